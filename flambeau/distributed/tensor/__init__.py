"""torch.distributed.tensor: DTensor, its placements, and `distribute_tensor` / `distribute_module`.

`DTensor` (`_api.py`) wraps each rank's local piece of a global tensor laid out over a `DeviceMesh`;
operators on it run by per-op sharding rules declared with the ops (`flambeau/_ops/_sharding.py`,
interpreted by `_dispatch.py`), data moves between placements by collectives (`_redistribute.py`),
and `_utils.py` says which piece a rank holds. Tensor parallelism builds on it (`parallel/`).
"""
from __future__ import annotations

from ...nn.parameter import Parameter
from ..device_mesh import DeviceMesh, init_device_mesh
from ._api import DTensor, distribute_tensor
from ._dispatch import FALLBACK_COUNTS, ops_with_rules
from .placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "DeviceMesh", "distribute_tensor", "distribute_module", "init_device_mesh", "Shard",
           "Replicate", "Partial", "Placement", "ops_with_rules", "FALLBACK_COUNTS"]


def distribute_module(module, device_mesh=None, partition_fn=None, input_fn=None, output_fn=None):
    """Apply `partition_fn(name, submodule, mesh)` to every submodule (default: replicate every
    parameter and buffer as a DTensor), and install `input_fn(module, inputs, mesh)` /
    `output_fn(module, outputs, mesh)` as forward hooks (PyTorch's `distribute_module`)."""
    if device_mesh is None:
        raise RuntimeError("distribute_module: device_mesh is required")

    def replicate_all(name, mod, mesh):
        for key, p in list(mod._parameters.items()):
            if p is not None and not isinstance(p, DTensor):
                mod._parameters[key] = Parameter(distribute_tensor(p.detach(), mesh, [Replicate()] * mesh.ndim),
                                                 p.requires_grad)
        for key, b in list(mod._buffers.items()):
            if b is not None and not isinstance(b, DTensor):
                mod._buffers[key] = distribute_tensor(b, mesh, [Replicate()] * mesh.ndim)
    for name, sub in module.named_modules():
        (partition_fn or replicate_all)(name, sub, device_mesh)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    return module
