"""`X86InductorQuantizer` (PyTorch's `torch.ao.quantization.quantizer.x86_inductor_quantizer`):
annotates convolutions and linears for x86 int8 inference: uint8 affine activations (histogram
observer; placeholder when dynamic; fused moving-average fake quantization under QAT) and int8
symmetric per-output-channel weights, the configuration of `get_default_x86_inductor_quantization_config`.

A convolution whose only user adds it to another tensor (ResNet's residual: conv -> add [-> relu])
also gets the add's other input annotated with the activation spec, as PyTorch's
`_annotate_conv2d_binary(_unary)`: the converted graph adds a dequantized residual, which the
inductor's pass takes as the integer accum of `qconv2d_pointwise.binary`. Otherwise only the
operators' inputs are annotated (as PyTorch does for a convolution or linear not followed by an
int8-consuming op). A linear followed by an add keeps the add's other input float, as PyTorch's
`_annotate_linear_binary_unary` (the inductor fuses it as `qlinear_pointwise.binary`'s add post-op).

As PyTorch's recipe, the last node of each quantized pattern is marked `_is_output_of_quantized_pattern`
(a convolution alone, the ReLU/ReLU6/Hardtanh/Hardswish/SiLU *module* after it, the add [or the unary
module after it] of conv + add, a linear): a max pool whose input is such a node is annotated too
(its input observed, its output sharing that observer: int8 in, int8 out), and so is a `cat` whose
inputs all are (the first input observed, the others and the output sharing its observer). Module
types come from the capture's `nn_module_stack`; a functional relu is not a pattern's end, as in
PyTorch. Average pools (`avg_pool2d`, `adaptive_avg_pool2d`, captured as `_taps_gather` or a global
`mean`) of such nodes, and a flatten between such a node and a quantizable op (`nn.Flatten`,
`torch.flatten`, a view merging dims), are annotated the same way, as PyTorch's `int8_in_int8_out_ops`.

With a QAT configuration a convolution followed by a batch norm (PyTorch's `_annotate_qat_conv2d_bn*`:
the batch norm is not folded before annotation) gets its output observed where the fused pattern ends:
after a ReLU/Hardtanh/Hardswish/SiLU that is the batch norm's only user, after an add [-> unary] (whose
other input is observed too), else after the batch norm. PyTorch matches the unary as a module
(`nn.ReLU`), which a make_fx graph does not record: a functional relu counts here as well.
"""
from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass

from .... import _dtype as D
from ....fx._aten import ops
from ....fx.graph_module import GraphModule
from ....fx.node import Node
from ....nn import functional
from ...._ops import quantized_pool
from ....nn.modules.conv import Conv2d
from ....nn.modules.linear import Linear
from ..observer import (HistogramObserver, PerChannelMinMaxObserver, PlaceholderObserver, MovingAverageMinMaxObserver,
                        MovingAveragePerChannelMinMaxObserver)
from ..fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from . import ANNOTATION_KEY, QuantizationAnnotation, QuantizationSpec, Quantizer, SharedQuantizationSpec

X86_EPS = 2 ** -12       # the eps of PyTorch's x86 qconfig
# the weighted operators the quantizer annotates: (op, position of the weight)
_WEIGHTED = ((ops.aten.convolution.default, 1), (ops.aten.linear.default, 1))


# the unary modules that end a conv pattern (PyTorch's `unary_patterns`), and the aten ops they record
_UNARY_MODULES = {"ReLU": (ops.aten.relu.default, ops.aten.relu_.default), "ReLU6": (ops.aten.hardtanh.default,),
                  "Hardtanh": (ops.aten.hardtanh.default,), "Hardswish": (ops.aten.hardswish.default,),
                  "SiLU": (ops.aten.silu.default,)}


@dataclass
class _X86InductorQuantizationAnnotation(QuantizationAnnotation):
    """PyTorch's: `_is_output_of_quantized_pattern` marks the node whose output a quantized pattern
    produces (what the propagation to pooling and cat looks for)."""
    _is_output_of_quantized_pattern: bool = False


def _is_unary_module(node) -> bool:
    """`node` is the aten op of a ReLU/ReLU6/Hardtanh/Hardswish/SiLU module call (a graph without module
    metadata: any of those ops)."""
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    if "nn_module_stack" not in node.meta:
        return any(node.target in t for t in _UNARY_MODULES.values())
    stack = list(node.meta["nn_module_stack"].values())
    return bool(stack) and node.target in _UNARY_MODULES.get(stack[-1][1].rsplit(".", 1)[-1], ())


def _flag(node) -> None:
    """Mark `node` as the output of a quantized pattern."""
    ann = node.meta.get(ANNOTATION_KEY)
    if ann is None:
        node.meta[ANNOTATION_KEY] = ann = _X86InductorQuantizationAnnotation(_annotated=True)
    ann._is_output_of_quantized_pattern = True


def _pool_output(node) -> Node | None:
    """The values output (getitem 0) of a max_pool2d_with_indices node, or None."""
    outs = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
    return outs[0] if len(outs) == 1 else None


def _is_quantized_op(node) -> bool:
    """PyTorch's `_is_quantized_op_pt2e`: the node ends a quantized pattern (a max pool's values output
    counts through the pool)."""
    if not isinstance(node, Node):
        return False
    if node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0 and \
            _is_max_pool(node.args[0]):
        node = node.args[0]
    return bool(getattr(node.meta.get(ANNOTATION_KEY), "_is_output_of_quantized_pattern", False))


def _shape(node):
    v = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(int(s) for s in v.shape) if v is not None and hasattr(v, "shape") else None


def _is_flatten(node) -> bool:
    """A view recorded by an `nn.Flatten` module, `torch.flatten`/`Tensor.flatten` or a `view`/`reshape`
    that merges consecutive dims (`x.view(x.size(0), -1)`): the capture records each as one view, so
    they are told apart by shape (PyTorch's `aten.flatten.using_ints` is propagated; a plain view there
    is not, which puts its observer after the view instead: the same values, so the same statistics)."""
    if not isinstance(node, Node) or node.op != "call_function" or \
            node.target is not ops.aten.view.default:
        return False
    stack = list(node.meta.get("nn_module_stack", {}).values())
    if stack and stack[-1][1].rsplit(".", 1)[-1] == "Flatten":
        return True
    src, out = _shape(node.args[0]), _shape(node)
    if src is None or out is None or len(out) >= len(src):
        return False
    m = len(src) - len(out) + 1                 # dims folded into one
    return any(src[:k] == out[:k] and math.prod(src[k:k + m]) == out[k] and src[k + m:] == out[k + 1:]
               for k in range(len(out)))


_AVG_POOL_MODULES = ("AvgPool2d", "AdaptiveAvgPool2d")


def _is_avg_pool(model, node) -> bool:
    """An average pool as the capture records it: `_taps_gather` over a 4-d input's last two dims with
    tables that average windows (`avg_pool2d`, `adaptive_avg_pool2d`; an interpolation's do not), or the
    `mean(dims (-2, -1), keepdim)` of a global pool (an `nn.AdaptiveAvgPool2d` module, or
    `F.adaptive_avg_pool2d(x, 1)`, which spells its dims so; a user's `x.mean((2, 3), keepdim=True)` is
    no pool, as in PyTorch). A node inside another nn module than the pools' (`nn.Upsample`) is none."""
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    stack = list(node.meta.get("nn_module_stack", {}).values())
    kind = stack[-1][1].rsplit(".", 1)[-1] if stack else None
    if kind is not None and kind not in _AVG_POOL_MODULES and stack[-1][1].startswith("flambeau.nn.modules."):
        return False
    src = _shape(node.args[0]) if node.args else None
    if src is None or len(src) != 4:
        return False
    if node.target is ops.aten.mean.dim:
        dims = tuple(node.args[1]) if len(node.args) > 1 else ()
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if not keep or node.kwargs.get("dtype") is not None:
            return False
        return dims == (-2, -1) or (kind == "AdaptiveAvgPool2d" and sorted(d % 4 for d in dims) == [2, 3])
    if node.target is not ops.aten._taps_gather.default or len(node.args) < 3:
        return False
    return quantized_pool.taps_windows_of(model, node) is not None


def _is_quantizable(node) -> bool:
    """PyTorch's `quantizable_ops` (what a flatten's user must be for the flatten to be propagated)."""
    return _is_plain_conv(node) or _is_max_pool(node) or _is_flatten(node) or \
        (isinstance(node, Node) and node.op == "call_function" and
         node.target in (ops.aten.linear.default, ops.aten.cat.default, ops.aten.mul.Tensor))


def _is_max_pool(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and \
        node.target is ops.aten.max_pool2d_with_indices.default


def _only_user(node) -> Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _bn_output(conv) -> Node | None:
    """The first output (getitem 0) of the batch norm that is `conv`'s only user, or None."""
    bn = _only_user(conv)
    if bn is None or bn.op != "call_function" or bn.target is not ops.aten.native_batch_norm.default:
        return None
    outs = [u for u in bn.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
    return outs[0] if len(outs) == 1 else None


def _is_plain_conv(node) -> bool:
    """A 2-D, not transposed `aten.convolution` node."""
    return isinstance(node, Node) and node.op == "call_function" and \
        node.target is ops.aten.convolution.default and len(node.args) == 9 and not node.args[6] and \
        len(node.args[3]) == 2


@dataclass(eq=True, frozen=True)
class QuantizationConfig:
    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: QuantizationSpec | None
    is_qat: bool = False


def get_default_x86_inductor_quantization_config(is_qat: bool = False, is_dynamic: bool = False,
                                                 reduce_range: bool = False) -> QuantizationConfig:
    """PyTorch's x86 default: activations uint8 [0, 255] (127 with reduce_range) per tensor, weights
    int8 [-128, 127] symmetric per output channel, eps 2**-12."""
    extra = {"eps": X86_EPS}
    if is_qat:
        if is_dynamic:
            act_ctr = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1),
                                             **extra)
        else:
            act_ctr = FusedMovingAvgObsFakeQuantize.with_args(**extra)
        weight_ctr = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, **extra)
    else:
        act_ctr = (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(**extra)
        weight_ctr = PerChannelMinMaxObserver.with_args(**extra)
    act = QuantizationSpec(dtype=D.uint8, quant_min=0, quant_max=127 if reduce_range else 255,
                           qscheme=D.per_tensor_affine, is_dynamic=is_dynamic, observer_or_fake_quant_ctr=act_ctr)
    weight = QuantizationSpec(dtype=D.int8, quant_min=-128, quant_max=127, qscheme=D.per_channel_symmetric,
                              ch_axis=0, is_dynamic=False, observer_or_fake_quant_ctr=weight_ctr)
    return QuantizationConfig(act, act, weight, None, is_qat)


class X86InductorQuantizer(Quantizer):
    """Annotates convolutions and linears (and the int8-in-int8-out ops after them) with the configuration
    of the module they come from (`set_module_name_qconfig`, by the node's `nn_module_stack`), else of
    their operator (`set_module_type_qconfig(nn.Conv2d | nn.Linear | F.conv2d | F.linear, ...)`, which
    PyTorch maps to the aten operator), else the global one (`set_global`); a None configuration leaves
    the nodes float."""

    def __init__(self):
        super().__init__()
        self.global_config: QuantizationConfig | None = None
        self.operator_type_config: dict = {}
        self.module_name_config: dict = {}

    def set_global(self, quantization_config: QuantizationConfig | None) -> "X86InductorQuantizer":
        self.global_config = quantization_config
        return self

    def set_module_type_qconfig(self, module_type, quantization_config) -> "X86InductorQuantizer":
        op = {Conv2d: ops.aten.convolution.default, functional.conv2d: ops.aten.convolution.default,
              Linear: ops.aten.linear.default, functional.linear: ops.aten.linear.default}.get(module_type)
        if op is None:
            warnings.warn(f"Module: Unable to customize quantization config for {module_type} by X86InductorQuantizer.")
        else:
            self.operator_type_config[op] = quantization_config
        return self

    def set_module_name_qconfig(self, module_name: str, quantization_config) -> "X86InductorQuantizer":
        self.module_name_config[module_name] = quantization_config
        return self

    def _config_for(self, node) -> QuantizationConfig | None:
        fqns = [fqn for fqn, _ in node.meta.get("nn_module_stack", {}).values()]
        for name, config in self.module_name_config.items():
            if any(f == name or f.startswith(name + ".") for f in fqns):
                return config
        if node.target in self.operator_type_config:
            return self.operator_type_config[node.target]
        return self.global_config

    def _annotate_weighted(self, node, w_pos: int) -> QuantizationConfig | None:
        """Annotate a convolution's or linear's activation and weight; returns the config used (None: the
        node is left alone)."""
        config = self._config_for(node)
        if config is None or ANNOTATION_KEY in node.meta:
            return None
        inputs = {}
        if config.input_activation is not None:
            inputs[node.args[0]] = config.input_activation
        if config.weight is not None and len(node.args) > w_pos:
            inputs[node.args[w_pos]] = config.weight
        node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(input_qspec_map=inputs, _annotated=True)
        return config

    def _annotate_conv_add(self, model: GraphModule) -> None:
        """conv -> add(conv, extra): the convolution as usual, and the add's extra input quantized (the
        first operand that is such a convolution is the one fused, as PyTorch's)."""
        for node in model.graph.nodes:
            if node.op != "call_function" or node.target is not ops.aten.add.Tensor or len(node.args) != 2 or \
                    node.kwargs.get("alpha", 1) != 1 or ANNOTATION_KEY in node.meta:
                continue
            for conv_pos in (0, 1):
                conv, extra = node.args[conv_pos], node.args[1 - conv_pos]
                if not _is_plain_conv(conv) or len(conv.users) != 1 or not isinstance(extra, Node):
                    continue
                config = self._annotate_weighted(conv, 1)
                if config is not None and config.input_activation is not None:
                    node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                        input_qspec_map={extra: config.input_activation}, _annotated=True)
                    relu = _only_user(node)
                    relu = relu if relu is not None and relu.target in _UNARY_MODULES["ReLU"] and \
                        _is_unary_module(relu) else None
                    _flag(relu if relu is not None else node)
                break

    def _annotate_conv(self, model: GraphModule) -> None:
        """conv [-> unary module]: the convolution's input and weight; the unary (else the convolution)
        ends the pattern (PyTorch's `_annotate_conv2d_unary` / `_annotate_conv2d`)."""
        for conv in model.graph.nodes:
            if not _is_plain_conv(conv) or ANNOTATION_KEY in conv.meta:
                continue
            if self._annotate_weighted(conv, 1) is None:
                continue
            unary = _only_user(conv)
            _flag(unary if unary is not None and _is_unary_module(unary) and ANNOTATION_KEY not in unary.meta
                  else conv)

    def _propagate(self, model: GraphModule) -> None:
        """int8 in, int8 out (PyTorch's `_annotate_propagation_quantizable_pattern` and
        `_annotate_output_for_int8_in_int8_out_pattern`): a max pool, an average pool or a flatten of a
        quantized pattern's output (the flatten only where a user is quantizable), a cat of such outputs."""
        for node in model.graph.nodes:
            if node.op != "call_function" or ANNOTATION_KEY in node.meta:
                continue
            config = self._config_for(node)
            act = None if config is None else config.input_activation
            if act is None or act.is_dynamic:
                continue
            if _is_max_pool(node):
                out, src = _pool_output(node), node.args[0]
                if out is None or not _is_quantized_op(src) or ANNOTATION_KEY in out.meta:
                    continue
                node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={src: act}, _annotated=True, _is_output_of_quantized_pattern=True)
                out.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    output_qspec=SharedQuantizationSpec((src, node)), _annotated=True)
            elif _is_avg_pool(model, node):
                src = node.args[0]
                if not _is_quantized_op(src):
                    continue
                node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={src: act}, output_qspec=SharedQuantizationSpec((src, node)), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            elif _is_flatten(node):
                src = node.args[0]
                if not node.users or not any(_is_quantizable(u) for u in node.users) or not _is_quantized_op(src):
                    continue
                node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={src: act}, output_qspec=SharedQuantizationSpec((src, node)), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            elif node.target is ops.aten.cat.default:
                inputs = list(node.args[0])
                if not inputs or not all(_is_quantized_op(i) for i in inputs):
                    continue
                first = inputs[0]
                shared = SharedQuantizationSpec((first, node))
                qspecs = {first: act}
                for i in inputs[1:]:
                    qspecs.setdefault(i, shared)
                node.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map=qspecs, output_qspec=shared, _annotated=True,
                    _is_output_of_quantized_pattern=True)

    def _annotate_qat_conv_bn(self, model: GraphModule) -> None:
        """QAT: conv -> batch norm [-> add(_, extra)] [-> unary]: the convolution's inputs, the add's extra
        input, and the output of the last node of the pattern."""
        for conv in model.graph.nodes:
            config = self._config_for(conv)
            if config is None or not config.is_qat or not _is_plain_conv(conv) or ANNOTATION_KEY in conv.meta:
                continue
            end = _bn_output(conv)
            if end is None:
                continue
            self._annotate_weighted(conv, 1)
            nxt = _only_user(end)
            if nxt is not None and nxt.op == "call_function" and nxt.target is ops.aten.add.Tensor and \
                    len(nxt.args) == 2 and nxt.kwargs.get("alpha", 1) == 1 and ANNOTATION_KEY not in nxt.meta:
                extra = nxt.args[1] if nxt.args[0] is end else nxt.args[0]
                if isinstance(extra, Node) and extra is not end:
                    nxt.meta[ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                        input_qspec_map={extra: config.input_activation}, _annotated=True)
                    end, nxt = nxt, _only_user(nxt)
            if nxt is not None and _is_unary_module(nxt) and ANNOTATION_KEY not in nxt.meta:
                end = nxt
            ann = end.meta.setdefault(ANNOTATION_KEY, _X86InductorQuantizationAnnotation(_annotated=True))
            ann.output_qspec = config.output_activation
            _flag(end)

    def annotate(self, model: GraphModule) -> GraphModule:
        self._annotate_qat_conv_bn(model)
        self._annotate_conv_add(model)
        self._annotate_conv(model)
        for node in model.graph.nodes:
            if node.op != "call_function":
                continue
            for target, w_pos in _WEIGHTED:
                if node.target is target and self._annotate_weighted(node, w_pos) is not None and \
                        target is ops.aten.linear.default:
                    _flag(node)
        self._propagate(model)
        return model

    def validate(self, model: GraphModule) -> None:
        return None
