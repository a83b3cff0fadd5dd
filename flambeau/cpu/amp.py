"""Deprecated `flambeau.cpu.amp` aliases of `flambeau.amp.autocast("cpu")` and `GradScaler("cpu")`."""
from __future__ import annotations

import warnings

from .. import _dtype as D
from ..amp import autocast_mode as _ac
from ..amp import grad_scaler as _gs


class autocast(_ac.autocast):
    """`flambeau.cpu.amp.autocast(args...)` is `flambeau.amp.autocast("cpu", args...)` (deprecated)."""

    def __init__(self, enabled: bool = True, dtype=D.bfloat16, cache_enabled: bool = True):
        warnings.warn("`torch.cpu.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cpu', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_gs.GradScaler):
    """`flambeau.cpu.amp.GradScaler(args...)` is `flambeau.amp.GradScaler("cpu", args...)` (deprecated)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        warnings.warn("`torch.cpu.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cpu', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
