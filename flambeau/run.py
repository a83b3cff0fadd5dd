"""`python -m flambeau.run script.py [args...]`: run an unmodified PyTorch script on flambeau.

`import torch`, `import torch.nn as nn`, `from torch.utils.data import DataLoader`, ... all
resolve to flambeau's modules (see `flambeau.compat`). The script runs as `__main__` with
`sys.argv` as if it had been started directly.

The objects alive after importing flambeau (its operator registry, decompositions and modules, ~57k
objects that live as long as the process) are already out of the cyclic garbage collector's reach:
`import flambeau` freezes them (`flambeau/_gc.py`; a full collection scanning them took ~37-47 ms on
CPU, 1.4-2.9 ms without them, `bench/gc_step.py --freeze`). The script's own objects, cycles
included, are collected as usual. `FLAMBEAU_GC_FREEZE=0` leaves them.
"""
from __future__ import annotations

import runpy
import sys
import os

from . import compat


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    compat.enable()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
