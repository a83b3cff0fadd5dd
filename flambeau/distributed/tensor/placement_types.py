"""Placements: how a DTensor is laid out along one mesh dimension (PyTorch's `placement_types`).

`Shard(dim)`: each rank of the mesh dimension holds one piece of tensor dimension `dim`, cut as
`torch.chunk` cuts. `Replicate()`: every rank holds the whole tensor. `Partial(reduce_op)`: every rank
holds a full-shape term and the value is their reduction. The classes are declared in the ops layer
(`flambeau._ops._sharding`), where the per-op sharding rules speak them.
"""
from __future__ import annotations

from ..._ops._sharding import Partial, Placement, Replicate, Shard

__all__ = ["Placement", "Shard", "Replicate", "Partial"]
