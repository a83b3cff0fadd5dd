"""`flambeau.cond(pred, true_fn, false_fn, operands)`: data-dependent control flow that can be captured.

Run eagerly, it calls the branch `pred` selects. Under make_fx's tracer (export, AOT autograd) both
branches are traced on the operands into subgraphs (`true_graph_<i>`, `false_graph_<i>`, stored on
the traced module) and one node `cond_op(pred, true_graph, false_graph, operands)` is recorded,
returning a tuple that getitem nodes read. Tensors a branch reads that are not operands (a module's
parameter through a closure) become extra operands of both subgraphs ("lifted"), so the graph
stays closed. Branches must return tensors of the same metadata, and may not mutate their inputs
(functionalization reports it; `UnsupportedAliasMutationException`). Gradients through cond are not
supported yet: tracing a cond whose inputs require grad with grad mode on raises.

Under a fake-tensor mode without tracing (dynamo computing example values) the true branch runs
for metadata. dynamo records the call with the branch functions as arguments (`variables/torch.py`);
AOT autograd then traces it as above.
"""
from __future__ import annotations

import operator

from .. import _state
from .._backends import MetaArray, contiguous_strides
from .._device import META
from .._subclasses.fake_tensor import FakeTensor
from .._tensor import Tensor
from ..fx.experimental.proxy_tensor import ProxyTorchDispatchMode, _Recorder
from ..fx.graph_module import GraphModule
from .._functorch.functionalization import run_functionalized

__all__ = ["cond", "cond_op", "UnsupportedAliasMutationException"]


class UnsupportedAliasMutationException(RuntimeError):
    """A cond/map branch mutates one of its inputs."""


class _BranchRecorder(_Recorder):
    """make_fx's recorder for a branch: a tensor from outside the branch becomes an extra input."""

    def __init__(self, fake_mode):
        super().__init__(fake_mode)
        self.free: list = []

    def add_input(self, t: Tensor, name: str):
        ph = self.graph.placeholder(name)
        self.bind(t, ph)
        ph.meta["val"] = self.fake_of(t)
        self.note_sizes(ph, t)
        return ph

    def node_of(self, t: Tensor):
        hit = self.data_to_node.get(id(t._data))
        if hit is not None:
            return hit[1]
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            ph = self.add_input(t, f"lifted_{len(self.free)}")
        else:
            with self.graph.inserting_before(first):
                ph = self.add_input(t, f"lifted_{len(self.free)}")
        self.free.append(t)
        return ph


def active_tracer():
    """The innermost make_fx tracing mode on the mode stack, or None."""
    for m in reversed(_state.tls.modes):
        if isinstance(m, ProxyTorchDispatchMode):
            return m
    return None


def trace_branch(fn, inputs: list, outer: ProxyTorchDispatchMode, what: str):
    """(GraphModule of `fn(*inputs)` with outside tensors lifted, its flat outputs, the lifted tensors)."""
    rec = _BranchRecorder(outer.recorder.fake_mode)
    for i, t in enumerate(inputs):
        rec.add_input(t, f"arg{i}_1")
    sub = ProxyTorchDispatchMode(rec)
    saved = _state.set_modes(sub if m is outer else m for m in _state.tls.modes)
    try:
        res = run_functionalized(lambda *a: fn(*a), tuple(inputs))
    finally:
        _state.set_modes(saved)
    if res.mutations:
        raise UnsupportedAliasMutationException(f"{what} might be modifying the input! (input {res.mutations[0][0]} "
                                                "is written in place)")
    out = res.out
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, Tensor) for o in flat):
        raise RuntimeError(f"{what} must return a tensor or a tuple/list of tensors, got {type(out).__name__}")
    rec.graph.output(tuple(rec.to_arg(o) for o in flat))
    return GraphModule(rec.root, rec.graph), flat, rec.free, type(out) if isinstance(out, (tuple, list)) else None


def order_inputs(gm: GraphModule, free: list, all_free: list, n_operands: int) -> None:
    """Give `gm` one placeholder per operand then per tensor of `all_free` (unused ones added), in that order."""
    phs = gm.graph.find_nodes(op="placeholder")
    by_id = {id(t): ph for t, ph in zip(free, phs[n_operands:])}
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    ordered = list(phs[:n_operands])
    for k, t in enumerate(all_free):
        ph = by_id.get(id(t))
        if ph is None:
            with gm.graph.inserting_before(first):
                ph = gm.graph.placeholder(f"lifted_unused_{k}")
            ph.meta["val"] = t
        ordered.append(ph)
    for ph in ordered:
        first.prepend(ph)
    gm.recompile()


def union_free(*lists) -> list:
    out, seen = [], set()
    for lst in lists:
        for t in lst:
            if id(t._data) not in seen:
                seen.add(id(t._data))
                out.append(t)
    return out


def check_no_grad(tensors: list, what: str) -> None:
    if _state.tls.grad_enabled and any(t._requires_grad for t in tensors):
        raise NotImplementedError(f"{what}: differentiating through it is not supported yet (an input requires grad "
                                  "and grad mode is on); trace it under flambeau.no_grad()")


def fresh_like(t: Tensor, fake_mode, shape: tuple | None = None) -> Tensor:
    """A new contiguous fake tensor with the dtype and device of `t` and its shape (or `shape`): outputs of
    a captured call must not alias its inputs, and making it records nothing."""
    shape = tuple(t.shape) if shape is None else tuple(shape)
    f = Tensor._make(MetaArray(shape, t._dtype.np, contiguous_strides(shape), 0), META, t._dtype)
    fake_mode._register(f, t.device)
    return f


def record_call(outer: ProxyTorchDispatchMode, target, node_args: tuple, results: list,
                shape_given: bool = False) -> list:
    """Record `target(*node_args)` returning a tuple; outputs are fresh fakes like `results` (or `results`
    themselves with `shape_given`), read by getitem nodes."""
    rec = outer.recorder
    node = rec.graph.call_function(target, node_args)
    outs = [r if shape_given else fresh_like(r, rec.fake_mode) for r in results]
    node.meta["val"] = tuple(rec.fake_of(o) for o in outs)
    for i, o in enumerate(outs):
        g = rec.graph.call_function(operator.getitem, (node, i))
        rec.bind(o, g)
        g.meta["val"] = rec.fake_of(o)
    return outs


def _metadata(t: Tensor) -> tuple:
    return tuple(str(s) for s in t.shape), t.dtype


def _subgraph_name(root, prefix: str) -> str:
    i = 0
    while hasattr(root, f"{prefix}_{i}"):
        i += 1
    return f"{prefix}_{i}"


def cond_op(pred, true_graph, false_graph, operands: tuple) -> tuple:
    """The graph-level operator: run the selected subgraph on `operands`; returns a tuple. Traced again
    (a graph with a cond exported or compiled), it records itself as `cond` does."""
    tracer = active_tracer()
    if tracer is not None and isinstance(pred, Tensor):
        out = _trace_cond(tracer, pred, true_graph, false_graph, tuple(operands))
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if isinstance(pred, FakeTensor):
        out = true_graph(*operands)
    else:
        out = (true_graph if bool(pred) else false_graph)(*operands)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _check_pred(pred) -> None:
    if isinstance(pred, Tensor) and pred.numel() != 1:
        raise RuntimeError(f"cond: expected pred to be a bool or a tensor with a single item, got a tensor of "
                           f"shape {list(pred.shape)}")


def cond(pred, true_fn, false_fn, operands=()):
    """`torch.cond` (see module docstring)."""
    if not callable(true_fn) or not callable(false_fn):
        raise RuntimeError("cond: expected true_fn and false_fn to be callable")
    if not isinstance(operands, (tuple, list)) or not all(isinstance(o, Tensor) for o in operands):
        raise RuntimeError(f"cond: expected operands to be a tuple/list of tensors, got {operands!r}")
    operands = tuple(operands)
    _check_pred(pred)
    tracer = active_tracer()
    if not isinstance(pred, Tensor):
        return (true_fn if pred else false_fn)(*operands)
    if tracer is None:
        if isinstance(pred, FakeTensor):
            return true_fn(*operands)
        return (true_fn if bool(pred) else false_fn)(*operands)
    return _trace_cond(tracer, pred, true_fn, false_fn, operands)


def _trace_cond(tracer, pred, true_fn, false_fn, operands: tuple):
    t_gm, t_out, t_free, kind = trace_branch(true_fn, list(operands), tracer, "cond's true_fn")
    f_gm, f_out, f_free, _ = trace_branch(false_fn, list(operands), tracer, "cond's false_fn")
    if [_metadata(o) for o in t_out] != [_metadata(o) for o in f_out]:
        raise RuntimeError("cond: true_fn and false_fn must return tensors of the same shapes and dtypes, got "
                           f"{[_metadata(o) for o in t_out]} and {[_metadata(o) for o in f_out]}")
    free = union_free(t_free, f_free)
    check_no_grad(list(operands) + free, "cond")
    order_inputs(t_gm, t_free, free, len(operands))
    order_inputs(f_gm, f_free, free, len(operands))
    rec = tracer.recorder
    names = []
    for prefix, gm in (("true_graph", t_gm), ("false_graph", f_gm)):
        name = _subgraph_name(rec.root, prefix)
        setattr(rec.root, name, gm)
        names.append(rec.graph.get_attr(name))
    args = (rec.to_arg(pred), names[0], names[1], tuple(rec.to_arg(t) for t in list(operands) + free))
    outs = record_call(tracer, cond_op, args, t_out)
    return outs[0] if kind is None else kind(outs)


cond._flambeau_higher_order = True      # dynamo records it with its function arguments
