"""Deprecated `flambeau.cuda.amp` aliases of `flambeau.amp.autocast("cuda")`, `GradScaler("cuda")`,
`custom_fwd` and `custom_bwd`."""
from __future__ import annotations

import functools
import warnings

from .. import _dtype as D
from ..amp import autocast_mode as _ac
from ..amp._deprecated import device_aliases


autocast, GradScaler = device_aliases("cuda", D.float16)


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
