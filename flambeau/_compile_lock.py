"""The compile stack's lock and per-thread state (`is_compiling`), below the library layers. The lock: one thread at a time translates a frame, traces and compiles a graph
(a forward at a compiled function's cache miss, a backward at its first use, an inductor variant for
new strides). Compiled code runs without it, so several threads may call one compiled function at
once, as in PyTorch (whose dynamo serializes compilation with its own `compile_lock`). Reentrant: a
compile may start another (a resume function, a lazily compiled backward inside a traced call)."""
from __future__ import annotations

import gc
import os
import threading

compile_lock = threading.RLock()


class _ThreadCompileState(threading.local):
    """One thread's counts: frames being translated, `flambeau._dynamo.disable`d functions running (dynamo
    keeps them, `flambeau._dynamo.compiled_state`; here, below the library, so that library code can ask
    `is_compiling()` without importing dynamo)."""

    def __init__(self) -> None:
        self.tracing = 0              # > 0 while a frame is being translated (nested compiled calls run eagerly)
        self.disabled = 0             # > 0 inside a disabled function (compiled calls run eagerly)
        self.eager_frames: list = []  # compile_callee of each compiled frame running eagerly (skipped): the
                                      # nn.Module calls it makes are compiled as their own frames


thread = _ThreadCompileState()
eager_frames_running = [0]      # all threads' eager_frames together: Module.__call__ reads this (a list item, cheaper
_eager_count_lock = threading.Lock()   # than the thread-local) and the thread's own list only when it is not 0


def enter_eager_frame(nested_call) -> None:
    thread.eager_frames.append(nested_call)
    with _eager_count_lock:
        eager_frames_running[0] += 1


def exit_eager_frame() -> None:
    thread.eager_frames.pop()
    with _eager_count_lock:
        eager_frames_running[0] -= 1


def is_compiling() -> bool:
    """Whether this thread is translating a frame (PyTorch's `torch.compiler.is_compiling`)."""
    return thread.tracing > 0


class gc_paused:
    """The cyclic collector off while a frame compiles (`flambeau.compile`'s capture, AOT autograd and
    lowering), back on after. A compile makes many objects that outlive several young collections (IR
    nodes, graphs, fake tensors), which triggered a full collection over the whole heap per graph lowered
    (0.1-0.3 s, about a third of lowering's time, on the CPU box).

    The collections a compile's objects need are made when the outermost pause ends, inside the compile,
    rather than in the program's next steps: once the compile left `COLLECT_AFTER` or more new tracked
    objects, the young generations are collected (its cyclic garbage freed, what lives moved to the
    oldest generation) and, when that grew the oldest generation by more than a quarter (CPython's own
    trigger for a full collection, which would otherwise come a few steps later: 70 ms in the timed steps
    of a compiled ResNet-50 on the H100), the whole heap. Nothing changes when the program disabled the
    collector itself. `FLAMBEAU_GC_PAUSE_COMPILE=0` leaves it on (and collects nothing)."""

    depth = 0                    # pauses open (compiles nest: a compile may start another)

    def __enter__(self):
        self.paused = gc.isenabled() and os.environ.get("FLAMBEAU_GC_PAUSE_COMPILE", "1") != "0"
        if self.paused:
            gc.disable()
            gc_paused.depth += 1
        return self

    def __exit__(self, *exc):
        if self.paused:
            gc_paused.depth -= 1
            if gc_paused.depth == 0:
                gc.enable()
                _collect_after_compile()
        return False


COLLECT_AFTER = 20_000           # new tracked objects a compile leaves before its end collects them
stats = {"young": 0, "full": 0}  # collections made at a compile's end


def _collect_after_compile() -> None:
    young = gc.get_count()[0]
    if young < COLLECT_AFTER:
        return
    old = len(gc.get_objects(2))
    gc.collect(1)
    stats["young"] += 1
    if len(gc.get_objects(2)) - old > old // 4:
        gc.collect()
        stats["full"] += 1
