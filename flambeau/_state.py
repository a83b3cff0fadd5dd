"""Settings read on hot paths: default dtype, the current cuda device (process-wide, as in PyTorch),
and, per thread (`tls`), grad mode, inference mode, forward-mode AD, the dispatch mode stack,
the autocast regions and the default device. A foundation module: every layer may read and set these.

Per-thread state is what PyTorch keeps in its thread-local state: a new thread starts with grad
enabled, no inference mode, no dispatch modes and autocast off, whatever the thread that started it
has (`no_grad` in one thread is not seen by another). Read and write it as `_state.tls.grad_enabled`.

The dispatch mode stack (`tls.modes`, a tuple, innermost last) and the autocast map (`tls.autocast`,
device type -> dtype, empty when off) change only through `push_mode`/`pop_mode`/`remove_mode`/
`set_modes`/`set_autocast`, which keep `interposed` up to date: the number of threads that have a
mode or an autocast region. The operator hot paths test that process-wide int first (a module
attribute read, several times cheaper than a thread-local one) and read the thread's own stack and
map only when some thread has one. (A thread that ends inside a mode stays counted: the hot paths
then only read the thread-local values, which are right for every thread.)
"""
from __future__ import annotations

import threading

from . import _dtype

default_dtype = _dtype.float32
anomaly = False                # anomaly mode is process-wide in PyTorch too
anomaly_check_nan = True
cuda_device = 0                # the current cuda device index (flambeau.cuda.set_device)
cuda_device_chosen = False     # set_device has run in this process (what cuda.is_initialized reports, with use)
float32_matmul_precision = "highest"   # cuda float32 products: "highest" exact, "high"/"medium" TF32
interposed = 0                 # threads whose mode stack or autocast map is non-empty (see docstring)
_interposed_lock = threading.Lock()


class _ThreadState(threading.local):
    """One thread's autograd and dispatch state; `__init__` runs once in each thread that reads it."""

    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference_mode = False
        self.fwd_grad_enabled = True
        self.modes: tuple = ()                 # dispatch modes, innermost (top) last
        self.autocast: dict = {}               # device type -> dtype where autocast is on; see flambeau.amp
        self.default_device = None             # None means cpu
        self.counted = False                   # whether this thread is counted in `interposed`


tls = _ThreadState()


def _recount(t: _ThreadState) -> None:
    """Count or uncount the calling thread in `interposed` after its modes or autocast map changed."""
    global interposed
    on = bool(t.modes) or bool(t.autocast)
    if on is not t.counted:
        with _interposed_lock:
            interposed += 1 if on else -1
        t.counted = on


def push_mode(mode) -> None:
    """Make `mode` the calling thread's innermost dispatch mode."""
    t = tls
    t.modes = t.modes + (mode,)
    _recount(t)


def pop_mode():
    """Remove and return the calling thread's innermost dispatch mode (IndexError when there is none)."""
    t = tls
    mode = t.modes[-1]
    t.modes = t.modes[:-1]
    _recount(t)
    return mode


def remove_mode(mode) -> None:
    """Remove the innermost occurrence of `mode` from the calling thread's stack (modes nest LIFO)."""
    t = tls
    modes = t.modes
    for i in range(len(modes) - 1, -1, -1):
        if modes[i] is mode:
            t.modes = modes[:i] + modes[i + 1:]
            _recount(t)
            return


def set_modes(modes) -> tuple:
    """Replace the calling thread's mode stack; return the previous one (to restore it)."""
    t = tls
    prev, t.modes = t.modes, tuple(modes)
    _recount(t)
    return prev


def set_autocast(on: dict) -> dict:
    """Replace the calling thread's autocast map (never mutated: a saved map restores it exactly);
    return the previous one."""
    t = tls
    prev, t.autocast = t.autocast, on
    _recount(t)
    return prev
