"""Factories: tensor/as_tensor/from_numpy, zeros/ones/empty/full (and *_like), arange, linspace,
logspace, eye, empty_strided, scalar_tensor, complex/polar, and Tensor's own constructors
(`Tensor(...)`, `t.new_tensor(...)`, installed with the other methods). Random factories live in
`random_ops`.

Factories with a size accept `f(2, 3)`, `f((2, 3))` and `f(torch.Size)`; `dtype`, `device`,
`requires_grad` as keywords, as in PyTorch.
"""
from __future__ import annotations

import builtins
import math
import warnings

import numpy as np

from .. import _dtype as D
from .. import _state
from .._tensor import Tensor, contiguous_format, preserve_format
from ..storage import TypedStorage, UntypedStorage
from .._device import canonical
from .._dispatch import WRAPPER_DEVICE
from .._backends import get as backend, MetaArray
from ._registry import METHODS, defop, export, TensorSpec, Tag
from .memory_format import check_format, is_plain, like_strides


def _size(size) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = s.item()
        if type(s).__name__ == "SymInt":      # a symbolic size while tracing (fx): kept symbolic
            out.append(s)
            continue
        if not isinstance(s, (int, np.integer)) or isinstance(s, builtins.bool):
            raise TypeError(f"empty(): argument 'size' must be tuple of ints, but found element of type "
                            f"{type(s).__name__} at pos {len(out)}")
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
        out.append(int(s))
    return tuple(out)


def _size_kw(size, kw, name):
    """Accept PyTorch's `size=` keyword alongside positional sizes."""
    if kw:
        if set(kw) != {"size"} or size:
            bad = next(k for k in kw if k != "size") if set(kw) != {"size"} else "size"
            raise TypeError(f"{name}() got an unexpected keyword argument '{bad}'")
        return (kw["size"],)
    return size


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
    return backend(canonical(device if device is not None else _state.tls.default_device).type).xp


# ---- full-like factories (ops, so tracing and meta see them) ---------------------------------
@defop("full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core, Tag.recomputable))
def _full(xp, size, fill_value, *, dtype=None, device=None):
    if xp is not np and _is_positive_zero(fill_value):
        return xp.zeros(size, dtype=dtype.np)      # on cuda a memset, not a fill kernel
    return xp.full(size, fill_value, dtype=dtype.np)


def _is_positive_zero(v) -> bool:
    t = type(v)
    return (t is int or t is bool or t is float) and v == 0 and math.copysign(1.0, v) > 0


@_full.def_meta
def _(size, fill_value, *, dtype=None, device=None):
    return TensorSpec(size, dtype)


@defop("empty(SymInt[] size, *, ScalarType? dtype=None, Device? device=None) -> Tensor", function=False,
       tags=(Tag.core,))
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
          names=None, **kw):
    t = _full(_size(_size_kw(size, kw, "zeros")), 0, dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export()
def ones(*size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False, out=None,
         names=None, **kw):
    t = _full(_size(_size_kw(size, kw, "ones")), 1, dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export()
def empty(*size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False,
          memory_format=None, out=None, names=None, **kw):
    t = _empty(_size(_size_kw(size, kw, "empty")), dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape)


def like_strides_of(input: Tensor, memory_format, op: str):
    """The strides `empty_like(input, memory_format=)` gives, None for C order (the common case, decided
    from the array's flags): preserve_format (None) keeps a dense input's strides, as PyTorch's."""
    if memory_format is None or memory_format is preserve_format:
        flags = getattr(input._data, "flags", None)
        if flags.c_contiguous if flags is not None else input.is_contiguous():
            return None
    elif memory_format is contiguous_format:
        return None
    else:
        check_format(memory_format, input.ndim, op)
    strides = like_strides(input, memory_format)
    return None if is_plain(tuple(input.shape), strides) else strides


def like_layout(t: Tensor, strides, requires_grad: bool = False) -> Tensor:
    """`t` (a fresh C-order tensor) copied into these strides (`like_strides_of`; None: `t` itself)."""
    if strides is None:
        return _finish(t, requires_grad)
    out = _empty_strided(tuple(t.shape), strides, dtype=t.dtype, device=t.device)
    return _finish(out.copy_(t), requires_grad)


def _like(fn, zero=False):
    def like(input, *args, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None,
             pin_memory=False):
        if input._device is WRAPPER_DEVICE:      # a DTensor: its layout, filled locally
            return input._wrapper_like(fn, args, dict(dtype=dtype, device=device, requires_grad=requires_grad))
        dev = device if device is not None else input.device
        strides = like_strides_of(input, memory_format, fn.__name__ + "_like")
        if zero and strides is not None:          # a zeroed buffer in the layout asked for
            return _finish(_empty_strided(tuple(input.shape), strides, dtype=dtype or input.dtype, device=dev),
                           requires_grad)
        return like_layout(fn(input.shape, *args, dtype=dtype or input.dtype, device=dev), strides, requires_grad)
    return like


zeros_like = export("zeros_like")(_like(zeros, zero=True))
ones_like = export("ones_like")(_like(ones))
empty_like = export("empty_like")(_like(empty, zero=True))


@export()
def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
              memory_format=None, pin_memory=False):
    if input._device is WRAPPER_DEVICE:
        return input._wrapper_like(full, (fill_value,), dict(dtype=dtype, device=device, requires_grad=requires_grad))
    strides = like_strides_of(input, memory_format, "full_like")
    t = full(input.shape, fill_value, dtype=dtype or input.dtype,
             device=device if device is not None else input.device)
    return like_layout(t, strides, requires_grad)


def _new(fn):
    def new(self, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
        if self._device is WRAPPER_DEVICE and device is None:   # a DTensor: a DTensor on its mesh
            return self._wrapper_new(fn, _size(size), dict(dtype=dtype, requires_grad=requires_grad))
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
        if isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, (np.str_, np.bytes_)):
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
        elif isinstance(x, (str, bytes)):
            raise ValueError(f"too many dimensions '{type(x).__name__}'")
        else:
            raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
    scal = {-1: None, 0: D.bool, 1: D.int64, 2: _state.default_dtype,
            3: D.complex128 if _state.default_dtype is D.float64 else D.complex64}[cat]
    if found is None:
        return scal or _state.default_dtype
    if scal is None:
        return found
    return D.promote_types(found, scal) if scal.category > found.category else found


def _nested_shape(data) -> tuple:
    """The shape of nested sequences, with PyTorch's errors for ragged or mixed nesting."""
    shape = []
    x = data
    while True:
        if isinstance(x, (list, tuple)):
            shape.append(len(x))
            if not x:
                break
            x = x[0]
        elif isinstance(x, (Tensor, np.ndarray)):
            if x.ndim and x.size != 1 or not shape:
                shape.extend(x.shape)
            break
        else:
            break
    _check_nested(data, tuple(shape), 0)
    return tuple(shape)


def _check_nested(x, shape, d):
    if isinstance(x, (list, tuple)):
        if d >= len(shape):
            raise ValueError(f"expected a scalar at dim {d} but got a sequence of length {len(x)}")
        if len(x) != shape[d]:
            raise ValueError(f"expected sequence of length {shape[d]} at dim {d} (got {len(x)})")
        for y in x:
            _check_nested(y, shape, d + 1)
    elif isinstance(x, (Tensor, np.ndarray)):
        if tuple(x.shape) != shape[d:] and not (d == len(shape) and x.size == 1):
            if d == len(shape):
                raise ValueError("only one element tensors can be converted to Python scalars")
            raise ValueError(f"expected sequence of length {shape[d]} at dim {d} (got {len(x)})")
    elif d < len(shape):
        raise TypeError("not a sequence")


def _to_host(data):
    if isinstance(data, Tensor):
        return np.asarray(data.detach()._host())
    if isinstance(data, (list, tuple)):
        return [_to_host(x) for x in data]
    return data


def _flat_values(host, shape):
    """Nested sequences (validated) as one flat list of scalars or 0-dim arrays."""
    if len(shape) == 0:
        return host.reshape(()) if isinstance(host, np.ndarray) else host
    out = []
    stack = [host]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, np.ndarray):
            out.extend(x.reshape(-1))
        else:
            out.append(x)
    return out


@export()
def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False) -> Tensor:
    if dtype is None:
        dt = D.from_numpy_dtype(data.dtype) if isinstance(data, np.ndarray) else _infer_dtype(data)
    else:
        dt = _dt(dtype)
    dev = canonical(device if device is not None else (data.device if isinstance(data, Tensor) and device is None
                                                       and _state.tls.default_device is None else _state.tls.default_device))
    shape = _nested_shape(data) if isinstance(data, (list, tuple)) else None
    host = _to_host(data)
    try:
        if shape is not None:
            host = _flat_values(host, shape)
        arr = np.array(host, dtype=dt.np if dt.np.kind != "V" else None)
        if arr.dtype != dt.np:
            arr = arr.astype(dt.np)
        if shape is not None:
            arr = arr.reshape(shape)
    except (ValueError, OverflowError) as e:
        if isinstance(e, OverflowError):
            raise RuntimeError(f"value cannot be converted to type {dt.name} without overflow") from None
        raise ValueError(f"expected sequence of equal-length lists: {e}") from None
    if dev.type == "cpu":
        return _finish(Tensor._make(arr, dev, dt), requires_grad)
    if dev.type == "meta":
        return _finish(Tensor._make(MetaArray(arr.shape, dt.np), dev, dt), requires_grad)
    return _finish(Tensor._make(backend(dev.type).asarray(arr, dt.np), dev, dt), requires_grad)


def _tensor_new(cls, *args, **kwargs) -> Tensor:
    """`Tensor.__new__`: `torch.Tensor(2, 3)` (an uninitialised tensor of the default dtype) and
    `torch.Tensor([1, 2])` (data as the default dtype; a Tensor argument is returned as it is)."""
    if len(args) == 1 and not isinstance(args[0], int):
        src = args[0]
        if isinstance(src, Tensor):
            return src
        return tensor(src, dtype=_state.default_dtype)
    return empty(*args, dtype=_state.default_dtype, **kwargs)


METHODS["__new__"] = staticmethod(_tensor_new)


@export("new_tensor", method=True, function=False)
def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    if isinstance(data, Tensor):
        data = data.detach()
    return tensor(data, dtype=dtype or self._dtype, device=device or self._device, requires_grad=requires_grad)


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
    if isinstance(obj, (UntypedStorage, TypedStorage)):
        return _finish(_from_storage(obj, dtype, device, copy), requires_grad)
    if copy:
        t = tensor(obj.detach() if isinstance(obj, Tensor) else obj, dtype=dtype, device=device)
    else:
        t = as_tensor(obj, dtype=dtype, device=device)
    return _finish(t, requires_grad)


def _from_storage(storage, dtype, device, copy) -> Tensor:
    """The bytes of a storage as a 1-D tensor of `dtype` (the storage's own dtype, or uint8 for
    an untyped one), sharing its memory unless a copy or another device is asked for."""
    dt = _dt(dtype) if dtype is not None else getattr(storage, "dtype", D.uint8)
    raw = storage.untyped()._bytes()
    if raw.size % dt.itemsize:
        raise ValueError(f"asarray: a storage of {raw.size} bytes does not hold a whole number of "
                         f"{dt.name} elements ({dt.itemsize} bytes each)")
    t = Tensor._make(raw.view(dt.np), storage.device, dt)
    if copy:
        t = t.clone()
    return t if device is None else t.to(device)


@export()
def from_numpy(arr: np.ndarray) -> Tensor:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(arr).__name__})")
    if any(s < 0 for s in arr.strides):
        raise ValueError("At least one stride in the given numpy array is negative, and tensors with "
                         "negative strides are not currently supported. (You can probably work around "
                         "this by making a copy of your array  with array.copy().) ")
    if type(arr) is not np.ndarray:
        arr = arr.view(np.ndarray)      # a subclass (np.memmap, ...): kernels and views expect the base class
    return Tensor._make(arr, canonical("cpu"), D.from_numpy_dtype(arr.dtype))


@export()
def scalar_tensor(s, *, dtype=None, device=None, requires_grad=False):
    return full((), s, dtype=_dt(dtype), device=device, requires_grad=requires_grad)


# ---- ranges and eye ------------------------------------------------------------------------
def _scalar(x):
    if isinstance(x, Tensor):
        return x.item()
    if isinstance(x, np.generic):
        return x.item()
    return x


def _range_dtype(dtype, *vals):
    if dtype is not None:
        return _dt(dtype)
    if any(isinstance(v, (float, complex)) for v in vals):
        return _state.default_dtype
    return D.int64


@defop("arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, "
       "Device? device=None) -> Tensor", function=False, tags=(Tag.core,))
def _arange(xp, start, end, step=1, *, dtype=None, device=None):
    n = _arange_len(start, end, step, dtype)
    if dtype.category <= D.INTEGER:
        return (int(start) + xp.arange(n, dtype=np.int64) * int(step)).astype(dtype.np)
    return (start + xp.arange(n, dtype=np.float64) * step).astype(dtype.np)


def _arange_len(start, end, step, dtype):
    if dtype.category <= D.INTEGER:
        if "SymInt" in (type(start).__name__, type(end).__name__):      # traced with symbolic sizes
            return _symbolic_arange_len(start, end, int(step))
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not all(math.isfinite(v) for v in (start, end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    return max(0, math.ceil((end - start) / step))


def _symbolic_arange_len(start, end, step):
    """The length of an integer arange whose bounds are symbolic sizes: a size expression, with the
    sign checks recorded as guards (the comparisons of SymInts do that) instead of specialising."""
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    span = end - start if step > 0 else start - end
    return span if abs(step) == 1 else (span + abs(step) - 1) // abs(step)


_arange.def_meta(lambda start, end, step=1, *, dtype=None, device=None:
                 TensorSpec((_arange_len(start, end, step, dtype),), dtype))


@export()
def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False, layout=None,
           pin_memory=False, out=None):
    if end is None:
        start, end = 0, start
    start, end, step = _scalar(start), _scalar(end), _scalar(step)
    dt = _range_dtype(dtype, start, end, step)
    if dt is D.bool:
        raise RuntimeError("\"arange_cpu\" not implemented for 'Bool'")
    t = _arange(start, end, step, dtype=dt, device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@export("range")
def range_(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False, layout=None, out=None):
    warnings.warn("torch.range is deprecated and will be removed in a future release because its behavior is "
                  "inconsistent with Python's range builtin. Instead, use torch.arange, which produces values "
                  "in [start, end).", UserWarning, stacklevel=2)
    if end is None:
        start, end = 0, start
    start, end, step = _scalar(start), _scalar(end), _scalar(step)
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    dt = _dt(dtype)
    n = int(math.floor((end - start) / step)) + 1
    t = _arange(start, start + n * step - step / 2 if dt.category >= D.FLOATING else start + n * step, step, dtype=dt,
                device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


def _lin_values(xp, start, end, steps, npdt):
    """PyTorch's linspace: the first half counts up from start, the second half down from end."""
    if steps == 1:
        return xp.full((1,), start, dtype=npdt)
    step = (npdt.type(end) - npdt.type(start)) / npdt.type(steps - 1)
    i = xp.arange(steps, dtype=npdt)
    half = steps // 2
    return xp.where(i < half, npdt.type(start) + step * i, npdt.type(end) - step * (steps - 1 - i))


@defop("linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core,))
def _linspace(xp, start, end, steps, *, dtype=None, device=None):
    cd = np.dtype(np.float64) if dtype.category <= D.INTEGER or dtype in D.LOW_PRECISION else dtype.np
    if dtype.category == D.COMPLEX:
        cd = dtype.np
    v = _lin_values(xp, start, end, steps, cd)
    return v.astype(dtype.np)


def _steps(steps):
    steps = _scalar(steps)
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    return int(steps)


_linspace.def_meta(lambda start, end, steps, *, dtype=None, device=None: TensorSpec((_steps(steps),), dtype))


def _lin_dtype(dtype, start, end):
    if dtype is not None:
        return _dt(dtype)
    if isinstance(start, complex) or isinstance(end, complex):
        return D.complex128 if _state.default_dtype is D.float64 else D.complex64
    return _state.default_dtype


@export()
def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False, layout=None, out=None):
    start, end, steps = _scalar(start), _scalar(end), _steps(steps)
    t = _linspace(start, end, steps, dtype=_lin_dtype(dtype, start, end), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@defop("logspace(Scalar start, Scalar end, int steps, float base=10.0, *, ScalarType? dtype=None, "
       "Device? device=None) -> Tensor", function=False, tags=(Tag.core,))
def _logspace(xp, start, end, steps, base=10.0, *, dtype=None, device=None):
    cd = np.dtype(np.complex128) if dtype.category == D.COMPLEX else np.dtype(np.float64)
    return (cd.type(base) ** _lin_values(xp, start, end, steps, cd)).astype(dtype.np)


_logspace.def_meta(lambda start, end, steps, base=10.0, *, dtype=None, device=None:
                   TensorSpec((_steps(steps),), dtype))


@export()
def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False, layout=None, out=None):
    start, end, steps = _scalar(start), _scalar(end), _steps(steps)
    t = _logspace(start, end, steps, base, dtype=_lin_dtype(dtype, start, end), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


def _eye_shape(n, m):
    if n < 0:
        raise RuntimeError(f"n must be greater or equal to 0, got {n}")
    if m < 0:
        raise RuntimeError(f"m must be greater or equal to 0, got {m}")
    return (n, m)


@defop("eye.m(SymInt n, SymInt m, *, ScalarType? dtype=None, Device? device=None) -> Tensor", function=False)
def _eye(xp, n, m, *, dtype=None, device=None):
    _eye_shape(n, m)
    return xp.eye(n, m, dtype=dtype.np)


_eye.def_meta(lambda n, m, *, dtype=None, device=None: TensorSpec(_eye_shape(n, m), dtype))


@export()
def eye(n, m=None, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False, out=None):
    n = _scalar(n)
    m = n if m is None else _scalar(m)
    t = _eye(n, m, dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


@defop("empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core,))
def _empty_strided(xp, size, stride, *, dtype=None, device=None):
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape")
    n = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    base = xp.zeros(n, dtype=dtype.np)
    it = dtype.np.itemsize
    return xp.lib.stride_tricks.as_strided(base, tuple(size), tuple(st * it for st in stride))


_empty_strided.def_meta(lambda size, stride, *, dtype=None, device=None:
                        TensorSpec(size, dtype, tuple(stride)))


@export()
def empty_strided(size, stride, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    t = _empty_strided(_size((size,)), tuple(int(s) for s in stride), dtype=_dt(dtype), device=device)
    return _finish(t, requires_grad)
