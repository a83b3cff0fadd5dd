"""Devices: `device('cpu')`, `device('cuda:0')`, `device('meta')`, and the default-device state.

Layer 2 (device) of tests/test_layers.py's order: above the foundation (`_state`, `_dtype`), below
`_backends`.
"""
from __future__ import annotations

from . import _state

_KNOWN = {"cpu", "cuda", "meta", "privateuseone"}
_PRIVATEUSE1 = ["privateuseone"]     # the name of the third-party device type (PrivateUse1)


def privateuse1_name() -> str:
    """The PrivateUse1 device type's name: 'privateuseone' until `rename_privateuse1` gives it one."""
    return _PRIVATEUSE1[0]


def rename_privateuse1(name: str) -> None:
    """Name the PrivateUse1 device type (once; `flambeau.utils.rename_privateuse1_backend`)."""
    if not isinstance(name, str) or not name.isidentifier() or name in _KNOWN - {_PRIVATEUSE1[0]}:
        raise RuntimeError(f"torch.register_privateuse1_backend(): invalid backend name {name!r}")
    if _PRIVATEUSE1[0] != "privateuseone":
        if name == _PRIVATEUSE1[0]:
            return
        raise RuntimeError(f"torch.register_privateuse1_backend() has already been set! Current backend: "
                           f"{_PRIVATEUSE1[0]}")
    _KNOWN.discard("privateuseone")
    _KNOWN.add(name)
    _PRIVATEUSE1[0] = name


class device:
    __slots__ = ("type", "index", "_prev")

    def __new__(cls, type, index=None):
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device(): type (device) cannot be combined with an index")
            return type
        if isinstance(type, int) and index is None:
            type, index = "cuda", type
        if not isinstance(type, str):
            raise TypeError(f"device() received an invalid combination of arguments - got ({type.__class__.__name__})")
        s = type
        if ":" in s:
            if index is not None:
                raise RuntimeError(f"type (string) must not include an index because index was passed explicitly: {s}")
            s, _, idx = s.partition(":")
            if not idx.isdigit():
                raise RuntimeError(f"Invalid device string: '{type}'")
            index = int(idx)
        if s not in _KNOWN:
            raise RuntimeError(f"Expected one of cpu, cuda, meta, {_PRIVATEUSE1[0]} device type at start of "
                               f"device string: {type}")
        self = object.__new__(cls)
        object.__setattr__(self, "type", s)
        object.__setattr__(self, "index", index)
        return self

    def __setattr__(self, k, v):
        if k == "_prev":
            object.__setattr__(self, k, v)
            return
        raise AttributeError("device objects are immutable")

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    # `with flambeau.device('meta'):` sets the default device for factories
    def __enter__(self):
        self._prev = _state.tls.default_device
        _state.tls.default_device = self
        return self

    def __exit__(self, *exc):
        _state.tls.default_device = self._prev
        return False

    def __reduce__(self):
        return (device, (self.type, self.index))


CPU = device("cpu")
# The device object of quantized tensors: equal to CPU (they live on the cpu) but a separate object,
# so that the dispatcher's identity test routes them away from float kernels (PyTorch's QuantizedCPU
# dispatch key): `_dispatch.call_functional` refuses them.
QUANTIZED_CPU = device("cpu")
META = device("meta")


_CUDA_DEVICES: dict = {}      # index -> the one device object cuda tensors of that index carry


def canonical(d) -> device:
    """The device a tensor actually lives on ('cuda' means the current cuda device). Cuda devices
    are one object per index, so that the dispatcher's same-device test is an identity test."""
    if d is None:
        return CPU
    if not isinstance(d, device):
        d = device(d)
    if d.type == "cuda":
        i = d.index if d.index is not None else _state.cuda_device
        c = _CUDA_DEVICES.get(i)
        if c is None:
            c = _CUDA_DEVICES[i] = device("cuda", i)
        return c
    return d


def cuda_index(d) -> int:
    """The index of the cuda device `d` names: an int, a string or a device; None or no index means
    the current cuda device (`flambeau.cuda.current_device`)."""
    if d is None:
        return _state.cuda_device
    if isinstance(d, int):
        return d
    d = device(d)
    return d.index if d.index is not None else _state.cuda_device
