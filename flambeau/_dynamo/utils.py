"""Helpers of graph capture shared with tests: `counters` (see `flambeau._counters`)."""
from __future__ import annotations

from .._counters import counters, record_fallback  # noqa: F401
