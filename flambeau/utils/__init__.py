"""flambeau.utils: dispatch modes, hooks handles, and (as submodules) data loading and friends."""
from __future__ import annotations

import importlib

from . import hooks  # noqa: F401


def __getattr__(name):
    # submodules owned by other parts of the library (data, checkpoint, ...) load on first use
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            raise AttributeError(f"module 'flambeau.utils' has no attribute '{name}'") from None
        raise

