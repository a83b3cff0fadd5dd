"""Shapes of shards: which piece of a global tensor a rank holds under a mesh and its placements.

`compute_local_shape_and_global_offset(global_shape, mesh, placements)` is PyTorch's: the shape of
this rank's local tensor and the global index of its first element. Mesh dimensions apply left to
right: a tensor dimension sharded by two mesh dimensions is cut by the first, and each piece again by
the second; except a `_StridedShard(d, sf)`, which cuts after the later mesh dimensions' `Shard(d)` (their
pieces, `sf` of them, each cut again by it: FSDP over the dp dimension of a tensor-parallel piece). So a
rank's piece is still one block of the global tensor. Distributed checkpointing reads it to reshard on load.
"""
from __future__ import annotations

from .placement_types import Shard, _StridedShard

__all__ = ["compute_local_shape_and_global_offset", "compute_local_shape", "local_shape_at", "check_strided"]


def _normalized(placement, ndim: int):
    if isinstance(placement, Shard) and placement.dim < 0:
        return Shard(placement.dim + ndim)
    return placement


def check_strided(placements, mesh_shape, what: str) -> None:
    """A `_StridedShard(d, sf)` is supported where the later mesh dimensions sharding `d` cut it in `sf`."""
    for i, p in enumerate(placements):
        if isinstance(p, _StridedShard):
            later = 1
            for j in range(i + 1, len(placements)):
                if isinstance(placements[j], Shard) and placements[j].dim == p.dim:
                    later *= mesh_shape[j]
            if later != p.split_factor or later == 1:
                raise NotImplementedError(f"{what}: {p!r} on mesh dimension {i} needs the later mesh dimensions to "
                                          f"cut dimension {p.dim} in split_factor pieces (they cut it in {later})")


def local_shape_at(global_shape, mesh_shape, placements, coordinate) -> tuple:
    """(local shape, global offset) of the rank at mesh `coordinate`."""
    shape = list(global_shape)
    offset = [0] * len(shape)
    order = [i for i, p in enumerate(placements) if not isinstance(p, _StridedShard)] + \
        [i for i, p in enumerate(placements) if isinstance(p, _StridedShard)]      # strided cuts come last
    for mesh_dim in order:
        placement = _normalized(placements[mesh_dim], len(shape))
        if isinstance(placement, (Shard, _StridedShard)):
            d = placement.dim
            if not 0 <= d < len(shape):
                raise IndexError(f"Shard({placement.dim}) is out of range for a tensor of {len(shape)} dimensions")
            start, length = Shard.local_range(shape[d], mesh_shape[mesh_dim], coordinate[mesh_dim])
            offset[d] += start
            shape[d] = length
    return tuple(shape), tuple(offset)


def compute_local_shape_and_global_offset(global_shape, mesh, placements) -> tuple:
    """(local_shape, global_offset) of this rank's shard; ((0,) * ndim, ()) when it is not in `mesh`."""
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return (0,) * len(global_shape), ()
    return local_shape_at(global_shape, mesh.shape, placements, coordinate)


def compute_local_shape(global_shape, mesh, placements) -> tuple:
    return compute_local_shape_and_global_offset(global_shape, mesh, placements)[0]
