"""Helpers of graph capture shared with tests (`counters`, see `flambeau._counters`), with the
variable trackers and with libraries (`warn_once`): `is_disabled` reads the mark that `flambeau._dynamo.disable` leaves on a function."""
from __future__ import annotations

import warnings

from .._counters import counters, record_fallback  # noqa: F401

_warned: set[str] = set()


def warn_once(msg: str, stacklevel: int = 1) -> None:
    """`warnings.warn(msg)` the first time this message is seen in the process, nothing after (as
    `torch._dynamo.utils.warn_once`, which libraries import)."""
    if msg in _warned:
        return
    _warned.add(msg)
    warnings.warn(msg, stacklevel=stacklevel + 1)


def is_disabled(fn) -> bool:
    return bool(getattr(fn, "_flambeau_dynamo_disable", False))
