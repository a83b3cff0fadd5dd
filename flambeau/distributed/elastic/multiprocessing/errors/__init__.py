"""`@record`, as torchrun scripts write it on their entry point.

Under `python -m flambeau.distributed.run` every worker already records an uncaught exception (message,
traceback, time) for the launcher to report (`flambeau/distributed/_worker.py`), so `record` only keeps
the decorated function's name and documentation and lets the exception through.
"""
from __future__ import annotations

import functools
from typing import Callable

__all__ = ["record"]


def record(fn: Callable, error_handler=None) -> Callable:
    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        return fn(*args, **kwargs)
    return recorded
