"""User dispatch modes (`flambeau.utils._python_dispatch.TorchDispatchMode`).

A mode is a context manager that pushes itself onto the dispatcher's mode stack
of the calling thread (`flambeau._state.tls.modes`). Every operator call, including those run by derivative formulas during
backward, goes to the innermost mode's `__torch_dispatch__(func, types, args, kwargs)`. While the
handler runs, the dispatcher has popped the mode, so calling `func(*args, **kwargs)` inside it
reaches the next mode (or autograd + the kernel when the stack is empty).
"""
from __future__ import annotations

from .. import _state


class TorchDispatchMode:
    """Subclass and override `__torch_dispatch__`; use as `with MyMode(): ...`."""

    def __init__(self, _dispatch_key=None):
        self._pushed = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise NotImplementedError

    def __enter__(self):
        _state.push_mode(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        _state.remove_mode(self)      # its innermost occurrence (modes nest LIFO)
        return False

    @classmethod
    def push(cls, *args, **kwargs):
        m = cls(*args, **kwargs)
        m.__enter__()
        return m

    @classmethod
    def is_infra_mode(cls) -> bool:
        return False


def _get_current_dispatch_mode():
    """The innermost active mode, or None."""
    modes = _state.tls.modes
    return modes[-1] if modes else None


def _get_current_dispatch_mode_stack() -> list:
    return list(_state.tls.modes)


def _len_torch_dispatch_stack() -> int:
    return len(_state.tls.modes)


def _pop_mode(k=None):
    return _state.pop_mode()


class _pop_mode_temporarily:
    """Run with the innermost mode removed (restored on exit)."""

    def __enter__(self):
        self.mode = _state.pop_mode()
        return self.mode

    def __exit__(self, *exc):
        _state.push_mode(self.mode)
        return False


def is_traceable_wrapper_subclass(t) -> bool:
    return hasattr(type(t), "__tensor_flatten__") and hasattr(type(t), "__tensor_unflatten__")
