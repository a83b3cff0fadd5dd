"""pin_memory: copy every tensor of a (nested) batch into page-locked host memory, keeping its structure."""
from __future__ import annotations

import collections.abc
from typing import Any

from .collate import rebuild_mapping, rebuild_sequence


def pin_memory(data: Any, device: Any = None) -> Any:
    """Tensors and objects with a `pin_memory()` method are pinned; containers are rebuilt around them."""
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return rebuild_mapping(data, {k: pin_memory(v, device) for k, v in data.items()})
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(pin_memory(v, device) for v in data))
        return type(data)(pin_memory(v, device) for v in data)
    if isinstance(data, collections.abc.Sequence):
        return rebuild_sequence(data, [pin_memory(v, device) for v in data])
    return data
