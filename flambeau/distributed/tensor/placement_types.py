"""Placements: how a DTensor is laid out along one mesh dimension (PyTorch's `placement_types`).

`Shard(dim)`: each rank of the mesh dimension holds one piece of tensor dimension `dim`, cut as
`torch.chunk` cuts. `Replicate()`: every rank holds the whole tensor. `Partial(reduce_op)`: every rank
holds a full-shape term and the value is their reduction. The classes are declared in the ops layer
(`flambeau._ops._sharding`), where the per-op sharding rules speak them. `_StridedShard(d, sf)` cuts the
pieces that the later mesh dimensions' `Shard(d)` make (`sf` of them) again: FSDP x TP's colwise pieces,
`(_StridedShard(0, sf=tp), Shard(0))`; a rank's piece is one block of the tensor (`_utils`).
"""
from __future__ import annotations

from ..._ops._sharding import Partial, Placement, Replicate, Shard

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class _StridedShard(Placement):
    """PyTorch's strided shard of dimension `dim` in `split_factor` groups (not a `Shard`, as in PyTorch).

    Supported where the later mesh dimensions cut `dim` in `split_factor` pieces, each cut again by this one
    (as torch.chunk, so uneven pieces follow FSDP's cut of its tensor-parallel piece); other uses raise
    NotImplementedError. Elementwise ops keep it, other ops gather it first (`_dispatch`)."""
    __slots__ = ("dim", "split_factor")

    def __init__(self, dim: int, *, split_factor: int = 1, sf: int | None = None) -> None:
        self.dim, self.split_factor = dim, split_factor if sf is None else sf

    def __eq__(self, other) -> bool:
        return type(other) is _StridedShard and (other.dim, other.split_factor) == (self.dim, self.split_factor)

    def __hash__(self) -> int:
        return hash(("_StridedShard", self.dim, self.split_factor))

    def __repr__(self) -> str:
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"

    def __str__(self) -> str:
        return f"_S({self.dim}, {self.split_factor})"
