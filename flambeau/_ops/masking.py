"""Mask and flat-index ops, and data-dependent lookups: masked_fill/masked_scatter/masked_select,
nonzero/argwhere/where(cond), take/take_along_dim/put, searchsorted/bucketize, bincount, histc,
isin, and Tensor.resize_.

Ops whose output shape depends on the data (masked_select, nonzero, bincount) have no meta
function, as in PyTorch.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D, _state
from .._tensor import Tensor
from ._registry import defop, export, TensorSpec, OPS, EXPORTS, Tag
from ._helpers import wrap_dim, broadcast_shapes, result_type
from .indexing import _ufunc_at, _fill_value, _tn
from .shape import with_out, cat
from .._backends import get, MetaArray
from .creation import zeros, tensor
from . import _batching


def _bool_mask(name, mask):
    if mask.dtype != np.bool_ and getattr(mask, "dtype", None) is not D.bool:
        raise RuntimeError(f"{name} only supports boolean masks, but got mask with dtype "
                           f"{D.FROM_NP[mask.dtype].name if hasattr(mask.dtype, 'kind') else mask.dtype}")


# ---- masked_fill / masked_scatter / masked_select -----------------------------------------------------
@defop("masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor", function=False, inplace=True,
       tags=(Tag.recomputable,))
def _masked_fill_s(xp, self, mask, value):
    _bool_mask("masked_fill_", mask)
    if self.dtype.kind in "iu" and isinstance(value, float) and not np.isfinite(value):   # bool: any value
        raise RuntimeError(f"value cannot be converted to type {_tn(self.dtype).lower()} without overflow")
    v = xp.asarray(_fill_value(self.dtype, value)).astype(self.dtype)
    return _c_order(xp, xp.where(mask, v, self))


@defop("masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor", function=False, inplace=True)
def _masked_fill_t(xp, self, mask, value):
    _bool_mask("masked_fill_", mask)
    if value.ndim:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    return _c_order(xp, xp.where(mask, value.astype(self.dtype), self))


def _c_order(xp, r):
    """PyTorch's masked_fill fills a contiguous clone of the (broadcast) self; `where` follows its
    operands' layout instead."""
    return r if r.flags.c_contiguous else xp.ascontiguousarray(r)


def _mf_meta(self, mask, value):
    _bool_mask("masked_fill_", mask)
    return TensorSpec(broadcast_shapes(tuple(self.shape), tuple(mask.shape)), self.dtype)


_masked_fill_s.def_meta(_mf_meta)
_masked_fill_t.def_meta(_mf_meta)
_masked_fill_s.def_derivative(lambda grad, mask: (grad.masked_fill(mask, 0), None))


@_masked_fill_t.def_derivative
def _(grad, mask):
    g = grad.masked_fill(mask, 0)
    return g, None, (grad - g).sum()


@export("masked_fill", method=True)
def masked_fill(self, mask, value):
    return (_masked_fill_t if isinstance(value, Tensor) else _masked_fill_s)(self, mask, value)


@export("masked_fill_", method=True, function=False)
def masked_fill_(self, mask, value):
    return OPS["masked_fill_.Tensor" if isinstance(value, Tensor) else "masked_fill_.Scalar"](self, mask, value)


@defop("masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor", method=True, inplace=True)
def masked_scatter(xp, self, mask, source):
    _bool_mask("masked_scatter_", mask)
    if source.dtype != self.dtype:
        raise RuntimeError(f"masked_scatter_: expected self and source to have same dtypes but got "
                           f"{_tn(self.dtype)} and {_tn(source.dtype)}")
    shape = broadcast_shapes(self.shape, mask.shape)
    out = xp.array(xp.broadcast_to(self, shape), copy=True)
    m = xp.broadcast_to(mask, shape)
    n = int(m.sum())
    if n > source.size:
        raise RuntimeError("masked_scatter: expected source to have at least as many elements as ones in mask")
    out[m] = source.reshape(-1)[:n]
    return out


masked_scatter.def_meta(lambda self, mask, source: TensorSpec(broadcast_shapes(tuple(self.shape), tuple(mask.shape)),
                                                              self.dtype))


@masked_scatter.def_derivative
def _(grad, mask, source_meta):
    sel = grad.masked_select(mask)
    n = source_meta.numel()
    pad = zeros((n - sel.numel(),), dtype=grad.dtype, device=grad.device)
    return grad.masked_fill(mask, 0), None, cat([sel, pad]).reshape(source_meta.shape)


@defop("masked_select(Tensor self, Tensor mask) -> Tensor", method=True, tags=(Tag.core, Tag.extern))
def masked_select(xp, self, mask):
    _bool_mask("masked_select", mask)
    shape = broadcast_shapes(self.shape, mask.shape)
    return xp.broadcast_to(self, shape)[xp.broadcast_to(mask, shape)]


@masked_select.def_derivative
def _(grad, self_meta, mask):
    shape = broadcast_shapes(tuple(self_meta.shape), tuple(mask.shape))
    return zeros(shape, dtype=grad.dtype, device=grad.device).masked_scatter(mask, grad), None


# ---- nonzero / argwhere / where(cond) -------------------------------------------------------------------
@defop("nonzero(Tensor self) -> Tensor", function=False, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _nonzero(xp, self):
    if self.ndim == 0:
        return xp.zeros((1 if self.item() else 0, 0), dtype=np.int64)
    return xp.argwhere(self).astype(np.int64, copy=False)


@export("nonzero", method=True)
def nonzero(self, *, out=None, as_tuple=False):
    r = _nonzero(self)
    if as_tuple:
        if self.ndim == 0:
            return (r.reshape(-1),)
        return tuple(r[:, k] .contiguous() for k in range(self.ndim))
    return with_out(r, out)


@export("argwhere", method=True)
def argwhere(self):
    return _nonzero(self)


_where3 = EXPORTS.get("where")


@export("where")
def where(condition, input=None, other=None, *, out=None):
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    if _where3 is None:
        return OPS["where.self"](condition, input, other, out=out) if out is not None else \
            OPS["where.self"](condition, input, other)
    return _where3(condition, input, other, out=out) if out is not None else _where3(condition, input, other)


# ---- take / put / take_along_dim -----------------------------------------------------------------------
def _flat_index(name, index, n):
    if index.dtype not in (np.int64,):
        raise RuntimeError(f"{name}(): Expected a long tensor for index, but got {_tn(index.dtype)}")
    if index.size and (int(index.max()) >= n or int(index.min()) < -n):
        bad = int(index.max()) if int(index.max()) >= n else int(index.min())
        raise IndexError(f"out of range: tried to access index {bad} on a tensor of {n} elements.")
    return index


@defop("take(Tensor self, Tensor index) -> Tensor", method=True)
def take(xp, self, index):
    n = self.size
    ix = _flat_index("take", index, n)
    if n == 0:
        return xp.empty(index.shape, dtype=self.dtype)
    return xp.take(self.reshape(-1), ix)


take.def_meta(lambda self, index: TensorSpec(index.shape, self.dtype))


@take.def_derivative
def _(grad, self_meta, index):
    return zeros(self_meta.shape, dtype=grad.dtype, device=grad.device).put(index, grad, True), None


@defop("put(Tensor self, Tensor index, Tensor source, bool accumulate=False) -> Tensor", method=True, inplace=True)
def put(xp, self, index, source, accumulate=False):
    if source.dtype != self.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{_tn(self.dtype)} and source.dtype = {_tn(source.dtype)}")
    if index.size != source.size:
        raise RuntimeError(f"put_(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.size}, index.numel() = {index.size}")
    out = xp.array(self, copy=True, order="C")
    n = out.size
    ix = _flat_index("put_", index, n).reshape(-1)
    ix = xp.where(ix < 0, ix + n, ix)
    flat = out.reshape(-1)
    if accumulate:
        _ufunc_at(xp, "add" if out.dtype != np.bool_ else "logical_or", flat, ix, source.reshape(-1))
    else:
        flat[ix] = source.reshape(-1)
    return out


put.def_meta(lambda self, index, source, accumulate=False: TensorSpec(self.shape, self.dtype))


@put.def_derivative
def _(grad, index, source_meta, accumulate):
    gs = grad if accumulate else grad.put(index, zeros(source_meta.shape, dtype=grad.dtype, device=grad.device))
    return gs, None, grad.take(index).reshape(source_meta.shape)


@export("take_along_dim", method=True)
def take_along_dim(self, indices, dim=None, *, out=None):
    if indices.dtype not in (D.int64,):
        raise RuntimeError(f"torch.take_along_dim(): dtype of indices should be int64 but got {indices.dtype}")
    if dim is None:
        return with_out(self.reshape(-1).gather(0, indices.reshape(-1)), out)
    if self.ndim != indices.ndim:
        raise RuntimeError("torch.take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {self.ndim} dimensions for input, and {indices.ndim} dimensions "
                           "for indices")
    d = wrap_dim(dim, self.ndim)
    s, i = list(self.shape), list(indices.shape)
    s[d] = i[d] = 1
    b = broadcast_shapes(tuple(s), tuple(i))
    ss, ii = list(b), list(b)
    ss[d], ii[d] = self.shape[d], indices.shape[d]
    return with_out(self.expand(ss).gather(d, indices.expand(ii)), out)


# ---- searchsorted / bucketize / bincount / histc / isin --------------------------------------------------
def _side(right, side):
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                               "while right was True")
        return side
    return "right" if right else "left"


def _search(xp, seq, vals, side, out_int32):
    dt = np.int32 if out_int32 else np.int64
    if seq.ndim <= 1:
        return xp.searchsorted(seq, vals, side=side).astype(dt)
    cmp = (seq[..., None, :] <= vals[..., :, None]) if side == "right" else (seq[..., None, :] < vals[..., :, None])
    return cmp.sum(-1).astype(dt)


def _ss_check(seq, vals_shape):
    if seq.ndim > 1 and (len(vals_shape) != seq.ndim or tuple(vals_shape[:-1]) != tuple(seq.shape[:-1])):
        raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                           f"dimensions of boundaries tensor and input value tensor must match, but we got "
                           f"boundaries tensor {list(seq.shape)} and input value tensor {list(vals_shape)}")


@defop("searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *, bool out_int32=False, bool right=False, "
       "str? side=None, Tensor? sorter=None) -> Tensor", function=False,
       tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _searchsorted(xp, sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    side = _side(right, side)
    _ss_check(sorted_sequence, self.shape)
    seq = sorted_sequence
    if sorter is not None:
        seq = xp.take_along_axis(seq, sorter, -1)
    dt = result_type(seq, self).np
    return _search(xp, seq.astype(dt, copy=False), self.astype(dt, copy=False), side, out_int32)


_searchsorted.def_meta(lambda sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None:
                       (_side(right, side), _ss_check(sorted_sequence, self.shape),
                        TensorSpec(self.shape, D.int32 if out_int32 else D.int64))[2])


@export("searchsorted")
def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None, out=None):
    if not isinstance(input, Tensor):
        input = tensor(input, dtype=sorted_sequence.dtype, device=sorted_sequence.device)
    r = _searchsorted(sorted_sequence, input, out_int32=out_int32, right=right, side=side, sorter=sorter)
    return with_out(r, out)


@export("bucketize")
def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    if not isinstance(input, Tensor):
        input = tensor(input, device=boundaries.device)
    return with_out(_searchsorted(boundaries, input, out_int32=out_int32, right=right), out)


@defop("bincount(Tensor self, Tensor? weights=None, int minlength=0) -> Tensor", method=True,
       tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def bincount(xp, self, weights=None, minlength=0):
    if self.dtype.kind not in "iub":
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{_tn(self.dtype)}'")
    if self.ndim != 1 or self.dtype.kind not in "iu" or (self.size and int(self.min()) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    n = max(int(self.max()) + 1 if self.size else 0, minlength)
    if weights is None:
        out = xp.zeros(n, dtype=np.int64)
        _ufunc_at(xp, "add", out, self, xp.ones(self.shape, dtype=np.int64))
        return out
    wdt = weights.dtype if weights.dtype in (np.float32, np.float64) else np.float64
    out = xp.zeros(n, dtype=np.float64)
    _ufunc_at(xp, "add", out, self, weights.astype(np.float64))
    return out.astype(wdt)


@defop("histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor", method=True,
       tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def histc(xp, self, bins=100, min=0, max=0):
    if self.dtype.kind not in "fV":
        raise RuntimeError(f"\"histogram_cpu\" not implemented for '{_tn(self.dtype)}'")
    if bins <= 0:
        raise RuntimeError("torch.histc(): bins must be > 0")
    x = self.reshape(-1).astype(np.float64)
    lo, hi = float(min), float(max)
    if lo == hi and x.size:
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi:
        raise RuntimeError("torch.histc(): max must be larger than min")
    keep = (x >= lo) & (x <= hi)
    idx = xp.floor((x[keep] - lo) * bins / (hi - lo)).astype(np.int64)
    idx = xp.minimum(idx, bins - 1)
    out = xp.zeros(bins, dtype=np.float64)
    _ufunc_at(xp, "add", out, idx, 1.0)
    return out.astype(self.dtype)


histc.def_meta(lambda self, bins=100, min=0, max=0: TensorSpec((bins,), self.dtype))


@defop("isin.Tensor_Tensor(Tensor elements, Tensor test_elements, *, bool assume_unique=False, bool invert=False) "
       "-> Tensor", function=False, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _isin(xp, elements, test_elements, *, assume_unique=False, invert=False):
    dt = result_type(elements, test_elements).np
    return xp.isin(elements.astype(dt, copy=False), test_elements.astype(dt, copy=False).reshape(-1),
                   invert=invert)


_isin.def_meta(lambda elements, test_elements, *, assume_unique=False, invert=False:
               TensorSpec(elements.shape, D.bool))


@export("isin")
def isin(elements, test_elements, *, assume_unique=False, invert=False, out=None):
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("isin() received an invalid combination of arguments")
    if not isinstance(elements, Tensor):
        elements = tensor(elements, device=test_elements.device)
    if not isinstance(test_elements, Tensor):
        test_elements = tensor(test_elements, device=elements.device)
    return with_out(_isin(elements, test_elements, assume_unique=assume_unique, invert=invert), out)


# ---- resize_ ---------------------------------------------------------------------------------------
@export("resize_", method=True, function=False)
def resize_(self, *sizes, memory_format=None):
    """Change the shape in place, keeping the leading elements of the storage (the rest uninitialised)."""
    shape = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(shape)}: {list(shape)}")
    if _state.tls.grad_enabled and self._requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    if tuple(self.shape) == shape:
        return self
    n = int(np.prod(shape))
    a = self._data
    if self._device.type == "meta":
        self._data = MetaArray(shape, a.dtype)
        return self
    xp = get(self._device.type).xp
    flat = a.reshape(-1) if a.flags["C_CONTIGUOUS"] else xp.ascontiguousarray(a).reshape(-1)
    if n <= flat.size:
        self._data = flat[:n].reshape(shape)
    else:
        new = xp.empty(n, dtype=a.dtype)
        new[:flat.size] = flat
        new[flat.size:] = 0
        self._data = new.reshape(shape)
    self._version[0] += 1
    return self


@export("resize_as_", method=True, function=False)
def resize_as_(self, other, memory_format=None):
    return resize_(self, tuple(other.shape))


# ---- vmap batching rules ----------------------------------------------------------------------------
_masked_fill_s.def_batching_rule(_batching.self_shaped_rule(_masked_fill_s))
_masked_fill_t_self_shaped = _batching.self_shaped_rule(_masked_fill_t)


@_masked_fill_t.def_batching_rule
def _masked_fill_t_batching(in_dims, self, mask, value):
    if in_dims[2] is not None:        # a batched fill value: one per example (the decomposition or loop)
        return NotImplemented
    return _masked_fill_t_self_shaped(in_dims, self, mask, value)
