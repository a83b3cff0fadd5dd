"""Factories: tensor/as_tensor/from_numpy, zeros/ones/empty/full (and *_like), arange, linspace,
logspace, eye, empty_strided, scalar_tensor, complex/polar. Random factories live in `random_ops`.

Factories with a size accept `f(2, 3)`, `f((2, 3))` and `f(torch.Size)`; `dtype`, `device`,
`requires_grad` as keywords, as in PyTorch.
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from .. import _dtype as D
from .. import _state
from .._tensor import Tensor
from .._device import canonical
from .._backends import get as backend, MetaArray
from ._registry import defop, export, TensorSpec


def _size(size) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = s.item()
        if not isinstance(s, (int, np.integer)) or isinstance(s, builtins.bool):
            raise TypeError(f"empty(): argument 'size' must be tuple of ints, but found element of type "
                            f"{type(s).__name__} at pos {len(out)}")
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
        out.append(int(s))
    return tuple(out)


def _dt(dtype, default=None):
    if dtype is None:
        return default or _state.default_dtype
    if isinstance(dtype, D.dtype):
        return dtype
    if isinstance(dtype, type) and dtype in (builtins.bool, int, float, complex):
        return {builtins.bool: D.bool, int: D.int64, float: D.float64, complex: D.complex128}[dtype]
    return D.from_numpy_dtype(np.dtype(dtype))


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad_(True)
    return t


def _xp_for(device):
    return backend(canonical(device if device is not None else _state.default_device).type).xp


# ---- full-like factories (ops, so tracing and meta see them) ---------------------------------
@defop("full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False)
def _full(xp, size, fill_value, *, dtype=None, device=None):
    return xp.full(size, fill_value, dtype=dtype.np)


@_full.def_meta
def _(size, fill_value, *, dtype=None, device=None):
    return TensorSpec(size, dtype)


@defop("empty(SymInt[] size, *, ScalarType? dtype=None, Device? device=None) -> Tensor", function=False)
def _empty(xp, size, *, dtype=None, device=None):
    return xp.empty(size, dtype=dtype.np)


@_empty.def_meta
def _(size, *, dtype=None, device=None):
    return TensorSpec(size, dtype)


def _fill_dtype(fill_value, dtype):
    if dtype is not None:
        return _dt(dtype)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    return D.scalar_dtype(fill_value, _state.default_dtype)


@export()
def full(size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
         pin_memory=False, out=None, names=None):
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    t = _full(_size((size,)), fill_value, dtype=_fill_dtype(fill_value, dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export()
def zeros(*size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False, out=None,
          names=None):
    t = _full(_size(size), 0, dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export()
def ones(*size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False, out=None,
         names=None):
    t = _full(_size(size), 1, dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export()
def empty(*size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False,
          memory_format=None, out=None, names=None):
    t = _empty(_size(size), dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape)


def _like(fn):
    def like(input, *args, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None,
             pin_memory=False):
        return fn(input.shape, *args, dtype=dtype or input.dtype,
                  device=device if device is not None else input.device, requires_grad=requires_grad)
    return like


zeros_like = export("zeros_like")(_like(zeros))
ones_like = export("ones_like")(_like(ones))
empty_like = export("empty_like")(_like(empty))


@export()
def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
              memory_format=None, pin_memory=False):
    return full(input.shape, fill_value, dtype=dtype or input.dtype,
                device=device if device is not None else input.device, requires_grad=requires_grad)


def _new(fn):
    def new(self, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
        return fn(*size, dtype=dtype or self.dtype, device=device if device is not None else self.device,
                  requires_grad=requires_grad)
    return new


export("new_zeros", method=True, function=False)(_new(zeros))
export("new_ones", method=True, function=False)(_new(ones))
export("new_empty", method=True, function=False)(_new(empty))


@export("new_full", method=True, function=False)
def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
             pin_memory=False):
    return full(size, fill_value, dtype=dtype or self.dtype, device=device if device is not None else self.device,
                requires_grad=requires_grad)


# ---- tensor() from Python data ---------------------------------------------------------------
def _infer_dtype(data) -> D.dtype:
    cat = -1
    stack = [data]
    found = None
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            if found is None or D.promote_types(found, x._dtype) is not found:
                found = x._dtype if found is None else D.promote_types(found, x._dtype)
            continue
        if isinstance(x, np.ndarray):
            dt = D.from_numpy_dtype(x.dtype)
            found = dt if found is None else D.promote_types(found, dt)
            continue
        if isinstance(x, (list, tuple)):
            stack.extend(x)
            continue
        if isinstance(x, builtins.bool) or isinstance(x, np.bool_):
            cat = max(cat, 0)
        elif isinstance(x, (int, np.integer)):
            cat = max(cat, 1)
        elif isinstance(x, (float, np.floating)):
            cat = max(cat, 2)
        elif isinstance(x, (complex, np.complexfloating)):
            cat = max(cat, 3)
        else:
            raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
    scal = {-1: None, 0: D.bool, 1: D.int64, 2: _state.default_dtype,
            3: D.complex128 if _state.default_dtype is D.float64 else D.complex64}[cat]
    if found is None:
        return scal or _state.default_dtype
    if scal is None:
        return found
    return D.promote_types(found, scal) if scal.category > found.category else found


def _to_host(data):
    if isinstance(data, Tensor):
        return np.asarray(data.detach()._host())
    if isinstance(data, (list, tuple)):
        return [_to_host(x) for x in data]
    return data


@export()
def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False) -> Tensor:
    if dtype is None:
        dt = D.from_numpy_dtype(data.dtype) if isinstance(data, np.ndarray) else _infer_dtype(data)
    else:
        dt = _dt(dtype)
    dev = canonical(device if device is not None else (data.device if isinstance(data, Tensor) and device is None
                                                       and _state.default_device is None else _state.default_device))
    host = _to_host(data)
    try:
        arr = np.array(host, dtype=dt.np if dt.np.kind != "V" else None)
        if arr.dtype != dt.np:
            arr = arr.astype(dt.np)
    except (ValueError, OverflowError) as e:
        if isinstance(e, OverflowError):
            raise RuntimeError(f"value cannot be converted to type {dt.name} without overflow") from None
        raise ValueError(f"expected sequence of equal-length lists: {e}") from None
    if dev.type == "cpu":
        return _finish(Tensor._make(arr, dev, dt), requires_grad)
    if dev.type == "meta":
        return _finish(Tensor._make(MetaArray(arr.shape, dt.np), dev, dt), requires_grad)
    return _finish(Tensor._make(backend(dev.type).asarray(arr, dt.np), dev, dt), requires_grad)


@export()
def as_tensor(data, dtype=None, device=None) -> Tensor:
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype) if (device is not None or dtype is not None) else data
    if isinstance(data, np.ndarray) and (device is None or canonical(device).type == "cpu") and \
            (dtype is None or _dt(dtype).np == data.dtype):
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


@export()
def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad=False):
    if copy:
        t = tensor(obj.detach() if isinstance(obj, Tensor) else obj, dtype=dtype, device=device)
    else:
        t = as_tensor(obj, dtype=dtype, device=device)
    return _finish(t, requires_grad)


@export()
def from_numpy(arr: np.ndarray) -> Tensor:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(arr).__name__})")
    if any(s < 0 for s in arr.strides):
        raise ValueError("At least one stride in the given numpy array is negative, and tensors with "
                         "negative strides are not currently supported. (You can probably work around "
                         "this by making a copy of your array  with array.copy().) ")
    return Tensor._make(arr, canonical("cpu"), D.from_numpy_dtype(arr.dtype))


@export()
def scalar_tensor(s, *, dtype=None, device=None, requires_grad=False):
    return full((), s, dtype=_dt(dtype), device=device, requires_grad=requires_grad)
