"""The PT2E quantization flow (PyTorch's `torch.ao.quantization.quantize_pt2e`): capture a model as an
aten graph, let a `Quantizer` annotate it, `prepare_pt2e` folds batch norms into their convolutions
and linear layers (as PyTorch's; `prepare_qat_pt2e` rewrites conv -> batch norm into PyTorch's fused
QAT form instead) and inserts observers (fake quantizers with `prepare_qat_pt2e`) on the annotated edges, the user calibrates (or trains), and `convert_pt2e`
replaces each observer by `quantized_decomposed` quantize/dequantize ops with the qparams it
computed, folding weights into int8 constants. The converted graph runs eagerly, and
`flambeau.compile` lowers its q/dq ops (their decompositions) into the generated kernels.

`capture_pre_autograd_graph` is the one place that captures: `make_fx` until `flambeau.export`
lands (then `export(...).module()`), so the captured graph is specialised to the example shapes.
"""
from __future__ import annotations

import operator

from ... import _dtype as D
from ...fx._aten import ops
from ...fx.graph_module import GraphModule
from ...fx.node import Node
from ...fx.experimental.proxy_tensor import make_fx
from ...nn.modules.module import Module
from .bn_folding import add_buffer, constant_of, fold_conv_bn, fold_conv_bn_qat, fold_linear_bn, fuse_conv_bn_qat
from .fake_quantize import FakeQuantize
from .observer import ObserverBase, PlaceholderObserver
from .quantizer import ANNOTATION_KEY, Quantizer, SharedQuantizationSpec
from .utils import is_per_channel

QD = ops.quantized_decomposed
OBSERVER_PREFIX = "activation_post_process_"


def capture_pre_autograd_graph(model: Module, args: tuple, kwargs: dict | None = None) -> GraphModule:
    """The aten graph of `model(*args, **kwargs)` with parameters as attributes (get_attr nodes). Traced
    on fake tensors, as torch.export: a model in training mode keeps its batch norms' running statistics
    (a real trace would update them once). Nodes record the module calls they come from
    (`nn_module_stack`), which the quantizers read (a ReLU module vs a functional relu, as PyTorch's)."""
    kwargs = kwargs or {}
    if kwargs:
        return make_fx(lambda *a: model(*a, **kwargs), tracing_mode="fake")(*args)
    return make_fx(model, tracing_mode="fake", record_module_stack=True)(*args)


def _check_graph_module(model, api: str) -> None:
    if not isinstance(model, GraphModule):
        raise TypeError(f"{api} expects a captured GraphModule (capture_pre_autograd_graph(model, args), or "
                        f"flambeau.export.export(...).module()), got {type(model).__name__}")


class _Observers:
    """Observer insertion state (PyTorch's `prepare`): one observer per (edge source, spec), reused by
    every annotated input reading that source with that spec; an output observer that inputs with the
    same spec share (implicit sharing); `SharedQuantizationSpec`s reuse another edge's observer
    instance, called again where they apply (as PyTorch, so a shared histogram sees both tensors)."""

    def __init__(self, model: GraphModule):
        self.model, self.graph, self.count = model, model.graph, 0
        self.made: dict = {}        # (source, spec) -> observer node
        self.edges: dict = {}       # (source, user) -> (observer node, spec)
        self.outputs: dict = {}     # node -> (observer node, spec)

    def _call(self, module, src, where):
        """A call of `module` on `src` inserted at `where` (a graph insertion context)."""
        name = f"{OBSERVER_PREFIX}{self.count}"
        self.count += 1
        self.model.add_submodule(name, module)
        with where:
            return self.graph.call_module(name, (src,))

    @staticmethod
    def _fresh(spec):
        return spec.observer_or_fake_quant_ctr(**spec.observer_kwargs())

    def _resolve(self, spec):
        """(observer node, root spec) a SharedQuantizationSpec points at."""
        key = spec.edge_or_node
        return self.edges[key] if isinstance(key, tuple) else self.outputs[key]

    def observe_input(self, node, src, spec) -> None:
        if isinstance(spec, SharedQuantizationSpec):
            target, root = self._resolve(spec)
            obs = self._call(self.model.get_submodule(target.target), src, self.graph.inserting_before(node))
        elif src in self.outputs and self.outputs[src][1] == spec:
            obs, root = self.outputs[src][0], spec
        else:
            obs, root = self.made.get((src, spec)), spec
            if obs is None:
                obs = self.made[(src, spec)] = self._call(self._fresh(spec), src, self.graph.inserting_before(node))
        seen = [src] + ([self.outputs[src][0]] if src in self.outputs else [])
        node.args = _map_nodes(node.args, lambda a: obs if isinstance(a, Node) and a in seen else a)
        self.edges[(src, node)] = (obs, root)

    def observe_output(self, node, spec) -> None:
        if isinstance(spec, SharedQuantizationSpec):
            target, root = self._resolve(spec)
            module = self.model.get_submodule(target.target)
        else:
            module, root = self._fresh(spec), spec
        obs = self._call(module, node, self.graph.inserting_after(node))
        node.replace_all_uses_with(obs, delete_user_cb=lambda user: user is not obs)
        self.outputs[node] = (obs, root)


def _map_nodes(args, fn):
    if isinstance(args, (tuple, list)):
        return type(args)(_map_nodes(a, fn) for a in args)
    return fn(args)


def _insert_observers(model: GraphModule) -> GraphModule:
    """Observers on the annotated edges and outputs, in graph order (`_Observers`)."""
    state = _Observers(model)
    for node in list(model.graph.nodes):
        ann = node.meta.get(ANNOTATION_KEY)
        if ann is None:
            continue
        for src, spec in ann.input_qspec_map.items():
            if spec is not None:
                state.observe_input(node, src, spec)
        if ann.output_qspec is not None:
            state.observe_output(node, ann.output_qspec)
    model.graph.lint()
    model.recompile()
    return model


def prepare_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Fold inference batch norms into the convolutions and linear layers before them (`bn_folding`),
    annotate `model` with `quantizer` and insert its observers; run calibration data through the
    result, then `convert_pt2e` it."""
    _check_graph_module(model, "prepare_pt2e")
    fold_conv_bn(model)
    fold_linear_bn(model)
    return _insert_observers(_annotate(model, quantizer))


def _annotate(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    model = quantizer.transform_for_annotation(model)
    quantizer.annotate(model)
    quantizer.validate(model)
    return model


def prepare_qat_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """`prepare_pt2e` for quantization-aware training: the quantizer's QAT configuration inserts fake
    quantizers, so training sees the rounding and its straight-through gradient; after annotation each
    convolution -> batch norm becomes PyTorch's fused QAT form (`bn_folding.fuse_conv_bn_qat`: the
    weight scaled by gamma / running std is fake-quantized), which `convert_pt2e` folds."""
    _check_graph_module(model, "prepare_qat_pt2e")
    model = _annotate(model, quantizer)
    fuse_conv_bn_qat(model)
    return _insert_observers(model)


def _set_batch_norm_training(model: GraphModule, training: bool) -> GraphModule:
    for node in model.graph.nodes:
        if node.op == "call_function" and node.target is ops.aten.native_batch_norm.default and len(node.args) == 8:
            node.args = node.args[:5] + (training,) + node.args[6:]
    model.recompile()
    return model


def move_exported_model_to_eval(model: GraphModule) -> GraphModule:
    """The captured graph's batch norms use their running statistics (PyTorch's
    `move_exported_model_to_eval`, for evaluating a QAT model; `model.eval()` does not change a
    captured graph). Dropout is not rewritten here."""
    return _set_batch_norm_training(model, False)


def move_exported_model_to_train(model: GraphModule) -> GraphModule:
    """The captured graph's batch norms use batch statistics and update the running ones again."""
    return _set_batch_norm_training(model, True)


# ---- convert ---------------------------------------------------------------------------------------
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
            const = constant_of(model, src) if fold_quantize else None
            if is_per_channel(obs.qscheme):
                axis = obs.ch_axis
                s_node = add_buffer(model, graph, "_scale_", scale)
                z_node = add_buffer(model, graph, "_zero_point_", zp)
                if const is not None:       # fold: the weight stored as its integers
                    q = add_buffer(model, graph, "_frozen_param",
                                QD.quantize_per_channel(const.detach(), scale, zp, axis, qmin, qmax, dtype))
                else:
                    q = graph.call_function(QD.quantize_per_channel.default,
                                            (src, s_node, z_node, axis, qmin, qmax, dtype))
                out = graph.call_function(QD.dequantize_per_channel.default,
                                          (q, s_node, z_node, axis, qmin, qmax, dtype))
            else:
                s, z = float(scale), int(zp)
                if const is not None:
                    q = add_buffer(model, graph, "_frozen_param",
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
    fold_conv_bn_qat(model)
    for node in list(model.graph.nodes):
        if node.op == "call_module" and node.target.startswith(OBSERVER_PREFIX):
            mod = getattr(model, node.target)
            if isinstance(mod, (ObserverBase, FakeQuantize)):
                _replace_observer(model, node, mod, fold_quantize)
    model.graph.eliminate_dead_code()
    model.graph.lint()
    model.recompile()
    return model
