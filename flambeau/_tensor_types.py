"""The legacy tensor types: `torch.FloatTensor`, `torch.LongTensor`, ..., `torch.cuda.FloatTensor`.

Each is a class (of metaclass `tensortype`, as in PyTorch) that is not a Tensor subclass but
answers `isinstance(t, torch.LongTensor)` by the tensor's dtype and device type, and builds tensors
as PyTorch's legacy constructors do: `LongTensor(3)` / `LongTensor(2, 3)` / `LongTensor(size)`
uninitialised, `LongTensor([1, 2])` from data, `LongTensor(t)` returns a tensor of that type
unchanged (TypeError for another dtype), `LongTensor()` empty. The cuda types build on cuda
(TypeError when cuda is not available). `Tensor.type(torch.LongTensor)` casts by the same classes.
"""
from __future__ import annotations

from . import _dtype as D
from ._backends import cupy_available
from ._device import device as _device
from ._ops import creation
from ._tensor import Tensor

_NAMES = {"Float": D.float32, "Double": D.float64, "Half": D.float16, "BFloat16": D.bfloat16,
          "Long": D.int64, "Int": D.int32, "Short": D.int16, "Char": D.int8, "Byte": D.uint8, "Bool": D.bool,
          "ComplexFloat": D.complex64, "ComplexDouble": D.complex128}


class tensortype(type):
    """Metaclass of the legacy types: isinstance by dtype and device type, construction by `_build`."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and obj.device.type == cls._device_type

    def __call__(cls, *args, device=None, **kwargs):
        if kwargs:
            raise TypeError(f"new() received an invalid combination of arguments - got keyword arguments "
                            f"{sorted(kwargs)}; {cls.__module__}.{cls.__name__} accepts data, a size, or a Tensor "
                            "(and device=)")
        return _build(cls, args, device)

    def __repr__(cls) -> str:
        return f"<class '{cls.__module__}.{cls.__name__}'>"


def _build(cls, args: tuple, device) -> Tensor:
    dev = _device(device) if device is not None else _device(cls._device_type)
    if dev.type != cls._device_type:
        raise RuntimeError(f"legacy constructor expects device type: {cls._device_type} but device type: "
                           f"{dev.type} was passed")
    if dev.type == "cuda" and not cupy_available():
        raise TypeError(f"type {cls.__module__}.{cls.__name__} not available. flambeau has no usable cuda "
                        "device here (CuPy and a GPU are needed)")
    if len(args) == 1 and isinstance(args[0], Tensor):
        src = args[0]
        if src.dtype is not cls.dtype or src.device.type != dev.type:
            raise TypeError(f"expected {cls.dtype} on {dev.type} (got {src.dtype} on {src.device.type}): "
                            f"{cls.__name__}(tensor) does not convert; use tensor.to({cls.dtype})")
        return src
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return creation.empty(*args, dtype=cls.dtype, device=dev) if args else \
            creation.empty(0, dtype=cls.dtype, device=dev)
    if len(args) == 1 and isinstance(args[0], tuple) and type(args[0]).__name__ == "Size":
        return creation.empty(*args[0], dtype=cls.dtype, device=dev)
    if len(args) == 1:
        return creation.tensor(args[0], dtype=cls.dtype, device=dev)
    raise TypeError(f"new() received an invalid combination of arguments - got {tuple(type(a).__name__ for a in args)}; "
                    f"{cls.__name__} takes a size (ints), data (a sequence or array) or a Tensor")


def _make_type(prefix: str, dtype, module: str, device_type: str) -> tensortype:
    return tensortype(f"{prefix}Tensor", (), {"dtype": dtype, "is_cuda": device_type == "cuda",
                                              "is_sparse": False, "_device_type": device_type,
                                              "__module__": module})


CPU_TYPES = {f"{p}Tensor": _make_type(p, dt, "torch", "cpu") for p, dt in _NAMES.items()}
CUDA_TYPES = {f"{p}Tensor": _make_type(p, dt, "torch.cuda", "cuda") for p, dt in _NAMES.items()}
BY_NAME = {**{f"torch.{n}": c for n, c in CPU_TYPES.items()}, **{f"torch.cuda.{n}": c for n, c in CUDA_TYPES.items()}}

