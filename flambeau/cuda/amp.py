"""Deprecated `flambeau.cuda.amp` aliases of `flambeau.amp.autocast("cuda")`, `GradScaler("cuda")`,
`custom_fwd` and `custom_bwd`."""
from __future__ import annotations

import functools
import warnings

from .. import _dtype as D
from ..amp import autocast_mode as _ac
from ..amp import grad_scaler as _gs


class autocast(_ac.autocast):
    """`flambeau.cuda.amp.autocast(args...)` is `flambeau.amp.autocast("cuda", args...)` (deprecated)."""

    def __init__(self, enabled: bool = True, dtype=D.float16, cache_enabled: bool = True):
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_gs.GradScaler):
    """`flambeau.cuda.amp.GradScaler(args...)` is `flambeau.amp.GradScaler("cuda", args...)` (deprecated)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """Deprecated form of `flambeau.amp.custom_fwd(device_type="cuda")`."""
    warnings.warn("`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_fwd(args..., device_type='cuda')` instead.", FutureWarning, stacklevel=2)
    if fwd is None:
        return functools.partial(_ac.custom_fwd, device_type="cuda", cast_inputs=cast_inputs)
    return _ac.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """Deprecated form of `flambeau.amp.custom_bwd(device_type="cuda")`."""
    warnings.warn("`torch.cuda.amp.custom_bwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_bwd(args..., device_type='cuda')` instead.", FutureWarning, stacklevel=2)
    return _ac.custom_bwd(bwd, device_type="cuda")
