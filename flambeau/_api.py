"""Top-level functions that are not operators: default dtype/device, dtype queries, result_type."""
from __future__ import annotations

import os
import warnings

import ml_dtypes
import numpy as np

from . import _state, _dtype as D
from ._tensor import Tensor
from ._device import device as Device, canonical
from ._dispatch import can_cast as cc
from ._ops._helpers import result_type as rt
from ._tensor_str import set_printoptions as _set

__all__ = ["set_default_dtype", "get_default_dtype", "set_default_device", "get_default_device",
           "result_type", "can_cast", "is_floating_point", "is_complex", "numel", "is_nonzero",
           "iinfo", "finfo", "set_printoptions", "is_storage", "typename", "use_deterministic_algorithms",
           "are_deterministic_algorithms_enabled", "get_num_threads", "set_num_threads", "compiled_with_cxx11_abi",
           "set_float32_matmul_precision", "get_float32_matmul_precision"]


def set_default_dtype(d) -> None:
    if not isinstance(d, D.dtype) or d.category != D.FLOATING or d not in (D.float16, D.bfloat16, D.float32, D.float64):
        raise TypeError(f"only floating-point types are supported as the default type")
    _state.default_dtype = d


def get_default_dtype():
    return _state.default_dtype


def set_default_device(device) -> None:
    _state.tls.default_device = None if device is None else Device(device)


def get_default_device():
    return canonical(_state.tls.default_device)


def result_type(tensor1, tensor2):
    return rt(tensor1, tensor2)


def can_cast(from_, to) -> bool:
    return cc(from_, to)


def is_floating_point(t: Tensor) -> bool:
    return t.is_floating_point()


def is_complex(t: Tensor) -> bool:
    return t.is_complex()


def numel(t: Tensor) -> int:
    return t.numel()


def is_nonzero(t: Tensor) -> bool:
    if t.numel() != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(t.item())


class iinfo:
    def __init__(self, dtype):
        i = np.iinfo(dtype.np)
        self.bits, self.min, self.max, self.dtype = i.bits, int(i.min), int(i.max), dtype.name


class finfo:
    def __init__(self, dtype=None):
        dtype = dtype or _state.default_dtype
        i = ml_dtypes.finfo(dtype.np)
        self.bits = i.bits
        self.eps = float(i.eps)
        self.max = float(i.max)
        self.min = float(i.min)
        self.tiny = float(i.tiny)
        self.smallest_normal = float(i.tiny)
        self.resolution = float(i.resolution)
        self.dtype = dtype.name


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None, sci_mode=None):
    _set(precision, threshold, edgeitems, linewidth, profile, sci_mode)


def is_storage(obj) -> bool:
    return False


def typename(obj) -> str:
    return obj.type() if isinstance(obj, Tensor) else type(obj).__name__


_deterministic = False


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    global _deterministic
    _deterministic = mode


def are_deterministic_algorithms_enabled() -> bool:
    return _deterministic


MATMUL_PRECISIONS = ("highest", "high", "medium")


def set_float32_matmul_precision(precision: str) -> None:
    """How float32 matrix products may compute on cuda: "highest" (exact float32, PyTorch's default),
    "high" or "medium" (TF32 tensor cores). Read by the cuBLASLt products (`_backends.cublaslt`)."""
    if precision not in MATMUL_PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "setFloat32MatmulPrecision call has no effect.", stacklevel=2)
        return
    _state.float32_matmul_precision = precision


def get_float32_matmul_precision() -> str:
    return _state.float32_matmul_precision


def get_num_threads() -> int:
    return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    pass


def compiled_with_cxx11_abi() -> bool:
    return True
