"""The inductor's quantization pass: a PT2E-converted graph's float linear and 1-D/2-D convolution layers
between quantize and dequantize become int8 GEMMs and convolutions (PyTorch's
`torch/_inductor/fx_passes/quantization.py`).

    fuse_quantized_linear(gm) -> int      rewrites in place; returns how many layers it fused
                                          (linear layers, then convolutions: `fuse_quantized_conv`)

It runs on the captured graph before AOT autograd decomposes the `quantized_decomposed` ops, and
recognises, with u8/s8 activations and int8 weights (per tensor or per channel):

    dequantize_per_tensor[.tensor](qx) --+
    dequantize_per_channel(qw) | dequantize_per_tensor(qw)  -> linear(x, w, bias) | mm(x, w^T) |
                                                               addmm(bias, x, w^T)
        [-> relu] [-> quantize_per_tensor(u8/s8, full range)]

as `onednn::qlinear_pointwise[.tensor](qx, ..., qlinear_prepack(qw), ...)`: int32 accumulation on
AVX-512 VNNI, dequantize (float32 out) or requantize (u8/s8 out) fused after the product, the ReLU
too (`flambeau/_ops/quantized_linear.py`). A u8 convolution whose only user adds a residual,

    dequantize(qx) -> convolution -> add(_, dequantize(q_res) | float32 residual) [-> relu] [-> quantize]

becomes `onednn::qconv2d_pointwise.binary` (oneDNN's sum post-op, `fuse_quantized_conv`): with the
residual dequantized from u8/s8 and the output requantized to that dtype, the integer residual is the
accum (PyTorch's X86 conv + add pattern); any other residual is a float accum, float output, the
quantize after it left to the generated code. A linear layer whose only user adds a float32 tensor of
its shape (`_fuse_linear_add`),

    dequantize(qx) -> linear | mm | addmm -> add(_, other) [-> relu] [-> quantize]

becomes `onednn::qlinear_pointwise.binary` with the add post-op (other's float values, as PyTorch's
X86 linear + add, whose recipe leaves other unquantized). Results equal PyTorch's x86 ops; against the float
graph of dequantized values they differ by float rounding, which a requantization can turn into one
step of the output scale (as in PyTorch's x86 inductor path). A layer whose bias requires grad
(grad mode on) keeps the float path: the int8 op has no derivative. `config.quantized_linear = False`
turns the pass off.
"""
from __future__ import annotations

import operator

from .. import _dtype as D
from .. import nn
from .._ops import EXPORTS, quantized as Q
from .._ops import quantized_conv as QC
from .._ops import quantized_linear as QL
from .._ops._registry import OPS
from .._tensor import Tensor
from ..autograd.grad_mode import is_grad_enabled
from ..fx.node import Node
from . import config

_DQ_X = (Q.qd_dequantize_per_tensor, Q.qd_dequantize_per_tensor_tensor)
_FULL_RANGE = {D.uint8: (0, 255), D.int8: (-128, 127)}
_CONSTANT_PREFIX = "_qlinear_constant"


def _is(node, *ops) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and any(node.target is op for op in ops)


def _arg(node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _float_out(node) -> bool:
    return node.kwargs.get("out_dtype") in (None, D.float32)


def _activation(node):
    """(qx, scale, zero point, tensor qparams) of an activation's dequantize node, or None."""
    if not _is(node, *_DQ_X) or len(node.args) != 6 or not _float_out(node) or node.args[5] not in _FULL_RANGE:
        return None
    return node.args[0], node.args[1], node.args[2], node.target is Q.qd_dequantize_per_tensor_tensor


def _weight(node):
    """(qw (N, K), scales, zero points) of an int8 weight's dequantize node, or None."""
    if _is(node, Q.qd_dequantize_per_channel) and len(node.args) == 7 and _float_out(node) and \
            node.args[6] is D.int8 and node.args[3] == 0 and node.args[2] is not None:
        return node.args[0], node.args[1], node.args[2]
    if _is(node, Q.qd_dequantize_per_tensor) and len(node.args) == 6 and _float_out(node) and node.args[5] is D.int8:
        return node.args[0], [float(node.args[1])], [int(node.args[2])]
    return None


def _transposed(node):
    """The 2-D node that `node` transposes (permute [1, 0], or the methods .permute(1, 0) and .t()), or None."""
    if _is(node, OPS["permute"]) and len(node.args) == 2 and list(node.args[1]) == [1, 0]:
        return node.args[0]
    if isinstance(node, Node) and node.op == "call_method" and not node.kwargs and (
            (node.target == "t" and len(node.args) == 1) or
            (node.target == "permute" and [list(a) if isinstance(a, (list, tuple)) else a for a in node.args[1:]]
             in ([1, 0], [[1, 0]]))):
        return node.args[0]
    return None


def _val(gm, node):
    """The example value of `node` (a tensor attribute for get_attr), or None."""
    if not hasattr(node, "meta"):
        return None
    if node.op == "get_attr":
        return getattr(gm, node.target, None)
    return node.meta.get("val", node.meta.get("example_value"))


def _product(gm, node):
    """(x, w (N, K), bias) of a linear layer written as linear, mm or addmm, or None."""
    if _is(node, OPS["linear"]):
        return _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")
    if _is(node, OPS["mm"]) and len(node.args) == 2:
        w = _transposed(node.args[1])
        return None if w is None else (node.args[0], w, None)
    if _is(node, OPS["addmm"]) and len(node.args) == 3 and not node.kwargs:
        w = _transposed(node.args[2])
        bias = node.args[0]
        val = _val(gm, bias)
        if w is None or not isinstance(val, Tensor) or val.ndim != 1:
            return None
        return node.args[1], w, bias
    return None


def _ints(v, n: int):
    """A convolution's stride/padding/dilation as n ints, or None (a string padding, a wrong length)."""
    v = [v] * n if isinstance(v, int) else v
    if not isinstance(v, (list, tuple)) or len(v) not in (1, n) or not all(isinstance(i, int) for i in v):
        return None
    return [int(i) for i in v] * (n // len(v))


def _convolution(gm, node):
    """(x, w, bias, stride, padding, dilation, groups, spatial dims) of a 1-D or 2-D convolution node, as
    a 2-D one (a 1-D convolution is one of height 1: stride/padding/dilation led by 1/0/1), or None."""
    if _is(node, OPS["convolution"]) and len(node.args) == 9 and not node.kwargs:
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
        if transposed or any(output_padding):
            return None
    elif isinstance(node, Node) and node.op == "call_function" and any(
            node.target is f for f in (nn.functional.conv2d, EXPORTS.get("conv2d"), nn.functional.conv1d,
                                       EXPORTS.get("conv1d"))):
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        defaults = (None, None, None, 1, 0, 1, 1)
        x, w, bias, stride, padding, dilation, groups = (_arg(node, i, n, d)
                                                         for i, (n, d) in enumerate(zip(names, defaults)))
    else:
        return None
    val = _val(gm, node)
    if not isinstance(val, Tensor) or val.ndim not in (3, 4) or not isinstance(groups, int):
        return None
    spatial = val.ndim - 2
    triples = [_ints(v, spatial) for v in (stride, padding, dilation)]
    if None in triples:
        return None
    if spatial == 1:
        triples = [[lead] + t for lead, t in zip((1, 0, 1), triples)]
    return (x, w, bias, *triples, groups, spatial)


def _is_relu(node) -> bool:
    if _is(node, OPS["relu"]):
        return True
    return isinstance(node, Node) and node.op == "call_function" and len(node.args) == 1 and \
        not node.kwargs.get("inplace", False) and any(node.target is f for f in (nn.functional.relu, EXPORTS["relu"]))


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _output_quantize(node):
    """(quantize node, scale, zero point, dtype) when `node`'s only user requantizes it over the full
    range of u8/s8, else None."""
    q = _only_user(node)
    if q is None or not _is(q, Q.qd_quantize_per_tensor) or len(q.args) != 6 or q.args[5] not in _FULL_RANGE or \
            (q.args[3], q.args[4]) != _FULL_RANGE[q.args[5]]:
        return None
    return q, float(q.args[1]), int(q.args[2]), q.args[5]


def _constant(gm, value: list, dtype):
    """A get_attr node of a new constant tensor of `gm` (a per-tensor weight's scale or zero point)."""
    n = sum(1 for k in vars(gm) if k.startswith(_CONSTANT_PREFIX))
    name = f"{_CONSTANT_PREFIX}{n}"
    setattr(gm, name, EXPORTS["tensor"](value, dtype=dtype))
    return gm.graph.get_attr(name)


def _float32(gm, node) -> bool:
    val = _val(gm, node)
    return isinstance(val, Tensor) and val.dtype is D.float32 and val.ndim >= 1


def _bias_stays_float(gm, bias) -> bool:
    """A bias the int8 op can't take: not a float32 graph value, or one being trained (the int8 op has
    no derivative)."""
    return bias is not None and (not isinstance(bias, Node) or not _float32(gm, bias) or
                                 (is_grad_enabled() and _val(gm, bias).requires_grad))


def _epilogue(node):
    """What the fused op absorbs after `node`: (last node absorbed, post-op name, requantize match or
    None, output scale, zero point, dtype)."""
    last, post = node, "none"
    relu = _only_user(node)
    if relu is not None and _is_relu(relu):
        last, post = relu, "relu"
    requant = _output_quantize(last)
    out_scale, out_zp, out_dtype = (1.0, 0, D.float32) if requant is None else requant[1:]
    return last, post, requant, out_scale, out_zp, out_dtype


def _swap_in(new, last, requant) -> None:
    """Let the fused node `new` stand for the pattern ending at `last` (or at its requantization)."""
    replaced = last if requant is None else requant[0]
    new.meta = {k: v for k, v in replaced.meta.items() if k not in ("val", "example_value")}
    replaced.replace_all_uses_with(new)


def _cleaned(gm, fused: int) -> int:
    if fused:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return fused


def _fuse(gm, match, build) -> int:
    """Rewrite every node whose operands `match(gm, node)` returns (None: not a candidate) with the int8
    node `build(graph, operands, qx, x_scale, x_zp, tensor_qparams, qw, w_scales, w_zps, epilogue)`
    makes; returns how many."""
    graph = gm.graph
    fused = 0
    for node in list(graph.nodes):
        operands = match(gm, node)
        if operands is None or not _float32(gm, node):
            continue
        x, w, bias = operands[:3]
        act, weight = _activation(x), _weight(w)
        if act is None or weight is None or _bias_stays_float(gm, bias):
            continue
        qx, x_scale, x_zp, tensor_qparams = act
        qw, w_scales, w_zps = weight
        epilogue = _epilogue(node)
        last, requant = epilogue[0], epilogue[2]
        with graph.inserting_before(node):
            if isinstance(w_scales, list):
                w_scales, w_zps = _constant(gm, w_scales, D.float32), _constant(gm, w_zps, D.int64)
            new = build(graph, operands, qx, x_scale, x_zp, tensor_qparams, qw, w_scales, w_zps, epilogue)
        _swap_in(new, last, requant)
        fused += 1
    return _cleaned(gm, fused)


def _linear_node(graph, operands, qx, x_scale, x_zp, tensor_qparams, qw, w_scales, w_zps, epilogue):
    bias = operands[2]
    _, post, _, out_scale, out_zp, out_dtype = epilogue
    packed = graph.call_function(QL.qlinear_prepack, (qw, None))
    op = QL.qlinear_pointwise_tensor if tensor_qparams else QL.qlinear_pointwise
    return graph.call_function(op, (qx, x_scale, x_zp, packed, w_scales, w_zps, bias, out_scale, out_zp,
                                    out_dtype, post, [], ""))


def _conv_node(graph, operands, qx, x_scale, x_zp, tensor_qparams, qw, w_scales, w_zps, epilogue):
    _, _, bias, stride, padding, dilation, groups, spatial = operands
    _, post, _, out_scale, out_zp, out_dtype = epilogue
    if spatial == 1:        # as a 2-D convolution of height 1 (PyTorch's 1-D int8 conv gives the same numbers)
        qx, qw = (graph.call_function(OPS["unsqueeze"], (t, 2)) for t in (qx, qw))
    packed = graph.call_function(QC.qconv_prepack, (qw, w_scales, 1.0, 0, stride, padding, dilation, groups, None))
    op = QC.qconv2d_pointwise_tensor if tensor_qparams else QC.qconv2d_pointwise
    out = graph.call_function(op, (qx, x_scale, x_zp, packed, w_scales, w_zps, bias, stride, padding,
                                   dilation, groups, out_scale, out_zp, out_dtype, post, [], ""))
    return graph.call_function(OPS["squeeze.dims"], (out, [2])) if spatial == 1 else out


def _u8_convolution(gm, node):
    """A convolution whose activation is a dequantized uint8 tensor (PyTorch's x86 convolution takes u8
    activations only), or None."""
    conv = _convolution(gm, node)
    if conv is None:
        return None
    x = conv[0]
    return conv if _activation(x) is not None and x.args[5] is D.uint8 else None


def _functional_relus(gm) -> None:
    """An in-place ReLU (`nn.ReLU(inplace=True)`) of a layer's or add's output is recorded as a `relu_` node
    without users, later reads of the tensor reading the layer itself: rewritten as `relu`, its users those
    later reads (every other user of the output must come after it), so the patterns above match it."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed = False
    for node in list(gm.graph.nodes):
        if not _is(node, OPS["relu_"]) or node.users or len(node.args) != 1:
            continue
        x = node.args[0]
        if not (_convolution(gm, x) is not None or _product(gm, x) is not None or _is_add(x)):
            continue
        later = [u for u in x.users if u is not node]
        if any(order[u] < order[node] for u in later):
            continue
        with gm.graph.inserting_after(node):
            relu = gm.graph.call_function(OPS["relu"], (x,))
        for u in later:
            u.replace_input_with(x, relu)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def fuse_quantized_linear(gm) -> int:
    """Rewrite each quantized linear layer of `gm` (module docstring) in place; returns how many."""
    if not config.quantized_linear:
        return 0
    _functional_relus(gm)
    return _fuse_linear_add(gm) + _fuse(gm, _product, _linear_node) + fuse_quantized_conv(gm)


def fuse_quantized_conv(gm) -> int:
    """Rewrite each quantized 1-D or 2-D convolution of `gm` (module docstring) in place, those adding a residual
    first; returns how many."""
    if not config.quantized_conv:
        return 0
    fused = _fuse_conv_add(gm) + _fuse(gm, _u8_convolution, _conv_node)
    if fused:
        _views_as_reshapes(gm)
    return fused


def _views_as_reshapes(gm) -> None:
    """The int8 convolutions return channels-last memory (as PyTorch's), which pooling now keeps: a
    captured `aten.view` downstream (a flatten before the classifier, recorded on contiguous float
    activations) may no longer be expressible as a view, so every view of the graph becomes a reshape
    (the same values; a copy only where the layout needs one; a converted inference graph writes
    through none of its views)."""
    changed = False
    for node in gm.graph.nodes:
        if _is(node, OPS["view"]):
            node.target = EXPORTS["reshape"]
            changed = True
    if changed:
        gm.recompile()


def _is_add(node) -> bool:
    if _is(node, OPS["add.Tensor"]):
        return len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1
    return isinstance(node, Node) and node.op == "call_function" and len(node.args) == 2 and not node.kwargs and \
        any(node.target is f for f in (operator.add, EXPORTS.get("add")))


def _residual(gm, conv):
    """(add node, the other addend) when the convolution's (or linear layer's) only user adds a float32
    tensor of its shape to it, else None."""
    add = _only_user(conv)
    if add is None or not _is_add(add) or add.args[0] is add.args[1]:
        return None
    other = add.args[1] if add.args[0] is conv else add.args[0]
    val, conv_val = _val(gm, other), _val(gm, conv)
    if not isinstance(other, Node) or not isinstance(val, Tensor) or val.dtype is not D.float32 or \
            tuple(val.shape) != tuple(conv_val.shape) or not _float32(gm, add):
        return None
    return add, other


def _fuse_conv_add(gm) -> int:
    """dequantize(u8) -> convolution -> add(_, residual) [-> relu] [-> quantize] as one
    `qconv2d_pointwise.binary` (oneDNN's sum post-op): a residual dequantized from u8/s8 with the output
    requantized to the same dtype becomes the integer accum (PyTorch's X86 pattern), any other float32
    residual a float accum with float output (a quantize after it stays)."""
    graph = gm.graph
    fused = 0
    for node in list(graph.nodes):
        conv = _u8_convolution(gm, node)
        residual = None if conv is None or conv[7] != 2 or not _float32(gm, node) else _residual(gm, node)
        if residual is None:
            continue
        x, w, bias = conv[:3]
        weight = _weight(w)
        if weight is None or _bias_stays_float(gm, bias):
            continue
        add, other = residual
        qx, x_scale, x_zp, tensor_qparams = _activation(x)
        qw, w_scales, w_zps = weight
        last, post, requant, out_scale, out_zp, out_dtype = _epilogue(add)
        accum = _activation(other)
        if requant is not None and accum is not None and not accum[3] and other.args[5] is out_dtype:
            accum, accum_scale, accum_zp = accum[0], float(accum[1]), int(accum[2])
        else:
            accum, accum_scale, accum_zp = other, 1.0, 0
            requant, out_scale, out_zp, out_dtype = None, 1.0, 0, D.float32
        with graph.inserting_before(add):
            if isinstance(w_scales, list):
                w_scales, w_zps = _constant(gm, w_scales, D.float32), _constant(gm, w_zps, D.int64)
            _, _, _, stride, padding, dilation, groups, _ = conv
            packed = graph.call_function(QC.qconv_prepack, (qw, w_scales, 1.0, 0, stride, padding, dilation, groups,
                                                            None))
            op = QC.qconv2d_pointwise_binary_tensor if tensor_qparams else QC.qconv2d_pointwise_binary
            new = graph.call_function(op, (qx, x_scale, x_zp, packed, w_scales, w_zps, accum, bias, stride, padding,
                                           dilation, groups, out_scale, out_zp, out_dtype, accum_scale, accum_zp,
                                           "sum", 1.0, post, [], ""))
        _swap_in(new, last, requant)
        fused += 1
    return _cleaned(gm, fused)


def _fuse_linear_add(gm) -> int:
    """dequantize -> linear -> add(_, other) [-> relu] [-> quantize] as one `qlinear_pointwise.binary`
    with oneDNN's add post-op (PyTorch's X86 linear + add patterns): other is any float32 tensor of the
    product's shape (the X86 recipe does not quantize it), added after the bias and before the ReLU;
    the output requantized when a full-range quantize follows, else float32 (PyTorch's "sum" there,
    the same numbers: ours is functional)."""
    graph = gm.graph
    fused = 0
    for node in list(graph.nodes):
        operands = _product(gm, node)
        residual = None if operands is None or not _float32(gm, node) else _residual(gm, node)
        if residual is None:
            continue
        x, w, bias = operands
        act, weight = _activation(x), _weight(w)
        if act is None or weight is None or _bias_stays_float(gm, bias):
            continue
        add, other = residual
        qx, x_scale, x_zp, tensor_qparams = act
        qw, w_scales, w_zps = weight
        last, post, requant, out_scale, out_zp, out_dtype = _epilogue(add)
        with graph.inserting_before(add):
            if isinstance(w_scales, list):
                w_scales, w_zps = _constant(gm, w_scales, D.float32), _constant(gm, w_zps, D.int64)
            packed = graph.call_function(QL.qlinear_prepack, (qw, None))
            op = QL.qlinear_pointwise_binary_tensor if tensor_qparams else QL.qlinear_pointwise_binary
            new = graph.call_function(op, (qx, x_scale, x_zp, packed, w_scales, w_zps, other, bias, out_scale, out_zp,
                                           out_dtype, 1.0, 0, "add", 1.0, post, [], ""))
        _swap_in(new, last, requant)
        fused += 1
    return _cleaned(gm, fused)
