"""`replace_pattern(gm, pattern, replacement)`: PyTorch's FX subgraph rewriter.

`pattern` and `replacement` are functions (or GraphModules / Graphs) of the same number of inputs;
each is traced with `symbolic_trace`. Every place in `gm.graph` where the pattern's computation occurs
(same ops, same targets, same literal arguments, its inputs bound to any nodes, one node per input)
and whose inner nodes are used nowhere else is a match; matches are found on the graph as it is before
any rewrite, in graph order, and one that shares a computing node with an earlier match is dropped.
Each match is replaced by the replacement's nodes, inserted before the first use of the pattern's result,
and `gm` is recompiled. Returns the matches (`Match(anchor, nodes_map)`: the graph node that held the
pattern's result, and pattern node -> graph node).

Patterns with one result only (PyTorch also matches several).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from .graph import Graph
from .graph_module import GraphModule
from .node import Node
from .proxy import symbolic_trace

__all__ = ["Match", "replace_pattern"]


class Match(NamedTuple):
    anchor: Node                # the node of the rewritten graph that held the pattern's result
    nodes_map: dict             # pattern node -> node of the rewritten graph


def _graph_of(fn_or_graph) -> Graph:
    if isinstance(fn_or_graph, Graph):
        return fn_or_graph
    if isinstance(fn_or_graph, GraphModule):
        return fn_or_graph.graph
    return symbolic_trace(fn_or_graph).graph


def _match_arg(pa, ga, m: dict) -> bool:
    if isinstance(pa, Node) or isinstance(ga, Node):
        return isinstance(pa, Node) and isinstance(ga, Node) and _match_node(pa, ga, m)
    if isinstance(pa, (list, tuple)) or isinstance(ga, (list, tuple)):
        return (type(pa) is type(ga) and len(pa) == len(ga)
                and all(_match_arg(a, b, m) for a, b in zip(pa, ga)))
    if isinstance(pa, dict) or isinstance(ga, dict):
        return (isinstance(pa, dict) and isinstance(ga, dict) and pa.keys() == ga.keys()
                and all(_match_arg(pa[k], ga[k], m) for k in pa))
    return type(pa) is type(ga) and pa == ga


def _match_node(pn: Node, gn: Node, m: dict) -> bool:
    if pn in m:
        return m[pn] is gn
    if any(g is gn for g in m.values()):       # one pattern node per graph node
        return False
    if pn.op == "placeholder":
        m[pn] = gn
        return True
    if pn.op != gn.op or pn.target != gn.target:
        return False
    m[pn] = gn
    return _match_arg(pn.args, gn.args, m) and _match_arg(pn.kwargs, gn.kwargs, m)


def _find(pattern: Graph, graph: Graph) -> list[Match]:
    out = pattern.output_node().args[0]
    if not isinstance(out, Node) or out.op == "placeholder":
        raise NotImplementedError("replace_pattern: the pattern must return one computed value (a node that "
                                  f"is not an input), got {out!r}; patterns with several results are not "
                                  "supported")
    matches, used = [], set()
    for gn in graph.nodes:
        m: dict = {}
        if gn.op in ("placeholder", "output") or not _match_node(out, gn, m):
            continue
        inner = {id(g) for p, g in m.items() if p.op != "placeholder"}
        if inner & used:                       # overlaps an earlier match
            continue
        if any(id(u) not in inner for p, g in m.items() if p.op != "placeholder" and p is not out
               for u in g.users):              # an inner value is used outside the match
            continue
        used |= inner
        matches.append(Match(gn, m))
    return matches


def replace_pattern(gm: GraphModule, pattern: Callable | Graph | GraphModule,
                    replacement: Callable | Graph | GraphModule) -> list[Match]:
    """Replace every non-overlapping occurrence of `pattern` in `gm.graph` with `replacement`."""
    pattern_graph, replacement_graph = _graph_of(pattern), _graph_of(replacement)
    p_inputs = [n for n in pattern_graph.nodes if n.op == "placeholder"]
    r_inputs = [n for n in replacement_graph.nodes if n.op == "placeholder"]
    if len(p_inputs) != len(r_inputs):
        raise ValueError(f"replace_pattern: the pattern takes {len(p_inputs)} inputs and the replacement "
                         f"{len(r_inputs)}; give both the same inputs, in the same order")
    graph = gm.graph
    matches = _find(pattern_graph, graph)
    for match in matches:
        val_map = {r: match.nodes_map[p] for p, r in zip(p_inputs, r_inputs) if p in match.nodes_map}
        if len(val_map) != len(r_inputs):
            raise ValueError("replace_pattern: an input of the pattern is unused by its computation, so a match "
                             "cannot bind it; use every input in the pattern")
        users = {id(u) for u in match.anchor.users}
        first_user = next((n for n in graph.nodes if id(n) in users), match.anchor.next)
        with graph.inserting_before(first_user):     # where PyTorch puts it: before the result's first use
            result = graph.graph_copy(replacement_graph, val_map)
        if not isinstance(result, Node):
            raise NotImplementedError("replace_pattern: the replacement must return one value, as the pattern")
        match.anchor.replace_all_uses_with(result)
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        inner = [g for p, g in match.nodes_map.items() if p.op != "placeholder"]
        for g in sorted(inner, key=lambda n: order[id(n)], reverse=True):
            graph.erase_node(g)
    gm.recompile()
    return matches
