"""The minifier hook after AOT autograd (`repro_after="aot"`): around the inductor compiler.

`wrap_compiler_debug(compile_graph, "inductor")` is what the inductor backend gives AOT autograd
as its forward/backward compiler. With `config.repro_after != "aot"` it only calls through. With
"aot", the graphs it sees are functional graphs of core operators whose inputs are real tensors
(parameters lifted), which is where a code-generator bug is easiest to isolate:
- level 3 writes `minifier_launcher.py` of every graph before compiling it;
- a compile error raises after report_failure (failure.py) wrote the repro of the level;
- the compiled callable is wrapped: an error in a call does the same; at level 4 each call also
  runs the graph eagerly and in float64 and raises AccuracyError when the compiled output is
  not the same (debug_utils.same, tolerance `config.repro_tolerance`).
"""
from __future__ import annotations

import copy
from typing import Callable

from .. import config
from .debug_utils import AccuracyError, check_config
from .failure import report_failure, write_launcher
from .script import check_accuracy, repro_disabled
from ...fx.graph_module import GraphModule

AFTER = "aot"


def wrap_compiler_debug(compiler_fn: Callable, compiler_name: str) -> Callable:
    """`compiler_fn(gm, example_inputs)` with the minifier around it (see module docstring)."""

    def debug_compiler(gm, example_inputs):
        check_config()
        if config.repro_after != AFTER:
            return compiler_fn(gm, example_inputs)
        orig = GraphModule(gm, copy.deepcopy(gm.graph))
        args = list(example_inputs)
        if config.repro_level == 3:
            with repro_disabled():
                write_launcher(orig, args, after=AFTER, backend=compiler_name, accuracy=False)
        try:
            inner = compiler_fn(gm, example_inputs)
        except Exception as e:
            report_failure(orig, args, e, after=AFTER, backend=compiler_name)
            raise
        return _DebugCall(orig, inner, compiler_name)
    debug_compiler.__name__ = getattr(compiler_fn, "__name__", "debug_compiler")
    return debug_compiler


class _DebugCall:
    """The compiled graph of a minifier-wrapped compile: each call checks for errors (and for
    accuracy at level 4) and reports them."""

    def __init__(self, gm, inner: Callable, compiler_name: str):
        self.gm, self.inner, self.compiler_name = gm, inner, compiler_name

    def __getattr__(self, name: str):
        return getattr(self.__dict__["inner"], name)

    def __call__(self, *args):
        try:
            out = self.inner(*args)
        except Exception as e:
            report_failure(self.gm, list(args), e, after=AFTER, backend=self.compiler_name)
            raise
        if config.repro_level == 4:
            with repro_disabled():
                why = check_accuracy(self.gm, list(args), out, tol=config.repro_tolerance,
                                     ignore_non_fp=config.repro_ignore_non_fp)
            if why:
                exc = AccuracyError(f"Bad accuracy detected (after aot, {self.compiler_name}): {why}")
                report_failure(self.gm, list(args), exc, after=AFTER, backend=self.compiler_name)
                raise exc
        return out
