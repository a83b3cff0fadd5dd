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

This is `numpy.errstate(all="ignore")` at a tenth of its cost: on NumPy 2 the error state is one
context variable, set and reset here directly by C-level callables (a `functools.partial` and a
bound method: no Python frame; about a tenth of `errstate`'s time, measured side by side), which
lets the dispatcher wrap every eager kernel call. On NumPy 1 (no such variable) it falls back to
`numpy.errstate`.
"""
from __future__ import annotations

import functools

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
else:
    def quiet():
        """Ignore floating-point errors until `restore(token)`; returns the token."""
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def restore(token) -> None:
        token.__exit__(None, None, None)
