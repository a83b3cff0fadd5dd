"""torch.distributed.fsdp: FSDP2's `fully_shard`, `FSDPModule` and `MixedPrecisionPolicy` (`_fully_shard.py`);
FSDP1's `FullyShardedDataParallel` exists for isinstance checks only (`fully_sharded_data_parallel.py`)."""
from __future__ import annotations

from ._fully_shard import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, UnshardHandle,
                           fully_shard)
from .fully_sharded_data_parallel import FullyShardedDataParallel

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "UnshardHandle",
           "FullyShardedDataParallel"]
