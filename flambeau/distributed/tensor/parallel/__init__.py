"""torch.distributed.tensor.parallel: `parallelize_module` applies tensor-parallel styles (`style.py`)
to the submodules a plan names (fnmatch patterns on module paths, as PyTorch's)."""
from __future__ import annotations

import fnmatch

from ...device_mesh import DeviceMesh
from .style import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel,
                    SequenceParallel)

__all__ = ["parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "PrepareModuleInput", "PrepareModuleOutput"]


def parallelize_module(module, device_mesh: DeviceMesh | None = None, parallelize_plan=None, *, src_data_rank=0):
    """Apply `parallelize_plan` (a ParallelStyle for `module` itself, or {path pattern: style}) over the
    1-D `device_mesh`; returns `module`, its parameters now DTensors."""
    if device_mesh is None:
        raise RuntimeError("parallelize_module: device_mesh is required")
    if device_mesh.ndim != 1:
        raise ValueError(f"parallelize_module: tensor parallelism needs a 1-D mesh (slice it: mesh['tp']), got "
                         f"{device_mesh.ndim}-D")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: expected a ParallelStyle or a dict, got {type(parallelize_plan).__name__}")
    names = dict(module.named_modules())
    for pattern, style in parallelize_plan.items():
        hits = [n for n in names if n and fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"parallelize_module: no submodule matches {pattern!r}")
        for n in hits:
            style._apply(names[n], device_mesh)
    return module
