"""Helpers of graph capture shared with tests (`counters`, see `flambeau._counters`) and with the
variable trackers: `is_disabled` reads the mark that `flambeau._dynamo.disable` leaves on a function."""
from __future__ import annotations

from .._counters import counters, record_fallback  # noqa: F401


def is_disabled(fn) -> bool:
    return bool(getattr(fn, "_flambeau_dynamo_disable", False))
