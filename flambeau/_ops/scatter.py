"""gather and the scatter family: scatter (src/value, optional reduce), scatter_add, scatter_reduce
(sum/prod/mean/amax/amin, include_self).

An `index` tensor addresses `self` along `dim`; every other dim is addressed by position, so the
kernels build one coordinate array per dim (an open grid) and use NumPy/CuPy fancy indexing, with
`ufunc.at` where repeated indices must accumulate.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._backends import device_checks, is_cupy
from ._registry import defop, export, TensorSpec, OPS, Tag
from ._helpers import wrap_dim
from .indexing import _ufunc_at, _fill_value
from .creation import zeros, zeros_like
from .shape import cat
from . import _batching


def _check(name, self_shape, dim, index, src_shape=None, index_dtype=None):
    nd = max(len(self_shape), 1)
    d = wrap_dim(dim, len(self_shape))
    if any(n == 0 for n in index.shape):
        return d                  # PyTorch checks an empty index neither for dtype nor for shape
    if index_dtype not in (np.int64, D.int64):
        raise RuntimeError(f"{name}(): Expected dtype int64 for index")
    ishape = tuple(index.shape) or (1,)
    sshape = tuple(self_shape) or (1,)
    if len(index.shape) and len(ishape) != nd:
        raise RuntimeError("Index tensor must have the same number of dimensions as "
                           f"{'input' if name == 'gather' else 'self'} tensor")
    for k, n in enumerate(ishape):
        if k != d and n > sshape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(index.shape)} to be "
                               f"smaller than self {list(self_shape)} apart from dimension {d}")
        if src_shape is not None and len(index.shape) and n > (tuple(src_shape) or (1,))[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index {list(index.shape)} to be "
                               f"smaller than src {list(src_shape)} apart from dimension {d}")
    return d


def _key(xp, a, index, d):
    """Coordinates of each index element: (grid..., index at d, grid...)."""
    n = index.ndim
    size = a.shape[d]
    if is_cupy(xp):         # on a GPU: tested on the device, raised at the next synchronisation
        device_checks.check_range(xp, index, 0, size, RuntimeError,
                                  f"index {{}} is out of bounds for dimension {d} with size {size}")
    elif index.size and (int(index.max()) >= size or int(index.min()) < 0):
        bad = int(index.max()) if int(index.max()) >= size else int(index.min())
        raise RuntimeError(f"index {bad} is out of bounds for dimension {d} with size {size}")
    return tuple(index if k == d else xp.arange(index.shape[k]).reshape([-1 if j == k else 1 for j in range(n)])
                 for k in range(n))


def _nd(a):
    return a.reshape(1) if a.ndim == 0 else a


def _crop(src, index):
    return src[tuple(slice(0, n) for n in index.shape)]


@defop("gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", method=True, tags=(Tag.core,))
def gather(xp, self, dim, index, *, sparse_grad=False):
    d = _check("gather", self.shape, dim, index, index_dtype=index.dtype)
    if index.size == 0:
        return xp.empty(index.shape, dtype=self.dtype)
    return _nd(self)[_key(xp, _nd(self), _nd(index), d)].reshape(index.shape)


@gather.def_meta
def _(self, dim, index, *, sparse_grad=False):
    _check("gather", self.shape, dim, index, index_dtype=index.dtype)
    return TensorSpec(index.shape, self.dtype)


@gather.def_derivative
def _(grad, self_meta, dim, index):
    return zeros(self_meta.shape, dtype=grad.dtype, device=grad.device).scatter_add(dim, index, grad), None


def _scatter(xp, name, self, dim, index, src, reduce=None):
    d = _check(name, self.shape, dim, index, None if not hasattr(src, "shape") else src.shape, index.dtype)
    out = xp.array(self, copy=True)
    if index.size == 0:
        return out
    o, ix = _nd(out), _nd(index)
    key = _key(xp, o, ix, d)
    v = _crop(_nd(src), ix) if hasattr(src, "shape") else _fill_value(self.dtype, src)
    if hasattr(v, "dtype") and v.dtype != out.dtype:
        v = v.astype(out.dtype)
    if reduce is None:
        o[key] = v
    elif reduce in ("add", "sum"):
        _ufunc_at(xp, "add" if out.dtype != np.bool_ else "logical_or", o, key, v)
    elif reduce in ("multiply", "prod"):
        _ufunc_at(xp, "multiply" if out.dtype != np.bool_ else "logical_and", o, key, v)
    else:
        raise RuntimeError(f"reduce argument must be either add or multiply. Got {reduce}")
    return out


def _same_dtype(name, self, src):
    if src.dtype != self.dtype:
        raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype")


@defop("scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", function=False, inplace=True,
       tags=(Tag.core,))
def _scatter_src(xp, self, dim, index, src):
    _same_dtype("scatter", self, src)
    return _scatter(xp, "scatter", self, dim, index, src)


@defop("scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor", function=False, inplace=True)
def _scatter_value(xp, self, dim, index, value):
    return _scatter(xp, "scatter", self, dim, index, value)


@defop("scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor", function=False,
       inplace=True)
def _scatter_reduce_src(xp, self, dim, index, src, *, reduce):
    _same_dtype("scatter", self, src)
    return _scatter(xp, "scatter", self, dim, index, src, reduce)


@defop("scatter.value_reduce(Tensor self, int dim, Tensor index, Scalar value, *, str reduce) -> Tensor",
       function=False, inplace=True)
def _scatter_reduce_value(xp, self, dim, index, value, *, reduce):
    return _scatter(xp, "scatter", self, dim, index, value, reduce)


def _meta(self, dim, index, *rest, **kw):
    _check("scatter", self.shape, dim, index, index_dtype=index.dtype)
    return TensorSpec(self.shape, self.dtype)


for _op in (_scatter_src, _scatter_value, _scatter_reduce_src, _scatter_reduce_value):
    _op.def_meta(_meta)


def pad_to(g, shape):
    """Zero-pad `g` at the end of each dim up to `shape` (the grad of a cropped `src`)."""
    for k, (a, b) in enumerate(zip(g.shape, shape)):
        if a < b:
            z = zeros(tuple(g.shape[:k]) + (b - a,) + tuple(g.shape[k + 1:]), dtype=g.dtype, device=g.device)
            g = cat([g, z], k)
    return g


@_scatter_src.def_derivative
def _(grad, dim, index, src_meta):
    return grad.scatter(dim, index, 0), None, pad_to(grad.gather(dim, index), src_meta.shape)


_scatter_value.def_derivative(lambda grad, dim, index: (grad.scatter(dim, index, 0), None))


def _pick(name, variants):
    def f(self, dim, index, src=None, value=None, *, reduce=None):
        v = src if src is not None else value
        is_t = hasattr(v, "_data")
        key = ("src" if is_t else "value") if reduce is None else ("reduce" if is_t else "value_reduce")
        op = OPS[f"{name}.{key}"]
        return op(self, dim, index, v) if reduce is None else op(self, dim, index, v, reduce=reduce)
    f.__name__ = name
    return f


export("scatter", method=True)(_pick("scatter", None))
export("scatter_", method=True, function=False)(_pick("scatter_", None))


@defop("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.autocast_promote))
def scatter_add(xp, self, dim, index, src):
    _same_dtype("scatter_add", self, src)
    return _scatter(xp, "scatter_add", self, dim, index, src, "add")


scatter_add.def_meta(_meta)
scatter_add.def_derivative(lambda grad, dim, index, src_meta: (grad, None, pad_to(grad.gather(dim, index), src_meta.shape)))

_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


@defop("scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) "
       "-> Tensor", method=True, inplace=True, tags=(Tag.core,))
def scatter_reduce(xp, self, dim, index, src, reduce, *, include_self=True):
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    _same_dtype("scatter_reduce", self, src)
    d = _check("scatter_reduce", self.shape, dim, index, src.shape, index.dtype)
    out = xp.array(self, copy=True)
    if index.size == 0:
        return out
    o, ix = _nd(out), _nd(index)
    key = _key(xp, o, ix, d)
    v = _crop(_nd(src), ix)
    if not include_self:
        if reduce in _IDENTITY:
            o[key] = _IDENTITY[reduce]
        else:
            o[key] = _extreme(xp, o.dtype, reduce == "amax")
    ufn = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum"}[reduce]
    if o.dtype == np.bool_:
        ufn = {"add": "logical_or", "multiply": "logical_and", "maximum": "logical_or",
               "minimum": "logical_and"}[ufn]
    _ufunc_at(xp, ufn, o, key, v)
    if reduce == "mean":
        cnt = xp.full(o.shape, 1 if include_self else 0, dtype=np.int64)
        _ufunc_at(xp, "add", cnt, key, xp.ones(ix.shape, dtype=np.int64))
        cnt = xp.maximum(cnt, 1)
        o[...] = (o // cnt) if o.dtype.kind in "iu" else (o / cnt).astype(o.dtype)
    return out


def _extreme(xp, npdt, lowest):
    if npdt.kind == "f" or npdt.kind == "V" or str(npdt) == "bfloat16":
        return -np.inf if lowest else np.inf
    if npdt == np.bool_:
        return not lowest
    info = np.iinfo(npdt)
    return info.min if lowest else info.max


scatter_reduce.def_meta(_meta)


@scatter_reduce.def_derivative
def _(grad, self, dim, index, src, reduce, include_self, result):
    if reduce == "sum":
        gs = grad if include_self else grad.scatter(dim, index, 0)
        return gs, None, grad.gather(dim, index)
    ones = zeros_like(src) + 1
    if reduce == "mean":
        cnt = (zeros_like(grad) + (1 if include_self else 0)).scatter_add(dim, index, ones)
        cnt = cnt.masked_fill(cnt == 0, 1)
        g = grad / cnt
        gs = g if include_self else g.scatter(dim, index, 0)
        return gs, None, g.gather(dim, index)
    if reduce in ("amax", "amin"):
        hit_self = (self == result).to(grad.dtype)
        if not include_self:
            hit_self = hit_self.scatter(dim, index, 0)
        hit_src = (src == result.gather(dim, index)).to(grad.dtype)
        cnt = hit_self.scatter_add(dim, index, hit_src)
        g = grad / cnt.masked_fill(cnt == 0, 1)
        return g * hit_self, None, g.gather(dim, index) * hit_src
    gs = grad * result / self if include_self else grad.scatter(dim, index, 0)
    return gs, None, (grad * result).gather(dim, index) / src


# ---- vmap batching rule -----------------------------------------------------------------------------
@gather.def_batching_rule
def _gather_batching(in_dims, self, dim, index, sparse_grad=False):
    size = _batching.batch_size((self, dim, index), in_dims)
    x = _batching.materialize(self, in_dims[0], size)
    i = _batching.materialize(index, in_dims[2], size)
    n = x.dim() - 1
    if n == 0:
        return NotImplemented
    return gather(x, _batching.wrap_dim(dim, n) + 1, i, sparse_grad=sparse_grad), 0


for _op in (_scatter_src, _scatter_value, _scatter_reduce_src, _scatter_reduce_value, scatter_add, scatter_reduce):
    _op.def_batching_rule(_batching.written_rule(_op, "dim"))
