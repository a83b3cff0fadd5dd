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
