"""Keep flambeau's import-time objects out of the cyclic garbage collector's scans.

Importing flambeau creates ~46k container objects (the operator registry, decompositions, modules,
their functions and tables) that live as long as the process and are never cyclic garbage. A full
collection walks every tracked object: with them it took ~25-47 ms (2-core CPU VM, H100 host), about
once in ten training steps of a host-bound model, 4-7 ms a step of GPT-2/ResNet-50 eager on the H100
(`bench/gpu_train.py` gc_ms_per_step). At the end of `import flambeau` they are collected once and
moved to the permanent generation (`gc.freeze()`): later collections skip them; they are still freed
by reference counting. Objects the program creates afterwards, cycles included, are collected as usual.
`gc.get_objects()` no longer lists the frozen ones (`gc.unfreeze()` gives them back).
`FLAMBEAU_GC_FREEZE=0` (read at import) leaves them.

The youngest generation is collected after 10,000 more tracked objects are alive than at its last
collection, not CPython's 700 (`raise_young_threshold`; CPython 3.13 itself moved to 2,000). An eager
training step holds its autograd graph, its tensors and their arrays until backward frees them: a
GPT-2 step peaks at 2,000-4,000 tracked objects, so at 700 the collector ran ~3 times a step and moved
the graph's live objects into the older generations, and a full collection of the process's 50-100k
objects followed every ~10-30 steps (12-25 ms on the H100 host: 1.6-2.8 ms a step of GPT-2 eager,
session 23). At 10,000 a step that frees what it made never triggers a collection. Cyclic garbage
lives longer before it is found; a cuda allocation that would fail collects it first (CuPy's pool runs
the collector and releases its cached blocks before it gives up), as `flambeau.cuda.empty_cache()`
collects before releasing the cache.
`FLAMBEAU_GC_THRESHOLD=N` sets another value (0: Python's); a program that set a higher one keeps it.
"""
from __future__ import annotations

import gc
import os


def freeze_import_objects() -> bool:
    """Collect, then freeze what is alive (once, at the end of the package's import). Returns whether
    it froze: not with FLAMBEAU_GC_FREEZE=0, nor when the program disabled the collector."""
    if os.environ.get("FLAMBEAU_GC_FREEZE", "1") == "0" or not gc.isenabled():
        return False
    gc.collect()
    gc.freeze()
    return True


YOUNG_THRESHOLD = 10_000


def raise_young_threshold() -> bool:
    """Raise the youngest generation's threshold to YOUNG_THRESHOLD (or FLAMBEAU_GC_THRESHOLD; 0 leaves
    Python's) where it is lower, the others kept. Returns whether it changed it."""
    value = os.environ.get("FLAMBEAU_GC_THRESHOLD")
    try:
        want = YOUNG_THRESHOLD if value is None else int(value)
        if want < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"FLAMBEAU_GC_THRESHOLD={value!r}: expected a non-negative integer (0 keeps Python's "
                         f"threshold)") from None
    young, middle, old = gc.get_threshold()
    if want <= young:
        return False
    gc.set_threshold(want, middle, old)
    return True
