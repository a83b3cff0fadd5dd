"""The int8 2-D convolution as PyTorch's x86 ops: `onednn::qconv_prepack` and `onednn::qconv2d_pointwise`
(+ `.tensor`, activation scale and zero point as tensors), running an int8 im2col and the AVX-512
VNNI GEMM (`flambeau/_backends/cpu_int8_conv.py`; int32 accumulation, dequantize or requantize fused).

    qw = qconv_prepack(w_int8 (O, C/groups, kh, kw), w_scales, x_scale, x_zp, stride, padding,
                       dilation, groups, x_shape)          the weight in the kernel's layout, once
    y = qconv2d_pointwise(qx (N, C, H, W), x_scale, x_zp, qw, w_scale (O,), w_zp (O,), bias, stride,
                          padding, dilation, groups, out_scale, out_zp, out_dtype, attr, scalars, algorithm)

qw is opaque (int8 (O, kh, kw, L), `cpu_int8_conv.pack_conv_weight`), as PyTorch's is (a oneDNN
tensor); packing is cached for an unchanged weight and folded at compile time under freezing.
qx is uint8 (PyTorch's refuses int8); y (N, O, OH, OW), channels-last memory, is float32/bfloat16 (out_dtype; the
dequantized product, out_scale 1 and out_zp 0) or, with out_dtype None/uint8/int8, requantized with
out_scale/out_zp. attr "none" or "relu". Padding reads the activation's zero point (real 0).

    y = qconv2d_pointwise.binary(qx, ..., qw, w_scale, w_zp, qaccum, bias, ..., out_scale, out_zp, out_dtype,
                                 accum_scale, accum_zp, "sum", alpha, unary_attr, scalars, algorithm)

adds a residual (oneDNN's sum post-op; `.binary_tensor` for tensor activation qparams): qaccum (N, O, OH,
OW), u8/s8 with accum_scale/accum_zp for an integer output dtype, float32/bfloat16 with 1 and 0 for a
float one, dequantized and added to the convolution before the ReLU ("relu" or "none") and the
output's requantization; the result has qaccum's dtype, as PyTorch's.
PyTorch's op writes the result into qaccum and returns it; this one is functional (qaccum is read,
a new tensor returned), which is what a compiled graph needs. The
integers are exact and the epilogue rounds as oneDNN's, so results equal PyTorch's ops. The
inductor's quantization pass (`flambeau/_inductor/quantization.py`) rewrites a converted model's
dequantize -> convolution (-> relu) (-> quantize) into these ops; tagged extern.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._backends import cpu_int8_conv
from . import _batching, EXPORTS
from ._registry import defop, TensorSpec, Tag
from .quantized_linear import ONEDNN, OUT_DTYPES, POST_OPS, _Meta, _on_cpu, _scalar

NAME = "onednn::qconv2d_pointwise"


def _pair(v, what: str, name: str) -> tuple[int, int]:
    v = list(v)
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise RuntimeError(f"{name}: expected {what} of 1 or 2 values for a 2-D convolution, got {v}")
    return int(v[0]), int(v[1])


def _weight_checks(weight, groups: int, name: str):
    if weight.dtype is not D.int8 or len(weight.shape) != 4:
        raise RuntimeError(f"{name}: expected a 4-D int8 weight (O, C/groups, kh, kw), got {weight.dtype} of shape "
                           f"{tuple(weight.shape)}")
    if groups < 1 or weight.shape[0] % groups:
        raise RuntimeError(f"{name}: {weight.shape[0]} output channels do not split into {groups} groups")


@defop("qconv_prepack(Tensor weight, Tensor w_scales, float x_scale, int x_zp, int[] stride, int[] padding, "
       "int[] dilation, int groups, int[]? x_shape=None) -> Tensor", op_namespace=ONEDNN, function=False,
       tags=(Tag.core, Tag.extern))
def qconv_prepack(xp, weight, w_scales, x_scale, x_zp, stride, padding, dilation, groups, x_shape=None):
    _on_cpu("onednn::qconv_prepack", weight)
    return cpu_int8_conv.pack_conv_weight(weight, groups)


@qconv_prepack.def_meta
def _qconv_prepack_meta(weight, w_scales, x_scale, x_zp, stride, padding, dilation, groups, x_shape=None):
    _weight_checks(weight, groups, "onednn::qconv_prepack")
    O, cg, kh, kw = weight.shape
    return TensorSpec((O, kh, kw, cpu_int8_conv.conv_rows(cg, kh, kw)), D.int8)


def _checks(qx_dtype, x_shape, qw, w_scale, bias, stride, padding, dilation, groups, output_scale,
            output_zero_point, output_dtype, attr):
    """(output dtype, output shape) after PyTorch's checks of a quantized convolution's arguments."""
    if qx_dtype is not D.uint8:
        raise RuntimeError(f"{NAME}: Input tensor should have uint8 (unsigned char) data type, got {qx_dtype}")
    if qw.dtype is not D.int8 or len(qw.shape) != 4:
        raise RuntimeError(f"{NAME}: expected a packed 4-D int8 weight (qconv_prepack), got {qw.dtype} of shape "
                           f"{tuple(qw.shape)}")
    O, cg, kh, kw = cpu_int8_conv.packed_conv_dims(qw)
    if len(x_shape) != 4 or groups < 1 or O % groups or x_shape[1] != cg * groups:
        raise RuntimeError(f"{NAME}: input of shape {tuple(x_shape)} does not match a packed weight of {O} output "
                           f"channels, {cg} input channels per group, kernel {kh}x{kw} and groups={groups}")
    stride, padding, dilation = (_pair(stride, "stride", NAME), _pair(padding, "padding", NAME),
                                 _pair(dilation, "dilation", NAME))
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise RuntimeError(f"{NAME}: expected stride and dilation >= 1 and padding >= 0, got stride {stride}, "
                           f"padding {padding}, dilation {dilation}")
    oh = cpu_int8_conv.out_size(x_shape[2], kh, stride[0], padding[0], dilation[0])
    ow = cpu_int8_conv.out_size(x_shape[3], kw, stride[1], padding[1], dilation[1])
    if oh < 1 or ow < 1:
        raise RuntimeError(f"{NAME}: input of shape {tuple(x_shape)} is smaller than the {kh}x{kw} kernel (dilation "
                           f"{dilation}, padding {padding})")
    if w_scale.shape[0] not in (1, O) or (bias is not None and tuple(bias.shape) != (O,)):
        raise RuntimeError(f"{NAME}: weight scales of shape {tuple(w_scale.shape)} or bias of shape "
                           f"{None if bias is None else tuple(bias.shape)} do not match {O} output channels")
    od = output_dtype or D.uint8
    if od not in OUT_DTYPES:
        raise RuntimeError(f"{NAME}: unsupported output dtype {od}")
    if od.is_floating_point and (output_scale != 1.0 or output_zero_point != 0):
        raise RuntimeError(f"{NAME}: fp32 or bf16 output, output_scale must be 1.0 and output_zero_point 0")
    if attr not in POST_OPS:
        raise RuntimeError(f"{NAME}: Unsupported post op {attr} for quantized pointwise conv2d (supported: "
                           f"{', '.join(POST_OPS)})")
    return od, (x_shape[0], O, oh, ow), (stride, padding, dilation)


def _qconv(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, stride, padding, dilation, groups,
           output_scale, output_zero_point, output_dtype, attr):
    _on_cpu(NAME, qx, qw)
    od, _, (stride, padding, dilation) = _checks(
        D.FROM_NP[qx.dtype], qx.shape, _Meta(qw), _Meta(w_scale), None if bias is None else _Meta(bias), stride,
        padding, dilation, groups, output_scale, output_zero_point, output_dtype, attr)
    kernel_dtype = np.float32 if od.is_floating_point else od.np
    out = cpu_int8_conv.qconv2d_packed(qx, x_scale, int(x_zero_point), qw, groups, w_scale, w_zero_point, bias,
                                       stride, padding, dilation, output_scale, output_zero_point, kernel_dtype,
                                       relu=attr == "relu")
    return out if od.np == out.dtype else out.astype(od.np)


def _qconv_meta(qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, stride, padding, dilation, groups,
                output_scale, output_zero_point, output_dtype, attr, scalars, algorithm):
    od, (n, o, oh, ow), _ = _checks(qx.dtype, qx.shape, qw, w_scale, bias, stride, padding, dilation, groups,
                                    output_scale, output_zero_point, output_dtype, attr)
    return TensorSpec((n, o, oh, ow), od, strides=(o * oh * ow, 1, ow * o, o))


@defop("qconv2d_pointwise(Tensor qx, float x_scale, int x_zero_point, Tensor qw, Tensor w_scale, "
       "Tensor w_zero_point, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
       "float output_scale, int output_zero_point, ScalarType? output_dtype, str attr, Scalar?[] scalars, "
       "str? algorithm) -> Tensor", op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qconv2d_pointwise(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, stride, padding, dilation,
                      groups, output_scale, output_zero_point, output_dtype, attr, scalars, algorithm):
    return _qconv(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, stride, padding, dilation, groups,
                  output_scale, output_zero_point, output_dtype, attr)


qconv2d_pointwise.def_meta(_qconv_meta)


@defop("qconv2d_pointwise.tensor(Tensor qx, Tensor x_scale, Tensor x_zero_point, Tensor qw, Tensor w_scale, "
       "Tensor w_zero_point, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
       "float output_scale, int output_zero_point, ScalarType? output_dtype, str attr, Scalar?[] scalars, "
       "str? algorithm) -> Tensor", op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qconv2d_pointwise_tensor(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, stride, padding,
                             dilation, groups, output_scale, output_zero_point, output_dtype, attr, scalars,
                             algorithm):
    return _qconv(xp, qx, float(_scalar(x_scale, "scale")), int(_scalar(x_zero_point, "zero point")), qw, w_scale,
                  w_zero_point, bias, stride, padding, dilation, groups, output_scale, output_zero_point,
                  output_dtype, attr)


qconv2d_pointwise_tensor.def_meta(_qconv_meta)


BINARY_NAME = "onednn::qconv2d_pointwise.binary"
BINARY_SCHEMA_TAIL = ("Tensor w_scale, Tensor w_zero_point, Tensor qaccum, Tensor? bias, int[] stride, int[] padding, "
                      "int[] dilation, int groups, float output_scale, int output_zero_point, "
                      "ScalarType? output_dtype, float accum_scale, int accum_zero_point, str binary_attr, Scalar? alpha, str? unary_attr, "
                      "Scalar?[] unary_scalars, str? unary_algorithm) -> Tensor")


def _binary_checks(qx_dtype, x_shape, qw, w_scale, qaccum, bias, stride, padding, dilation, groups, output_scale,
                   output_zero_point, output_dtype, accum_scale, accum_zero_point, binary_attr, alpha, unary_attr):
    """(result dtype, shape, geometry) after PyTorch's checks of the sum post-op's arguments; the result
    has the accum's dtype (oneDNN writes the sum into it), its values the output dtype's kind."""
    unary = unary_attr or "none"
    if binary_attr != "sum" or unary not in POST_OPS:
        raise RuntimeError(f"{BINARY_NAME}: post_op sum or post_op sum_relu is supported for quantized pointwise "
                           f"conv2d. Got binary_post_op: {binary_attr} unary_post_op: {unary}.")
    if alpha is not None and alpha != 1:
        raise RuntimeError(f"{BINARY_NAME}: only alpha 1 is supported for post op sum, got {alpha}")
    od, shape, geometry = _checks(qx_dtype, x_shape, qw, w_scale, bias, stride, padding, dilation, groups,
                                  output_scale, output_zero_point, output_dtype, unary)
    if od.is_floating_point and (accum_scale != 1.0 or accum_zero_point != 0):
        raise RuntimeError(f"{BINARY_NAME}: fp32 or bf16 output, accum_scale must be 1.0 and accum_zero_point 0")
    if tuple(qaccum.shape) != shape or qaccum.dtype not in OUT_DTYPES or \
            qaccum.dtype.is_floating_point != od.is_floating_point:
        raise RuntimeError(f"{BINARY_NAME}: accum of shape {tuple(qaccum.shape)} and dtype {qaccum.dtype} does not "
                           f"match the output's {shape} and {od} (float accum for a float output, u8/s8 for an "
                           f"integer one)")
    return qaccum.dtype, shape, geometry


def _qconv_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, bias, stride, padding, dilation,
                  groups, output_scale, output_zero_point, output_dtype, accum_scale, accum_zero_point, binary_attr,
                  alpha, unary_attr):
    _on_cpu(BINARY_NAME, qx, qw, qaccum)
    od, _, (stride, padding, dilation) = _binary_checks(
        D.FROM_NP[qx.dtype], qx.shape, _Meta(qw), _Meta(w_scale), _Meta(qaccum),
        None if bias is None else _Meta(bias), stride, padding, dilation, groups, output_scale, output_zero_point,
        output_dtype, accum_scale, accum_zero_point, binary_attr, alpha, unary_attr)
    kernel_dtype = np.float32 if od.is_floating_point else od.np
    out = cpu_int8_conv.qconv2d_packed(qx, x_scale, int(x_zero_point), qw, groups, w_scale, w_zero_point, bias,
                                       stride, padding, dilation, output_scale, output_zero_point, kernel_dtype,
                                       relu=unary_attr == "relu", accum=qaccum, accum_scale=accum_scale,
                                       accum_zp=int(accum_zero_point))
    return out if od.np == out.dtype else out.astype(od.np)


def _qconv_binary_meta(qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, bias, stride, padding,
                       dilation, groups, output_scale, output_zero_point, output_dtype, accum_scale, accum_zero_point,
                       binary_attr, alpha, unary_attr, unary_scalars, unary_algorithm):
    od, (n, o, oh, ow), _ = _binary_checks(qx.dtype, qx.shape, qw, w_scale, qaccum, bias, stride, padding, dilation,
                                           groups, output_scale, output_zero_point, output_dtype, accum_scale,
                                           accum_zero_point, binary_attr, alpha, unary_attr)
    return TensorSpec((n, o, oh, ow), od, strides=(o * oh * ow, 1, ow * o, o))


@defop("qconv2d_pointwise.binary(Tensor qx, float x_scale, int x_zero_point, Tensor qw, " + BINARY_SCHEMA_TAIL,
       op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qconv2d_pointwise_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, bias, stride, padding,
                             dilation, groups, output_scale, output_zero_point, output_dtype, accum_scale,
                             accum_zero_point, binary_attr, alpha, unary_attr, unary_scalars, unary_algorithm):
    return _qconv_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, bias, stride, padding,
                         dilation, groups, output_scale, output_zero_point, output_dtype, accum_scale,
                         accum_zero_point, binary_attr, alpha, unary_attr)


qconv2d_pointwise_binary.def_meta(_qconv_binary_meta)


@defop("qconv2d_pointwise.binary_tensor(Tensor qx, Tensor x_scale, Tensor x_zero_point, Tensor qw, " +
       BINARY_SCHEMA_TAIL, op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qconv2d_pointwise_binary_tensor(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, bias, stride,
                                    padding, dilation, groups, output_scale, output_zero_point, output_dtype,
                                    accum_scale, accum_zero_point, binary_attr, alpha, unary_attr, unary_scalars,
                                    unary_algorithm):
    return _qconv_binary(xp, qx, float(_scalar(x_scale, "scale")), int(_scalar(x_zero_point, "zero point")), qw,
                         w_scale, w_zero_point, qaccum, bias, stride, padding, dilation, groups, output_scale,
                         output_zero_point, output_dtype, accum_scale, accum_zero_point, binary_attr, alpha,
                         unary_attr)


qconv2d_pointwise_binary_tensor.def_meta(_qconv_binary_meta)


# ---- vmap batching rules ----------------------------------------------------------------------------
@qconv_prepack.def_batching_rule
def _qconv_prepack_batching(in_dims, weight, *rest):
    if any(d is not None for d in in_dims[1:]):
        return NotImplemented
    ws = _batching.front(weight, in_dims[0])
    return EXPORTS["stack"]([_batching.call(qconv_prepack, (w,) + rest) for w in ws.unbind(0)]), 0


def _qconv_batching(op):
    """A batched input (N, C, H, W) folds into N (weights and qparams unbatched); otherwise decline."""
    def rule(in_dims, qx, *rest):
        if any(d is not None for d in in_dims[1:]):
            return NotImplemented
        x = _batching.front(qx, in_dims[0])
        b, n = x.shape[0], x.shape[1]
        y = _batching.call(op, (x.reshape((b * n,) + tuple(x.shape[2:])),) + rest)
        return y.reshape((b, n) + tuple(y.shape[1:])), 0
    rule.__name__ = f"_{op.name.split('::')[-1].replace('.', '_')}_batching"
    return rule


qconv2d_pointwise.def_batching_rule(_qconv_batching(qconv2d_pointwise))
qconv2d_pointwise_tensor.def_batching_rule(_qconv_batching(qconv2d_pointwise_tensor))


def _fold_batch(t):
    """(B, N, ...) -> (B N, ...)."""
    return t.reshape((t.shape[0] * t.shape[1],) + tuple(t.shape[2:]))


def _qconv_binary_batching(op):
    """A batched input and/or accum (B, N, ...) fold into N, an unbatched one broadcast over B (weights and
    qparams unbatched); otherwise decline."""
    def rule(in_dims, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, qaccum, *rest):
        dims = list(in_dims)
        if any(d is not None for i, d in enumerate(dims) if i not in (0, 6)):
            return NotImplemented
        b = _batching.batch_size((qx, qaccum), (dims[0], dims[6]))
        x, acc = _batching.materialize(qx, dims[0], b), _batching.materialize(qaccum, dims[6], b)
        y = _batching.call(op, (_fold_batch(x), x_scale, x_zero_point, qw, w_scale, w_zero_point,
                                _fold_batch(acc)) + rest)
        return y.reshape((b, x.shape[1]) + tuple(y.shape[1:])), 0
    rule.__name__ = f"_{op.name.split('::')[-1].replace('.', '_')}_batching"
    return rule


qconv2d_pointwise_binary.def_batching_rule(_qconv_binary_batching(qconv2d_pointwise_binary))
qconv2d_pointwise_binary_tensor.def_batching_rule(_qconv_binary_batching(qconv2d_pointwise_binary_tensor))
