"""Delta debugging over an FX graph (PyTorch's functorch `minifier`): shrink a graph that fails a
test into a small one that still fails it.

    gm, inputs = minify(gm, inputs, fails)      # fails(gm, inputs) -> True while it reproduces

The graph is first run eagerly once, recording every node's concrete value. Then, from coarse to
fine granularity (a power of two of nodes, halved when nothing is found), candidates are tried:

- truncate the tail: the graph up to a cut point, returning only the node there;
- delta debugging: a run of `granularity` nodes become graph inputs (their recorded values),
  after which dead nodes and unused inputs are dropped and the inputs moved to the front;
- drop outputs that are not needed for the failure;
- remove dead code and unused inputs.

A candidate is kept when `fails` still says True, and the search restarts from it; it stops
when no candidate at granularity 1 fails. Each candidate is a fresh GraphModule given to `fails`
on its own (which re-runs the backend on it). Answers are memoised by the candidate's code.
"""
from __future__ import annotations

import copy
from typing import Callable

from ... import _logging
from ...fx.graph import Graph
from ...fx.graph_module import GraphModule
from ...fx.interpreter import Interpreter
from ...fx.node import map_arg
from ..._tensor import Tensor

log = _logging.get_logger("flambeau._dynamo.repro")
LOG_KIND = "minifier"                  # FLAMBEAU_LOGS=minifier prints each step


class _State:
    """A candidate: a graph whose placeholders are named by `inputs`' keys, in graph order."""

    def __init__(self, graph: Graph, inputs: dict):
        self.graph = graph
        self.inputs = inputs

    def compute_nodes(self) -> list:
        return [n for n in self.graph.nodes if n.op not in ("placeholder", "output")]

    def outputs(self) -> list:
        out = self.graph.output_node().args[0]
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def args(self) -> list:
        return [self.inputs[n.target] for n in self.graph.nodes if n.op == "placeholder"]

    def size(self) -> tuple:
        """What minification decreases, most important first: nodes, outputs, inputs."""
        return (len(self.compute_nodes()), len(self.outputs()), len(self.inputs))


class _Recorder(Interpreter):
    """Runs the graph once, keeping each node's value (by node name)."""

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict = {}

    def run_node(self, n):
        v = super().run_node(n)
        self.values[n.name] = v
        return v


def _rebuild(graph: Graph, inputs: dict, values: dict, lift=(), output=None) -> _State:
    """A copy of `graph` with the nodes named in `lift` turned into inputs (their recorded values),
    the output replaced by `output` (a node of `graph`) when given, dead code and unused inputs
    dropped, and every input first."""
    new = Graph()
    env: dict = {}
    new_inputs: dict = {}
    nodes = list(graph.nodes)
    for n in nodes:
        if n.op == "placeholder" or n.name in lift:
            ph = new.placeholder(n.name if n.op != "placeholder" else n.target)
            ph.meta = dict(n.meta)
            env[n] = ph
            new_inputs[ph.target] = inputs[n.target] if n.op == "placeholder" else values[n.name]
    for n in nodes:
        if n in env or n.op == "output":
            continue
        env[n] = new.node_copy(n, lambda x: env[x])
        if n is output:
            break
    if output is not None:
        new.output((env[output],))
    else:
        onode = graph.output_node()
        new.output(_map_nodes(onode.args[0], env)).meta = dict(onode.meta)
    new.eliminate_dead_code()
    for ph in [n for n in new.nodes if n.op == "placeholder" and not n.users]:
        new.erase_node(ph)
        del new_inputs[ph.target]
    return _State(new, new_inputs)


def _map_nodes(a, env):
    return map_arg(a, lambda x: env[x])


def _liftable(n, values: dict) -> bool:
    """A node whose recorded value can stand in for it as a graph input (a tensor or a number)."""
    v = values.get(n.name)
    return isinstance(v, (Tensor, int, float)) and not isinstance(v, bool)


def _is_tensor(n, values: dict) -> bool:
    return isinstance(values.get(n.name), Tensor)


def minify(gm: GraphModule, inputs: list, fails: Callable[[GraphModule, list], bool], *,
           max_granularity: int | None = None,
           on_step: Callable[[GraphModule, list], None] | None = None) -> tuple:
    """The smallest graph (and its inputs) found that still `fails` (see module docstring);
    `on_step(gm, inputs)` sees every improvement (to checkpoint it)."""
    if max_granularity is not None and (max_granularity < 1 or max_granularity & (max_granularity - 1)):
        raise ValueError(f"minify: max_granularity must be a power of two, got {max_granularity}")
    root = gm
    rec = _Recorder(gm)
    rec.run(*inputs)
    values = rec.values
    memo: dict = {}
    queries = [0]

    def module(state: _State) -> GraphModule:
        return GraphModule(root, copy.deepcopy(state.graph))

    def still_fails(state: _State) -> bool:
        m = module(state)
        key = m.code
        if key not in memo:
            queries[0] += 1
            args = state.args()
            try:
                memo[key] = bool(fails(m, args))
            except Exception as e:             # a broken test says nothing about this candidate
                if _logging.enabled(LOG_KIND):
                    log.debug("[minifier] the test raised %s: %s", type(e).__name__, e)
                memo[key] = False
        return memo[key]

    placeholders = {n.target: a for n, a in zip([n for n in gm.graph.nodes if n.op == "placeholder"], inputs)}
    state = _State(copy.deepcopy(gm.graph), placeholders)
    if not still_fails(state):
        raise RuntimeError("flambeau minifier: the graph given to the minifier does not fail the test")
    start = state.size()

    def accept(new: _State, what: str) -> bool:
        if new.size() >= state.size() or not new.outputs():
            return False
        if not still_fails(new):
            return False
        if _logging.enabled(LOG_KIND):
            log.debug("[minifier] %s: %d nodes, %d outputs, %d inputs", what, *new.size())
        if on_step is not None:
            on_step(module(new), new.args())
        return True

    def truncate_tail(g: int):
        nodes = state.compute_nodes()
        for i in range(g - 1, len(nodes) - 1, g):
            if _is_tensor(nodes[i], values):
                cand = _rebuild(state.graph, state.inputs, values, output=nodes[i])
                if accept(cand, f"truncate after {nodes[i].name} (granularity {g})"):
                    return cand
        return None

    def delta_debug(g: int):
        nodes = state.compute_nodes()
        for start_i in range(0, len(nodes), g):
            lift = {n.name for n in nodes[start_i:start_i + g] if _liftable(n, values)}
            if not lift:
                continue
            cand = _rebuild(state.graph, state.inputs, values, lift=lift)
            if accept(cand, f"inputs for {sorted(lift)} (granularity {g})"):
                return cand
        return None

    def drop_outputs():
        outs = state.outputs()
        if len(outs) < 2:
            return None
        for i in range(len(outs)):
            g2 = copy.deepcopy(state.graph)
            onode = g2.output_node()
            kept = list(onode.args[0])
            del kept[i]
            onode.args = (tuple(kept),)
            cand = _rebuild(g2, state.inputs, values)
            if accept(cand, f"drop output {i}"):
                return cand
        return None

    def drop_dead():
        cand = _rebuild(state.graph, state.inputs, values)
        return cand if accept(cand, "dead code, unused inputs") else None

    while True:
        new = drop_dead() or drop_outputs()
        g = 1
        while g * 2 <= max(1, len(state.compute_nodes())):
            g *= 2
        if max_granularity is not None:
            g = min(g, max_granularity)
        while new is None and g >= 1:
            new = truncate_tail(g) or delta_debug(g)
            g //= 2
        if new is None:
            break
        state = new
    result = module(state)
    log.warning("flambeau minifier: %d nodes, %d outputs, %d inputs -> %d nodes, %d outputs, %d inputs "
                "(%d queries)", *start, *state.size(), queries[0])
    return result, state.args()
