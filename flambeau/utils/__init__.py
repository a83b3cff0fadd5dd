"""flambeau.utils: dispatch modes, hooks handles, and (as submodules) data loading and friends;
`rename_privateuse1_backend` and the other third-party-device functions of `backend_registration`."""
from __future__ import annotations

import importlib

from . import hooks  # noqa: F401


# functions of submodules, loaded with them on first use
_FROM_SUBMODULES = {"rename_privateuse1_backend": "backend_registration",
                    "generate_methods_for_privateuse1_backend": "backend_registration",
                    "register_privateuse1_array_backend": "backend_registration"}


def __getattr__(name):
    if name in _FROM_SUBMODULES:
        return getattr(importlib.import_module(f"{__name__}.{_FROM_SUBMODULES[name]}"), name)
    # submodules owned by other parts of the library (data, checkpoint, ...) load on first use
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            raise AttributeError(f"module 'flambeau.utils' has no attribute '{name}'") from None
        raise

