"""User dispatch modes (`flambeau.utils._python_dispatch.TorchDispatchMode`).

A mode is a context manager that pushes itself onto the dispatcher's mode stack
(`flambeau._state.modes`). Every operator call, including those run by derivative formulas during
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
        _state.modes.append(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        # the innermost occurrence of this mode leaves the stack (modes nest LIFO)
        for i in range(len(_state.modes) - 1, -1, -1):
            if _state.modes[i] is self:
                del _state.modes[i]
                break
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
    return _state.modes[-1] if _state.modes else None


def _get_current_dispatch_mode_stack() -> list:
    return list(_state.modes)


def _len_torch_dispatch_stack() -> int:
    return len(_state.modes)


def _pop_mode(k=None):
    return _state.modes.pop()


class _pop_mode_temporarily:
    """Run with the innermost mode removed (restored on exit)."""

    def __enter__(self):
        self.mode = _state.modes.pop()
        return self.mode

    def __exit__(self, *exc):
        _state.modes.append(self.mode)
        return False


def is_traceable_wrapper_subclass(t) -> bool:
    return hasattr(type(t), "__tensor_flatten__") and hasattr(type(t), "__tensor_unflatten__")
