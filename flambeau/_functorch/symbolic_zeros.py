"""Symbolic zeros: specialise a backward graph on the tangents that are absent.

An output of a compiled graph that requires grad may receive no gradient (the loss does not use it,
or only a non-differentiable op reads it after a graph break). Eager autograd then never runs the
backward of the ops that made it; a backward graph fed a zero tangent would run them, and a zero
times a NaN or an infinity of the forward (`softmax` of `log10(-1)`) would poison the real
gradients. So, as PyTorch's and JAX's symbolic zeros, an absent tangent is no input at all:
`prune_absent_tangents(bw_gm, absent)` rebuilds the backward graph with those tangents known to
be zero and propagates the fact.

A backward graph is linear in its tangents, so a node whose tangent-dependent inputs are all zero,
and whose value is a floating tensor, is zero and is dropped. Where a zero meets a real value:
`a + 0` and `a - 0` are `a` (kept bit for bit, signed zeros too, as eager's accumulation keeps the
defined gradient); elsewhere (`cat`, a scatter, a comparison) the zero is materialised as `full(0)`
of its shape. A gradient output that is zero becomes None (eager leaves such an input's grad None).
Sizes that were read from an absent tangent are read from another input with the same size symbol;
an absent tangent stays a placeholder (to be fed zeros) only when it is the sole source of a size.
"""
from __future__ import annotations

from .._dtype import FLOATING
from .._tensor import Tensor
from ..fx._aten import is_op
from ..fx.experimental.proxy_tensor import _Recorder
from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..fx.node import Node, map_arg
from ..fx._symbolic_shapes import SymInt
from .._ops._registry import OPS

__all__ = ["prune_absent_tangents"]

# x + alpha * 0 == x and x - alpha * 0 == x: the op keeps its first operand when the second is zero
_KEEPS_SELF_WITH_ZERO_OTHER = (OPS["add.Tensor"], OPS["sub.Tensor"])
# 0 + x == x: the op is its second operand when the first is zero (alpha scales only the second)
_KEEPS_OTHER_WITH_ZERO_SELF = (OPS["add.Tensor"],)


def _floating(v) -> bool:
    return isinstance(v, Tensor) and v._dtype.category >= FLOATING


def _same_meta(a, b) -> bool:
    return (isinstance(a, Tensor) and isinstance(b, Tensor) and a._dtype is b._dtype
            and tuple(a.shape) == tuple(b.shape))


class _Pruner:
    """Copies `gm`'s graph node by node, with `absent` tangent placeholders as symbolic zeros."""

    def __init__(self, gm: GraphModule, absent: set, fake_mode):
        self.gm, self.absent = gm, absent
        self.graph = Graph()
        self.rec = _Recorder(fake_mode)
        self.rec.graph = self.graph
        self.env: dict = {}              # old node -> new node (or a Python value)
        self.zero: set = set()           # old nodes known to be zero
        self.depends: set = set()        # old nodes that depend on a tangent
        self.materialised: dict = {}     # old zero node -> new full(0) node

    def placeholders(self) -> list:
        phs = self.gm.graph.find_nodes(op="placeholder")
        n_saved = self.gm.meta["num_saved"]
        for i, ph in enumerate(phs):
            new = self.graph.placeholder(ph.name)
            new.meta = dict(ph.meta)
            self.env[ph] = new
            if i >= n_saved:
                self.depends.add(ph)
                if i - n_saved in self.absent:
                    self.zero.add(ph)
        # sizes are read from saved values and present tangents first, an absent tangent last
        for ph in sorted(phs, key=lambda p: p in self.zero):
            v = ph.meta.get("val")
            if isinstance(v, Tensor):
                self.rec.note_sizes(self.env[ph], v)
            elif isinstance(v, SymInt) and v.expr.is_Symbol:
                self.rec._expr_nodes.setdefault(v.expr, self.env[ph])
        return phs

    def zeros_for(self, n: Node) -> Node:
        """A `full(0)` node with the shape, dtype and device of the zero node `n`."""
        hit = self.materialised.get(n)
        if hit is None:
            v = n.meta["val"]
            size = [self.rec.to_arg(s) for s in v.shape]
            hit = self.graph.call_function(OPS["full"], (size, 0), {"dtype": v._dtype, "device": v.device})
            hit.meta["val"] = v
            self.materialised[n] = hit
        return hit

    def copy(self, n: Node) -> Node:
        def arg(x):
            if x in self.zero:
                return self.zeros_for(x)
            return self.env[x]
        if n.op == "call_function" and n.meta.get("val") is not None and isinstance(n.meta["val"], SymInt) \
                and any(i in self.zero for i in n.all_input_nodes):
            return self.rec.to_arg(n.meta["val"])      # a size of an absent tangent, read from another input
        return self.graph.node_copy(n, arg)

    def visit(self, n: Node) -> None:
        tangent_inputs = [i for i in n.all_input_nodes if i in self.depends]
        if not tangent_inputs:
            self.env[n] = self.copy(n)
            return
        self.depends.add(n)
        zeros = [i for i in tangent_inputs if i in self.zero]
        if not zeros:
            self.env[n] = self.copy(n)
        elif len(zeros) == len(tangent_inputs) and _floating(n.meta.get("val")):
            self.zero.add(n)
        else:
            self.env[n] = self.identity(n) or self.copy(n)

    def identity(self, n: Node):
        """The surviving operand of `x + a*0`, `x - a*0`, `0 + x` with x of the result's shape and dtype."""
        if n.op != "call_function" or not is_op(n.target) or len(n.args) < 2:
            return None
        a, b = n.args[0], n.args[1]
        val = n.meta.get("val")
        if n.target in _KEEPS_SELF_WITH_ZERO_OTHER and b in self.zero and a not in self.zero \
                and isinstance(a, Node) and _same_meta(a.meta.get("val"), val):
            return self.env[a]
        if n.target in _KEEPS_OTHER_WITH_ZERO_SELF and a in self.zero and b not in self.zero \
                and n.kwargs.get("alpha", 1) == 1 and isinstance(b, Node) and _same_meta(b.meta.get("val"), val):
            return self.env[b]
        return None

    def output(self, n: Node) -> None:
        outs = n.args[0]
        self.graph.output(map_arg(outs, lambda x: None if x in self.zero else self.env[x]))


def prune_absent_tangents(bw_gm: GraphModule, absent: set, fake_mode) -> tuple:
    """(the backward graph specialised on the tangents numbered `absent` being zero, the numbers of
    the tangents it still takes). `bw_gm` takes `(*saved, *tangents)` (`meta["num_saved"]`); the result
    takes the saved values and the kept tangents, and returns None for a gradient that is zero."""
    p = _Pruner(bw_gm, set(absent), fake_mode)
    phs = p.placeholders()
    for n in bw_gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            p.output(n)
        else:
            p.visit(n)
    p.graph.eliminate_dead_code()
    n_saved = bw_gm.meta["num_saved"]
    kept = []
    for i, ph in enumerate(phs[n_saved:]):
        new = p.env[ph]
        if i in p.absent and not new.users:
            p.graph.erase_node(new)
        else:
            kept.append(i)
    gm = GraphModule(bw_gm, p.graph, "GraphModule")
    gm.meta["num_saved"] = n_saved
    return gm, kept
