"""FSDP1's `FullyShardedDataParallel` (PyTorch's `fsdp.fully_sharded_data_parallel`): the class, not the wrapper.

Libraries test `isinstance(module, FullyShardedDataParallel)` (transformers' generate does) whenever
`distributed.is_available()`; no module here is ever one. Constructing it raises NotImplementedError
pointing to FSDP2's `fully_shard`, which is implemented (`_fully_shard.py`).
"""
from __future__ import annotations

from ...nn.modules.module import Module


class FullyShardedDataParallel(Module):
    """FSDP1's wrapper; refused on construction (use `flambeau.distributed.fsdp.fully_shard`)."""

    def __init__(self, module: Module, *args, **kwargs) -> None:
        raise NotImplementedError("FullyShardedDataParallel (FSDP1) is not implemented; shard the module with "
                                  "FSDP2's flambeau.distributed.fsdp.fully_shard(module, mesh=...) instead")
