"""torch.distributed._tensor: the name DTensor had before `torch.distributed.tensor`; PyTorch keeps it for
scripts written then (its own tensor-parallel examples import `Shard`, `Replicate` and the device mesh from
here). The same objects as `flambeau.distributed.tensor`."""
from __future__ import annotations

from ..tensor import (DTensor, DeviceMesh, Partial, Placement, Replicate, Shard, distribute_module,  # noqa: F401
                      distribute_tensor, init_device_mesh)

__all__ = ["DTensor", "DeviceMesh", "distribute_tensor", "distribute_module", "init_device_mesh", "Shard",
           "Replicate", "Partial", "Placement"]
