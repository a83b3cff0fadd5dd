"""The deprecated per-device `autocast` and `GradScaler` classes of `flambeau.cpu.amp` and `flambeau.cuda.amp`.

Both modules take their pair from `device_aliases`, so the warning text and the forwarded arguments
are written once."""
from __future__ import annotations

import warnings

from .._dtype import dtype as _Dtype
from . import autocast_mode as _ac
from . import grad_scaler as _gs


def device_aliases(device: str, default_dtype: _Dtype) -> tuple[type, type]:
    """The `autocast` and `GradScaler` subclasses that `flambeau.<device>.amp` exports: each warns as
    PyTorch's does (FutureWarning) and is `flambeau.amp.<name>(device, ...)`."""

    class autocast(_ac.autocast):
        __doc__ = f"`flambeau.{device}.amp.autocast(args...)` is `flambeau.amp.autocast({device!r}, args...)` " \
                  "(deprecated)."

        def __init__(self, enabled: bool = True, dtype: _Dtype = default_dtype, cache_enabled: bool = True):
            warnings.warn(f"`torch.{device}.amp.autocast(args...)` is deprecated. Please use "
                          f"`torch.amp.autocast('{device}', args...)` instead.", FutureWarning, stacklevel=2)
            super().__init__(device, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    class GradScaler(_gs.GradScaler):
        __doc__ = f"`flambeau.{device}.amp.GradScaler(args...)` is `flambeau.amp.GradScaler({device!r}, args...)` " \
                  "(deprecated)."

        def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000, enabled: bool = True) -> None:
            warnings.warn(f"`torch.{device}.amp.GradScaler(args...)` is deprecated. Please use "
                          f"`torch.amp.GradScaler('{device}', args...)` instead.", FutureWarning, stacklevel=2)
            super().__init__(device, init_scale=init_scale, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

    module = f"flambeau.{device}.amp"
    autocast.__module__ = GradScaler.__module__ = module
    return autocast, GradScaler
