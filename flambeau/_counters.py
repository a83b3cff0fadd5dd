"""What the compile stack did, in counters tests can read (`flambeau._dynamo.utils.counters`, like
`torch._dynamo.utils.counters`): a `defaultdict(Counter)`, cleared with `counters.clear()`.

    counters["frames"]["total"], ["ok"]     frames given to capture, frames that got a compiled entry
    counters["graph_break"][reason]         graph breaks, by reason
    counters["recompiles"][function]        recompiles after a guard failure, by function name
    counters["stats"]["unique_graphs"]      graphs given to a backend
    counters["inductor_fallbacks"]["<op>: <reason>"]
                                            everything that runs eagerly inside compiled code: a node
                                            without a lowering, a graph the code generator cannot take
                                            (op "whole graph"), a call a compiled graph sends to eager,
                                            a frame run eagerly after a backend error or past
                                            config.cache_size_limit (op "whole frame")

`record_fallback(op, reason)` adds to the last and says so under `FLAMBEAU_LOGS=fallbacks` (or
`perf_hints`). The module sits below every compiler layer: capture, AOT autograd and the code
generator all record here.
"""
from __future__ import annotations

import collections

from . import _logging

counters: collections.defaultdict = collections.defaultdict(collections.Counter)
FALLBACKS = "inductor_fallbacks"
_log = _logging.get_logger("flambeau.fallbacks")


def fallback_key(op: str, reason: str) -> str:
    """The counter key of one fallback: `"<op>: <reason>"`."""
    return f"{op}: {reason}"


def record_fallback(op: str, reason: str, *, log: bool = True) -> None:
    """Count that `op` runs eagerly inside compiled code because of `reason` (and log it)."""
    counters[FALLBACKS][fallback_key(op, reason)] += 1
    if log and (_logging.enabled("fallbacks") or _logging.enabled("perf_hints")):
        _log.warning("%s runs eagerly inside compiled code: %s", op, reason)


def fallbacks_since(snapshot: collections.Counter) -> collections.Counter:
    """The fallbacks recorded after `snapshot` (a copy of `counters[FALLBACKS]` taken earlier)."""
    return counters[FALLBACKS] - snapshot
