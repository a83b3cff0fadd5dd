"""The legacy tensor types: `torch.FloatTensor`, `torch.LongTensor`, ... and their `torch.cuda`
twins. Each names a (dtype, device type) pair: `isinstance(t, torch.LongTensor)` asks whether `t`
is an int64 cpu tensor, `torch.LongTensor(2, 3)` makes an uninitialised tensor of that shape and
`torch.LongTensor([1, 2])` one from data. Model code mostly meets them in type hints
(`input_ids: torch.LongTensor | None`). As in PyTorch they are not subclasses of Tensor.
"""
from __future__ import annotations

from . import _dtype as D
from ._tensor import Size, Tensor
from ._ops.creation import empty, tensor

# type name -> dtype (the same names under torch and torch.cuda)
TYPE_DTYPES: dict[str, D.dtype] = {
    "FloatTensor": D.float32, "DoubleTensor": D.float64, "HalfTensor": D.float16,
    "BFloat16Tensor": D.bfloat16, "ByteTensor": D.uint8, "CharTensor": D.int8, "ShortTensor": D.int16,
    "IntTensor": D.int32, "LongTensor": D.int64, "BoolTensor": D.bool,
}


class tensortype(type):
    """Metaclass of the legacy types: instance checks by dtype and device, calls construct."""

    dtype: D.dtype
    device_type: str

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype == cls.dtype and obj.device.type == cls.device_type

    def __call__(cls, *args, device=None) -> Tensor:
        dev = cls.device_type if device is None else device
        if not args or all(isinstance(a, int) for a in args):
            return empty(*args, dtype=cls.dtype, device=dev)
        if len(args) == 1 and isinstance(args[0], Size):
            return empty(args[0], dtype=cls.dtype, device=dev)
        if len(args) == 1:
            return tensor(args[0], dtype=cls.dtype, device=dev)
        raise TypeError(f"{cls.__module__}.{cls.__name__}() got invalid arguments "
                        f"({', '.join(type(a).__name__ for a in args)}): expected sizes (int...) or data")


def make_types(device_type: str, module: str) -> dict[str, tensortype]:
    """One legacy type per entry of TYPE_DTYPES for `device_type`, named as in `module`."""
    out = {}
    for name, dt in TYPE_DTYPES.items():
        out[name] = tensortype(name, (), {"dtype": dt, "device_type": device_type, "__module__": module,
                                          "is_cuda": device_type == "cuda"})
    return out
