"""What a repro script runs: `run_repro(Repro(), INPUTS, after=..., backend=..., accuracy=...)`.

`python repro.py` (command `run`) rebuilds the graph the script's `Repro` module stands for with
random inputs of the recorded shapes, compiles it as the failing run did and exits non-zero while
the failure reproduces; `python repro.py minify` shrinks that graph again (failure.py) and writes
the smaller script. Writing scripts and compiling their graphs is script.py's part.
"""
from __future__ import annotations

import sys

from .. import config
from .debug_utils import AccuracyError, clone_inputs, dynamic_dims, make_inputs
from .failure import minify_and_dump
from .script import SEED, check_accuracy, graph_of, run_compiled


def run_repro(mod, inputs: list, *, after: str, backend: str | None = "inductor", accuracy: bool = False,
              command: str = "run", argv: list | None = None) -> None:
    """Run a repro script's graph (see module docstring); `argv[0]` (default sys.argv[1]) overrides `command`."""
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else command
    if command not in ("run", "minify"):
        raise SystemExit(f"usage: python repro.py [run|minify] (got {command!r})")
    if after not in ("aot", "dynamo"):
        raise ValueError(f"run_repro: after must be 'aot' or 'dynamo', got {after!r}")
    args = make_inputs(inputs, SEED)
    dims = dynamic_dims(inputs)
    gm = graph_of(mod, args, after, dims)
    if command == "minify":
        minify_and_dump(gm, args, after=after, backend=backend, accuracy=accuracy)
        return
    out = run_compiled(gm, clone_inputs(args), after, backend, dims)
    if accuracy:
        why = check_accuracy(gm, args, out, tol=config.repro_tolerance)
        if why:
            raise AccuracyError(f"Bad accuracy detected: {why}")
    print(f"flambeau repro: no failure ({'accuracy' if accuracy else 'error'} check, after {after})")
