"""torch.jit: TorchScript. flambeau has no TorchScript compiler; this module answers the questions
model code asks at run time (`is_scripting()`, `is_tracing()`: never) and keeps the marker
decorators (`ignore`, `unused`, `export`) and `script` on plain functions, which run as Python.
`flambeau.compile` is the compiler."""
from __future__ import annotations

from typing import Callable, Final  # noqa: F401  (torch.jit.Final)

__all__ = ["is_scripting", "is_tracing", "script", "ignore", "unused", "export", "Final"]


def is_scripting() -> bool:
    return False


def is_tracing() -> bool:
    return False


def script(obj, optimize=None, _frames_up: int = 0, _rcb=None, example_inputs=None):
    """The function or module itself: it runs as Python (there is no TorchScript here)."""
    return obj


def ignore(drop=False, **kwargs):
    """Marks a function TorchScript should leave to Python; all functions run as Python here."""
    if callable(drop):
        return drop
    return lambda fn: fn


def unused(fn: Callable) -> Callable:
    return fn


def export(fn: Callable) -> Callable:
    return fn
