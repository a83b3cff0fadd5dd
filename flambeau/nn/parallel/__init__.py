"""torch.nn.parallel: DataParallel and DistributedDataParallel at PyTorch's paths.

`DistributedDataParallel` lives in `distributed.py` (bucketed async all-reduce over a process group).
`DataParallel` over at most one device is what PyTorch does on one device: it calls the module itself
(after moving it to that device); replicating over several GPUs is not implemented and says so.
"""
from __future__ import annotations

from ... import cuda
from ..modules.module import Module
from .distributed import DistributedDataParallel

__all__ = ["DataParallel", "DistributedDataParallel", "data_parallel"]


def _device_ids(device_ids) -> list:
    """PyTorch's default: every visible cuda device, none on a machine without cuda."""
    if device_ids is None:
        return list(range(cuda.device_count())) if cuda.is_available() else []
    return [getattr(d, "index", d) for d in device_ids]


def _single_device(what: str, ids: list) -> None:
    if len(ids) > 1:
        raise NotImplementedError(f"{what}: replicating a module over {len(ids)} devices ({ids}) is not "
                                  "implemented in flambeau; pass device_ids=[one device] or use one GPU")


class DataParallel(Module):
    """`module` run on one device (or on the cpu when there is no GPU), as PyTorch does there."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0) -> None:
        super().__init__()
        ids = _device_ids(device_ids)
        _single_device("DataParallel", ids)
        self.module = module
        self.device_ids = ids
        self.dim = dim
        self.output_device = ids[0] if output_device is None and ids else output_device
        if ids:
            self.module.to(f"cuda:{ids[0]}")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


def data_parallel(module: Module, inputs, device_ids=None, output_device=None, dim: int = 0,
                  module_kwargs=None):
    """The functional DataParallel: `module(*inputs)` on one cuda device; without one PyTorch's
    RuntimeError (it has no device to scatter to)."""
    ids = _device_ids(device_ids)
    if not ids:
        raise RuntimeError("device type could not be determined")
    _single_device("data_parallel", ids)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return module(*inputs, **(module_kwargs or {}))
