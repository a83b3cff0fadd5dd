"""Graph passes AOT autograd runs on a joint graph before partitioning it (PyTorch's
`torch._functorch.compile_utils`).

`fx_graph_cse(gm)`: common subexpression elimination. A backward formula often recomputes what the
forward already has: cross-entropy's backward takes the softmax of the logits again (their cast to
float32, the row maximum, the sum of exponentials), so the joint graph holds each of those twice.
Merged, the partitioner sees one value used by both halves and saves the small statistics (the row
maximum and sum) instead of reading the logits three more times in the backward. Two calls merge when
they call the same operator on the same arguments (after earlier merges); calls that draw random
numbers (`Tag.nondeterministic_seeded`), write an argument, or have other effects (`Node.is_impure`)
never merge.
"""
from __future__ import annotations

from ..fx._aten import is_op
from ..fx.graph_module import GraphModule
from ..fx.node import Node

__all__ = ["fx_graph_cse"]


def _mergeable(n: Node) -> bool:
    if n.op != "call_function" or n.is_impure():
        return False
    op = n.target
    if is_op(op):
        return not (op.nondeterministic or op.is_inplace or any(a.mutated for a in op._schema.args))
    return getattr(op, "__module__", None) == "_operator"      # operator.getitem and friends: pure


_PLAIN = (int, bool, str, complex, type(None))


def _key(value):
    """A hashable stand-in for an argument: nodes and other objects by identity (a dtype is one object;
    a symbolic size is never compared by value, which could guard on it), numbers by type and value
    (floats by repr: 0.0 and -0.0 differ, two NaNs agree), lists as tuples, dicts as sorted items."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted((k, _key(v)) for k, v in value.items()))
    if type(value) is float:
        return ("float", repr(value))
    if type(value) in _PLAIN:
        return (type(value).__name__, value)
    return ("id", id(value))


def fx_graph_cse(gm: GraphModule) -> GraphModule:
    """Merge duplicate pure calls of `gm` in place (the later call's users read the earlier one); returns
    `gm`, recompiled when anything merged."""
    seen: dict = {}
    merged = 0
    for n in list(gm.graph.nodes):
        if not _mergeable(n):
            continue
        key = (n.target, _key(n.args), _key(n.kwargs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        n.replace_all_uses_with(first)
        gm.graph.erase_node(n)
        merged += 1
    if merged:
        gm.recompile()
    return gm
