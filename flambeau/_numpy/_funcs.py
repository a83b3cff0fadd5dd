"""flambeau._numpy's functions: NumPy's creation, reduction, shape and linear-algebra functions over
flambeau operators, and the ndarray methods that are these functions with the array first (`a.sum(0)`
is `sum(a, 0)`, as in NumPy).

Dtype rules are NumPy's, asked of NumPy itself where they are not plain promotion: a reduction's
result dtype is the one NumPy gives for a one-element array of the input dtype (`sum` of int32 is
int64, `mean` of ints float64), creation functions default to float64 / int64, and mixed operands
promote by `np.result_type`. Unsupported arguments raise NotImplementedError naming the function
(under `flambeau.compile` that is a graph break with the reason).
"""
from __future__ import annotations

import builtins

import numpy as np

from .._ops import functions as F
from ._ndarray import ndarray, to_tensor, np_dtype, fl_dtype, write_out, UFUNCS, matmul, _PY_SCALARS

_DEFAULT_FLOAT = np.float64
_REDUCTION_PROBE_SHAPE = (2,)       # a probe array for NumPy's reduction dtype (2 elements: var(ddof=1) defined)


def _finish(r, out):
    return write_out(r, out) if out is not None else ndarray(r)


def _dims(axis, ndim: int):
    """NumPy's axis (None, int, tuple) as a tuple of non-negative dims."""
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in axes:
        a = builtins.int(a)
        if not -builtins.max(ndim, 1) <= a < builtins.max(ndim, 1):
            raise np.exceptions.AxisError(f"axis {a} is out of bounds for array of dimension {ndim}")
        out.append(a % builtins.max(ndim, 1))
    return tuple(out)


def _common(*xs):
    """The NumPy result dtype of operands (Python scalars weak) as a flambeau dtype."""
    return fl_dtype(np.result_type(*[x if type(x) in _PY_SCALARS else np_dtype(x) for x in xs]))


def _reduction_dtype(np_fn, dt, **kw):
    return np_fn(np.ones(_REDUCTION_PROBE_SHAPE, dt), **kw).dtype


# ---- creation -----------------------------------------------------------------------------------------
def _shape(shape) -> tuple:
    return (shape,) if isinstance(shape, builtins.int) or hasattr(shape, "__index__") else tuple(shape)


def zeros(shape, dtype=float, order="C", *, like=None) -> ndarray:
    return ndarray(F.zeros(_shape(shape), dtype=fl_dtype(dtype)))


def ones(shape, dtype=None, order="C", *, like=None) -> ndarray:
    return ndarray(F.ones(_shape(shape), dtype=fl_dtype(dtype or _DEFAULT_FLOAT)))


def empty(shape, dtype=float, order="C", *, like=None) -> ndarray:
    return zeros(shape, dtype)


def full(shape, fill_value, dtype=None, order="C", *, like=None) -> ndarray:
    dt = _scalar_dtype(fill_value) if dtype is None else dtype
    if isinstance(fill_value, (ndarray, np.ndarray)):
        return ndarray(F.broadcast_to(to_tensor(fill_value, dt), _shape(shape)).clone())
    return ndarray(F.full(_shape(shape), fill_value, dtype=fl_dtype(dt)))


def _scalar_dtype(x) -> np.dtype:
    """NumPy's dtype for a value standing alone (a Python float is float64, an int int64)."""
    d = np_dtype(x)
    return np.asarray(x).dtype if isinstance(d, type) else d


def _like(fn_name):
    def like(a, dtype=None, order="K", subok=True, shape=None):
        t = to_tensor(a)
        dt = fl_dtype(dtype) if dtype is not None else t.dtype
        size = _shape(shape) if shape is not None else tuple(t.shape)
        return ndarray(getattr(F, fn_name)(size, dtype=dt, device=t.device))     # on `a`'s device
    like.__name__ = fn_name + "_like"
    return like


zeros_like = _like("zeros")
ones_like = _like("ones")
empty_like = _like("zeros")
empty_like.__name__ = "empty_like"


def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None) -> ndarray:
    t = to_tensor(a)
    size = _shape(shape) if shape is not None else tuple(t.shape)
    return ndarray(F.full(size, fill_value, dtype=fl_dtype(dtype) if dtype is not None else t.dtype,
                          device=t.device))


def arange(start, stop=None, step=1, dtype=None, *, like=None) -> ndarray:
    if stop is None:
        start, stop = 0, start
    dt = dtype if dtype is not None else np.result_type(*[_scalar_dtype(v) for v in (start, stop, step)])
    return ndarray(F.arange(start, stop, step, dtype=fl_dtype(dt)))


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    if axis != 0:
        raise NotImplementedError("np.linspace(axis != 0) is not supported by flambeau._numpy")
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else float("nan")
    t = F.arange(num, dtype=fl_dtype(_DEFAULT_FLOAT)) * step + start
    if endpoint and num > 1:
        t[-1] = stop
    if dtype is not None:
        t = t.to(fl_dtype(dtype))
    return (ndarray(t), step) if retstep else ndarray(t)


def eye(N, M=None, k=0, dtype=float, order="C", *, like=None) -> ndarray:
    m = N if M is None else M
    ones_ = F.ones((N, m), dtype=fl_dtype(dtype))
    return ndarray(F.triu(F.tril(ones_, k), k))


def identity(n, dtype=None, *, like=None) -> ndarray:
    return eye(n, dtype=dtype or _DEFAULT_FLOAT)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, like=None) -> ndarray:
    t = to_tensor(obj, dtype)
    if copy and ((isinstance(obj, ndarray) and t is obj.tensor) or
                 (isinstance(obj, np.ndarray) and t.device.type == "cpu" and np.shares_memory(t._data, obj))):
        t = t.clone()
    while t.dim() < ndmin:
        t = t.unsqueeze(0)
    return ndarray(t)


def asarray(a, dtype=None, order=None, *, like=None) -> ndarray:
    if isinstance(a, ndarray) and dtype is None:
        return a
    return ndarray(to_tensor(a, dtype))


def ascontiguousarray(a, dtype=None, *, like=None) -> ndarray:
    return ndarray(to_tensor(a, dtype).contiguous())


def copy(a, order="K", subok=False) -> ndarray:
    return ndarray(to_tensor(a).clone())


# ---- reductions ---------------------------------------------------------------------------------------
def _reduce(np_fn, compute, a, axis, dtype, out, keepdims, cast_input=True, **np_kw):
    t = to_tensor(a)
    res = _reduction_dtype(np_fn, np_dtype(t), dtype=dtype, **np_kw) if dtype is not None or cast_input \
        else np_dtype(t)
    if cast_input and fl_dtype(res) != t.dtype:
        t = t.to(fl_dtype(res))
    r = compute(t, _dims(axis, t.dim()), builtins.bool(keepdims))
    if r.dtype != fl_dtype(res):
        r = r.to(fl_dtype(res))
    return _finish(r, out)


def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None) -> ndarray:
    _no_where("sum", where)
    r = _reduce(np.sum, lambda t, d, k: F.sum(t, d, keepdim=k), a, axis, dtype, None, keepdims)
    return _finish(r.tensor + initial if initial is not None else r.tensor, out)


def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None) -> ndarray:
    _no_where("prod", where)

    def compute(t, dims, keep):
        for d in sorted(dims, reverse=True):
            t = F.prod(t, d, keepdim=keep)
        return t
    r = _reduce(np.prod, compute, a, axis, dtype, None, keepdims)
    return _finish(r.tensor * initial if initial is not None else r.tensor, out)


def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=None) -> ndarray:
    _no_where("mean", where)
    return _reduce(np.mean, lambda t, d, k: F.mean(t, d, keepdim=k), a, axis, dtype, out, keepdims)


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, mean=None,
        correction=None) -> ndarray:
    _no_where("var", where)
    c = ddof if correction is None else correction
    return _reduce(np.var, lambda t, d, k: F.var(t, d, correction=c, keepdim=k), a, axis, dtype, out, keepdims)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, mean=None,
        correction=None) -> ndarray:
    _no_where("std", where)
    c = ddof if correction is None else correction
    return _reduce(np.std, lambda t, d, k: F.std(t, d, correction=c, keepdim=k), a, axis, dtype, out, keepdims)


def amax(a, axis=None, out=None, keepdims=False, initial=None, where=None) -> ndarray:
    _no_where("max", where)
    return _reduce(np.amax, lambda t, d, k: F.amax(t, d, keepdim=k), a, axis, None, out, keepdims, False)


def amin(a, axis=None, out=None, keepdims=False, initial=None, where=None) -> ndarray:
    _no_where("min", where)
    return _reduce(np.amin, lambda t, d, k: F.amin(t, d, keepdim=k), a, axis, None, out, keepdims, False)


max = amax
min = amin


def ptp(a, axis=None, out=None, keepdims=False) -> ndarray:
    return _finish(amax(a, axis, keepdims=keepdims).tensor - amin(a, axis, keepdims=keepdims).tensor, out)


def _arg_reduce(fn, a, axis, out, keepdims):
    t = to_tensor(a)
    if axis is None:
        r = fn(t.reshape(-1), 0)
        if keepdims:
            r = r.reshape((1,) * t.dim())
    else:
        r = fn(t, _dims(axis, t.dim())[0], keepdim=builtins.bool(keepdims))
    return _finish(r, out)


def argmax(a, axis=None, out=None, *, keepdims=False) -> ndarray:
    return _arg_reduce(F.argmax, a, axis, out, keepdims)


def argmin(a, axis=None, out=None, *, keepdims=False) -> ndarray:
    return _arg_reduce(F.argmin, a, axis, out, keepdims)


def all(a, axis=None, out=None, keepdims=False, *, where=None) -> ndarray:
    _no_where("all", where)
    return _finish(_bool_reduce(F.all, a, axis, keepdims), out)


def any(a, axis=None, out=None, keepdims=False, *, where=None) -> ndarray:
    _no_where("any", where)
    return _finish(_bool_reduce(F.any, a, axis, keepdims), out)


def _bool_reduce(fn, a, axis, keepdims):
    t = to_tensor(a)
    t = t if t.dtype == fl_dtype(np.bool_) else t != 0
    return fn(t, _dims(axis, t.dim()), keepdim=builtins.bool(keepdims))


def _cumulative(np_fn, fl_fn, a, axis, dtype, out):
    t = to_tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    res = _reduction_dtype(np_fn, np_dtype(t), dtype=dtype)
    return _finish(fl_fn(t.to(fl_dtype(res)), _dims(axis, t.dim())[0]), out)


def cumsum(a, axis=None, dtype=None, out=None) -> ndarray:
    return _cumulative(np.cumsum, F.cumsum, a, axis, dtype, out)


def cumprod(a, axis=None, dtype=None, out=None) -> ndarray:
    return _cumulative(np.cumprod, F.cumprod, a, axis, dtype, out)


def count_nonzero(a, axis=None, *, keepdims=False) -> ndarray:
    t = to_tensor(a) != 0
    return ndarray(F.sum(t, _dims(axis, t.dim()), keepdim=builtins.bool(keepdims)))


def _no_where(name, where):
    if where is not None and where is not True:
        raise NotImplementedError(f"np.{name}(where=...) is not supported by flambeau._numpy")


# ---- shapes -------------------------------------------------------------------------------------------
def reshape(a, shape=None, order="C", *, newshape=None, copy=None) -> ndarray:
    if order != "C":
        raise NotImplementedError(f"np.reshape(order={order!r}) is not supported by flambeau._numpy")
    return ndarray(to_tensor(a).reshape(_shape(shape if shape is not None else newshape)))


def ravel(a, order="C") -> ndarray:
    return reshape(a, -1, order)


def transpose(a, axes=None) -> ndarray:
    t = to_tensor(a)
    perm = tuple(reversed(range(t.dim()))) if axes is None else _dims(tuple(axes), t.dim())
    return ndarray(t.permute(*perm))


def swapaxes(a, axis1, axis2) -> ndarray:
    return ndarray(F.transpose(to_tensor(a), axis1, axis2))


def moveaxis(a, source, destination) -> ndarray:
    return ndarray(F.movedim(to_tensor(a), source, destination))


def expand_dims(a, axis) -> ndarray:
    t = to_tensor(a)
    for d in sorted(_dims(axis, t.dim() + len(axis if isinstance(axis, tuple) else (axis,)))):
        t = t.unsqueeze(d)
    return ndarray(t)


def squeeze(a, axis=None) -> ndarray:
    t = to_tensor(a)
    if axis is None:
        return ndarray(t.squeeze())
    dims = _dims(axis, t.dim())
    for d in dims:
        if t.shape[d] != 1:
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return ndarray(t.squeeze(dims))


def broadcast_to(array, shape, subok=False) -> ndarray:
    return ndarray(F.broadcast_to(to_tensor(array), _shape(shape)))


def broadcast_arrays(*args, subok=False) -> tuple:
    return tuple(ndarray(t) for t in F.broadcast_tensors(*[to_tensor(a) for a in args]))


def atleast_1d(a) -> ndarray:
    return ndarray(F.atleast_1d(to_tensor(a)))


def atleast_2d(a) -> ndarray:
    return ndarray(F.atleast_2d(to_tensor(a)))


def _join(fn, arrays, axis):
    ts = [to_tensor(a) for a in arrays]
    common = _common(*ts)
    return fn([t.to(common) for t in ts], axis)


def concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind") -> ndarray:
    arrays = [a.reshape(-1) if axis is None else a for a in (to_tensor(x) for x in arrays)]
    r = _join(F.cat, arrays, 0 if axis is None else axis)
    return _finish(r.to(fl_dtype(dtype)) if dtype is not None else r, out)


def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind") -> ndarray:
    r = _join(F.stack, arrays, axis)
    return _finish(r.to(fl_dtype(dtype)) if dtype is not None else r, out)


def vstack(tup, *, dtype=None, casting="same_kind") -> ndarray:
    return concatenate([atleast_2d(a) for a in tup], 0, dtype=dtype)


def hstack(tup, *, dtype=None, casting="same_kind") -> ndarray:
    arrs = [atleast_1d(a) for a in tup]
    return concatenate(arrs, 0 if arrs[0].ndim == 1 else 1, dtype=dtype)


def split(ary, indices_or_sections, axis=0) -> list:
    t = to_tensor(ary)
    if isinstance(indices_or_sections, builtins.int):
        n = t.shape[axis]
        if n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        return [ndarray(p) for p in F.split(t, n // indices_or_sections, axis)]
    return [ndarray(p) for p in F.tensor_split(t, list(indices_or_sections), axis)]


def where(condition, x=None, y=None) -> ndarray:
    if x is None or y is None:
        raise NotImplementedError("np.where(condition) (nonzero: a data-dependent shape) is not supported "
                                  "by flambeau._numpy")
    common = _common(x, y)
    cond = to_tensor(condition)
    cond = cond if cond.dtype == fl_dtype(np.bool_) else cond != 0
    return ndarray(F.where(cond, to_tensor(x, common), to_tensor(y, common)))


def clip(a, a_min=None, a_max=None, out=None, **kwargs) -> ndarray:
    t = to_tensor(a)
    if a_min is not None:
        t = UFUNCS["maximum"](t, a_min).tensor
    if a_max is not None:
        t = UFUNCS["minimum"](t, a_max).tensor
    return _finish(t, out)


def tile(A, reps) -> ndarray:
    return ndarray(F.tile(to_tensor(A), _shape(reps)))


def repeat(a, repeats, axis=None) -> ndarray:
    t = to_tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return ndarray(F.repeat_interleave(t, repeats, axis))


def flip(m, axis=None) -> ndarray:
    t = to_tensor(m)
    return ndarray(F.flip(t, _dims(axis, t.dim())))


def roll(a, shift, axis=None) -> ndarray:
    t = to_tensor(a)
    if axis is None:
        return ndarray(F.roll(t.reshape(-1), shift, 0).reshape(tuple(t.shape)))
    return ndarray(F.roll(t, shift, axis))


def diag(v, k=0) -> ndarray:
    return ndarray(F.diag(to_tensor(v), k))


def diagonal(a, offset=0, axis1=0, axis2=1) -> ndarray:
    return ndarray(F.diagonal(to_tensor(a), offset, axis1, axis2))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None) -> ndarray:
    return sum(diagonal(a, offset, axis1, axis2), -1, dtype=dtype, out=out)


def tril(m, k=0) -> ndarray:
    return ndarray(F.tril(to_tensor(m), k))


def triu(m, k=0) -> ndarray:
    return ndarray(F.triu(to_tensor(m), k))


def sort(a, axis=-1, kind=None, order=None, *, stable=None) -> ndarray:
    t = to_tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return ndarray(F.sort(t, axis, stable=True)[0])


def argsort(a, axis=-1, kind=None, order=None, *, stable=None) -> ndarray:
    t = to_tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return ndarray(F.argsort(t, axis, stable=True))


def take(a, indices, axis=None, out=None, mode="raise") -> ndarray:
    t, idx = to_tensor(a), to_tensor(indices)
    r = F.take(t, idx) if axis is None else F.index_select(t, axis, idx.reshape(-1)).reshape(
        tuple(t.shape[:axis]) + tuple(idx.shape) + tuple(t.shape[axis + 1:]))
    return _finish(r, out)


def take_along_axis(arr, indices, axis) -> ndarray:
    return ndarray(F.take_along_dim(to_tensor(arr), to_tensor(indices), axis))


def around(a, decimals=0, out=None) -> ndarray:
    t = to_tensor(a)
    r = F.round(t, decimals=decimals) if t.is_floating_point() else t.clone()
    return _finish(r, out)


round = around


def diff(a, n=1, axis=-1) -> ndarray:
    t = to_tensor(a)
    for _ in range(n):
        t = F.diff(t, dim=axis)
    return ndarray(t)


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None) -> ndarray:
    return ndarray(F.nan_to_num(to_tensor(x), nan, posinf, neginf))


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> ndarray:
    common = _common(a, b, 1.0)
    return ndarray(F.isclose(to_tensor(a, common), to_tensor(b, common), rtol, atol, equal_nan))


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return builtins.bool(all(isclose(a, b, rtol, atol, equal_nan)))


def shape(a) -> tuple:
    return tuple(to_tensor(a).shape)


def ndim(a) -> int:
    return to_tensor(a).dim()


def size(a, axis=None) -> int:
    t = to_tensor(a)
    return t.numel() if axis is None else t.shape[axis]


# ---- products -----------------------------------------------------------------------------------------
def dot(a, b, out=None) -> ndarray:
    ta, tb = to_tensor(a), to_tensor(b)
    common = _common(ta, tb)
    ta, tb = ta.to(common), tb.to(common)
    if ta.dim() == 0 or tb.dim() == 0:
        r = ta * tb
    elif tb.dim() <= 2:
        r = F.matmul(ta, tb)
    else:
        r = F.tensordot(ta, tb, ([ta.dim() - 1], [tb.dim() - 2]))
    return _finish(r, out)


def vdot(a, b) -> ndarray:
    ta, tb = to_tensor(a).reshape(-1), to_tensor(b).reshape(-1)
    common = _common(ta, tb)
    return ndarray(F.vdot(ta.to(common), tb.to(common)))


def inner(a, b) -> ndarray:
    ta, tb = to_tensor(a), to_tensor(b)
    common = _common(ta, tb)
    return ndarray(F.inner(ta.to(common), tb.to(common)))


def outer(a, b, out=None) -> ndarray:
    ta, tb = to_tensor(a).reshape(-1), to_tensor(b).reshape(-1)
    common = _common(ta, tb)
    return _finish(F.outer(ta.to(common), tb.to(common)), out)


def tensordot(a, b, axes=2) -> ndarray:
    ta, tb = to_tensor(a), to_tensor(b)
    common = _common(ta, tb)
    return ndarray(F.tensordot(ta.to(common), tb.to(common), axes))


def einsum(subscripts, *operands, out=None, dtype=None, order="K", casting="safe", optimize=False) -> ndarray:
    ts = [to_tensor(o) for o in operands]
    common = fl_dtype(dtype) if dtype is not None else _common(*ts)
    return _finish(F.einsum(subscripts, *[t.to(common) for t in ts]), out)


def kron(a, b) -> ndarray:
    ta, tb = to_tensor(a), to_tensor(b)
    common = _common(ta, tb)
    return ndarray(F.kron(ta.to(common), tb.to(common)))


# ---- ndarray methods: the functions above with the array first ------------------------------------------
_METHODS = {"sum": sum, "prod": prod, "mean": mean, "var": var, "std": std, "max": amax, "min": amin,
            "ptp": ptp, "argmax": argmax, "argmin": argmin, "all": all, "any": any, "cumsum": cumsum,
            "cumprod": cumprod, "transpose": None, "reshape": None, "ravel": ravel, "swapaxes": swapaxes,
            "squeeze": squeeze, "clip": clip, "repeat": repeat, "diagonal": diagonal, "trace": trace,
            "argsort": argsort, "take": take, "round": around, "dot": dot, "nonzero": None, "sort": None,
            "flatten": None, "conj": UFUNCS["conjugate"], "conjugate": UFUNCS["conjugate"]}


def _reshape_method(self, *shape, order="C", copy=None):
    if len(shape) == 1 and not isinstance(shape[0], builtins.int) and not hasattr(shape[0], "__index__"):
        shape = shape[0]
    return reshape(self, shape, order)


def _transpose_method(self, *axes):
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    return transpose(self, axes or None)


def _sort_method(self, axis=-1, kind=None, order=None, *, stable=None) -> None:
    self.tensor.copy_(sort(self, axis).tensor)


def _flatten_method(self, order="C"):
    return ndarray(self.tensor.reshape(-1).clone())


def _nonzero_method(self):
    raise NotImplementedError("ndarray.nonzero() (a data-dependent shape) is not supported by flambeau._numpy")


def _method(fn, name):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__ = name
    return method


_SPECIAL_METHODS = {"reshape": _reshape_method, "transpose": _transpose_method, "sort": _sort_method,
                    "flatten": _flatten_method, "nonzero": _nonzero_method}
for _name, _fn in _METHODS.items():
    setattr(ndarray, _name, _SPECIAL_METHODS.get(_name) or _method(_fn, _name))
__all__ = [n for n in dir() if not n.startswith("_") and n not in ("np", "F", "builtins")]
