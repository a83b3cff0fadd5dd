"""`flambeau._dynamo.explain(fn)(*args)`: what capture made of one call (graphs, breaks and why),
and what the inductor backend would run eagerly inside those graphs (fallbacks and why).

Each captured graph is recorded, then compiled with the inductor backend (a graph it cannot
compile is reported as a fallback of op "whole graph" and run as captured); the fallbacks are the
`counters["inductor_fallbacks"]` entries recorded during the call.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .._counters import FALLBACKS, counters, fallbacks_since, record_fallback
from .backends.registry import lookup_backend
from .convert_frame import CompileStats
from ..nn.modules.module import Module
from .eval_frame import CompiledFunction, reset, _ModuleCall, _caches

EXPLAIN_BACKEND = "inductor"          # the backend whose fallbacks explain() reports


@dataclass
class BreakReason:
    reason: str
    user_stack: list = field(default_factory=list)     # [(filename, lineno, function name)], innermost first

    def location(self) -> str:
        if not self.user_stack:
            return "<unknown>"
        f, line, name = self.user_stack[0]
        return f"{f}:{line}"

    def __str__(self) -> str:
        return f"{self.reason} ({self.location()})"


@dataclass
class ExplainOutput:
    graphs: list
    graph_count: int
    graph_break_count: int
    break_reasons: list
    op_count: int
    ops_per_graph: list
    out_guards: list
    compile_times: str = ""
    fallbacks: list = field(default_factory=list)      # ["<op>: <reason>"]: what runs eagerly in the graphs

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}", "Break Reasons:"]
        for i, b in enumerate(self.break_reasons):
            lines.append(f"  Break Reason {i + 1}:")
            lines.append(f"    Reason: {b.reason}")
            lines.append("    User Stack:")
            for f, line, name in reversed(b.user_stack):
                lines.append(f'      File "{f}", line {line}, in {name}')
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"  Ops {i + 1}:")
            lines += [f"    {o}" for o in ops]
        lines.append(f"Fallback Count: {len(self.fallbacks)}")
        lines.append("Fallbacks:")
        lines += [f"  {f}" for f in self.fallbacks]
        return "\n".join(lines) + "\n"


def explain(fn, *extra_args, **extra_kwargs):
    """`explain(fn)(*args, **kwargs)` runs `fn` once, compiled with a recording backend, and returns an
    ExplainOutput (`explain(fn, *args)` is accepted too, as in older PyTorch)."""
    def inner(*args, **kwargs):
        reset()
        stats = CompileStats(keep_graphs=True)
        guards = []
        compile_graph = lookup_backend(EXPLAIN_BACKEND)
        before = collections.Counter(counters[FALLBACKS])

        def backend(gm, example_inputs):
            try:
                return compile_graph(gm, example_inputs)
            except Exception as e:                   # explain reports; it does not raise for the backend
                record_fallback("whole graph", f"{EXPLAIN_BACKEND} failed: {type(e).__name__}: {e}")
                return gm.forward
        if isinstance(fn, Module):
            call = _ModuleCall(fn, backend, False, None)
            call.forward.stats = call.call_impl.stats = stats
        else:
            call = CompiledFunction(fn, backend, stats=stats)
        call(*args, **kwargs)
        for cache in _caches.values():
            for e in cache.entries:
                guards.extend(d for _, _, d in e.guards.checks)
        reset()
        ops = [[n.target if n.op != "call_module" else n.target for n in g.graph.nodes
                if n.op in ("call_function", "call_method", "call_module")] for g in stats.graphs]
        reasons = [BreakReason(getattr(r, "msg", str(r)), list(getattr(r, "user_stack", []))) for r in
                   stats.break_reasons]
        return ExplainOutput(stats.graphs, len(stats.graphs), len(reasons), reasons, sum(len(o) for o in ops),
                             ops, guards, "", sorted(fallbacks_since(before)))
    if extra_args or extra_kwargs:
        return inner(*extra_args, **extra_kwargs)
    return inner
