"""NumPy's floating-point error handling, silenced inside flambeau's kernels only.

PyTorch computes 1/0, log(-1), inf - inf and overflowing casts silently (inf/nan results, no
warning), so flambeau's kernels must not let NumPy warn either; the user's own NumPy code keeps
the user's `numpy.seterr` settings. `quiet()` switches NumPy's error state to "ignore" for the
current thread and context and returns a token; `restore(token)` puts back what was there:

    token = quiet()
    try:
        ...kernel...
    finally:
        restore(token)

The dispatcher runs every eager kernel quietly, so it uses the cheaper `run_quiet(kernel, *args)`:
the call made inside a `contextvars.Context` set up once with the error state "ignore" (entering a
context costs about a sixth of setting and resetting the variable, measured by callgrind). One
context can be entered by one thread at a time and not twice: when it is taken (a kernel of another
thread, or an op run by a kernel), the call raises `RuntimeError` before running anything and
`context_taken(e)` says so; the dispatcher then falls back to `quiet()`/`restore()`. Inside it,
other context variables read as they were when flambeau was imported (kernels read none but NumPy's).

`quiet_runner_with(setup)` makes another such runner, over a copy of that context in which `setup()`
ran (vmap's kernels allocate from flambeau's caching allocator this way: NumPy's allocation policy is a
context variable too); it returns None on NumPy 1.

`quiet()`/`restore()` are `numpy.errstate(all="ignore")` at a tenth of its cost: on NumPy 2 the error state is one
context variable, set and reset here directly by C-level callables (a `functools.partial` and a
bound method: no Python frame; about a tenth of `errstate`'s time, measured side by side), which
lets the dispatcher wrap every eager kernel call. On NumPy 1 (no such variable) it falls back to
`numpy.errstate`.
"""
from __future__ import annotations

import contextvars
import functools
from typing import Callable

import numpy as np

try:
    from numpy._core._ufunc_config import _extobj_contextvar as _STATE
except ImportError:      # NumPy 1.x
    _STATE = None

if _STATE is not None:
    with np.errstate(all="ignore"):
        _IGNORE = _STATE.get()

    quiet = functools.partial(_STATE.set, _IGNORE)     # -> token; ignore FP errors until restore(token)
    restore = _STATE.reset
    _QUIET = contextvars.copy_context()
    _QUIET.run(_STATE.set, _IGNORE)
    run_quiet = _QUIET.run                             # run_quiet(fn, *args, **kwargs) -> fn(...) quietly

    def quiet_runner_with(setup: Callable[[], object]) -> Callable | None:
        """A `run_quiet` over its own copy of the quiet context, with `setup()` run in it."""
        context = _QUIET.copy()
        context.run(setup)
        return context.run
else:
    def quiet():
        """Ignore floating-point errors until `restore(token)`; returns the token."""
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def restore(token) -> None:
        token.__exit__(None, None, None)

    def run_quiet(fn, *args, **kwargs):
        """`fn(*args, **kwargs)` with floating-point errors ignored."""
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    def quiet_runner_with(setup: Callable[[], object]) -> Callable | None:
        """None: NumPy 1 has no error-state context variable to run kernels in a context of their own."""
        return None


_TAKEN = "cannot enter context"


def context_taken(e: RuntimeError) -> bool:
    """Whether `run_quiet` raised `e` because its context is entered already (nothing ran)."""
    return str(e).startswith(_TAKEN)
