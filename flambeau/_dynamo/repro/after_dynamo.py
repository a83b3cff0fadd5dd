"""The minifier hook after graph capture (`repro_after="dynamo"`): around the whole backend.

`call_backend(backend, gm, example_inputs)` is how the capture front end (output_graph.py) gives a
captured graph to the backend. With `config.repro_after != "dynamo"` it only calls through. With
"dynamo" it compiles a copy of the graph and checks it on copies of the example inputs before
returning it, so a failure anywhere behind capture (AOT autograd, decompositions, the code
generator) is caught with the Python-level graph:
- level 3 writes `minifier_launcher.py` first;
- levels 1-3: an error compiling or running the graph raises after report_failure (failure.py)
  wrote the repro of the level;
- level 4: the compiled output is also compared with eager and float64 (debug_utils.same) and an
  inaccurate graph raises AccuracyError after its minified repro is written.
The repro script names the backend by its registered name (`compiler_name`, set by
`flambeau.compiler.lookup_backend`), else by `module.qualname` of the backend function.
"""
from __future__ import annotations

import copy
from typing import Callable

from .. import config
from .debug_utils import AccuracyError, check_config, clone_inputs
from .failure import lift_attributes, report_failure, write_launcher
from .script import check_accuracy, repro_disabled
from ...fx.graph_module import GraphModule

AFTER = "dynamo"


def backend_name(backend: Callable) -> str | None:
    """How a repro script names `backend` (see module docstring); None when it cannot."""
    name = getattr(backend, "compiler_name", None)
    if name is not None:
        return name
    mod, qual = getattr(backend, "__module__", None), getattr(backend, "__qualname__", None)
    return f"{mod}.{qual}" if mod and qual and "<" not in qual else None


def call_backend(backend: Callable, gm, example_inputs: list) -> Callable:
    """`backend(gm, example_inputs)`, with the minifier around it (see module docstring)."""
    check_config()
    if config.repro_after != AFTER:
        return backend(gm, example_inputs)
    name = backend_name(backend)
    orig = GraphModule(gm, copy.deepcopy(gm.graph))
    args = list(example_inputs)
    level = config.repro_level
    if level == 3:
        with repro_disabled():
            write_launcher(orig, args, after=AFTER, backend=name, accuracy=False)
    try:
        compiled = backend(gm, example_inputs)        # gm itself: its meta (shape_env) says it is dynamic
        out = compiled(*clone_inputs(args))
    except Exception as e:
        report_failure(orig, args, e, after=AFTER, backend=name)
        raise
    if level == 4:
        lifted, lifted_args = lift_attributes(orig, args)
        with repro_disabled():
            why = check_accuracy(lifted, lifted_args, out, tol=config.repro_tolerance,
                                 ignore_non_fp=config.repro_ignore_non_fp)
        if why:
            exc = AccuracyError(f"Bad accuracy detected (after dynamo, backend {name}): {why}")
            report_failure(orig, args, exc, after=AFTER, backend=name)
            raise exc
    return compiled
