"""Splitting a model into pipeline stages (PyTorch's `pipeline()`, `SplitPoint`, `pipe_split`, `Pipe`).

The model is traced with `flambeau.fx` (the submodules named in `split_spec` kept as calls), and its
nodes are cut into consecutive stages: before a submodule marked `SplitPoint.BEGINNING`, after one marked
`SplitPoint.END`, and wherever forward calls `pipe_split()`. Each stage becomes a GraphModule whose inputs
are the values earlier stages made that it or later stages use (so a skip connection across a cut travels
through the stages between), and whose output is the tuple of values later stages need (one value alone
is passed as itself). Parameters are read where they are used.
"""
from __future__ import annotations

import enum

from ...fx.graph import Graph
from ...fx.graph_module import GraphModule
from ...fx.node import map_arg
from ...fx.proxy import Tracer
from ...nn.modules.module import Module
from .stage import PipelineStage

_active_tracers: list = []          # the pipeline tracer running now, for pipe_split to record into


class SplitPoint(enum.Enum):
    BEGINNING = 1
    END = 2


def pipe_split() -> None:
    """Mark a stage boundary inside forward (does nothing when the model runs normally)."""
    if _active_tracers:
        _active_tracers[-1].graph.create_node("call_function", pipe_split, (), {}, "pipe_split")


class _SplitTracer(Tracer):
    def __init__(self, split_modules: set) -> None:
        super().__init__()
        self.split_modules = split_modules

    def is_leaf_module(self, m: Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.split_modules or super().is_leaf_module(m, module_qualified_name)


def _stage_of_nodes(graph: Graph, split_spec: dict) -> dict:
    """node -> stage index (get_attr nodes: None, copied where used; output: the last stage)."""
    stage, has_compute, out = 0, False, {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is pipe_split:
            stage, has_compute = (stage + 1, False) if has_compute else (stage, has_compute)
            continue
        if node.op == "call_module" and split_spec.get(node.target) is SplitPoint.BEGINNING and has_compute:
            stage, has_compute = stage + 1, False
        if node.op == "get_attr":
            out[node] = None
            continue
        if node.op == "output":
            out[node] = stage - 1 if not has_compute and stage > 0 else stage
            continue
        out[node] = stage
        has_compute = has_compute or node.op != "placeholder"
        if node.op == "call_module" and split_spec.get(node.target) is SplitPoint.END:
            stage, has_compute = stage + 1, False
    return out


def _users(node) -> list:
    return list(node.users)


class Pipe:
    """The model cut into stages: `num_stages`, `get_stage_module(i)`, `build_stage(i, device, group)`;
    calling it runs the stages one after another (the unsplit computation)."""

    def __init__(self, stage_modules: list) -> None:
        self.stage_modules = stage_modules
        self.num_stages = len(stage_modules)

    def get_stage_module(self, stage_index: int) -> GraphModule:
        return self.stage_modules[stage_index]

    def build_stage(self, stage_index: int, device=None, group=None) -> PipelineStage:
        return PipelineStage(self.stage_modules[stage_index], stage_index, self.num_stages, device, group=group)

    def __call__(self, *args):
        values = args
        for i, m in enumerate(self.stage_modules):
            out = m(*values)
            values = out if isinstance(out, tuple) and i < self.num_stages - 1 else (out,)
        return out


def _build(root: Module, graph: Graph, stage_of: dict, num_stages: int) -> list:
    order = {n: i for i, n in enumerate(graph.nodes)}
    defined = [n for n in graph.nodes if stage_of.get(n) is not None and n.op != "output"]

    def crossing(k: int) -> list:
        """Values made in stages <= k that a node of a later stage uses, in graph order."""
        return [n for n in defined if stage_of[n] <= k and any(stage_of[u] is not None and stage_of[u] > k
                                                               for u in _users(n))]
    modules = []
    for k in range(num_stages):
        g, env = Graph(), {}
        inputs = [n for n in defined if n.op == "placeholder"] if k == 0 else crossing(k - 1)
        for n in inputs:
            env[n] = g.placeholder(n.name)

        def lookup(n):
            if n not in env:                                     # a parameter or buffer read here
                env[n] = g.node_copy(n)
            return env[n]
        for n in sorted((n for n in defined if stage_of[n] == k and n.op != "placeholder"), key=order.get):
            env[n] = g.node_copy(n, lookup)
        if k == num_stages - 1:
            g.output(map_arg(graph.output_node().args[0], lookup))
        else:
            outs = [lookup(n) for n in crossing(k)]
            g.output(outs[0] if len(outs) == 1 else tuple(outs))
        modules.append(GraphModule(root, g, f"PipeStage{k}"))
    return modules


def pipeline(module: Module, mb_args: tuple = (), mb_kwargs: dict | None = None, split_spec: dict | None = None,
             split_policy=None) -> Pipe:
    """Cut `module` into stages at `split_spec` ({submodule name: SplitPoint}) and `pipe_split()` calls."""
    if split_policy is not None:
        raise NotImplementedError("pipeline: split_policy is not supported; give split_spec or call pipe_split()")
    split_spec = dict(split_spec or {})
    names = dict(module.named_modules())
    for name, point in split_spec.items():
        if name not in names:
            raise ValueError(f"pipeline: split_spec names '{name}', which is not a submodule of the model")
        if not isinstance(point, SplitPoint):
            raise TypeError(f"pipeline: split_spec['{name}'] must be a SplitPoint, got {point!r}")
    tracer = _SplitTracer(set(split_spec))
    _active_tracers.append(tracer)
    try:
        graph = tracer.trace(module)
    finally:
        _active_tracers.pop()
    stage_of = _stage_of_nodes(graph, split_spec)
    num_stages = max(s for s in stage_of.values() if s is not None) + 1
    return Pipe(_build(module, graph, stage_of, num_stages))
