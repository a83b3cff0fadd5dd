"""Partitioners: split a joint forward+backward graph into a forward and a backward graph.

The joint graph (made by `aot_autograd`) has placeholders `primals_*` then `tangents_*` and
returns `(*forward outputs, *gradients)`. A partitioner decides which forward values the
backward receives ("saved" values); the forward graph returns `(*forward outputs, *saved)` and
the backward graph takes `(*saved, *tangents)` and returns the gradients.

* `default_partition`: the forward graph computes exactly what the forward outputs need; every
  forward value (or input) that a backward node reads is saved. Work that depends only on the
  inputs but only the backward needs (e.g. `w.t()` for a weight gradient) runs in the backward.
* `min_cut_rematerialization_partition`: starts from the default choice, then greedily stops saving
  values that cheap pointwise/view/cast ops (`Tag.recomputable`) can recompute in the backward from values that are
  saved anyway (or from a smaller set of values): for each saved value made by a recomputable op
  that the forward does not write to memory anyway (an operand of a matrix product or convolution is
  kept: saving it is free, recomputing it is a pass over it),
  walk up through recomputable producers (at most `MAX_RECOMPUTE_DEPTH` ops) to a frontier of
  non-recomputable, already-saved or input values; if saving the frontier costs fewer bytes than
  saving the value (or nothing new), the value is recomputed in the backward instead. Reductions,
  matrix products and random ops are never recomputed, nor a value that the backward compares for
  equality (`Tag.exact_compare`: amax's gradient goes to the elements equal to the saved result; a
  recomputation may round differently, a vector libm's sinf against the scalar one's, and then no
  element is equal: a 0/0 gradient). This is a greedy approximation of
  PyTorch's max-flow/min-cut choice, aimed at the same effect: a fused pointwise chain saves its
  inputs, not each intermediate.
"""
from __future__ import annotations

import operator

from .._tags import Tag
from .._tensor import Tensor
from ..fx._aten import is_op
from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..fx.node import Node, map_arg
from ..fx._symbolic_shapes import SymInt

__all__ = ["default_partition", "min_cut_rematerialization_partition"]

MAX_RECOMPUTE_DEPTH = 16


def _is_tangent(n: Node) -> bool:
    return n.op == "placeholder" and str(n.target).startswith("tangents")


def _outputs(gm: GraphModule, num_fwd_outputs: int):
    out = gm.graph.output_node().args[0]
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    return out[:num_fwd_outputs], out[num_fwd_outputs:]


def _ancestors(roots, stop=()) -> set:
    seen = set()
    todo = [r for r in roots if isinstance(r, Node)]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in stop:
            continue
        todo.extend(n.all_input_nodes)
    return seen


def _nbytes(n: Node) -> int:
    v = n.meta.get("val")
    if isinstance(v, Tensor):
        k = v.dtype.itemsize
        for s in v.shape:
            k *= s.hint() if isinstance(s, SymInt) else int(s)
        return k
    if isinstance(v, SymInt):
        return 8
    return 0


def extract_graph(joint: GraphModule, inputs: list, outputs: list, name: str) -> GraphModule:
    """A GraphModule computing `outputs` from `inputs` (nodes of `joint`), copying what is needed."""
    stop = set(inputs)
    needed = _ancestors(outputs, stop)
    g = Graph()
    env = {}
    for n in inputs:
        p = g.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    for n in joint.graph.nodes:
        if n in needed and n not in env and n.op != "output":
            if n.op == "placeholder":
                raise RuntimeError(f"partition: {name} graph needs input {n.name}, which it does not receive")
            env[n] = g.node_copy(n, lambda x: env[x])
    g.output(tuple(map_arg(o, lambda x: env[x]) if isinstance(o, Node) else o for o in outputs))
    return GraphModule(joint, g, name)


def _split(joint: GraphModule, saved: list, num_fwd_outputs: int):
    fw_outs, bw_outs = _outputs(joint, num_fwd_outputs)
    nodes = list(joint.graph.nodes)
    primals = [n for n in nodes if n.op == "placeholder" and not _is_tangent(n)]
    tangents = [n for n in nodes if _is_tangent(n)]
    order = {n: i for i, n in enumerate(nodes)}
    saved = sorted(set(saved), key=order.__getitem__)
    fw = extract_graph(joint, primals, list(fw_outs) + saved, "GraphModule")
    bw = extract_graph(joint, saved + tangents, list(bw_outs), "GraphModule")
    fw.meta["num_saved"] = len(saved)
    fw.meta["num_fwd_outputs"] = len(fw_outs)     # the outputs the caller sees; the saved values follow
    fw.meta[SAVED_RETURNED] = _returned(saved, bw_outs)
    bw.meta["num_saved"] = len(saved)
    return fw, bw


SAVED_RETURNED = "saved_returned_by_backward"   # fw gm.meta: positions in the saved values (see `_returned`)


def _returned(saved: list, bw_outs) -> frozenset:
    """Positions of the saved values that the backward returns as a gradient, themselves or a view of them
    (`loss = s * f(x).sum()`: s's gradient is the saved sum): such a gradient outlives the backward, so
    the forward keeps their memory apart from the other saved values (inductor's saved-activation arena)."""
    at = {n: i for i, n in enumerate(saved)}
    out = set()
    for n in bw_outs:
        while isinstance(n, Node) and n not in at and n.op == "call_function" and is_op(n.target) and \
                n.target.is_view and n.args:
            n = n.args[0]
        if isinstance(n, Node) and n in at:
            out.add(at[n])
    return frozenset(out)


def _default_saved(joint: GraphModule, num_fwd_outputs: int):
    fw_outs, bw_outs = _outputs(joint, num_fwd_outputs)
    nodes = list(joint.graph.nodes)
    primals = [n for n in nodes if n.op == "placeholder" and not _is_tangent(n)]
    fw_set = _ancestors(fw_outs) | set(primals)
    # the parts of a multi-output forward op are forward values too (save a part, never the tuple)
    fw_set |= {u for n in list(fw_set) for u in n.users if u.op == "call_function" and u.target is operator.getitem}
    bw_region = _ancestors(bw_outs, fw_set) - fw_set
    saved = [n for n in nodes if n in fw_set and n.op != "get_attr" and
             (any(u in bw_region for u in n.users) or n in bw_outs)]
    return saved, fw_set, bw_region


def default_partition(joint_module: GraphModule, _joint_inputs=None, *, num_fwd_outputs: int):
    """Forward = what the forward outputs need; save every forward value the backward reads."""
    saved, _, _ = _default_saved(joint_module, num_fwd_outputs)
    return _split(joint_module, saved, num_fwd_outputs)


def _materialized(n: Node, fw_set: set) -> bool:
    """`n` (or a view of it) is an operand of a forward extern kernel (matrix product, convolution,
    scan, ...: `Tag.extern`), so the forward writes it to memory anyway: saving it costs no extra
    pass, recomputing it costs one."""
    todo, seen = [n], set()
    while todo:
        for u in todo.pop().users:
            if u in seen or u not in fw_set or u.op != "call_function" or not is_op(u.target):
                continue
            seen.add(u)
            if Tag.extern in u.target.tags:
                return True
            if u.target.is_view:
                todo.append(u)
    return False


def _compared_exactly(n: Node, fw_set: set) -> bool:
    """A backward node compares `n` (or a view of it) bit for bit (`Tag.exact_compare`)."""
    todo, seen = [n], set()
    while todo:
        for u in todo.pop().users:
            if u in seen or u.op != "call_function" or not is_op(u.target):
                continue
            seen.add(u)
            if Tag.exact_compare in u.target.tags and u not in fw_set:
                return True
            if u.target.is_view:
                todo.append(u)
    return False


def _recomputable(n: Node) -> bool:
    return (n.op == "call_function" and is_op(n.target) and Tag.recomputable in n.target.tags
            and not n.target.nondeterministic)


def _frontier(n: Node, saved: set, fw_set: set):
    """Recomputable producers of `n` (not saved), and the values they read that must be saved."""
    closure, frontier = set(), set()
    todo = [n]
    while todo:
        x = todo.pop()
        if x in closure:
            continue
        closure.add(x)
        if len(closure) > MAX_RECOMPUTE_DEPTH:
            return None, None
        for i in x.all_input_nodes:
            if i.op == "get_attr":
                continue
            if i not in fw_set:
                return None, None
            if i in saved or i.op == "placeholder" or not _recomputable(i):
                frontier.add(i)
            else:
                todo.append(i)
    return closure, frontier


def min_cut_rematerialization_partition(joint_module: GraphModule, _joint_inputs=None, *,
                                        num_fwd_outputs: int, compiler: str = "inductor"):
    """Save fewer values: recompute cheap pointwise chains in the backward (see module docstring)."""
    saved_list, fw_set, _ = _default_saved(joint_module, num_fwd_outputs)
    saved = set(saved_list)
    _, bw_outs = _outputs(joint_module, num_fwd_outputs)
    position = {n: i for i, n in enumerate(joint_module.graph.nodes)}
    changed = True
    while changed:
        changed = False
        # largest first, ties in graph order: a set of nodes iterates in address order, which would make
        # the choice (hence the compiled graphs and their kernel-cache keys) differ from one compile to the next
        for n in sorted(saved, key=lambda x: (-_nbytes(x), position[x])):
            if n not in saved or not _recomputable(n) or n in bw_outs or _materialized(n, fw_set) \
                    or _compared_exactly(n, fw_set):
                continue
            closure, frontier = _frontier(n, saved, fw_set)
            if closure is None:
                continue
            cost = sum(_nbytes(f) for f in frontier if f not in saved)
            if cost == 0 or cost < _nbytes(n):
                saved.discard(n)
                saved |= frontier
                changed = True
    # keep only what the backward still reads
    nodes = list(joint_module.graph.nodes)
    tangents = {x for x in nodes if _is_tangent(x)}
    reached = _ancestors(bw_outs, saved | tangents)
    return _split(joint_module, [n for n in saved if n in reached], num_fwd_outputs)
