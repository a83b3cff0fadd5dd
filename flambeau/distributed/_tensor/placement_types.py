"""torch.distributed._tensor.placement_types: the placements' old home (`flambeau.distributed.tensor`)."""
from __future__ import annotations

from ..tensor.placement_types import Partial, Placement, Replicate, Shard  # noqa: F401

__all__ = ["Placement", "Shard", "Replicate", "Partial"]
