"""The compile stack's lock: one thread at a time translates a frame, traces and compiles a graph
(a forward at a compiled function's cache miss, a backward at its first use, an inductor variant for
new strides). Compiled code runs without it, so several threads may call one compiled function at
once, as in PyTorch (whose dynamo serializes compilation with its own `compile_lock`). Reentrant: a
compile may start another (a resume function, a lazily compiled backward inside a traced call)."""
from __future__ import annotations

import threading

compile_lock = threading.RLock()
