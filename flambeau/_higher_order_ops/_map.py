"""`flambeau._higher_order_ops.map(f, xs, *args)`: `f` applied to each slice `xs[i]`, results stacked.

Eagerly a Python loop. Under make_fx's tracer `f` is traced once on a slice-shaped input into a
subgraph (`body_graph_<i>`, outside tensors lifted as extra arguments, as for `cond`) and one node
`map_op(body_graph, xs, args)` is recorded.
"""
from __future__ import annotations

import builtins

from .._ops.shape import stack
from .._tensor import Tensor
from ._cond import active_tracer, check_no_grad, fresh_like, order_inputs, record_call, trace_branch, _subgraph_name

__all__ = ["map", "map_op"]


def map_op(body, xs: Tensor, args: tuple) -> tuple:
    """The graph-level operator: stack `body(x, *args)` over the leading dim of `xs`; returns a tuple (traced
    again, it records itself as `map` does)."""
    if active_tracer() is not None:
        out = map(body, xs, *args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    results = [body(x, *args) for x in xs.unbind(0)]
    results = [tuple(r) if isinstance(r, (tuple, list)) else (r,) for r in results]
    return tuple(stack([r[k] for r in results]) for k in range(len(results[0])))


def map(f, xs: Tensor, *args):  # noqa: A001
    """`torch._higher_order_ops.map` (see module docstring)."""
    if not isinstance(xs, Tensor) or xs.dim() == 0:
        raise RuntimeError("map: xs must be a tensor with at least one dimension")
    if not builtins.all(isinstance(a, Tensor) for a in args):
        raise RuntimeError("map: extra arguments must be tensors")
    tracer = active_tracer()
    if tracer is None:
        out = [f(x, *args) for x in xs.unbind(0)]
        if isinstance(out[0], (tuple, list)):
            return type(out[0])(stack([o[k] for o in out]) for k in range(len(out[0])))
        return stack(out)
    fake_mode = tracer.recorder.fake_mode
    sample = fresh_like(xs, fake_mode, tuple(xs.shape)[1:])
    gm, outs, free, kind = trace_branch(f, [sample, *args], tracer, "map's body")
    check_no_grad([xs, *args, *free], "map")
    order_inputs(gm, free, free, 1 + len(args))
    rec = tracer.recorder
    name = _subgraph_name(rec.root, "body_graph")
    setattr(rec.root, name, gm)
    node_args = (rec.graph.get_attr(name), rec.to_arg(xs), tuple(rec.to_arg(t) for t in list(args) + free))
    stacked = [fresh_like(o, fake_mode, (xs.shape[0], *o.shape)) for o in outs]
    res = record_call(tracer, map_op, node_args, stacked, shape_given=True)
    return res[0] if kind is None else kind(res)


map._flambeau_higher_order = True      # dynamo records it with its function arguments
