"""Translating one frame: run the symbolic evaluator (restarting at chosen graph breaks) and build an entry.

`convert_frame(...)` returns a `CompiledEntry`, or raises `SkipFrame` when the frame must run
eagerly (generators, breaks the continuation machinery cannot express, anything unexpected), or,
with `fullgraph=True`, an `Unsupported` naming the reason and the user's file:line.
"""
from __future__ import annotations

import time

from .exc import Unsupported, SkipFrame, RestartAnalysis
from .guards import LocalSource
from .output_graph import OutputGraph
from .opcodes import LazyLocal
from .symbolic_convert import InstructionTranslator
from .variables.functions import is_generator_code


class CompileStats:
    """What explain() reports: graphs given to the backend (kept only with `keep_graphs`: a graph and the
    fake tensors of its nodes are of no use once compiled) and the reasons of graph breaks."""

    def __init__(self, keep_graphs: bool = False):
        self.keep_graphs = keep_graphs
        self.graphs: list = []
        self.break_reasons: list = []
        self.compile_times: list = []


def format_user_error(e: Unsupported) -> str:
    lines = [str(e.msg)]
    if e.user_stack:
        lines.append("\nfrom user code:")
        for f, line, name in reversed(e.user_stack):
            lines.append(f'   File "{f}", line {line}, in {name}')
    return "\n".join(lines)


def convert_frame(fn, code, arg_values: dict, backend, *, one_graph: bool, dynamic, cache, compile_resume,
                  compile_callee, stats: CompileStats):
    if is_generator_code(code):
        raise SkipFrame(f"{code.co_name} is a generator or coroutine (run eagerly)")
    break_at: dict = {}
    t0 = time.perf_counter()
    for _ in range(64):
        output = OutputGraph(code, fn, fn.__globals__, backend, one_graph=one_graph, dynamic=dynamic, dynamic_dims=cache.dynamic_dims,
                             frame_sizes=cache.frame_sizes, compile_resume=compile_resume,
                             compile_callee=compile_callee, stats=stats)
        tx = InstructionTranslator(output, code, fn.__globals__, fn, {}, break_at)
        for name, v in arg_values.items():
            tx.locals[name] = LazyLocal(v, LocalSource(name))
        try:
            tx.run()
        except RestartAnalysis:
            continue
        except Unsupported as e:
            if one_graph:
                raise Unsupported(format_user_error(e), user_stack=e.user_stack) from None
            raise SkipFrame(f"{e.msg} (at {e.location()})") from e
        finally:
            for ctx in reversed(output.entered):     # a failed trace leaves no global state behind
                ctx.__exit__(None, None, None)
        stats.compile_times.append(time.perf_counter() - t0)
        if output.result is None:
            raise SkipFrame("translation ended without a result")
        return output.result
    raise SkipFrame("too many graph-break restarts")
