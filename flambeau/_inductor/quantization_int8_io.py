"""The inductor's int8-in, int8-out rewrite (PyTorch's x86 `dequant -> max_pool2d / cat / flatten ->
quant` patterns in `torch/_inductor/fx_passes/quantization.py`): an operator that only moves or selects
values, between dequantizes and a quantize that all use the same static per-tensor qparams (what
X86InductorQuantizer's shared observers produce around a max pool, a cat or a flatten), runs on the
integers themselves:

    dequantize(qx, s, zp, ...) -> max_pool2d_with_indices -> [0] -> quantize(_, s, zp, ...)
    dequantize(qa, s, zp, ...), dequantize(qb, ...) -> cat -> quantize(_, s, zp, ...)
    dequantize(qx, s, zp, ...) -> view / reshape / flatten -> quantize(_, s, zp, ...)
    dequantize(qx, s, zp, ...) -> avg pool (`_taps_gather` averaging windows, or a global mean) -> quantize(_, s, zp, ...)

become max_pool2d_with_indices(qx)[0] / cat([qa, qb]) / view(qx) / `_avg_pool2d_int8(qx, windows, zp)`
on the uint8 (int8) tensors. The average pool sums integers exactly and rounds as PyTorch's quantized
avg_pool2d (a `_taps_gather`) or adaptive_avg_pool2d (a global mean) (`_ops/quantized_pool.py`; within
one integer of the float q/dq path, at near-halves). The max of
dequantized values is the dequantized max (dequantize is monotonic and max pooling's padding never wins),
and requantizing a dequantized integer with its own qparams gives it back, so the results are the
integers the float path computes, in a quarter of the memory traffic, without the dequantize and
quantize kernels. `config.quantized_pooling = False` turns it off.
"""
from __future__ import annotations

import operator

from .. import _dtype as D
from .._ops import EXPORTS, quantized as Q, quantized_pool
from .._ops._registry import OPS
from ..fx.node import Node
from . import config

_INT8 = (D.uint8, D.int8)


def _is(node, *ops) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and any(node.target is op for op in ops)


def _qparams(node, op):
    """The (scale, zero point, qmin, qmax, dtype) of a static per-tensor `op` node over u8/s8 producing
    or reading float32, else None."""
    if not _is(node, op) or len(node.args) != 6 or node.kwargs.get("out_dtype") not in (None, D.float32) or \
            node.args[5] not in _INT8:
        return None
    return tuple(node.args[1:])


def _requantize(value):
    """(quantize node, qparams) when `value`'s only user quantizes it (static, per tensor), else None."""
    users = list(value.users)
    if len(users) != 1:
        return None
    qp = _qparams(users[0], Q.qd_quantize_per_tensor)
    return None if qp is None else (users[0], qp)


def _integers(inputs, qparams):
    """The integer tensors behind `inputs` when each is a dequantize with `qparams`, else None."""
    out = []
    for x in inputs:
        if _qparams(x, Q.qd_dequantize_per_tensor) != qparams:
            return None
        out.append(x.args[0])
    return out


def _views():
    return tuple(op for op in (OPS["view"], EXPORTS["reshape"], EXPORTS.get("flatten"), OPS.get("_unsafe_view"))
                 if op is not None)


def _avg_windows(gm, node):
    """The integer windows (`quantized_pool`) of an average pool: a `_taps_gather` whose tables average
    windows of the last two dims, or a mean over the last two dims of a 4-d tensor with keepdim (a global
    pool); None for anything else."""
    if _is(node, OPS["_taps_gather"]):
        return quantized_pool.taps_windows_of(gm, node)
    if not _is(node, OPS["mean.dim"]) or node.kwargs.get("dtype") is not None:
        return None
    val = node.args[0].meta.get("val", node.args[0].meta.get("example_value")) if isinstance(node.args[0], Node) \
        else None
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if val is None or len(val.shape) != 4 or not keep or len(node.args) < 2 or \
            sorted(int(d) % 4 for d in node.args[1]) != [2, 3]:
        return None
    H, W = int(val.shape[2]), int(val.shape[3])
    return ([0], [H], [H]), ([0], [W], [W])


def _rewrite(gm, node) -> bool:
    """Rewrite one candidate `node` (module docstring); returns whether it did."""
    graph = gm.graph
    windows = _avg_windows(gm, node)
    if windows is not None:
        requant = _requantize(node)
        ints = None if requant is None else _integers([node.args[0]], requant[1])
        if ints is None:
            return False
        q, qparams = requant
        with graph.inserting_before(node):
            new = graph.call_function(OPS["_avg_pool2d_int8"], (ints[0], *windows[0], *windows[1], qparams[1],
                                                                _is(node, OPS["mean.dim"])))
        q.replace_all_uses_with(new)
        return True
    if _is(node, OPS["max_pool2d_with_indices"]):
        values = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
        if len(values) != 1:
            return False
        value, inputs = values[0], [node.args[0]]
    elif _is(node, OPS["cat"]) and isinstance(node.args[0], (list, tuple)):
        value, inputs = node, list(node.args[0])
    elif _is(node, *_views()):
        value, inputs = node, [node.args[0]]
    else:
        return False
    requant = _requantize(value)
    if requant is None:
        return False
    q, qparams = requant
    ints = _integers(inputs, qparams)
    if ints is None:
        return False
    with graph.inserting_before(node):
        if value is node:
            first = ints if _is(node, OPS["cat"]) else ints[0]
            new = graph.call_function(node.target, (first,) + tuple(node.args[1:]), dict(node.kwargs))
        else:
            pooled = graph.call_function(node.target, (ints[0],) + tuple(node.args[1:]), dict(node.kwargs))
            new = graph.call_function(operator.getitem, (pooled, 0))
    q.replace_all_uses_with(new)
    return True


def fuse_int8_in_int8_out(gm) -> int:
    """Rewrite, in place, each max pool / average pool / cat / view of `gm` between dequantizes and a quantize with the
    same qparams to run on the integers; returns how many."""
    if not config.quantized_pooling:
        return 0
    graph = gm.graph
    done = sum(_rewrite(gm, node) for node in list(graph.nodes))
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done
