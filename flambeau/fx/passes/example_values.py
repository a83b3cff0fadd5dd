"""Dropping a compiled graph's example values and giving them back when it is compiled again.

Each node of a traced graph carries its example value (`meta["val"]`: a FakeTensor over a
MetaArray, or a tuple of them). Once a backend has compiled the graph, the callable runs without
them, but the graph stays alive for a later compile (another input layout, a backward without some
tangents), and with it two or three tracked objects per node that every full garbage collection of
the process walks (issue 11). `drop_values(gm)` removes them from a graph with static sizes;
`restore_values(gm, args)` recomputes them from the inputs of the call that needs them (ShapeProp
on fake tensors). A graph with symbolic sizes keeps its values: they carry the size symbols. A graph
whose values were dropped is also packed into bytes until it is read again (packed_graph.py): its nodes
are then not objects the collector walks either.
"""
from __future__ import annotations

from ..._subclasses.fake_tensor import FakeTensorMode
from ..._tensor import Tensor
from .._symbolic_shapes import SymInt
from ..node import map_aggregate
from .shape_prop import ShapeProp

VALUES_DROPPED = "example_values_dropped"      # gm.meta key: drop_values removed them
_VALUE_KEYS = ("val", "tensor_meta")


def _symbolic(v) -> bool:
    found = [False]

    def visit(x):
        if isinstance(x, SymInt) or (isinstance(x, Tensor) and any(
                isinstance(s, SymInt) for s in tuple(x.shape) + tuple(x.stride()))):
            found[0] = True
        return x
    map_aggregate(v, visit)
    return found[0]


def drop_values(gm) -> bool:
    """Remove the example values of `gm`'s nodes unless a size in them is symbolic; whether it did."""
    nodes = list(gm.graph.nodes)
    if gm.meta.get("shape_env") is not None or any(_symbolic(n.meta.get("val")) for n in nodes):
        return False
    for n in nodes:
        for k in _VALUE_KEYS:
            n.meta.pop(k, None)
    gm.meta[VALUES_DROPPED] = True
    gm.pack_graph()
    return True


def restore_values(gm, args, fake_mode: FakeTensorMode | None = None) -> bool:
    """Recompute the example values that drop_values removed, for inputs like `args` (real or fake
    tensors), under `fake_mode` (a fresh one by default); whether they had been dropped."""
    if not gm.meta.pop(VALUES_DROPPED, False):
        return False
    ShapeProp(gm, fake_mode or FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    for n in gm.graph.nodes:
        n.meta.pop("tensor_meta", None)
    return True
