"""Deprecated `flambeau.cpu.amp` aliases of `flambeau.amp.autocast("cpu")` and `GradScaler("cpu")`."""
from __future__ import annotations

from .. import _dtype as D
from ..amp._deprecated import device_aliases

autocast, GradScaler = device_aliases("cpu", D.bfloat16)
