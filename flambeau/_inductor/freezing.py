"""Freezing (`config.freezing`): an inference graph's weights become constants, folded at compile time.

    lift_to_constants(gm, {placeholder: tensor})   placeholders -> get_attr constants of gm
    constant_fold(gm) -> int                       nodes computed from constants only -> constants

`lift_to_constants` turns the placeholders of parameters and buffers into `get_attr` nodes reading
attributes `_frozen_param<i>` of the GraphModule; the code generator then treats them as constants
(graph.py's `_constant`: baked into the compiled code, never passed per call). `constant_fold`
evaluates, eagerly and once, every node whose tensor inputs are all constants (a linear layer's
`permute(weight)`, batch norm's `rsqrt(running_var + eps) * weight`, ...) and replaces it by a
new constant, stored C-contiguous: the transposed weight of a linear layer is written once in the
row-major layout the GEMM reads, instead of being read through strides on every call. Folding
never grows the weights (a node whose result has more elements than its constant inputs together,
an `expand`, stays; except a weight-packing op, `onednn::qlinear_prepack`, whose packed int8 weight
has a few rows more for its column sums: packed once here, never per call), never folds random ops,
and never folds sizes (SymInt arguments).
"""
from __future__ import annotations

from .._tags import Tag
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from ..fx.node import Node
from ..fx._symbolic_shapes import SymInt
from .._tensor import contiguous_format

FROZEN_PREFIX = "_frozen_param"
FOLDED_PREFIX = "_folded_constant"
PACKING_OPS = ("onednn::qlinear_prepack", "onednn::qconv_prepack")   # folded though larger than their input


def lift_to_constants(gm, values: dict) -> list:
    """Replace each placeholder node in `values` by a get_attr of its tensor (detached); returns the
    attribute names, in graph order."""
    names = []
    for node in list(gm.graph.nodes):
        if node.op != "placeholder" or node not in values:
            continue
        name = f"{FROZEN_PREFIX}{len(names)}"
        t = values[node]
        setattr(gm, name, t.detach() if isinstance(t, Tensor) else t)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
        names.append(name)
    _move_get_attrs_first(gm)
    gm.recompile()
    return names


def _move_get_attrs_first(gm):
    """Keep placeholders first, then get_attrs: the graph's inputs stay a prefix, as FX expects."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not placeholders:
        return
    last = placeholders[-1]
    for n in nodes:
        if n.op == "get_attr":
            last.append(n)
            last = n


def _constant_of(gm, node) -> Tensor | None:
    if node.op != "get_attr":
        return None
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, Tensor) else None


def _foldable(node) -> bool:
    """Not random, and no size argument (SymInt: unknown until the graph runs)."""
    if Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return False
    return not any(isinstance(a, SymInt) for a in _flat(node.args, node.kwargs))


def constant_fold(gm, keep=frozenset()) -> int:
    """Fold every node whose tensor inputs are all constants of `gm` (see module docstring). The
    attributes named in `keep` are state the compiled code writes (buffers a program updates): not
    constant, never folded, their get_attr nodes kept even when nothing reads them."""
    consts: dict = {n: t for n in gm.graph.nodes if (t := _constant_of(gm, n)) is not None and n.target not in keep}
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if not inputs or any(i not in consts for i in inputs) or not _foldable(node):
            continue
        args = _map(node.args, consts)
        kwargs = _map(node.kwargs, consts)
        with no_grad():
            value = node.target(*args, **kwargs)
        if not isinstance(value, Tensor) or (value.numel() > sum(consts[i].numel() for i in set(inputs)) and
                                             getattr(node.target, "name", None) not in PACKING_OPS):
            continue
        value = value.clone(memory_format=contiguous_format)
        name = f"{FOLDED_PREFIX}{folded}"
        setattr(gm, name, value)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
        consts[attr] = value
        folded += 1
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or (n.op == "get_attr" and n.target in keep))
    gm.recompile()
    return folded


def _flat(args, kwargs) -> list:
    out: list = []

    def visit(a):
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
        else:
            out.append(a)
    visit(args)
    visit(kwargs)
    return out


def _map(a, consts: dict):
    if isinstance(a, Node):
        return consts[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_map(x, consts) for x in a)
    if isinstance(a, dict):
        return {k: _map(v, consts) for k, v in a.items()}
    return a


class FrozenGraph:
    """A compiled graph whose leading state inputs were frozen: called with every input, it passes on
    the ones it still takes. `compiled` is the CompiledGraph (tests read its source)."""

    def __init__(self, compiled, keep: list):
        self.compiled = compiled
        self.keep = keep

    def __call__(self, *args):
        return self.compiled(*[args[i] for i in self.keep])


def compile_frozen(gm, example_inputs: list, n_state: int, compile_fn):
    """`compile_fn(gm, inputs)` of the graph with its inputs 0..n_state-1 (a module's parameters and
    buffers, as AOT autograd lifts them) frozen, except those the graph writes
    (`gm.meta["mutated_inputs"]`), then constant-folded."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs):
        return compile_fn(gm, example_inputs)
    mutated = set(gm.meta.get("mutated_inputs", ()))
    frozen = {placeholders[i]: example_inputs[i] for i in range(n_state)
              if i not in mutated and isinstance(example_inputs[i], Tensor)}
    keep = [i for i, p in enumerate(placeholders) if p not in frozen]
    writes = gm.meta.get("input_writes")
    if writes:                          # input positions of the graph that is compiled (mutated inputs are kept)
        gm.meta["input_writes"] = {j: keep.index(i) for j, i in writes.items() if i in keep}
    lift_to_constants(gm, {p: t.detach().contiguous() for p, t in frozen.items()})
    constant_fold(gm)
    return FrozenGraph(compile_fn(gm, [example_inputs[i] for i in keep]), keep)
