"""Batch norms folded into the layer before them, as PyTorch's PT2E flow does (torchao's
`pt2e/utils.py` and `pt2e/qat_utils.py`):

- `fold_conv_bn` / `fold_linear_bn` (`prepare_pt2e`): an inference batch norm after a convolution, or
  after a linear layer whose input is 2-D (BatchNorm1d over the linear's features), is folded into its
  weight and bias (`torch.nn.utils.fusion.fuse_conv_bn_weights` / `fuse_linear_bn_weights` arithmetic,
  float32), so the weight is observed and quantized folded.
- `fuse_conv_bn_qat` (`prepare_qat_pt2e`): conv -> batch norm is rewritten into the approximate fused
  QAT form, sf = gamma / sqrt(running_var + eps), conv(x, w * sf) / sf + b -> batch norm, so the weight
  fake quantizer sees the folded weight while training still updates the batch statistics.
- `fold_conv_bn_qat` (`convert_pt2e`): that form becomes one convolution with the batch norm's running
  statistics folded into the weight (quantized with the QAT scales) and the bias.

The graphs are `make_fx` aten graphs: `aten.convolution`, `aten.linear`, `aten.native_batch_norm`
followed by `getitem`s, parameters and buffers as get_attr nodes.
"""
from __future__ import annotations

import operator

from ... import _ops
from ...fx._aten import ops
from ...fx.graph_module import GraphModule
from .quantizer import ANNOTATION_KEY

F = _ops.EXPORTS
QAT_CONV_BN_KEY = "qat_conv_bn"       # bn.meta: the fused QAT form's original weight and bias nodes


def fresh_name(model: GraphModule, base: str) -> str:
    i = 0
    while hasattr(model, f"{base}{i}"):
        i += 1
    return f"{base}{i}"


def add_buffer(model: GraphModule, graph, base: str, value):
    """Register `value` as a new buffer of `model` and return a get_attr node reading it."""
    name = fresh_name(model, base)
    model.register_buffer(name, value)
    return graph.get_attr(name)


def constant_of(model: GraphModule, node):
    """The tensor a get_attr node reads, or None for any other node."""
    if node is None or node.op != "get_attr":
        return None
    obj = model
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def _is_batch_norm(node) -> bool:
    return node.op == "call_function" and node.target is ops.aten.native_batch_norm.default and len(node.args) == 8


def _is_conv(node) -> bool:
    return node.op == "call_function" and node.target is ops.aten.convolution.default


def _bn_statistics(model: GraphModule, bn):
    """(gamma, beta, running_mean, running_var, eps) as constants, or None if any is not a constant;
    an absent gamma/beta reads as ones/zeros."""
    _, gamma, beta, mean, var, _, _, eps = bn.args
    mu, v = constant_of(model, mean), constant_of(model, var)
    g, bt = constant_of(model, gamma), constant_of(model, beta)
    if mu is None or v is None or (gamma is not None and g is None) or (beta is not None and bt is None):
        return None
    g = F["ones_like"](mu) if gamma is None else g
    bt = F["zeros_like"](mu) if beta is None else bt
    return g.detach(), bt.detach(), mu.detach(), v.detach(), eps


def _conv_bn_weights(w, b, stats, transposed: bool):
    """`fuse_conv_bn_weights`: w * (gamma r), ((b - mean) r) gamma + beta with r = rsqrt(var + eps)."""
    g, bt, mu, v, eps = stats
    r = F["rsqrt"](v + eps)
    shape = [1, -1] if transposed else [-1, 1]
    fused_w = w.detach() * (g * r).reshape(shape + [1] * (w.ndim - 2))
    fused_b = ((F["zeros_like"](mu) if b is None else b.detach()) - mu) * r * g + bt
    return fused_w, fused_b


def _linear_bn_weights(w, b, stats):
    """`fuse_linear_bn_weights`: s = gamma rsqrt(var + eps); w * s[:, None], (b - mean) s + beta."""
    g, bt, mu, v, eps = stats
    s = g * F["rsqrt"](v + eps)
    return w.detach() * s.unsqueeze(-1), ((F["zeros_like"](mu) if b is None else b.detach()) - mu) * s + bt


def _replace_bn_output(bn, producer) -> None:
    """Users of the batch norm's first output read `producer` instead."""
    for user in list(bn.users):
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0:
            user.replace_all_uses_with(producer)


def _finish(model: GraphModule, changed: int) -> int:
    if changed:
        model.graph.eliminate_dead_code()
        model.graph.lint()
        model.recompile()
    return changed


def _inference_bns(graph):
    """(batch norm, its input node) for each inference batch norm whose input has no other user."""
    for bn in list(graph.nodes):
        if _is_batch_norm(bn) and bn.args[5] is False and len(bn.args[0].users) == 1:
            yield bn, bn.args[0]


def fold_conv_bn(model: GraphModule) -> int:
    """Fold each inference batch norm whose input is a convolution used by it alone; returns how many.
    The folded values are new buffers; the convolution's users read it where they read the batch norm."""
    graph = model.graph
    folded = 0
    for bn, conv in _inference_bns(graph):
        if not _is_conv(conv):
            continue
        w, b, stats = constant_of(model, conv.args[1]), constant_of(model, conv.args[2]), _bn_statistics(model, bn)
        if w is None or (conv.args[2] is not None and b is None) or stats is None:
            continue
        fused_w, fused_b = _conv_bn_weights(w, b, stats, conv.args[6])
        with graph.inserting_before(conv):
            args = list(conv.args)
            args[1], args[2] = add_buffer(model, graph, "_folded_weight", fused_w), \
                add_buffer(model, graph, "_folded_bias", fused_b)
        conv.args = tuple(args)
        _replace_bn_output(bn, conv)
        folded += 1
    return _finish(model, folded)


def fold_linear_bn(model: GraphModule) -> int:
    """Fold each inference batch norm whose input is a linear layer with a 2-D input, used by the batch
    norm alone (with a 3-D input BatchNorm1d normalises dim 1 while the linear maps the last: not
    folded, as PyTorch's `_fuse_linear_bn_`); returns how many."""
    graph = model.graph
    folded = 0
    for bn, lin in _inference_bns(graph):
        if lin.op != "call_function" or lin.target is not ops.aten.linear.default:
            continue
        x = lin.args[0]
        val = x.meta.get("val") if hasattr(x, "meta") else None
        if val is None or val.ndim != 2:
            continue
        bias = lin.args[2] if len(lin.args) > 2 else None
        w, b, stats = constant_of(model, lin.args[1]), constant_of(model, bias), _bn_statistics(model, bn)
        if w is None or (bias is not None and b is None) or stats is None:
            continue
        fused_w, fused_b = _linear_bn_weights(w, b, stats)
        with graph.inserting_before(lin):
            lin.args = (x, add_buffer(model, graph, "_folded_weight", fused_w),
                        add_buffer(model, graph, "_folded_bias", fused_b))
        _replace_bn_output(bn, lin)
        folded += 1
    return _finish(model, folded)


# ---- QAT -------------------------------------------------------------------------------------------
def _counter_update(conv, bn):
    """The batch norm's `num_batches_tracked += 1` (an in-place add of 1 to a get_attr) between the
    convolution and the batch norm in graph order, or None."""
    node = conv.next
    while node is not bn:
        if node.op == "call_function" and node.target is ops.aten.add_.Tensor and node.args[1] == 1 and \
                node.args[0].op == "get_attr":
            return node
        node = node.next
    return None


def fuse_conv_bn_qat(model: GraphModule) -> int:
    """Rewrite each convolution -> batch norm (the batch norm its only user, its affine weight and
    running statistics constants) into PyTorch's approximate fused QAT form:

        sf = gamma / sqrt(running_var + eps)
        y  = conv(x, w * sf.view(-1, 1, ...), no bias) / sf.view(1, -1, 1, ...) [+ b.view(1, -1, 1, ...)]
        batch_norm(y, ...)                                   (unchanged: batch statistics in training)

    The convolution's weight annotation moves to w * sf (its fake quantizer observes the folded
    weight). Runs after annotation, before observers are inserted, as PyTorch's `_fuse_conv_bn_qat`.
    The batch norm's own eps is used (PyTorch's pattern fixes 1e-5, the default). Returns how many."""
    graph = model.graph
    fused = 0
    view = ops.aten.view.default
    for bn in list(graph.nodes):
        if not _is_batch_norm(bn) or QAT_CONV_BN_KEY in bn.meta:
            continue
        conv = bn.args[0]
        if not _is_conv(conv) or len(conv.users) != 1 or conv.args[6]:
            continue
        gamma, var, eps = bn.args[1], bn.args[4], bn.args[7]
        w_node, b_node = conv.args[1], conv.args[2]
        w = constant_of(model, w_node)
        if gamma is None or constant_of(model, gamma) is None or constant_of(model, var) is None or w is None \
                or (b_node is not None and constant_of(model, b_node) is None):
            continue
        ones = [1] * (w.ndim - 2)
        for attr in (gamma, var):          # make_fx reads the batch norm's parameters after the conv
            conv.prepend(attr)
        with graph.inserting_before(conv):
            std = graph.call_function(ops.aten.sqrt.default, (graph.call_function(ops.aten.add.Tensor, (var, eps)),))
            sf = graph.call_function(ops.aten.div.Tensor, (gamma, std))
            scaled_w = graph.call_function(ops.aten.mul.Tensor, (w_node, graph.call_function(view, (sf, [-1, 1] + ones))))
        with graph.inserting_after(conv):
            y = graph.call_function(ops.aten.div.Tensor, (conv, graph.call_function(view, (sf, [1, -1] + ones))))
        out = y
        if b_node is not None:
            with graph.inserting_after(y):
                out = graph.call_function(ops.aten.add.Tensor, (y, graph.call_function(view, (b_node, [1, -1] + ones))))
        bn.replace_input_with(conv, out)
        conv.args = (conv.args[0], scaled_w, None) + tuple(conv.args[3:])
        ann = conv.meta.get(ANNOTATION_KEY)
        if ann is not None:
            ann.input_qspec_map = {scaled_w if src is w_node else src: spec
                                   for src, spec in ann.input_qspec_map.items() if src is not b_node}
        bn.meta[QAT_CONV_BN_KEY] = (conv, w_node, b_node)
        fused += 1
    if fused:
        graph.lint()
        model.recompile()
    return fused


def fold_conv_bn_qat(model: GraphModule) -> int:
    """`convert_pt2e`'s half of the QAT fusion: each fused form becomes conv(x, folded w, folded b) with
    the batch norm's current running statistics (`fuse_conv_bn_weights`); the weight's observer now
    reads the folded weight, so convert quantizes it with the scales learned in training, as PyTorch's
    `_fold_conv_bn_qat`. The batch norm and its counter update leave the graph. Returns how many."""
    graph = model.graph
    folded = 0
    for bn in list(graph.nodes):
        if not _is_batch_norm(bn) or QAT_CONV_BN_KEY not in bn.meta:
            continue
        conv, w_node, b_node = bn.meta.pop(QAT_CONV_BN_KEY)
        stats = _bn_statistics(model, bn)
        fused_w, fused_b = _conv_bn_weights(constant_of(model, w_node), constant_of(model, b_node), stats, False)
        weight_in = conv.args[1]           # the weight's observer, or w * sf itself when not annotated
        target = weight_in if weight_in.op == "call_module" else conv
        with graph.inserting_before(target):
            w_attr = add_buffer(model, graph, "_folded_weight", fused_w)
        if weight_in.op == "call_module":
            weight_in.args = (w_attr,) + tuple(weight_in.args[1:])
        with graph.inserting_before(conv):
            b_attr = add_buffer(model, graph, "_folded_bias", fused_b)
        args = list(conv.args)
        if weight_in.op != "call_module":
            args[1] = w_attr
        args[2] = b_attr
        conv.args = tuple(args)
        _replace_bn_output(bn, conv)
        counter = _counter_update(conv, bn)
        for user in list(bn.users):
            if not user.users:
                graph.erase_node(user)
        if not bn.users:
            graph.erase_node(bn)
        if counter is not None:
            graph.erase_node(counter)
        folded += 1
    return _finish(model, folded)
