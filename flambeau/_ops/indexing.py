"""Indexing: `Tensor.__getitem__`/`__setitem__` with PyTorch's semantics, and the indexing ops they
and users call: index/index_put (advanced indexing), copy_/fill_/zero_, index_select/add/copy/fill,
gather and the scatter family (scatter, scatter_add, scatter_reduce).

`x[i]` splits the index into a basic part (ints, slices, None, Ellipsis), applied as view ops
(select, slice, unsqueeze) so the result shares memory and is marked as a view, and an advanced
part (bool masks, integer tensors or lists), applied with the `index` op, which copies. Writes
(`x[i] = v`) copy into the basic view (`copy_`/`fill_`) or call `index_put_` on it; autograd
rebases the view's base after the in-place op (autograd/graph.py `record_inplace`).
"""
from __future__ import annotations

import builtins

import numpy as np

from .. import _dtype as D
from .._backends import MetaArray, device_checks, is_cupy
from .._tensor import Tensor
from ._registry import defop, export, TensorSpec, OPS, Tag, call
from ._helpers import wrap_dim, broadcast_shapes
from .views import slice_, select, unsqueeze, alias, expand_shape
from .._dispatch import check_no_internal_overlap, type_name
from .creation import zeros, tensor
from . import _batching

_INDEX_DTYPES = "tensors used as indices must be long, int, byte or bool tensors"
_LOWP = (np.dtype(np.float16), D.bfloat16.np)


def _ufunc_at(xp, name, a, key, v):
    """`a[key] op= v` with repeated indices accumulated (np.add.at; cupyx on the GPU)."""
    if a.dtype in _LOWP:
        t = a.astype(np.float32)
        _ufunc_at(xp, name, t, key, v.astype(np.float32) if hasattr(v, "astype") else v)
        a[...] = t.astype(a.dtype)
        return
    if not is_cupy(xp):
        getattr(np, name).at(a, key, v)
        return
    import cupyx  # deferred: optional dependency, present only where cuda is used
    if name == "add":
        cupyx.scatter_add(a, key, v)
    elif name in ("maximum", "minimum"):
        getattr(cupyx, "scatter_max" if name == "maximum" else "scatter_min")(a, key, v)
    else:
        _at_by_rounds(xp, getattr(xp, name), a, key, v)


def _at_by_rounds(xp, ufunc, a, key, v):
    """ufunc.at for CuPy ufuncs without `.at`: apply the first occurrence of every target position,
    drop it, repeat (as many rounds as the largest multiplicity). `a` must be C-contiguous."""
    coords = xp.broadcast_arrays(*key)
    lin = xp.ravel_multi_index(tuple(c.reshape(-1) for c in coords), a.shape)
    vals = xp.broadcast_to(xp.asarray(v, dtype=a.dtype), coords[0].shape).reshape(-1)
    flat = a.reshape(-1)
    while lin.size:
        _, first = xp.unique(lin, return_index=True)
        flat[lin[first]] = ufunc(flat[lin[first]], vals[first])
        keep = xp.ones(lin.size, dtype=bool)
        keep[first] = False
        lin, vals = lin[keep], vals[keep]


# ---- advanced indexing: index / index_put ----------------------------------------------------------
def _bounds(ix, size, d, xp):
    if not ix.size:
        return
    if is_cupy(xp):         # on a GPU: tested on the device, raised at the next synchronisation
        device_checks.check_range(xp, ix, -size, size, IndexError,
                                  f"index {{}} is out of bounds for dimension {d} with size {size}")
        return
    mx, mn = int(ix.max()), int(ix.min())
    bad = mx if mx >= size else (mn if mn < -size else None)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {d} with size {size}")


def adv_key(xp, shape, indices):
    """Validate `Tensor?[]` indices and turn them into a NumPy key (masks as their nonzero arrays)."""
    key, d = [], 0
    for ix in indices:
        if ix is None:
            key.append(slice(None))
            d += 1
            continue
        if ix.dtype == np.bool_ or ix.dtype == np.uint8:
            m = ix.astype(bool, copy=False)
            for j, s in enumerate(m.shape):
                if d + j >= len(shape) or shape[d + j] != s:
                    raise IndexError(f"The shape of the mask {list(m.shape)} at index {j} does not match the shape "
                                     f"of the indexed tensor {list(shape)} at index {d + j}")
            key.extend(xp.nonzero(m) if m.ndim else (m,))
            d += m.ndim
            continue
        if ix.dtype not in (np.int64, np.int32):
            raise IndexError(_INDEX_DTYPES)
        if d >= len(shape):
            raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
        _bounds(ix, shape[d], d, xp)
        key.append(ix)
        d += 1
    if d > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    return tuple(key)


@defop("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", function=False, tags=(Tag.core, Tag.no_fp_errors))
def index(xp, self, indices):
    if len(indices) == 1 and xp is np and self.ndim and type(ix := indices[0]) is np.ndarray \
            and ix.dtype == np.int64:
        try:                                   # fast path: one integer index on dim 0
            return np.take(self, ix, axis=0)
        except IndexError:
            pass                               # adv_key below raises PyTorch's message
    key = adv_key(xp, self.shape, indices)
    r = self[key]
    if r.size == 0:
        return xp.empty(r.shape, dtype=r.dtype)
    if all(isinstance(k, slice) for k in key):
        return r.copy()
    return r if r.flags.c_contiguous else xp.ascontiguousarray(r)    # NumPy may put the index dims inside


@index.def_meta
def _(self, indices):
    shape, adv, d = list(self.shape), [], 0
    for ix in indices:
        if ix is None:
            d += 1
            continue
        if ix.dtype in (D.bool, D.uint8):
            raise NotImplementedError("aten::index with a boolean mask has a data-dependent output shape")
        if ix.dtype not in (D.int64, D.int32):
            raise IndexError(_INDEX_DTYPES)
        if d >= len(shape):
            raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
        adv.append((d, tuple(ix.shape)))
        d += 1
    if not adv:
        return TensorSpec(shape, self.dtype)
    bshape = broadcast_shapes(*(s for _, s in adv))
    pos = [p for p, _ in adv]
    rest = [s for i, s in enumerate(shape) if i not in pos]
    at = pos[0] if pos == list(range(pos[0], pos[0] + len(pos))) else 0
    return TensorSpec(rest[:at] + list(bshape) + rest[at:], self.dtype)


@index.def_derivative
def _(grad, self_meta, indices):
    return grad.new_zeros(self_meta.shape).index_put(indices, grad, True), None


@defop("index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor",
       method=True, inplace=True, tags=(Tag.core, Tag.autocast_promote),
       eager_fallback="boolean-mask indices (a data-dependent count) and index_put without indices have no loop")
def index_put(xp, self, indices, values, accumulate=False):
    if values.dtype != self.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{_tn(self.dtype)} for the destination and {_tn(values.dtype)} for the source.")
    key = adv_key(xp, self.shape, indices)
    out = xp.array(self, copy=True)
    target = out[key].shape
    try:
        v = xp.broadcast_to(values, target)
    except ValueError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(target)}") from None
    if accumulate:
        _ufunc_at(xp, "add" if self.dtype != np.bool_ else "logical_or", out, key, v)
    else:
        out[key] = v
    return out


def _tn(npdt):
    return type_name(D.FROM_NP[npdt])


@index_put.def_meta
def _(self, indices, values, accumulate=False):
    if values.dtype is not self.dtype:
        raise RuntimeError("Index put requires the source and destination dtypes match")
    if not any(ix is not None and ix.dtype in (D.bool, D.uint8) for ix in indices):
        target = index.meta(self, indices).shape
        if broadcast_shapes(tuple(values.shape), target) != target:
            raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                               f"indexing result of shape {list(target)}")
    return TensorSpec(self.shape, self.dtype)


@index_put.def_derivative
def _(grad, indices, values_meta, accumulate):
    gself = grad if accumulate else grad.index_put(indices, zeros((), dtype=grad.dtype, device=grad.device))
    return gself, None, index(grad, indices)


# ---- Tensor.__getitem__ / __setitem__ ---------------------------------------------------------------
def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (builtins.bool, np.bool_))


def _as_items(index):
    if type(index) is tuple:
        return index
    if isinstance(index, list) and any(isinstance(x, (list, tuple, slice, Tensor)) or x is None or x is Ellipsis
                                       for x in index):
        return tuple(index)
    return (index,)


def _consumed(item):
    if item is None or item is Ellipsis or isinstance(item, (builtins.bool, np.bool_)):
        return 0
    if isinstance(item, Tensor) and item.dtype in (D.bool, D.uint8):
        return item.ndim
    return 1


def _to_index_tensor(item, device):
    if isinstance(item, Tensor):
        t = item
    else:
        t = tensor(np.asarray(item) if isinstance(item, np.ndarray) else item)
        if t.numel() == 0 and t.dtype.category == D.FLOATING:
            t = t.long()
    if t.dtype not in (D.int64, D.int32, D.bool, D.uint8):
        raise IndexError(_INDEX_DTYPES)
    return t.to(device) if t.device != device else t


def apply_index(self, index):
    """Basic indexing as view ops; returns (view, advanced indices as a Tensor?[] list or None)."""
    items = _as_items(index)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(_consumed(i) for i in items)
    if used > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    r, d, adv = self, 0, {}
    for item in items:
        if item is None:
            r = unsqueeze(r, d)
            d += 1
        elif item is Ellipsis:
            d += self.ndim - used
        elif isinstance(item, (builtins.bool, np.bool_)):
            r = unsqueeze(r, d)
            adv[d] = _to_index_tensor([0] if item else [], self.device)
            d += 1
        elif _is_int(item) or (isinstance(item, Tensor) and item.ndim == 0 and item.dtype.category == D.INTEGER
                               and item.dtype is not D.uint8 and item.device.type != "meta"):
            i = int(item)
            size = r.shape[d]
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            r = select(r, d, i)
        elif isinstance(item, slice):
            step = 1 if item.step is None else int(item.step)
            if step <= 0:
                raise ValueError("step must be greater than zero")
            if not (item.start in (None, 0) and item.stop is None and step == 1):
                r = slice_(r, d, None if item.start is None else int(item.start),
                           None if item.stop is None else int(item.stop), step)
            d += 1
        elif isinstance(item, (Tensor, list, tuple, np.ndarray)):
            t = _to_index_tensor(item, self.device)
            adv[d] = t
            d += t.ndim if t.dtype in (D.bool, D.uint8) else 1
        else:
            raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are "
                             f"valid indices (got {type(item).__name__})")
    if not adv:
        return r, None
    idx, k = [], 0
    for pos in sorted(adv):
        idx.extend([None] * (pos - k))
        t = adv[pos]
        idx.append(t)
        k = pos + (t.ndim if t.dtype in (D.bool, D.uint8) else 1)
    return r, idx


def _int_bound(b):
    """A 0-dim integer cpu Tensor slice bound read as an int, as `apply_index` reads it (any other bound
    is left for it to judge)."""
    if b._data.ndim == 0 and b._dtype.category == D.INTEGER and b._dtype is not D.uint8 and b._device.type == "cpu":
        return int(b._data)
    return b


_INT_OR_NONE = (int, type(None))


@export("__getitem__", method=True, function=False)
def getitem(self, key):
    t = type(key)
    if self.ndim:                        # fast paths for the commonest keys; same ops as below
        if t is builtins.slice:
            start, stop, step = key.start, key.stop, key.step
            if type(start) is Tensor or type(stop) is Tensor:     # data[i:i + n] with i drawn by randint (get_batch)
                start = _int_bound(start) if type(start) is Tensor else start
                stop = _int_bound(stop) if type(stop) is Tensor else stop
                key = slice(start, stop, step)
            if (step is None or type(step) is int and step > 0) and type(start) in _INT_OR_NONE \
                    and type(stop) in _INT_OR_NONE:
                if start is None and stop is None and step in (None, 1):
                    return alias(self)
                return call(slice_, (self, 0, start, stop, 1 if step is None else step))
        if t is int:
            size = self.shape[0]
            if not -size <= key < size:
                raise IndexError(f"index {key} is out of bounds for dimension 0 with size {size}")
            return call(select, (self, 0, key))
        if t is Tensor and key.ndim and key.dtype in (D.int64, D.int32) and key.device == self.device:
            return index(self, [key])
    r, idx = apply_index(self, key)
    if idx is not None:
        return index(r, idx)
    return alias(r) if r is self else r


@export("__setitem__", method=True, function=False)
def setitem(self, key, value):
    v, idx = apply_index(self, key)
    if isinstance(value, Tensor):
        while value.ndim > 0 and value.shape[0] == 1:
            value = value.squeeze(0)
    if idx is None:
        if isinstance(value, Tensor):
            copy_(v, value)
        else:
            fill_(v, value)
        return
    if not isinstance(value, Tensor):
        value = tensor(value, dtype=self.dtype, device=self.device)
    elif value.device != self.device:
        value = value.to(self.device)
    v.index_put_(idx, value)


# ---- copy_ / fill_ / zero_ ---------------------------------------------------------------------------
@defop("copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor", function=False, inplace=True,
       tags=(Tag.core, Tag.recomputable), inplace_tags=(Tag.core,))
def _copy(xp, self, src, non_blocking=False):
    expand_shape(src.shape, self.shape)
    out = xp.empty(self.shape, dtype=self.dtype)
    out[...] = src.astype(self.dtype) if src.dtype != self.dtype else src
    return out


_copy.def_meta(lambda self, src, non_blocking=False: (expand_shape(src.shape, self.shape),
                                                       TensorSpec(self.shape, self.dtype))[1])
_copy.def_derivative(lambda grad: (grad * 0, grad))


@export("copy_", method=True, function=False)
def copy_(self, src, non_blocking=False):
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be Tensor, not {type(src).__name__}")
    if src.device != self.device:
        src = src.to(self.device)
    if _same_elements(self, src):
        return self                       # PyTorch's copy_ returns at once (no overlap check: x[0] = x works)
    if type(self._data) is MetaArray:
        check_no_internal_overlap(self)   # as the kernel does for real data: fake tensors in a trace too
    return OPS["copy_"](self, src, non_blocking)


def _same_elements(a, b) -> bool:
    """`a` and `b` view the same memory the same way (same address, dtype, shape and strides); without
    data (meta, fake) the same address is the same tensor or the same base at the same offset."""
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    p = a.data_ptr()
    if p != 0:
        return p == b.data_ptr()
    return a is b or ((a._base if a._base is not None else a) is (b._base if b._base is not None else b)
                      and a.storage_offset() == b.storage_offset())


@defop("fill.Scalar(Tensor self, Scalar value) -> Tensor", function=False, inplace=True,
       inplace_tags=(Tag.overlap_ok,))       # PyTorch's fill_ with a Scalar skips the overlap check
def _fill_scalar(xp, self, value):
    if self.dtype == np.bool_:
        value = bool(value)
    elif self.dtype.kind in "iu" and isinstance(value, complex):
        raise RuntimeError("value cannot be converted to type without overflow")
    return xp.full(self.shape, value, dtype=self.dtype)


_fill_scalar.def_meta(lambda self, value: TensorSpec(self.shape, self.dtype))
def _fill_scalar_derivative(grad):
    """Zeros, not grad * 0 (PyTorch's zeros_like(grad)): an infinite or NaN gradient reaching a
    filled tensor must not become NaN for what it overwrote."""
    return zeros(tuple(grad.shape), dtype=grad.dtype, device=grad.device)


_fill_scalar.def_derivative(_fill_scalar_derivative)


def _zero_dim_value(name, value):
    if value.ndim != 0:
        raise RuntimeError(f"{name} only supports 0-dimension value tensor but got tensor with {value.ndim} "
                           "dimensions.")


@defop("fill.Tensor(Tensor self, Tensor value) -> Tensor", function=False, inplace=True)
def _fill_tensor(xp, self, value):
    _zero_dim_value("fill_", value)
    return xp.full(self.shape, value.astype(self.dtype), dtype=self.dtype)


_fill_tensor.def_meta(lambda self, value: (_zero_dim_value("fill_", value), TensorSpec(self.shape, self.dtype))[1])
_fill_tensor.def_derivative(lambda grad: (_fill_scalar_derivative(grad), grad.sum()))


@export("fill")
def fill(self, value):
    return (_fill_tensor if isinstance(value, Tensor) else _fill_scalar)(self, value)


@export("fill_", method=True, function=False)
def fill_(self, value):
    return OPS["fill_.Tensor" if isinstance(value, Tensor) else "fill_.Scalar"](self, value)


@export("zero_", method=True)
def zero_(self):
    return OPS["fill_.Scalar"](self, 0)


# ---- index_select / index_add / index_copy / index_fill -------------------------------------------------
def _index_vec(name, index):
    if index.ndim > 1:
        raise IndexError(f"{name}(): Index is supposed to be a vector")
    if index.dtype not in (np.int64, np.int32) and index.dtype not in (D.int64, D.int32):
        raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index")


def _dim_index(xp, name, self, dim, index):
    _index_vec(name, index)
    d = wrap_dim(dim, self.ndim)
    size = self.shape[d] if self.ndim else 1
    ix = index.reshape(-1)
    if is_cupy(xp):         # on a GPU: tested on the device, raised at the next synchronisation
        device_checks.check_range(xp, ix, -size, size, IndexError, "index out of range in self")
    elif ix.size and (int(ix.max()) >= size or int(ix.min()) < -size):
        raise IndexError("index out of range in self")
    return d, ix


@defop("index_select(Tensor self, int dim, Tensor index) -> Tensor", method=True,
       eager_fallback="no lowering yet: a gather loop like `index.Tensor`'s would serve")
def index_select(xp, self, dim, index):
    d, ix = _dim_index(xp, "index_select", self, dim, index)
    if self.ndim == 0:
        return self[()].reshape(()).copy() if index.ndim == 0 else xp.take(self.reshape(1), ix)
    return xp.take(self, ix, axis=d)


@index_select.def_meta
def _(self, dim, index):
    _index_vec("index_select", index)
    d = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return TensorSpec(index.shape, self.dtype)
    shape = list(self.shape)
    shape[d] = index.numel()
    return TensorSpec(shape, self.dtype)


@index_select.def_derivative
def _(grad, self_meta, dim, index):
    z = zeros(self_meta.shape, dtype=grad.dtype, device=grad.device)
    if self_meta.ndim == 0:
        return z + grad.sum(), None
    return z.index_add(dim, index.reshape(-1), grad), None


def _check_source(name, self, d, ix, source):
    sshape = source.shape if source.ndim else (1,)
    shape = self.shape if self.ndim else (1,)
    if len(sshape) != len(shape) or sshape[d] != ix.shape[0] or any(
            a != b for k, (a, b) in enumerate(zip(sshape, shape)) if k != d):
        raise RuntimeError(f"{name}(): Source/destination tensor must have same slice shapes. Destination "
                           f"slice shape: {list(shape[:d]) + list(shape[d + 1:])} at dimension {d} and source slice "
                           f"shape: {list(sshape[:d]) + list(sshape[d + 1:])} at dimension {d}.")


def _dim_write(xp, name, self, dim, index, source, how):
    d, ix = _dim_index(xp, name, self, dim, index)
    if source is not None:
        _check_source(name, self, d, ix, source)
    out = xp.array(self, copy=True)
    o = xp.moveaxis(out.reshape(out.shape or (1,)), d, 0)
    s = None if source is None else xp.moveaxis(source.reshape(source.shape or (1,)), d, 0)
    how(o, ix, s)
    return out


@defop("index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
       method=True, inplace=True,
       eager_fallback="no lowering yet: an accumulating scatter loop like `scatter_add`'s would serve")
def index_add(xp, self, dim, index, source, *, alpha=1):
    if source.dtype != self.dtype:
        raise RuntimeError(f"index_add_(): self ({_tn(self.dtype)}) and source ({_tn(source.dtype)}) must have "
                           "the same scalar type")
    return _dim_write(xp, "index_add", self, dim, index, source,
                      lambda o, ix, s: _ufunc_at(xp, "add" if o.dtype != np.bool_ else "logical_or", o, ix,
                                                 s if alpha == 1 else (s * alpha).astype(o.dtype)))


index_add.def_meta(lambda self, dim, index, source, *, alpha=1: TensorSpec(self.shape, self.dtype))


@index_add.def_derivative
def _(grad, dim, index, source_meta, alpha):
    g = grad.index_select(dim, index.reshape(-1)) if grad.ndim else grad.reshape(1)
    g = g.reshape(source_meta.shape)
    return grad, None, g if alpha == 1 else g * alpha


@defop("index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor", method=True, inplace=True,
       tags=(Tag.cpu_autocast_promote,))
def index_copy(xp, self, dim, index, source):
    if source.dtype != self.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{_tn(self.dtype)} and (source) {_tn(source.dtype)}")

    def put(o, ix, s):
        o[ix] = s
    return _dim_write(xp, "index_copy", self, dim, index, source, put)


index_copy.def_meta(lambda self, dim, index, source: TensorSpec(self.shape, self.dtype))


@index_copy.def_derivative
def _(grad, dim, index, source_meta):
    g = grad.index_select(dim, index.reshape(-1)) if grad.ndim else grad.reshape(1)
    return grad.index_fill(dim, index, 0), None, g.reshape(source_meta.shape)


def _fill_value(dtype, value):
    return bool(value) if dtype == np.bool_ else value


@defop("index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value) -> Tensor", function=False,
       inplace=True)
def _index_fill_s(xp, self, dim, index, value):
    def put(o, ix, s):
        o[ix] = _fill_value(o.dtype, value)
    return _dim_write(xp, "index_fill", self, dim, index, None, put)


@defop("index_fill.int_Tensor(Tensor self, int dim, Tensor index, Tensor value) -> Tensor", function=False,
       inplace=True)
def _index_fill_t(xp, self, dim, index, value):
    if value.ndim:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")

    def put(o, ix, s):
        o[ix] = value.astype(o.dtype)
    return _dim_write(xp, "index_fill", self, dim, index, None, put)


for _op in (_index_fill_s, _index_fill_t):
    _op.def_meta(lambda self, dim, index, value: TensorSpec(self.shape, self.dtype))
_index_fill_s.def_derivative(lambda grad, dim, index: (grad.index_fill(dim, index, 0), None))


@_index_fill_t.def_derivative
def _(grad, dim, index):
    g = grad.index_fill(dim, index, 0)
    return g, None, (grad - g).sum()


@export("index_fill", method=True)
def index_fill(self, dim, index, value):
    return (_index_fill_t if isinstance(value, Tensor) else _index_fill_s)(self, dim, index, value)


@export("index_fill_", method=True, function=False)
def index_fill_(self, dim, index, value):
    return OPS["index_fill_.int_Tensor" if isinstance(value, Tensor) else "index_fill_.int_Scalar"](
        self, dim, index, value)


# ---- vmap batching rules ----------------------------------------------------------------------------
@index.def_batching_rule
def _index_batching(in_dims, self, indices):
    if in_dims[1] is not None or any(i is not None and i.dtype.name == "bool" for i in indices):
        return NotImplemented
    x = _batching.front(self, in_dims[0])
    pos = [k for k, i in enumerate(indices) if i is not None]
    if not pos:
        return x, 0
    out = index(x, [None] + list(indices))
    if pos == list(range(pos[0], pos[-1] + 1)):
        return out, 0
    return out, max(i.dim() for i in indices if i is not None)


index_select.def_batching_rule(_batching.dim_rule(index_select, "dim"))
_copy.def_batching_rule(_batching.self_shaped_rule(_copy))
_fill_scalar.def_batching_rule(_batching.unary_rule(_fill_scalar))


for _op in (index_add, index_copy, _index_fill_s):
    _op.def_batching_rule(_batching.written_rule(_op, "dim", keep=("index",)))
