"""Sorting and selection: sort/argsort/msort, topk, kthvalue, median/nanmedian, mode, unique and
unique_consecutive.

Every kernel is built on a stable argsort along one dimension, with NaN ordered as the largest
value (as PyTorch does); descending order keeps ties in their original order. Gradients scatter
into the selected positions (`reduction.select_backward`).
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._dispatch import resize_out
from ._registry import defop, export, TensorSpec, Tag
from ._helpers import accumulate, wrap_dim
from .reduction import select_backward, evenly_backward, reduced_shape, _check_empty
from . import _batching


def _sortable(x):
    return x.astype(np.float32) if D.FROM_NP[x.dtype] in D.LOW_PRECISION else x


def argsort_stable(xp, x, d, descending=False):
    """Stable argsort along axis d; NaN last ascending, first descending; ties in original order."""
    s = _sortable(x)
    if not descending:
        return xp.argsort(s, axis=d, kind="stable")
    idx = xp.argsort(xp.flip(s, axis=d), axis=d, kind="stable")
    return xp.ascontiguousarray(xp.flip(x.shape[d] - 1 - idx, axis=d))


def _no_complex(name, a):
    if a.dtype.kind == "c":
        raise RuntimeError(f"{name}(): does not support complex input")


# ---- sort / argsort / msort ----------------------------------------------------------------
@defop("sort(Tensor self, int dim=-1, bool descending=False, *, bool? stable=False) "
       "-> (Tensor values, Tensor indices)", method=True, tags=(Tag.core, Tag.extern))
def sort(xp, self, dim=-1, descending=False, *, stable=False):
    d = wrap_dim(dim, self.ndim)
    _no_complex("sort", self)
    if self.ndim == 0:
        return self.copy(), xp.zeros((), np.int64)
    idx = argsort_stable(xp, self, d, descending).astype(np.int64)
    return xp.take_along_axis(self, idx, axis=d), idx


@sort.def_meta
def _(self, dim=-1, descending=False, *, stable=False):
    wrap_dim(dim, self.ndim)
    return TensorSpec(self.shape, self.dtype), TensorSpec(self.shape, D.int64)


@sort.def_derivative
def _(grad, self_meta, dim, result):
    return select_backward(grad[0], self_meta.shape, dim, result[1], True)


@export("argsort", method=True)
def argsort(input, dim=-1, descending=False, *, stable=False):
    return sort(input, dim, descending, stable=stable).indices


@export("msort", method=True)
def msort(input, *, out=None):
    r = sort(input, 0).values
    if out is not None:
        resize_out(out, r)
        return out
    return r


# ---- topk / kthvalue -----------------------------------------------------------------------
def _topk_check(self_shape, k, d, ndim):
    n = self_shape[d] if ndim else 1
    if k < 0 or k > n:
        raise RuntimeError("selected index k out of range")


@defop("topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) "
       "-> (Tensor values, Tensor indices)", method=True, tags=(Tag.core, Tag.extern))
def topk(xp, self, k, dim=-1, largest=True, sorted=True):
    d = wrap_dim(dim, self.ndim)
    _topk_check(self.shape, k, d, self.ndim)
    _no_complex("topk", self)
    if self.ndim == 0:
        return self.copy(), xp.zeros((), np.int64)
    idx = argsort_stable(xp, self, d, largest).astype(np.int64)
    idx = xp.ascontiguousarray(xp.take(idx, xp.arange(k), axis=d))
    return xp.take_along_axis(self, idx, axis=d), idx


@topk.def_meta
def _(self, k, dim=-1, largest=True, sorted=True):
    d = wrap_dim(dim, self.ndim)
    _topk_check(self.shape, k, d, self.ndim)
    shape = tuple(k if i == d else s for i, s in enumerate(self.shape))
    return TensorSpec(shape, self.dtype), TensorSpec(shape, D.int64)


@topk.def_derivative
def _(grad, self_meta, dim, result):
    return select_backward(grad[0], self_meta.shape, dim, result[1], True)


def _kth_check(shape, k, d):
    n = shape[d] if shape else 1
    if k < 1 or k > n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")


def _pick(xp, self, d, pos, keepdim):
    """Values and indices at sorted positions `pos` (keepdims-shaped) along d."""
    idx = xp.take_along_axis(argsort_stable(xp, self, d).astype(np.int64), pos, axis=d)
    vals = xp.take_along_axis(self, idx, axis=d)
    if not keepdim:
        vals, idx = xp.squeeze(vals, axis=d), xp.squeeze(idx, axis=d)
    return vals.copy(), idx.copy()


@defop("kthvalue(Tensor self, SymInt k, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)",
       method=True, tags=(Tag.core, Tag.extern))
def kthvalue(xp, self, k, dim=-1, keepdim=False):
    d = wrap_dim(dim, self.ndim)
    _kth_check(self.shape, k, d)
    if self.ndim == 0:
        return self.copy(), xp.zeros((), np.int64)
    pos = xp.full(reduced_shape(self.shape, (d,), True), k - 1, dtype=np.int64)
    return _pick(xp, self, d, pos, keepdim)


def _select_meta(name, self, dim, keepdim):
    d = wrap_dim(dim, self.ndim)
    dims = (d,) if self.ndim else ()
    _check_empty(name, self.shape, dims)
    shape = reduced_shape(self.shape, dims, keepdim)
    return TensorSpec(shape, self.dtype), TensorSpec(shape, D.int64)


@kthvalue.def_meta
def _(self, k, dim=-1, keepdim=False):
    _kth_check(self.shape, k, wrap_dim(dim, self.ndim))
    return _select_meta("kthvalue", self, dim, keepdim)




@kthvalue.def_derivative
def _(grad, self_meta, dim, keepdim, result):
    return select_backward(grad[0], self_meta.shape, dim, result[1], keepdim)


# ---- median / nanmedian / mode -------------------------------------------------------------
def _median_pos(xp, x, d, ignore_nan):
    n = x.shape[d]
    nnan = xp.sum(xp.isnan(x), axis=d, keepdims=True) if x.dtype.kind == "f" or \
        D.FROM_NP[x.dtype] in D.LOW_PRECISION else xp.zeros(reduced_shape(x.shape, (d,), True), np.int64)
    if ignore_nan:
        return xp.maximum((n - nnan - 1) // 2, 0).astype(np.int64)
    return xp.where(nnan > 0, n - nnan, (n - 1) // 2).astype(np.int64)


def _median_ops(name, ignore_nan):
    @defop(f"{name}(Tensor self) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
    def full(xp, self):
        _no_complex(name, self)
        if self.size == 0:
            return xp.full((), np.nan, dtype=self.dtype)
        flat = self.reshape(-1)
        v, _ = _pick(xp, flat, 0, _median_pos(xp, flat, 0, ignore_nan), False)
        return v

    @full.def_meta
    def _(self):
        return TensorSpec((), self.dtype)

    @full.def_derivative
    def _(grad, self, result):
        return evenly_backward(grad, self, result, None, False)

    @defop(f"{name}.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
           function=False, tags=(Tag.core, Tag.extern))
    def bydim(xp, self, dim, keepdim=False):
        d = wrap_dim(dim, self.ndim)
        _no_complex(name, self)
        if self.ndim == 0:
            return self.copy(), xp.zeros((), np.int64)
        _check_empty(name, self.shape, (d,))
        return _pick(xp, self, d, _median_pos(xp, self, d, ignore_nan), keepdim)

    @bydim.def_meta
    def _(self, dim, keepdim=False):
        return _select_meta(name, self, dim, keepdim)

    @bydim.def_derivative
    def _(grad, self_meta, dim, keepdim, result):
        return select_backward(grad[0], self_meta.shape, dim, result[1], keepdim)

    def fn(input, dim=None, keepdim=False, *, out=None):
        if dim is None:
            return full(input) if out is None else full(input, out=out)
        return bydim(input, dim, keepdim) if out is None else bydim(input, dim, keepdim, out=out)
    fn.__name__ = name
    export(name, method=True)(fn)
    return full, bydim, fn


_median, _median_dim, median = _median_ops("median", False)
_nanmedian, _nanmedian_dim, nanmedian = _median_ops("nanmedian", True)


@defop("mode(Tensor self, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)", method=True,
       tags=(Tag.core, Tag.extern))
def mode(xp, self, dim=-1, keepdim=False):
    d = wrap_dim(dim, self.ndim)
    _no_complex("mode", self)
    if self.ndim == 0:
        return self.copy(), xp.zeros((), np.int64)
    _check_empty("mode", self.shape, (d,))
    n = self.shape[d]
    rows = xp.moveaxis(self, d, -1).reshape(-1, n)
    perm = argsort_stable(xp, rows, 1)
    s = xp.take_along_axis(rows, perm, axis=1)
    start = xp.ones(s.shape, dtype=bool)
    start[:, 1:] = s[:, 1:] != s[:, :-1]
    pos = xp.arange(n, dtype=np.int64)
    run = pos - accumulate(xp, "maximum", xp.where(start, pos, 0), 1) + 1
    best = xp.argmax(run, axis=1)[:, None]          # end of the first longest run: smallest value
    out_shape = reduced_shape(self.shape, (d,), keepdim)
    vals = xp.take_along_axis(s, best, axis=1).reshape(out_shape)
    idx = xp.take_along_axis(perm, best, axis=1).astype(np.int64).reshape(out_shape)
    return vals, idx                                  # last occurrence, as PyTorch


@mode.def_meta
def _(self, dim=-1, keepdim=False):
    return _select_meta("mode", self, dim, keepdim)


@mode.def_derivative
def _(grad, self_meta, dim, keepdim, result):
    return select_backward(grad[0], self_meta.shape, dim, result[1], keepdim)


# ---- unique / unique_consecutive -----------------------------------------------------------
def _runs(xp, s, rows):
    """Start-of-run flags of sorted data `s` (1-D, or rows along axis 0 when `rows`)."""
    flag = xp.ones(s.shape[0], dtype=bool)
    if s.shape[0] > 1:
        ne = s[1:] != s[:-1]
        flag[1:] = ne.reshape(ne.shape[0], -1).any(axis=1) if rows else ne
    return flag


def _finish_unique(xp, s, flag, perm, n):
    vals = s[flag]
    inv_sorted = xp.cumsum(flag) - 1
    inverse = xp.empty(n, dtype=np.int64)
    if perm is None:
        inverse = inv_sorted.astype(np.int64)
    else:
        inverse[perm] = inv_sorted
    starts = xp.nonzero(flag)[0]
    counts = xp.diff(xp.concatenate([starts, xp.asarray([n])])).astype(np.int64)
    return vals, inverse, counts


def _unique_flat(xp, self, sort):
    flat = self.reshape(-1)
    perm = argsort_stable(xp, flat, 0) if sort else None
    s = flat[perm] if sort else flat
    vals, inv, counts = _finish_unique(xp, s, _runs(xp, s, False), perm, flat.shape[0])
    return vals, inv.reshape(self.shape), counts


def _unique_dim(xp, self, dim, sort):
    d = wrap_dim(dim, self.ndim)
    m = self.shape[d]
    moved = xp.moveaxis(self, d, 0)
    rows = _sortable(moved.reshape(m, -1))
    perm = xp.lexsort(rows.T[::-1]) if sort and rows.shape[1] else (xp.arange(m) if sort else None)
    s = moved[perm] if sort else moved
    vals, inv, counts = _finish_unique(xp, s, _runs(xp, s, True), perm, m)
    return xp.ascontiguousarray(xp.moveaxis(vals, 0, d)), inv, counts


@defop("_unique2(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False) "
       "-> (Tensor, Tensor, Tensor)", function=False, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _unique2(xp, self, sorted=True, return_inverse=False, return_counts=False):
    return _unique_flat(xp, self, True)


@defop("unique_dim(Tensor self, int dim, bool sorted=True, bool return_inverse=False, bool return_counts=False) "
       "-> (Tensor, Tensor, Tensor)", function=False, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _unique_dim_op(xp, self, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique_dim(xp, self, dim, True)


@defop("unique_consecutive(Tensor self, bool return_inverse=False, bool return_counts=False, int? dim=None) "
       "-> (Tensor, Tensor, Tensor)", function=False, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _unique_consecutive(xp, self, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        return _unique_flat(xp, self, False)
    return _unique_dim(xp, self, dim, False)


def _select_outputs(res, return_inverse, return_counts):
    out = (res[0],) + ((res[1],) if return_inverse else ()) + ((res[2],) if return_counts else ())
    return out if len(out) > 1 else out[0]


@export("unique", method=True)
def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    res = _unique2(input, sorted, return_inverse, return_counts) if dim is None else \
        _unique_dim_op(input, dim, sorted, return_inverse, return_counts)
    return _select_outputs(res, return_inverse, return_counts)


@export("unique_consecutive", method=True)
def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    return _select_outputs(_unique_consecutive(input, return_inverse, return_counts, dim),
                           return_inverse, return_counts)


# ---- vmap batching rules ----------------------------------------------------------------------------
for _op in (sort, topk):
    _op.def_batching_rule(_batching.dim_rule(_op, "dim"))


for _op in (kthvalue, _median_dim, mode, _nanmedian_dim):
    _op.def_batching_rule(_batching.dim_rule(_op, "dim"))
