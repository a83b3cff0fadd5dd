"""Moving a DTensor's local data between placements, one mesh dimension at a time, by collectives.

Per mesh dimension: Shard -> Replicate is an all-gather (uneven pieces as torch.chunk cut them),
Partial -> Replicate an all-reduce, Partial -> Shard a reduce-scatter, Replicate -> Shard a local cut,
Replicate -> Partial a local fill (rank 0 keeps the value for a sum, the others hold zeros); any other
change passes through Replicate. Shards are undone right to left and made left to right, because a
tensor dimension cut by two mesh dimensions is cut by the first and each piece again by the second. A
`_StridedShard` is the innermost cut (it cuts the later mesh dimensions' pieces, `_utils`): undone first (an
all-gather of its pieces of this rank's piece), made last (a local cut of it).

`redistribute_local` works on plain local tensors (no autograd; DTensor's `redistribute` wraps it in a
differentiable function). The collectives are `flambeau.distributed`'s, on each mesh dimension's group.
"""
from __future__ import annotations

from ... import _state
from ..._ops.creation import empty, zeros_like
from ..._ops.shape import cat
from ..collectives import all_gather, all_reduce, reduce_scatter
from ..distributed_c10d import ReduceOp
from ._utils import local_shape_at
from .placement_types import Partial, Replicate, Shard, _StridedShard

_REDUCE = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
           "product": ReduceOp.PRODUCT}
REPLICATE = Replicate()


def normalize(placements, ndim: int) -> tuple:
    """Placements with negative Shard dims made positive."""
    return tuple(Shard(p.dim % ndim) if isinstance(p, Shard) and p.dim < 0 else p for p in placements)


def _piece_sizes(global_shape, mesh, placements, mesh_dim: int, dim: int) -> list:
    """Sizes along `dim` of the pieces mesh dimension `mesh_dim` cuts, given `placements` elsewhere."""
    before = list(placements)
    before[mesh_dim] = REPLICATE
    full = local_shape_at(global_shape, mesh.shape, before, mesh.get_coordinate())[0][dim]
    n = mesh.size(mesh_dim)
    return [Shard.local_range(full, n, k)[1] for k in range(n)]


def _gather(local, mesh, mesh_dim: int, dim: int, sizes: list):
    front = local.movedim(dim, 0).contiguous()
    rest = tuple(front.shape[1:])
    outs = [empty((s,) + rest, dtype=local.dtype, device=local.device) for s in sizes]
    all_gather(outs, front, group=mesh.get_group(mesh_dim))
    return cat(outs, 0).movedim(0, dim).contiguous()


def _cut(local, mesh, mesh_dim: int, dim: int):
    start, length = Shard.local_range(local.shape[dim], mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim))
    return local.narrow(dim, start, length).clone()


def _reduce(local, mesh, mesh_dim: int, reduce_op: str):
    out = local.clone()
    all_reduce(out, op=_REDUCE[reduce_op], group=mesh.get_group(mesh_dim))
    return out


def _reduce_scatter(local, mesh, mesh_dim: int, dim: int, reduce_op: str):
    n, me = mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim)
    front = local.movedim(dim, 0).contiguous()
    sizes = [Shard.local_range(front.shape[0], n, k)[1] for k in range(n)]
    pieces, start = [], 0
    for s in sizes:
        pieces.append(front.narrow(0, start, s).contiguous())
        start += s
    out = empty(tuple(pieces[me].shape), dtype=local.dtype, device=local.device)
    reduce_scatter(out, pieces, op=_REDUCE[reduce_op], group=mesh.get_group(mesh_dim))
    return out.movedim(0, dim).contiguous()


def _to_partial(local, mesh, mesh_dim: int, placement: Partial):
    if placement.reduce_op == "sum" and mesh.get_local_rank(mesh_dim) != 0:
        return zeros_like(local)
    return local.clone()


def redistribute_local(local, mesh, src: tuple, dst: tuple, global_shape: tuple):
    """This rank's local tensor of the same global tensor laid out by `dst` instead of `src`."""
    ndim = len(global_shape)
    src, dst = normalize(src, ndim), normalize(dst, ndim)
    if src == dst:
        return local
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False
    try:
        return _redistribute(local, mesh, list(src), dst, global_shape)
    finally:
        _state.tls.grad_enabled = prev


def _must_unshard(cur: list, dst: tuple) -> list:
    """Mesh dims whose shard must be undone: changed ones, and later ones cutting a dimension that an
    earlier mesh dim undoes or newly cuts (their pieces are pieces of that cut)."""
    undo = {i for i, p in enumerate(cur) if isinstance(p, Shard) and p != dst[i]}
    for i in range(len(cur)):
        touched = cur[i] if i in undo else dst[i] if isinstance(dst[i], Shard) and cur[i] != dst[i] else None
        if isinstance(touched, Shard):
            undo |= {j for j in range(i + 1, len(cur)) if cur[j] == Shard(touched.dim)}
    return sorted(undo, reverse=True)


def _redistribute(local, mesh, cur: list, dst: tuple, global_shape: tuple):
    strided = [i for i, p in enumerate(cur) if isinstance(p, _StridedShard)]
    for i in strided:
        d = cur[i].dim
        local = _gather(local, mesh, i, d, _piece_sizes(global_shape, mesh, cur, i, d))
        cur[i] = REPLICATE
    for i in _must_unshard(cur, dst):
        d = cur[i].dim
        local = _gather(local, mesh, i, d, _piece_sizes(global_shape, mesh, cur, i, d))
        cur[i] = REPLICATE
    for i, (c, want) in enumerate(zip(cur, dst)):
        if isinstance(c, Partial) and c != want and not isinstance(want, Shard):
            local = _reduce(local, mesh, i, c.reduce_op)
            cur[i] = REPLICATE
    for i, want in enumerate(dst):
        c = cur[i]
        if c == want or isinstance(want, _StridedShard):
            continue
        if isinstance(want, Shard):
            local = _reduce_scatter(local, mesh, i, want.dim, c.reduce_op) if isinstance(c, Partial) else \
                _cut(local, mesh, i, want.dim)
        elif isinstance(want, Partial):
            local = _to_partial(local, mesh, i, want)
        cur[i] = want
    for i, want in enumerate(dst):
        if isinstance(want, _StridedShard):
            local = _cut(local, mesh, i, want.dim)
    return local
