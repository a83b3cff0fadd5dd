"""torch.distributed._composable.fsdp: FSDP2's earlier import path, the same objects as `distributed.fsdp`."""
from __future__ import annotations

from ...fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, UnshardHandle, fully_shard

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "UnshardHandle"]
