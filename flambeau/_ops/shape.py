"""Copying shape operators: cat/stack and friends, flip/roll/rot90, tril/triu, repeat/tile/
repeat_interleave, meshgrid, diag/diag_embed/block_diag, broadcasting helpers, atleast_nd,
trace, tril/triu_indices, and the functional scatters of views (select/slice/diagonal/as_strided
_scatter) that functionalization uses to replace writes through views.

Results are fresh arrays. Composites (stack, hstack, tile, ...) are plain functions over ops, so
autograd comes from the ops they call.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._tensor import Tensor
from ._registry import defop, export, TensorSpec, Tag, call
from ._helpers import wrap_dim, wrap_dims, result_type, broadcast_shapes
from .views import as_strided, diagonal as _diagonal, expand, reshape, select, slice_
from .._dispatch import resize_out
from .creation import zeros, tensor, zeros_like
from . import _batching, _sharding


def with_out(res, out):
    """`out=` for composites: resize/cast `res` into `out` with the dispatcher's rules."""
    if out is None:
        return res
    resize_out(out, res)
    return out


# ---- cat / stack -------------------------------------------------------------------------------
def _skipped(shape):
    return len(shape) == 1 and shape[0] == 0


def _cat_check(shapes, dim):
    if not shapes:
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    live = [(i, s) for i, s in enumerate(shapes) if not _skipped(s)]
    if not live:
        return None, shapes[0]
    i0, ref = live[0]
    if len(ref) == 0:
        raise RuntimeError(f"zero-dimensional tensor (at position {i0}) cannot be concatenated")
    d = wrap_dim(dim, len(ref))
    total = 0
    for i, s in live:
        if len(s) != len(ref):
            raise RuntimeError(f"Tensors must have same number of dimensions: got {len(ref)} and {len(s)}")
        for k in range(len(ref)):
            if k != d and s[k] != ref[k]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size "
                                   f"{ref[k]} but got size {s[k]} for tensor number {i} in the list.")
        total += s[d]
    return d, tuple(ref[:d]) + (total,) + tuple(ref[d + 1:])


def _alike(arrays) -> bool:
    """Whether every array has the first one's dtype and shape, which has at least one dimension
    and no zero size (nothing for `_cat_check` to reject or skip, no promotion)."""
    first = arrays[0]
    dt, shape = first.dtype, first.shape
    if not shape or not first.size:
        return False
    for a in arrays:
        if a.dtype != dt or a.shape != shape:
            return False
    return True


@defop("cat(Tensor[] tensors, int dim=0) -> Tensor", tags=(Tag.core, Tag.cpu_autocast_promote))
def cat(xp, tensors, dim=0):
    tensors = list(tensors)
    if tensors and _alike(tensors):       # the common case (stack, get_batch): one dtype, one shape
        return xp.concatenate(tensors, axis=wrap_dim(dim, tensors[0].ndim))
    d, shape = _cat_check([t.shape for t in tensors], dim)
    dt = result_type(*tensors).np
    if d is None:
        return xp.empty(shape, dtype=dt)
    return xp.concatenate([t.astype(dt, copy=False) for t in tensors if not _skipped(t.shape)], axis=d)


@cat.def_meta
def _(tensors, dim=0):
    tensors = list(tensors)
    d, shape = _cat_check([tuple(t.shape) for t in tensors], dim)
    return TensorSpec(shape, result_type(*tensors))


@cat.def_derivative
def _(grad, tensors_meta, dim):
    d, _ = _cat_check([tuple(m.shape) for m in tensors_meta], dim)
    out, start = [], 0
    for m in tensors_meta:
        if d is None or _skipped(m.shape):
            out.append(zeros(m.shape, dtype=grad.dtype, device=grad.device))
            continue
        n = m.shape[d]
        out.append(grad.narrow(d, start, n))
        start += n
    return out


export("concat")(lambda tensors, dim=0, *, out=None: cat(tensors, dim, out=out))
export("concatenate")(lambda tensors, axis=0, *, out=None: cat(tensors, axis, out=out))


@export("stack")
def stack(tensors, dim=0, *, out=None):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    first = tensors[0].shape
    for i in range(1, len(tensors)):
        t = tensors[i]
        if (t._data.shape if type(t) is Tensor else t.shape) != first:       # no Size object per plain tensor
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(first)} at "
                               f"entry 0 and {list(t.shape)} at entry {i}")
    d = wrap_dim(dim, tensors[0].ndim + 1)
    shape = tensors[0].shape
    if d < len(shape) and shape[d]:
        # one cat along d, its blocks then split into a new dimension: the layout stack's result
        # has, with one op call in place of one unsqueeze per tensor
        res = call(cat, (tensors, d)).view(*shape[:d], len(tensors), *shape[d:])
        if type(res) is Tensor:
            res._base = None         # nothing else sees the cat result: not a view, as PyTorch's stack
        return with_out(res, out)
    return cat([t.unsqueeze(d) for t in tensors], d, out=out)


@export("hstack")
def hstack(tensors, *, out=None):
    ts = atleast_1d(*tensors) if len(tensors) != 1 else (atleast_1d(tensors[0]),)
    return cat(list(ts), 0 if ts[0].ndim == 1 else 1, out=out)


@export("vstack")
def vstack(tensors, *, out=None):
    ts = [atleast_2d(t) for t in tensors]
    return cat(ts, 0, out=out)


export("row_stack")(vstack)


@export("dstack")
def dstack(tensors, *, out=None):
    ts = [atleast_3d(t) for t in tensors]
    return cat(ts, 2, out=out)


@export("column_stack")
def column_stack(tensors, *, out=None):
    ts = [t.reshape(t.numel(), 1) if t.ndim <= 1 else t for t in tensors]
    return cat(ts, 1, out=out)


# ---- flip / roll / rot90 ----------------------------------------------------------------------
@defop("flip(Tensor self, int[] dims) -> Tensor", method=True)
def flip(xp, self, dims):
    ax = wrap_dims(dims, self.ndim)
    return xp.ascontiguousarray(xp.flip(self, ax)) if ax else self.copy()


flip.def_meta(lambda self, dims: (wrap_dims(dims, self.ndim), TensorSpec(self.shape, self.dtype))[1])
flip.def_derivative(lambda grad, dims: grad.flip(dims))


@export("fliplr", method=True)
def fliplr(self):
    if self.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(self, [1])


@export("flipud", method=True)
def flipud(self):
    if self.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(self, [0])


def _roll_args(self_ndim, shifts, dims):
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
        return shifts, dims
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    return shifts, tuple(wrap_dim(d, self_ndim) for d in dims)


@defop("roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor", method=True)
def roll(xp, self, shifts, dims=()):
    shifts, dims = _roll_args(self.ndim, shifts, dims)
    if not dims:
        return xp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return xp.ascontiguousarray(xp.roll(self, shifts, axis=dims))


roll.def_meta(lambda self, shifts, dims=(): (_roll_args(self.ndim, shifts, dims), TensorSpec(self.shape, self.dtype))[1])
roll.def_derivative(lambda grad, shifts, dims: grad.roll([-s for s in ((shifts,) if isinstance(shifts, int) else shifts)], dims))


@export("rot90", method=True)
def rot90(self, k=1, dims=(0, 1)):
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if self.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {self.ndim}")
    d0, d1 = wrap_dim(dims[0], self.ndim), wrap_dim(dims[1], self.ndim)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k %= 4
    if k == 1:
        return flip(self, [d1]).transpose(d0, d1)
    if k == 2:
        return flip(self, [d0, d1])
    if k == 3:
        return flip(self, [d0]).transpose(d0, d1)
    return self.clone()


# ---- tril / triu --------------------------------------------------------------------------------
def _tri(name, fn):
    @defop(f"{name}(Tensor self, int diagonal=0) -> Tensor", method=True, inplace=True)
    def op(xp, self, diagonal=0):
        if self.ndim < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return xp.ascontiguousarray(getattr(xp, fn)(self, diagonal))

    @op.def_meta
    def _(self, diagonal=0):
        if self.ndim < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return TensorSpec(self.shape, self.dtype)

    op.def_derivative(lambda grad, diagonal: getattr(grad, name)(diagonal))
    return op


tril = _tri("tril", "tril")
triu = _tri("triu", "triu")


# ---- repeat / tile / repeat_interleave --------------------------------------------------------------
def _repeat_check(ndim, repeats):
    if len(repeats) < ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions "
                           "of tensor")
    if any(r < 0 for r in repeats):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(repeats)}: {list(repeats)}")


@defop("repeat(Tensor self, SymInt[] repeats) -> Tensor", function=False)
def _repeat(xp, self, repeats):
    _repeat_check(self.ndim, repeats)
    src = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return xp.tile(src, tuple(repeats)) if src.size else xp.empty(
        tuple(s * r for s, r in zip(src.shape, repeats)), dtype=self.dtype)


@_repeat.def_meta
def _(self, repeats):
    _repeat_check(self.ndim, repeats)
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    return TensorSpec(tuple(s * r for s, r in zip(shape, repeats)), self.dtype)


@_repeat.def_derivative
def _(grad, self_meta, repeats):
    shape = (1,) * (len(repeats) - self_meta.ndim) + tuple(self_meta.shape)
    inter = []
    for r, s in zip(repeats, shape):
        inter += [r, s]
    g = grad.reshape(inter)
    return g.sum(tuple(range(0, len(inter), 2))).reshape(self_meta.shape)


@export("repeat", method=True, function=False)
def repeat(self, *repeats):
    if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)):
        repeats = tuple(repeats[0])
    return _repeat(self, tuple(repeats))


@export("tile", method=True)
def tile(self, dims):
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    dims = (1,) * (self.ndim - len(dims)) + dims
    return _repeat(self, dims)


@defop("repeat_interleave.Tensor(Tensor repeats, *, SymInt? output_size=None) -> Tensor",
       tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def _repeat_interleave_idx(xp, repeats, *, output_size=None):
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype.kind not in "iu":
        raise RuntimeError("repeats has to be Long or Int tensor")
    if repeats.size and int(repeats.min()) < 0:
        raise RuntimeError("repeats can not be negative")
    return xp.repeat(xp.arange(repeats.shape[0], dtype=repeats.dtype), repeats)


@export("repeat_interleave", method=True, function=False)
def repeat_interleave_method(self, repeats, dim=None, *, output_size=None):
    return repeat_interleave(self, repeats, dim, output_size=output_size)


@export("repeat_interleave")
def repeat_interleave(self, repeats=None, dim=None, *, output_size=None):
    if repeats is None:
        return _repeat_interleave_idx(self, output_size=output_size)
    if dim is None:
        self, dim = self.reshape(-1), 0
    d = wrap_dim(dim, self.ndim)
    n = self.shape[d] if self.ndim else 1
    if isinstance(repeats, Tensor):
        if repeats.ndim == 0 or repeats.numel() == 1:
            repeats = int(repeats.reshape(-1)[0].item())
        elif repeats.shape[0] != n:
            raise RuntimeError("repeats must have the same size as input along dim, but got repeats.size(0) = "
                               f"{repeats.shape[0]} and input.size({d}) = {n}")
        else:
            return self.index_select(d, _repeat_interleave_idx(repeats.to(self.device).long()))
    if repeats < 0:
        raise RuntimeError("repeats can not be negative")
    idx = tensor(np.repeat(np.arange(n, dtype=np.int64), repeats), device=self.device)
    return self.index_select(d, idx)


# ---- grids, diagonals, blocks --------------------------------------------------------------------
@export("meshgrid")
def meshgrid(*tensors, indexing=None):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = indexing or "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but received: {indexing}")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t}")
    ts = list(tensors)
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.numel() for t in ts)
    out = []
    for i, t in enumerate(ts):
        v = t.reshape(tuple(-1 if j == i else 1 for j in range(len(ts))))
        out.append(v.expand(shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def _embed_shape(shape, offset, dim1, dim2):
    n = len(shape) + 1
    d1, d2 = wrap_dim(dim1, n), wrap_dim(dim2, n)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    m = shape[-1] + abs(offset)
    rest = list(shape[:-1])
    out = []
    for i in range(n):
        out.append(m if i in (d1, d2) else rest.pop(0))
    return tuple(out), d1, d2


@defop("diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1) -> Tensor", method=True)
def diag_embed(xp, self, offset=0, dim1=-2, dim2=-1):
    if self.ndim == 0:
        raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got -2)")
    shape, d1, d2 = _embed_shape(self.shape, offset, dim1, dim2)
    out = xp.zeros(shape, dtype=self.dtype)
    _diagonal.kernel(xp, out, offset, d1, d2)[...] = self
    return out


@diag_embed.def_meta
def _(self, offset=0, dim1=-2, dim2=-1):
    if self.ndim == 0:
        raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got -2)")
    return TensorSpec(_embed_shape(self.shape, offset, dim1, dim2)[0], self.dtype)


diag_embed.def_derivative(lambda grad, offset, dim1, dim2: grad.diagonal(offset, dim1, dim2))


@export("diag", method=True)
def diag(self, diagonal=0, *, out=None):
    if self.ndim == 1:
        return with_out(diag_embed(self, diagonal, 0, 1), out)
    if self.ndim == 2:
        return with_out(_diagonal(self, diagonal).clone(), out)
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")


@export("diagflat", method=True)
def diagflat(self, offset=0):
    return diag_embed(self.reshape(-1), offset, 0, 1)


@export("block_diag")
def block_diag(*tensors):
    mats = []
    for i, t in enumerate(tensors):
        if t.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has "
                               f"{t.ndim} dimensions")
        mats.append(t.reshape(1, -1) if t.ndim < 2 else t)
    if not mats:
        return zeros((1, 0))
    dt = result_type(*mats)
    dev = mats[0].device
    cols = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        r, c = m.shape
        parts = [zeros((r, left), dtype=dt, device=dev), m.to(dt),
                 zeros((r, cols - left - c), dtype=dt, device=dev)]
        rows.append(cat(parts, 1))
        left += c
    return cat(rows, 0)


@export("cartesian_prod")
def cartesian_prod(*tensors):
    for t in tensors:
        if t.ndim != 1:
            raise RuntimeError(f"Expect a 1D vector, but got shape {list(t.shape)}")
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([g.reshape(-1) for g in grids], 1)


@export("trace", method=True, tags=(Tag.cpu_autocast_fp32,))
def trace(self):
    if self.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.ndim}")
    return _diagonal(self).sum()


def _tri_count(row, col, offset, lower):
    i = np.arange(row)[:, None]
    j = np.arange(col)[None, :]
    m = (j - i <= offset) if lower else (j - i >= offset)
    return np.nonzero(m)


def _tri_indices(name, lower, *, tags=()):
    @defop(f"{name}(int row, int col, int offset=0, *, ScalarType? dtype=None, Device? device=None) -> Tensor", tags=tags)
    def op(xp, row, col, offset=0, *, dtype=None, device=None):
        if row < 0 or col < 0:
            raise RuntimeError(f"row must be non-negative, got{row}" if row < 0 else f"col must be non-negative, got{col}")
        r, c = _tri_count(row, col, offset, lower)
        return xp.asarray(np.stack([r, c]).astype((dtype or D.int64).np).reshape(2, -1))

    op.def_meta(lambda row, col, offset=0, *, dtype=None, device=None:
                TensorSpec((2, _tril_size(row, col, offset) if lower else row * col - _tril_size(row, col, offset - 1)),
                           dtype or D.int64))
    return op


def _tril_size(row, col, offset):
    """Elements of the lower triangle of a row x col matrix on and below diagonal `offset`, in closed
    form (so symbolic sizes give a symbolic count): a trapezoid of rows whose lengths grow by one from
    `first` to `last`, then full rows of `col`."""
    if row == 0 or col == 0:
        return 0
    first = min(col, 1 + offset) if offset > 0 else int(row + offset > 0)
    last = max(0, min(col, row + offset))
    rows = max(0, min(row, row + offset))
    trapezoid = last - first + 1
    size = (first + last) * trapezoid // 2
    return size + (rows - trapezoid) * col if rows > trapezoid else size


tril_indices = _tri_indices("tril_indices", True, tags=(Tag.core,))
triu_indices = _tri_indices("triu_indices", False, tags=(Tag.core,))


# ---- broadcasting and atleast_nd ------------------------------------------------------------------
@export("broadcast_to", method=True)
def broadcast_to(self, size):
    return expand(self, *size)


@export("broadcast_tensors")
def broadcast_tensors(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    shape = broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(t if tuple(t.shape) == shape else expand(t, shape) for t in tensors)


def _atleast(n):
    def fix(t):
        if t.ndim >= n:
            return t
        if n == 3 and t.ndim == 2:
            return t.unsqueeze(-1)
        if n == 3 and t.ndim == 1:
            return t.reshape(1, -1, 1)
        return t.reshape((1,) * (n - t.ndim) + tuple(t.shape))

    def f(*tensors):
        if len(tensors) == 1 and isinstance(tensors[0], Tensor):
            return fix(tensors[0])
        if len(tensors) == 1:
            tensors = tuple(tensors[0])
        return tuple(fix(t) for t in tensors)
    f.__name__ = f"atleast_{n}d"
    return export(f.__name__)(f)


atleast_1d, atleast_2d, atleast_3d = _atleast(1), _atleast(2), _atleast(3)


@export("ravel", method=True)
def ravel(self):
    return reshape(self, -1)


@export("narrow_copy", method=True)
def narrow_copy(self, dim, start, length, *, out=None):
    return with_out(self.narrow(dim, start, length).clone(), out)


# ---- functional scatters into views ----------------------------------------------------------------
def _scatter_into(xp, self, view_fn, src):
    out = xp.array(self, copy=True, order="K")
    v = view_fn(out)
    if tuple(v.shape) != tuple(src.shape):
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(v.shape)}")
    v[...] = src
    return out


def _scatter_meta(view_spec, src, self):
    if tuple(view_spec.shape) != tuple(src.shape):
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(view_spec.shape)}")
    return TensorSpec(self.shape, self.dtype)


@defop("select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor", method=True, tags=(Tag.core,))
def select_scatter(xp, self, src, dim, index):
    return _scatter_into(xp, self, lambda o: select.kernel(xp, o, dim, index), src)


@select_scatter.def_meta
def _(self, src, dim, index):
    return _scatter_meta(select.meta(self, dim, index), src, self)


@select_scatter.def_derivative
def _(grad, src, dim, index):
    return grad.select_scatter(zeros_like(src), dim, index), grad.select(dim, index)


@defop("slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) "
       "-> Tensor", method=True, tags=(Tag.core,))
def slice_scatter(xp, self, src, dim=0, start=None, end=None, step=1):
    return _scatter_into(xp, self, lambda o: slice_.kernel(xp, o, dim, start, end, step), src)


@slice_scatter.def_meta
def _(self, src, dim=0, start=None, end=None, step=1):
    return _scatter_meta(slice_.meta(self, dim, start, end, step), src, self)


@slice_scatter.def_derivative
def _(grad, src, dim, start, end, step):
    return grad.slice_scatter(zeros_like(src), dim, start, end, step), slice_(grad, dim, start, end, step)


@defop("diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor", method=True,
       tags=(Tag.core,))
def diagonal_scatter(xp, self, src, offset=0, dim1=0, dim2=1):
    return _scatter_into(xp, self, lambda o: _diagonal.kernel(xp, o, offset, dim1, dim2), src)


@diagonal_scatter.def_meta
def _(self, src, offset=0, dim1=0, dim2=1):
    return _scatter_meta(_diagonal.meta(self, offset, dim1, dim2), src, self)


@diagonal_scatter.def_derivative
def _(grad, src, offset, dim1, dim2):
    return grad.diagonal_scatter(zeros_like(src), offset, dim1, dim2), grad.diagonal(offset, dim1, dim2)


@defop("as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) "
       "-> Tensor", method=True, tags=(Tag.core,))
def as_strided_scatter(xp, self, src, size, stride, storage_offset=None):
    return _scatter_into(xp, self, lambda o: as_strided.kernel(xp, o, size, stride, storage_offset or 0), src)


@as_strided_scatter.def_meta
def _(self, src, size, stride, storage_offset=None):
    return _scatter_meta(TensorSpec(size, self.dtype), src, self)


@as_strided_scatter.def_derivative
def _(grad, src, size, stride, storage_offset):
    g = grad.contiguous()
    return (g.as_strided_scatter(zeros_like(src), size, stride, storage_offset),
            g.as_strided(size, stride, storage_offset))


# ---- vmap batching rules ----------------------------------------------------------------------------
@cat.def_batching_rule
def _cat_batching(in_dims, tensors, dim=0):
    size = _batching.batch_size([tensors], in_dims)
    ref = next(t for t, d in zip(tensors, in_dims[0]) if d is not None)
    n = ref.dim() - 1
    parts = []
    for t, d in zip(tensors, in_dims[0]):
        if t.dim() - (d is not None) == 1 and t.shape[-1] == 0 and n != 1:
            continue                      # a legacy empty 1-D tensor joins any cat
        parts.append(_batching.materialize(t, d, size))
    return cat(parts, _batching.wrap_dim(dim, n) + 1), 0


@_repeat.def_batching_rule
def _repeat_batching(in_dims, self, repeats):
    x = _batching.pad_front(self, in_dims[0], len(repeats))
    return _repeat(x, [1] + list(repeats)), 0


flip.def_batching_rule(_batching.dim_rule(flip, "dims"))
roll.def_batching_rule(_batching.dim_rule(roll, "dims"))
for _op in (tril, triu):
    _op.def_batching_rule(_batching.dim_rule(_op))


diag_embed.def_batching_rule(_batching.dim_rule(diag_embed, "dim1", "dim2", extra=1))
select_scatter.def_batching_rule(_batching.written_rule(select_scatter, "dim"))
slice_scatter.def_batching_rule(_batching.written_rule(slice_scatter, "dim"))
diagonal_scatter.def_batching_rule(_batching.written_rule(diagonal_scatter, "dim1", "dim2"))
select_scatter.def_sharding_rule(_sharding.select_scatter_rule)
slice_scatter.def_sharding_rule(_sharding.slice_scatter_rule)
