"""The PT2E quantization flow (PyTorch's `torch.ao.quantization.quantize_pt2e`): capture a model as an
aten graph, let a `Quantizer` annotate it, `prepare_pt2e` folds batch norms into their convolutions
(as PyTorch's) and inserts observers (fake quantizers with
`prepare_qat_pt2e`) on the annotated edges, the user calibrates (or trains), and `convert_pt2e`
replaces each observer by `quantized_decomposed` quantize/dequantize ops with the qparams it
computed, folding weights into int8 constants. The converted graph runs eagerly, and
`flambeau.compile` lowers its q/dq ops (their decompositions) into the generated kernels.

`capture_pre_autograd_graph` is the one place that captures: `make_fx` until `flambeau.export`
lands (then `export(...).module()`), so the captured graph is specialised to the example shapes.
"""
from __future__ import annotations

import operator

from ... import _dtype as D
from ... import _ops
from ...fx._aten import ops
from ...fx.graph_module import GraphModule
from ...fx.experimental.proxy_tensor import make_fx
from ...nn.modules.module import Module
from .fake_quantize import FakeQuantize
from .observer import ObserverBase, PlaceholderObserver
from .quantizer import ANNOTATION_KEY, Quantizer
from .utils import is_per_channel

F = _ops.EXPORTS
QD = ops.quantized_decomposed
OBSERVER_PREFIX = "activation_post_process_"


def capture_pre_autograd_graph(model: Module, args: tuple, kwargs: dict | None = None) -> GraphModule:
    """The aten graph of `model(*args, **kwargs)` with parameters as attributes (get_attr nodes)."""
    kwargs = kwargs or {}
    if kwargs:
        return make_fx(lambda *a: model(*a, **kwargs))(*args)
    return make_fx(model)(*args)


def _check_graph_module(model, api: str) -> None:
    if not isinstance(model, GraphModule):
        raise TypeError(f"{api} expects a captured GraphModule (capture_pre_autograd_graph(model, args), or "
                        f"flambeau.export.export(...).module()), got {type(model).__name__}")


def _new_observer(model: GraphModule, spec, index: int) -> str:
    name = f"{OBSERVER_PREFIX}{index}"
    model.add_submodule(name, spec.observer_or_fake_quant_ctr(**spec.observer_kwargs()))
    return name


def _insert_observers(model: GraphModule) -> GraphModule:
    """One observer per (edge source, spec); each annotated input reads it, an annotated output feeds it."""
    graph = model.graph
    made: dict = {}
    count = 0
    for node in list(graph.nodes):
        ann = node.meta.get(ANNOTATION_KEY)
        if ann is None:
            continue
        for src, spec in ann.input_qspec_map.items():
            if spec is None:
                continue
            obs = made.get((src, spec))
            if obs is None:
                name = _new_observer(model, spec, count)
                count += 1
                with graph.inserting_before(node):
                    obs = graph.call_module(name, (src,))
                made[(src, spec)] = obs
            node.replace_input_with(src, obs)
        if ann.output_qspec is not None and (node, ann.output_qspec) not in made:
            name = _new_observer(model, ann.output_qspec, count)
            count += 1
            with graph.inserting_after(node):
                obs = graph.call_module(name, (node,))
            node.replace_all_uses_with(obs, delete_user_cb=lambda user, o=obs: user is not o)
            made[(node, ann.output_qspec)] = obs
    graph.lint()
    model.recompile()
    return model


def _is_inference_batch_norm(node) -> bool:
    return node.op == "call_function" and node.target is ops.aten.native_batch_norm.default and \
        len(node.args) == 8 and node.args[5] is False


def _fold_conv_bn(model: GraphModule) -> int:
    """Fold each inference batch norm whose input is a convolution used by it alone into that
    convolution's weight and bias (PyTorch's `_fuse_conv_bn_` in `prepare_pt2e`, with
    `torch.nn.utils.fusion.fuse_conv_bn_weights`' arithmetic: r = rsqrt(var + eps), w * (gamma r),
    ((b - mean) r) gamma + beta, in float32), so the weight is observed and quantized folded, as
    PyTorch's; returns how many. The folded values are new attributes; the convolution's users read
    it where they read the batch norm's output."""
    graph = model.graph
    folded = 0
    for bn in list(graph.nodes):
        if not _is_inference_batch_norm(bn):
            continue
        conv, gamma, beta, mean, var, _, _, eps = bn.args
        if conv.op != "call_function" or conv.target is not ops.aten.convolution.default or len(conv.users) != 1:
            continue
        w, b = _constant_of(model, conv.args[1]), None if conv.args[2] is None else _constant_of(model, conv.args[2])
        stats = [None if n is None else _constant_of(model, n) for n in (gamma, beta, mean, var)]
        if w is None or (conv.args[2] is not None and b is None) or stats[2] is None or stats[3] is None or \
                any(n is not None and t is None for n, t in zip((gamma, beta), stats[:2])):
            continue
        g, bt, mu, v = (t.detach() for t in (stats[0] if gamma is not None else F["ones_like"](stats[2]),
                                              stats[1] if beta is not None else F["zeros_like"](stats[2]),
                                              stats[2], stats[3]))
        transposed = conv.args[6]
        r = F["rsqrt"](v + eps)
        shape = [1, -1] if transposed else [-1, 1]
        fused_w = w.detach() * (g * r).reshape(shape + [1] * (w.ndim - 2))
        fused_b = ((F["zeros_like"](mu) if b is None else b.detach()) - mu) * r * g + bt
        with graph.inserting_before(conv):
            args = list(conv.args)
            args[1], args[2] = _buffer(model, graph, "_folded_weight", fused_w), \
                _buffer(model, graph, "_folded_bias", fused_b)
        conv.args = tuple(args)
        for user in list(bn.users):
            if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(conv)
        folded += 1
    if folded:
        graph.eliminate_dead_code()
        graph.lint()
        model.recompile()
    return folded


def prepare_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Fold batch norms into their convolutions (`_fold_conv_bn`), annotate `model` with `quantizer`
    and insert its observers; run calibration data through the result, then `convert_pt2e` it."""
    _check_graph_module(model, "prepare_pt2e")
    _fold_conv_bn(model)
    return _prepare(model, quantizer)


def _prepare(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    model = quantizer.transform_for_annotation(model)
    quantizer.annotate(model)
    quantizer.validate(model)
    return _insert_observers(model)


def prepare_qat_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """`prepare_pt2e` for quantization-aware training: the quantizer's QAT configuration inserts fake
    quantizers, so training sees the rounding and its straight-through gradient (batch norms stay:
    no QAT conv-bn fusion)."""
    _check_graph_module(model, "prepare_qat_pt2e")
    return _prepare(model, quantizer)


# ---- convert ---------------------------------------------------------------------------------------
def _fresh_name(model: GraphModule, base: str) -> str:
    i = 0
    while hasattr(model, f"{base}{i}"):
        i += 1
    return f"{base}{i}"


def _buffer(model: GraphModule, graph, base: str, value):
    name = _fresh_name(model, base)
    model.register_buffer(name, value)
    return graph.get_attr(name)


def _constant_of(model: GraphModule, node):
    if node.op != "get_attr":
        return None
    obj = model
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def _replace_observer(model: GraphModule, node, mod, fold_quantize: bool) -> None:
    graph = model.graph
    src = node.args[0]
    obs = mod.activation_post_process if isinstance(mod, FakeQuantize) else mod
    dtype = getattr(obs, "dtype", D.float32)
    qmin, qmax = getattr(obs, "quant_min", None), getattr(obs, "quant_max", None)
    with graph.inserting_before(node):
        if isinstance(obs, PlaceholderObserver):
            if not obs.is_dynamic:
                out = src
            else:          # dynamic: qparams chosen from each input at run time
                eps = obs.eps if obs.eps is not None else float(2 ** -23)
                qparams = graph.call_function(QD.choose_qparams.tensor, (src, qmin, qmax, eps, dtype))
                scale = graph.call_function(operator.getitem, (qparams, 0))
                zp = graph.call_function(operator.getitem, (qparams, 1))
                q = graph.call_function(QD.quantize_per_tensor.tensor, (src, scale, zp, qmin, qmax, dtype))
                out = graph.call_function(QD.dequantize_per_tensor.tensor, (q, scale, zp, qmin, qmax, dtype))
        else:
            scale, zp = mod.calculate_qparams()
            const = _constant_of(model, src) if fold_quantize else None
            if is_per_channel(obs.qscheme):
                axis = obs.ch_axis
                s_node = _buffer(model, graph, "_scale_", scale)
                z_node = _buffer(model, graph, "_zero_point_", zp)
                if const is not None:       # fold: the weight stored as its integers
                    q = _buffer(model, graph, "_frozen_param",
                                QD.quantize_per_channel(const.detach(), scale, zp, axis, qmin, qmax, dtype))
                else:
                    q = graph.call_function(QD.quantize_per_channel.default,
                                            (src, s_node, z_node, axis, qmin, qmax, dtype))
                out = graph.call_function(QD.dequantize_per_channel.default,
                                          (q, s_node, z_node, axis, qmin, qmax, dtype))
            else:
                s, z = float(scale), int(zp)
                if const is not None:
                    q = _buffer(model, graph, "_frozen_param",
                                QD.quantize_per_tensor(const.detach(), s, z, qmin, qmax, dtype))
                else:
                    q = graph.call_function(QD.quantize_per_tensor.default, (src, s, z, qmin, qmax, dtype))
                out = graph.call_function(QD.dequantize_per_tensor.default, (q, s, z, qmin, qmax, dtype))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    model.delete_submodule(node.target)


def convert_pt2e(model: GraphModule, use_reference_representation: bool = False,
                 fold_quantize: bool = True) -> GraphModule:
    """Replace every observer / fake quantizer by quantize -> dequantize with its qparams (weights
    folded into integer constants); returns the model, whose ops are `quantized_decomposed`'s."""
    _check_graph_module(model, "convert_pt2e")
    if use_reference_representation:
        raise NotImplementedError("convert_pt2e: use_reference_representation=True is not supported")
    for node in list(model.graph.nodes):
        if node.op == "call_module" and node.target.startswith(OBSERVER_PREFIX):
            mod = getattr(model, node.target)
            if isinstance(mod, (ObserverBase, FakeQuantize)):
                _replace_observer(model, node, mod, fold_quantize)
    model.graph.eliminate_dead_code()
    model.graph.lint()
    model.recompile()
    return model
