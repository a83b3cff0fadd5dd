"""Lowering rules for the ops that write into a copy of a tensor: scatter, scatter_add,
scatter_reduce, index_put, diagonal_scatter, as_strided_scatter, and the mutation `copy_`.

scatter/scatter_add/scatter_reduce/index_put/as_strided_scatter are `ir.Scatter` loops: the
destination is copied into a new buffer, then a loop over the index (or source) elements stores,
or combines (adds, multiplies, takes the max or min), each value at its target element. Indices read from tensors are bounds-checked in the loop (an out-of-range
index sets the kernel's error flag and the wrapper raises PyTorch's exception, nothing is written
outside the buffer): index_put wraps negative indices like advanced indexing, scatter does not.
diagonal_scatter is a pointwise select over the output index, like slice_scatter and
select_scatter (in `lowering_views`).

`copy_(dst, src)` in a graph that still has mutations (a plain trace, or the copy-back of
`functionalize`): the new value of the tensor `dst` aliases (the root of its chain of views) is
computed functionally, a Scatter into the view's elements when `dst` is a view, and every alias
lowered so far is re-lowered on it, so later readers see the write. A graph input written this
way is copied back into the caller's tensor at the end of the compiled call (`GraphLowering.mutations`).
"""
from __future__ import annotations

import math
import operator

import numpy as np

from .. import _dtype as D
from .._ops import _helpers as H
from .index import contiguous_strides, offset_of
from .ir import Buffer, Layout, Pointwise, Scatter, StridedView, Unsupported, ops
from .._decomp._table import aten
from .lowering import loader, out_dtype, out_shape, register_lowering
from .sizevars import size_tuple


def _scatter_target(g, shape, dim, index):
    """(dim wrapped, target_fn, parallel dims) of a scatter along `dim`: element `i` of `index`
    goes to the output element `i` with its `dim` coordinate replaced by `index[i]` (checked, not
    wrapped: a negative index is out of range, as PyTorch's scatter)."""
    nd = len(shape)
    ishape = tuple(index.shape)
    if nd == 0 or len(ishape) != nd:
        raise Unsupported("scatter of a 0-dim tensor")
    dim = H.wrap_dim(dim, nd)
    ld_index = loader(g, index, ishape, D.int64)
    strides = contiguous_strides(shape)

    def target(idx):
        full = list(idx)
        full[dim] = ops.indirect_indexing(ld_index(idx), shape[dim], False)
        return offset_of(full, strides)
    return dim, target, [d for d in range(nd) if d != dim]


@register_lowering(aten.scatter.src, aten.scatter_add)
def _scatter(g, x, dim, index, src):
    shape, dt = out_shape(g), out_dtype(g)
    dim, target, par = _scatter_target(g, shape, dim, index)
    ld_src = src.make_loader()
    return g.realize(Scatter(shape, dt, loader(g, x, shape, dt), tuple(index.shape), target,
                             lambda idx: ops.to_dtype(ld_src(idx), dt),
                             "sum" if g.node.target.name == "scatter_add" else None, par))


# scatter_reduce's reductions as Scatter combines (mean: a sum, divided by the count after)
_SCATTER_REDUCE = {"sum": "sum", "mean": "sum", "prod": "prod", "amax": "max", "amin": "min"}


def _reduce_identity(reduce: str, dt):
    """The element that `reduce` leaves unchanged, in `dt` (what include_self=False starts from)."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    lowest = reduce == "amax"
    if dt is D.bool:
        return not lowest
    if dt.category == D.FLOATING:
        return -math.inf if lowest else math.inf
    info = np.iinfo(dt.np)
    return info.min if lowest else info.max


@register_lowering(aten.scatter_reduce)
def _scatter_reduce(g, x, dim, index, src, reduce, include_self=True):
    """Loops over `index` combining `src` into a copy of `x` (sum/prod/amax/amin, on bool: or/and);
    include_self=False first stores the reduction's identity at every target; mean divides the
    sum by a second scatter's count (1 + hits with include_self, else hits; at least 1), as the
    eager kernel: true division for floats, floor division in int64 for integers."""
    shape, dt = out_shape(g), out_dtype(g)
    if reduce not in _SCATTER_REDUCE:
        raise Unsupported(f"scatter_reduce with reduce={reduce!r}")
    if reduce == "mean" and dt is D.bool:
        raise Unsupported("scatter_reduce mean of bool")
    dim, target, par = _scatter_target(g, shape, dim, index)
    ishape = tuple(index.shape)
    init = loader(g, x, shape, dt)
    if not include_self:
        ident = _reduce_identity(reduce, dt)
        init = g.realize(Scatter(shape, dt, init, ishape, target, lambda idx: ops.constant(ident, dt), None,
                                 par)).make_loader()
    ld_src = src.make_loader()
    out = g.realize(Scatter(shape, dt, init, ishape, target, lambda idx: ops.to_dtype(ld_src(idx), dt),
                            _SCATTER_REDUCE[reduce], par))
    if reduce != "mean":
        return out
    count = g.realize(Scatter(shape, D.int64, lambda idx: ops.constant(int(include_self), D.int64), ishape,
                              target, lambda idx: ops.constant(1, D.int64), "sum", par)).make_loader()
    total = out.make_loader()

    def mean(idx):
        n = ops.maximum(count(idx), ops.constant(1, D.int64))
        if dt.category == D.FLOATING:
            return ops.div(total(idx), ops.to_dtype(n, dt))
        return ops.to_dtype(ops.floor_divide(ops.to_dtype(total(idx), D.int64), n), dt)
    return Pointwise(shape, dt, mean)


@register_lowering(aten.index_put)
def _index_put(g, x, indices, values, accumulate=False):
    shape, dt = out_shape(g), out_dtype(g)
    nd = len(shape)
    indices = list(indices) + [None] * (nd - len(indices))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos or any(indices[i].dtype not in (D.int64, D.int32) for i in pos):
        raise Unsupported("index_put with boolean masks or without indices")
    bshape = H.broadcast_shapes(*[tuple(indices[i].shape) for i in pos])
    nb = len(bshape)
    first = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    rest = [shape[d] for d in range(nd) if indices[d] is None]
    tshape = tuple(rest[:first]) + tuple(bshape) + tuple(rest[first:])     # the shape of x[indices]
    loads = {i: loader(g, indices[i], bshape, D.int64) for i in pos}
    strides = contiguous_strides(shape)

    def target(idx):
        bidx, others = list(idx[first:first + nb]), iter(list(idx[:first]) + list(idx[first + nb:]))
        full = [ops.indirect_indexing(loads[d](bidx), shape[d]) if indices[d] is not None else next(others)
                for d in range(nd)]
        return offset_of(full, strides)
    free = [j for j in range(len(tshape)) if not first <= j < first + nb]
    return g.realize(Scatter(shape, dt, loader(g, x, shape, dt), tshape, target, loader(g, values, tshape, dt),
                             "sum" if accumulate else None, free))


@register_lowering(aten.diagonal_scatter)
def _diagonal_scatter(g, x, src, offset=0, dim1=0, dim2=1):
    shape, dt = out_shape(g), out_dtype(g)
    nd = len(shape)
    d1, d2 = H.wrap_dim(dim1, nd), H.wrap_dim(dim2, nd)
    lx = loader(g, x, shape, dt)
    ls = loader(g, src, tuple(src.shape), dt)
    keep = [d for d in range(nd) if d not in (d1, d2)]
    first_row = max(-offset, 0)            # diagonal element k is x[first_row + k, first_row + k + offset]

    def inner(idx):
        i1, i2 = ops.index_expr(idx[d1], D.int64), ops.index_expr(idx[d2], D.int64)
        mask = ops.eq(ops.sub(i2, i1), ops.constant(offset, D.int64))
        sub = [idx[d] for d in keep] + [idx[d1] - first_row]
        return ops.where(mask, ops.masked(mask, lambda: ls(sub), 0), lx(idx))
    return Pointwise(shape, dt, inner)


@register_lowering(aten.as_strided_scatter)
def _as_strided_scatter(g, x, src, size, stride, storage_offset=None):
    shape, dt = out_shape(g), out_dtype(g)
    xv = g.node.args[0].meta.get("val")
    if xv is None or not xv.is_contiguous():
        raise Unsupported("as_strided_scatter into a non-contiguous tensor")
    lay = Layout(size_tuple(size), dt, size_tuple(stride), storage_offset or 0)
    return g.realize(_store_into_view(g, x, lay, src))


def _store_into_view(g, base, lay: Layout, src) -> Scatter:
    """A copy of `base` (viewed as contiguous memory) with `src` stored into its view `lay`."""
    shape = tuple(base.shape)
    value = loader(g, src, lay.shape, lay.dtype)
    par = range(len(lay.shape)) if _non_overlapping(lay) else ()
    return Scatter(shape, lay.dtype, loader(g, base, shape, lay.dtype), lay.shape,
                   lambda idx: offset_of(idx, lay.strides, lay.offset), value, None, par)


def _non_overlapping(lay: Layout) -> bool:
    """No two elements of the view share memory (provably, for every size)."""
    dims = [(st, s) for st, s in zip(lay.strides, lay.shape) if s != 1]
    if any(not isinstance(st, int) or not isinstance(s, int) for st, s in dims):
        return False
    span = 1
    for st, s in sorted(dims):
        if st < span:
            return False
        span = st * s
    return True


# ---- copy_: a mutation, lowered functionally --------------------------------------------------------
_ALIASING = ("detach", "lift_fresh", "_pw_real", "_pw_imag")


@register_lowering(aten.copy_)
def _copy_(g, dst, src, non_blocking=False):
    node = g.node
    chain = [node.args[0]]                  # dst's node, its view parents, ..., the root tensor
    while chain[-1] in g.view_parent:
        chain.append(g.view_parent[chain[-1]])
    root = chain[-1]
    _check_root(root)
    rv = g.env[root]
    dt = rv.dtype
    if all(_is_copy_(n) for n in chain[:-1]):       # dst is the whole tensor
        new = Pointwise(tuple(rv.shape), dt, loader(g, src, tuple(rv.shape), dt))
    else:
        new = _store_into_view(g, rv, _view_layout(g, chain), src)
    if root.op == "placeholder" or isinstance(new, Scatter):
        new = g.realize(new)
    g.env[root] = new
    if root.op == "placeholder":
        g.mutations[[n for n in g.gm.graph.nodes if n.op == "placeholder"].index(root)] = new
    for n, parent in list(g.view_parent.items()):        # (in lowering order: parents first)
        if _root_of(g, n) is root:
            g.env[n] = g.env[parent] if _is_copy_(n) else g.lower_node(n)
    return g.env[chain[0]]


def _is_copy_(n) -> bool:
    return getattr(n.target, "name", None) == "copy_"


def _root_of(g, n):
    while n in g.view_parent:
        n = g.view_parent[n]
    return n


def _check_root(root):
    """The root must own its memory: a graph input or the fresh result of a computing op."""
    if root.op == "placeholder":
        return
    t = root.target
    if t is operator.getitem:
        t = root.args[0].target
    if root.op != "call_function" or getattr(t, "is_view", False) or getattr(t, "name", "") in _ALIASING:
        raise Unsupported(f"copy_ into an alias of {root.name} that the compiler doesn't track")


def _view_layout(g, chain) -> Layout:
    """The layout, over `chain[-1]` viewed as contiguous memory, of the view `chain[0]`: the view
    rules re-run on a probe buffer standing for the root."""
    root = chain[-1]
    probe = Buffer("view_probe", Layout(tuple(g.env[root].shape), g.env[root].dtype))
    saved = {n: g.env[n] for n in chain}
    prev = g.node
    g.env[root] = probe
    try:
        for n in reversed(chain[:-1]):
            if _is_copy_(n):
                g.env[n] = g.env[n.args[0]]
                continue
            rule = getattr(n.target, "lowering", None)
            if rule is None:
                raise Unsupported(f"copy_ into a view by {n.target.name}")
            g.node = n
            args, kwargs = g.map_args(n)
            g.env[n] = rule(g, *n.target.bind(*args, **kwargs))
        v = g.env[chain[0]]
    finally:
        g.env.update(saved)
        g.node = prev
    if v is probe:
        return probe.layout
    if isinstance(v, StridedView) and v.base is probe:
        return v.layout
    raise Unsupported("copy_ into a view that strides cannot express")

