"""Lowering rules for views, indexing and data movement.

Views never copy. A view of a buffer that strides can express (permute, expand, slice, select,
squeeze/unsqueeze, compatible reshapes, as_strided) is a `StridedView`, which extern kernels
receive as a strided NumPy array; otherwise (a view of a lazy value, an incompatible reshape) it
is a `Pointwise` whose loader remaps the index onto its input's loader. Indexing ops
(gather, index, embedding) compute an index from a loaded value (`ops.indirect_indexing`); cat and
the `*_scatter` ops are piecewise: a `where` over masked loads, so no out-of-range read happens.
"""
from __future__ import annotations


from .. import _dtype as D
from .._ops import _helpers as H
from .index import Index, contiguous_strides
from .ir import Buffer, IRNode, Layout, Pointwise, StridedView, Unsupported, ops, ComputedBuffer
from .lowering import loader, out_dtype, out_shape, register_lowering
from .._decomp._table import aten
from .._ops.views import slice_bounds, view_strides
from .sizevars import SizeExpr, known_nonneg


def _strided(x):
    """(base buffer, layout) when `x` is memory, else None."""
    if isinstance(x, Pointwise) and x.realized is not None:
        x = x.realized
    if isinstance(x, StridedView):
        return x.base, x.layout
    if isinstance(x, Buffer) and x.layout is not None:
        return x, x.layout
    return None


def view_of(x, shape, strides_fn, remap):
    """A view of `x` with `shape`: strides_fn(layout) -> (strides, offset) or None; remap(idx) ->
    index into x."""
    s = _strided(x)
    if s is not None:
        base, lay = s
        r = _try(strides_fn, lay)
        if r is not None:
            st, off = r
            return StridedView(base, Layout(shape, lay.dtype, st, off))
    ld = x.make_loader()
    p = Pointwise(shape, x.dtype, lambda idx: ld(remap(idx)))
    p.view_of = (x, strides_fn)       # an extern reading p may read x's memory through strides instead
    return p


def _try(strides_fn, lay):
    """strides_fn(lay), or None when it needs a fact about symbolic sizes that can't be decided
    (then the view re-indexes its input instead)."""
    try:
        return strides_fn(lay)
    except Unsupported:
        return None


@register_lowering(aten.permute)
def _permute(g, x, dims):
    nd = len(x.shape)
    dims = [H.wrap_dim(d, nd) for d in dims]
    shape = tuple(x.shape[d] for d in dims)
    inv = [0] * nd
    for i, d in enumerate(dims):
        inv[d] = i
    return view_of(x, shape, lambda lay: ([lay.strides[d] for d in dims], lay.offset),
                   lambda idx: [idx[inv[j]] for j in range(nd)])


@register_lowering(aten.expand)
def _expand(g, x, size, implicit=False):
    shape = out_shape(g)
    xs = tuple(x.shape)
    lead = len(shape) - len(xs)

    def strides(lay):
        st = [0] * lead + [0 if (xs[j] == 1 and shape[lead + j] != 1) else lay.strides[j] for j in range(len(xs))]
        return st, lay.offset
    return view_of(x, shape, strides,
                   lambda idx: [Index() if xs[j] == 1 else idx[lead + j] for j in range(len(xs))])


@register_lowering(aten.squeeze)
def _squeeze(g, x, dim=None):
    nd = len(x.shape)
    if dim is None:
        dims = [d for d in range(nd) if x.shape[d] == 1]
    else:
        dims = [H.wrap_dim(d, nd) for d in (dim if isinstance(dim, (list, tuple)) else [dim]) if nd]
        dims = [d for d in dims if x.shape[d] == 1]
    keep = [d for d in range(nd) if d not in dims]
    shape = tuple(x.shape[d] for d in keep)

    def remap(idx):
        full = [Index()] * nd
        for k, d in enumerate(keep):
            full[d] = idx[k]
        return full
    return view_of(x, shape, lambda lay: ([lay.strides[d] for d in keep], lay.offset), remap)


@register_lowering(aten.unsqueeze)
def _unsqueeze(g, x, dim):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd + 1)
    shape = tuple(x.shape[:dim]) + (1,) + tuple(x.shape[dim:])

    def strides(lay):
        st = list(lay.strides)
        inner = st[dim] * x.shape[dim] if dim < nd else 1
        return st[:dim] + [inner] + st[dim:], lay.offset
    return view_of(x, shape, strides, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


def _slice_params(size, start, end, step):
    """PyTorch's slice normalisation (the eager op's own `slice_bounds`), as (start, end, step).

    On a symbolic size only the start matters here (the output length comes from the traced
    meta["val"], whose clamping decisions the tracer guarded): a start of None, a non-negative
    int, or a negative int counted from the end."""
    if isinstance(size, SizeExpr) or isinstance(start, SizeExpr) or isinstance(end, SizeExpr):
        if not isinstance(step, int) or step <= 0:
            raise Unsupported("slice with a symbolic step")
        start = 0 if start is None else start
        if isinstance(start, int) and start < 0:
            start = size + start
        if not known_nonneg(start):
            raise Unsupported(f"slice start {start} of a symbolic size")
        return start, None, step
    start, end, _ = slice_bounds(size, start, end, step)
    return start, end, step


@register_lowering(aten.slice)
def _slice(g, x, dim=0, start=None, end=None, step=1):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd)
    start, end, step = _slice_params(x.shape[dim], start, end, step)
    shape = out_shape(g)

    def strides(lay):
        st = list(lay.strides)
        off = lay.offset + start * st[dim]
        st[dim] *= step
        return st, off

    def remap(idx):
        idx = list(idx)
        idx[dim] = idx[dim] * step + start
        return idx
    return view_of(x, shape, strides, remap)


@register_lowering(aten.select)
def _select(g, x, dim, index):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd)
    if index < 0:
        index += x.shape[dim]
    shape = tuple(x.shape[:dim]) + tuple(x.shape[dim + 1:])

    def strides(lay):
        st = list(lay.strides)
        return st[:dim] + st[dim + 1:], lay.offset + index * st[dim]
    return view_of(x, shape, strides, lambda idx: list(idx[:dim]) + [Index(None, index)] + list(idx[dim:]))


@register_lowering(aten.diagonal)
def _diagonal(g, x, offset=0, dim1=0, dim2=1):
    """A view relative to x's layout (the core decomposition into as_strided would bake in the
    traced input's storage offset and strides)."""
    nd = len(x.shape)
    d1, d2 = H.wrap_dim(dim1, nd), H.wrap_dim(dim2, nd)
    keep = [i for i in range(nd) if i not in (d1, d2)]
    shape = out_shape(g)
    s1, s2 = max(-offset, 0), max(offset, 0)
    if shape[-1] == 0:
        s1 = s2 = 0

    def strides(lay):
        st = lay.strides
        return [st[i] for i in keep] + [st[d1] + st[d2]], lay.offset + s1 * st[d1] + s2 * st[d2]

    def remap(idx):
        src = [None] * nd
        for j, i in enumerate(keep):
            src[i] = idx[j]
        src[d1], src[d2] = idx[-1] + s1, idx[-1] + s2
        return src
    return view_of(x, shape, strides, remap)


@register_lowering(aten.unfold)
def _unfold(g, x, dimension, size, step):
    """Windows of `size` every `step` along `dimension`, as a view relative to x's layout."""
    nd = len(x.shape)
    d = H.wrap_dim(dimension, nd) if nd else 0
    shape = out_shape(g)
    if nd == 0:
        raise Unsupported("unfold of a 0-dim tensor")

    def strides(lay):
        st = list(lay.strides)
        return st[:d] + [st[d] * step] + st[d + 1:] + [st[d]], lay.offset

    def remap(idx):
        idx = list(idx)
        window = idx.pop()
        idx[d] = idx[d] * step + window
        return idx
    return view_of(x, shape, strides, remap)


@register_lowering(aten.view)
def _view(g, x, size):
    shape = out_shape(g)
    xs = tuple(x.shape)
    out_cs = contiguous_strides(shape)
    in_cs = contiguous_strides(xs)

    def strides(lay):
        st = view_strides(lay.shape, lay.strides, shape)
        return None if st is None else (st, lay.offset)

    def remap(idx):
        if [s for s in shape if s != 1] == [s for s in xs if s != 1]:
            it = iter([i for i, s in zip(idx, shape) if s != 1])
            return [Index() if s == 1 else next(it) for s in xs]
        flat = Index()
        for i, c in zip(idx, out_cs):
            flat = flat + Index.of(i) * c
        return [(flat // c) % s if s != 1 else Index() for c, s in zip(in_cs, xs)]
    return view_of(x, shape, strides, remap)


@register_lowering(aten.as_strided)
def _as_strided(g, x, size, stride, storage_offset=None):
    x = g.realize(x, channels_last=False)
    base = g.storage_order(x.base if isinstance(x, StridedView) else x, g.node.args[0])
    if base.layout.offset != 0 or (base.layout.strides != contiguous_strides(base.shape)
                                   and not _is_fresh(base)):
        raise Unsupported("as_strided of a non-contiguous buffer")
    return StridedView(base, Layout(size, base.dtype, stride, storage_offset or 0))


def _is_fresh(b):
    return isinstance(b, ComputedBuffer)


# ---- indexing ------------------------------------------------------------------------------------
def _indirect(g, idx_node, shape, size):
    """Loader giving an Index from an integer index tensor broadcast to `shape`."""
    ld = loader(g, idx_node, shape, D.int64)
    return lambda idx: ops.indirect_indexing(ld(idx), size)


@register_lowering(aten.gather)
def _gather(g, x, dim, index, sparse_grad=False):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd) if nd else 0
    shape = out_shape(g)
    if nd and len(shape) != nd:          # an empty index of another rank (PyTorch checks no rank then)
        return Pointwise(shape, x.dtype, lambda idx: ops.constant(0, x.dtype))
    ld = x.make_loader()
    ind = _indirect(g, index, shape, x.shape[dim] if nd else 1)

    def inner(idx):
        if not nd:
            return ld([])
        full = list(idx)
        full[dim] = ind(idx)
        return ld(full)
    return Pointwise(shape, x.dtype, inner)


@register_lowering(aten.index)
def _index(g, x, indices):
    nd = len(x.shape)
    indices = list(indices) + [None] * (nd - len(indices))
    pos = [i for i, t in enumerate(indices) if t is not None]
    for i in pos:
        if indices[i].dtype not in (D.int64, D.int32):
            raise Unsupported("boolean mask indexing")
    shape = out_shape(g)
    bshape = H.broadcast_shapes(*[tuple(indices[i].shape) for i in pos])
    nb = len(bshape)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    loads = {i: loader(g, indices[i], bshape, D.int64) for i in pos}
    ld = x.make_loader()

    def inner(idx):
        bidx = list(idx[first:first + nb])
        rest = list(idx[:first]) + list(idx[first + nb:])
        full, k = [], 0
        for d in range(nd):
            if indices[d] is not None:
                full.append(ops.indirect_indexing(loads[d](bidx), x.shape[d]))
            else:
                full.append(rest[k])
                k += 1
        return ld(full)
    return Pointwise(shape, x.dtype, inner)


@register_lowering(aten.embedding)
def _embedding(g, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    shape = out_shape(g)
    ishape = tuple(indices.shape)
    ld = weight.make_loader()
    ind = _indirect(g, indices, ishape, weight.shape[0])
    n = len(ishape)
    return Pointwise(shape, weight.dtype, lambda idx: ld([ind(idx[:n]), idx[n]]))


# ---- piecewise: cat and the scatter-into-view ops ------------------------------------------------
@register_lowering(aten.cat)
def _cat(g, tensors, dim=0):
    shape = out_shape(g)
    dt = out_dtype(g)
    dim = H.wrap_dim(dim, len(shape))
    parts = [t for t in tensors if isinstance(t, IRNode) and len(t.shape) == len(shape) and t.shape[dim] != 0]
    if not parts:
        raise Unsupported("cat of empty tensors")
    offsets, o = [], 0
    for t in parts:
        offsets.append(o)
        o += t.shape[dim]
    loaders = [loader(g, t, tuple(t.shape), dt) for t in parts]

    def inner(idx):
        i = ops.index_expr(idx[dim], D.int64)
        out = None
        for k in range(len(parts) - 1, -1, -1):
            sub = list(idx)
            sub[dim] = idx[dim] - offsets[k]
            lo = ops.ge(i, ops.constant(offsets[k], D.int64))
            hi = ops.lt(i, ops.constant(offsets[k] + parts[k].shape[dim], D.int64))
            mask = hi if k == 0 else lo if k == len(parts) - 1 else ops.logical_and(lo, hi)
            if len(parts) == 1:
                return loaders[k](sub)
            v = ops.masked(mask, (lambda s=sub, k=k: loaders[k](s)), 0)
            out = v if out is None else ops.where(mask, v, out)
        return out
    return Pointwise(shape, dt, inner)


@register_lowering(aten.slice_scatter)
def _slice_scatter(g, x, src, dim=0, start=None, end=None, step=1):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd)
    start, end, step = _slice_params(x.shape[dim], start, end, step)
    shape, dt = out_shape(g), out_dtype(g)
    lx = loader(g, x, shape, dt)
    ls = loader(g, src, tuple(src.shape), dt)
    n = src.shape[dim]

    def inner(idx):
        i = ops.index_expr(idx[dim], D.int64)
        rel = ops.sub(i, ops.constant(start, D.int64))
        mask = ops.logical_and(ops.ge(rel, ops.constant(0, D.int64)),
                               ops.lt(rel, ops.constant(n * step, D.int64)))
        if step != 1:
            mask = ops.logical_and(mask, ops.eq(ops.remainder(rel, ops.constant(step, D.int64)),
                                                ops.constant(0, D.int64)))
        sub = list(idx)
        sub[dim] = (idx[dim] - start) // step if step != 1 else idx[dim] - start
        return ops.where(mask, ops.masked(mask, lambda: ls(sub), 0), lx(idx))
    return Pointwise(shape, dt, inner)


@register_lowering(aten.select_scatter)
def _select_scatter(g, x, src, dim, index):
    nd = len(x.shape)
    dim = H.wrap_dim(dim, nd)
    if index < 0:
        index += x.shape[dim]
    shape, dt = out_shape(g), out_dtype(g)
    lx = loader(g, x, shape, dt)
    ls = loader(g, src, tuple(src.shape), dt)

    def inner(idx):
        mask = ops.eq(ops.index_expr(idx[dim], D.int64), ops.constant(index, D.int64))
        sub = list(idx[:dim]) + list(idx[dim + 1:])
        return ops.where(mask, ops.masked(mask, lambda: ls(sub), 0), lx(idx))
    return Pointwise(shape, dt, inner)


@register_lowering(aten.constant_pad_nd)
def _constant_pad_nd(g, x, pad, value=0):
    shape, dt = out_shape(g), out_dtype(g)
    nd = len(x.shape)
    ld = loader(g, x, tuple(x.shape), dt)
    lows = [0] * nd
    for k in range(len(pad) // 2):
        lows[nd - 1 - k] = pad[2 * k]
    if any(p < 0 for p in pad):
        raise Unsupported("negative padding")

    def inner(idx):
        mask = None
        sub = []
        for d in range(nd):
            sub.append(idx[d] - lows[d])
            if lows[d] or shape[d] != x.shape[d]:
                i = ops.index_expr(idx[d], D.int64)
                m = ops.logical_and(ops.ge(i, ops.constant(lows[d], D.int64)),
                                    ops.lt(i, ops.constant(lows[d] + x.shape[d], D.int64)))
                mask = m if mask is None else ops.logical_and(mask, m)
        if mask is None:
            return ld(sub)
        return ops.where(mask, ops.masked(mask, lambda: ld(sub), 0), ops.constant(value, dt))
    return Pointwise(shape, dt, inner)
