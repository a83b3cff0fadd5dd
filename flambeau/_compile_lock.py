"""The compile stack's lock: one thread at a time translates a frame, traces and compiles a graph
(a forward at a compiled function's cache miss, a backward at its first use, an inductor variant for
new strides). Compiled code runs without it, so several threads may call one compiled function at
once, as in PyTorch (whose dynamo serializes compilation with its own `compile_lock`). Reentrant: a
compile may start another (a resume function, a lazily compiled backward inside a traced call)."""
from __future__ import annotations

import gc
import os
import threading

compile_lock = threading.RLock()


class gc_paused:
    """The cyclic collector off while a frame compiles (`flambeau.compile`'s capture, AOT autograd and
    lowering), back on after. A compile makes many objects that outlive several young collections (IR
    nodes, graphs, fake tensors), which triggered a full collection over the whole heap per graph lowered
    (0.1-0.3 s, about a third of lowering's time, on the CPU box); the cycles it leaves are collected after.
    Nothing changes when the program disabled the collector itself. `FLAMBEAU_GC_PAUSE_COMPILE=0` leaves it on."""

    def __enter__(self):
        self.paused = gc.isenabled() and os.environ.get("FLAMBEAU_GC_PAUSE_COMPILE", "1") != "0"
        if self.paused:
            gc.disable()
        return self

    def __exit__(self, *exc):
        if self.paused:
            gc.enable()
        return False
