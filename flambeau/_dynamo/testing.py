"""Helpers for tests of compiled code (`torch._dynamo.testing`'s role): `CompileCounter`, a backend
that counts frames and ops, and `no_unexpected_fallbacks`, which fails when anything ran eagerly
inside compiled code that the test did not expect (see `flambeau._counters`).

    with no_unexpected_fallbacks({"nonzero": "data-dependent output size"}):
        flambeau.compile(fn)(x)
"""
from __future__ import annotations

import collections
import contextlib
from typing import Iterable, Iterator

from .._counters import FALLBACKS, counters, fallbacks_since


class CompileCounter:
    """A backend counting the graphs it is given (`frame_count`) and their call nodes (`op_count`);
    it runs each graph as captured."""

    def __init__(self):
        self.frame_count = 0
        self.op_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        return gm.forward

    def clear(self) -> None:
        self.frame_count = 0
        self.op_count = 0


def fallback_op(key: str) -> str:
    """The op of a `counters["inductor_fallbacks"]` key (`"<op>: <reason>"`)."""
    return key.split(": ", 1)[0]


def unexpected_fallbacks(recorded: collections.Counter, expected: Iterable[str] = ()) -> list:
    """The keys of `recorded` whose op is not in `expected` (a collection of op names, e.g. a dict
    op -> reason)."""
    allowed = set(expected)
    return sorted(k for k in recorded if fallback_op(k) not in allowed)


@contextlib.contextmanager
def no_unexpected_fallbacks(expected: Iterable[str] = ()) -> Iterator[collections.Counter]:
    """Fail (AssertionError) when the block records a fallback whose op is not in `expected`; yields
    the fallbacks recorded so far (filled in when the block ends)."""
    before = collections.Counter(counters[FALLBACKS])
    seen: collections.Counter = collections.Counter()
    yield seen
    seen.update(fallbacks_since(before))
    bad = unexpected_fallbacks(seen, expected)
    assert not bad, f"unexpected eager fallbacks inside compiled code: {bad}"
