"""torch.distributed.fsdp: FSDP2's `fully_shard`, `FSDPModule` and `MixedPrecisionPolicy` (`_fully_shard.py`)."""
from __future__ import annotations

from ._fully_shard import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, UnshardHandle,
                           fully_shard)

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "UnshardHandle"]
