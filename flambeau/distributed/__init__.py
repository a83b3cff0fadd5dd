"""torch.distributed: process groups and collectives. Not built yet (its own issue), so this
module answers truthfully that it is not available, as PyTorch built without distributed does:
`is_available()` is False and code guarded by it takes its single-process path."""
from __future__ import annotations


def is_available() -> bool:
    """False: flambeau has no process-group backend yet."""
    return False
