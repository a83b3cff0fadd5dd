"""Shapes of shards: which piece of a global tensor a rank holds under a mesh and its placements.

`compute_local_shape_and_global_offset(global_shape, mesh, placements)` is PyTorch's: the shape of
this rank's local tensor and the global index of its first element. Mesh dimensions apply left to
right: a tensor dimension sharded by two mesh dimensions is cut by the first, and each piece again by
the second. Distributed checkpointing reads it to reshard on load.
"""
from __future__ import annotations

from .placement_types import Shard

__all__ = ["compute_local_shape_and_global_offset", "compute_local_shape", "local_shape_at"]


def _normalized(placement, ndim: int):
    if isinstance(placement, Shard) and placement.dim < 0:
        return Shard(placement.dim + ndim)
    return placement


def local_shape_at(global_shape, mesh_shape, placements, coordinate) -> tuple:
    """(local shape, global offset) of the rank at mesh `coordinate`."""
    shape = list(global_shape)
    offset = [0] * len(shape)
    for mesh_dim, placement in enumerate(placements):
        placement = _normalized(placement, len(shape))
        if isinstance(placement, Shard):
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
