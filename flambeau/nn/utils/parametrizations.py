"""`nn.utils.parametrizations.weight_norm`: the parametrization-style weight norm, exposed with the
hook-based implementation (parameters `<name>_g`/`<name>_v` registered on the module)."""
from __future__ import annotations

from .weight_norm import weight_norm as _weight_norm


def weight_norm(module, name: str = "weight", dim: int = 0):
    return _weight_norm(module, name, dim)
