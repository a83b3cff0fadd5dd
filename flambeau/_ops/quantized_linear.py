"""The int8 linear layer as PyTorch's x86 ops: `onednn::qlinear_prepack` and `onednn::qlinear_pointwise`
(+ `.tensor`, activation scale and zero point as tensors), running the AVX-512 VNNI kernel of
`flambeau/_backends/cpu_int8.cpp` (int32 accumulation, dequantize or requantize fused after it).

    qw = qlinear_prepack(w_int8 (N, K), x_shape)         the weight in the kernel's packed layout, once
    y = qlinear_pointwise(qx, x_scale, x_zp, qw, w_scale (N,), w_zp (N,), bias, out_scale, out_zp,
                          out_dtype, post_op_name, post_op_args, post_op_algorithm)

qw is opaque: int8 of shape (K + 7, N), the VNNI panels and the column sums (`cpu_int8.pack_weight`),
so qlinear_pointwise packs no weight per call; under freezing the prepack is folded at compile time,
otherwise it returns the packing cached for the unchanged weight (`cpu_int8.pack_weight_cached`).
qx is uint8 or int8 (..., K); y is float32/bfloat16 (out_dtype; the dequantized product, out_scale 1
and out_zp 0) or, with out_dtype None/uint8/int8, requantized with out_scale/out_zp (None: uint8).
post_op_name "none" or "relu".

    y = qlinear_pointwise.binary(qx, x_scale, x_zp, qw, w_scale, w_zp, other, bias, out_scale, out_zp,
                                 out_dtype, other_scale, other_zp, binary_post_op, alpha, unary_post_op,
                                 unary_post_op_args, unary_post_op_algorithm)

adds `other` (of the output's number of elements) after the bias and before the ReLU, as oneDNN's
binary post-ops (`.binary_tensor` for tensor activation qparams): "add" adds other's values as they
are (float32/bf16/u8/s8; other_scale and other_zp unused), "sum" the dequantized accum
(other - other_zp) * other_scale, other of the output dtype ("none": other unused). A float output takes
other_scale 1 and other_zp 0; alpha must be 1. PyTorch's "sum" writes into other and returns it (reading
other's memory as if contiguous); this one is functional: other is read in its logical order.
Integers are exact and the epilogue rounds as oneDNN's, so results
equal PyTorch's ops; unlike them, non-zero weight zero points are honoured (PyTorch's x86 weights
are symmetric). The inductor's quantization pass (`flambeau/_inductor/quantization.py`) rewrites a
converted model's dequantize -> linear (-> relu) (-> quantize) into these ops; tagged extern, so
compiled graphs call the kernel as a library call.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._backends import cpu_int8
from . import _batching, EXPORTS
from ._registry import defop, TensorSpec, Tag

ONEDNN = "onednn"
POST_OPS = ("none", "relu")
BINARY_POST_OPS = ("none", "sum", "add")
ADD_OTHER_DTYPES = (D.float32, D.bfloat16, D.uint8, D.int8)
OUT_DTYPES = (D.float32, D.bfloat16, D.uint8, D.int8)


def _on_cpu(name, *arrays):
    if any(type(a).__module__.startswith("cupy") for a in arrays):
        raise NotImplementedError(f"Could not run '{name}' with arguments from the 'CUDA' backend: it is an x86 "
                                  "cpu kernel (oneDNN's); move the tensors to the cpu")


@defop("qlinear_prepack(Tensor weight, int[]? x_shape) -> Tensor", op_namespace=ONEDNN, function=False,
       tags=(Tag.core, Tag.extern))
def qlinear_prepack(xp, weight, x_shape=None):
    _on_cpu("onednn::qlinear_prepack", weight)
    return cpu_int8.pack_weight_cached(weight)


@qlinear_prepack.def_meta
def _qlinear_prepack_meta(weight, x_shape=None):
    if weight.dtype is not D.int8 or weight.ndim != 2:
        raise RuntimeError(f"onednn::qlinear_prepack: expected a 2-D int8 weight, got {weight.dtype} of shape "
                           f"{tuple(weight.shape)}")
    return TensorSpec((weight.shape[1] + cpu_int8.PACK_EXTRA_ROWS, weight.shape[0]), D.int8)


def _checks(qx_dtype, x_shape, qw, w_scale, bias, output_scale, output_zero_point, output_dtype, post_op_name):
    name = "onednn::qlinear_pointwise"
    if qx_dtype not in (D.uint8, D.int8):
        raise RuntimeError(f"{name}: expected a uint8 or int8 input, got {qx_dtype}")
    if qw.dtype is not D.int8 or len(qw.shape) != 2 or qw.shape[0] < cpu_int8.PACK_EXTRA_ROWS:
        raise RuntimeError(f"{name}: expected a packed 2-D int8 weight (qlinear_prepack), got {qw.dtype} of shape "
                           f"{tuple(qw.shape)}")
    k, n = cpu_int8.packed_dims(qw)
    if not x_shape or x_shape[-1] != k:
        raise RuntimeError(f"{name}: input of shape {tuple(x_shape)} and packed weight of {k} x {n} (shape "
                           f"{tuple(qw.shape)}) cannot be multiplied")
    if w_scale.shape[0] not in (1, n) or (bias is not None and tuple(bias.shape) != (n,)):
        raise RuntimeError(f"{name}: weight scales of shape {tuple(w_scale.shape)} or bias of shape "
                           f"{None if bias is None else tuple(bias.shape)} do not match {n} output channels")
    od = output_dtype or D.uint8
    if od not in OUT_DTYPES:
        raise RuntimeError(f"{name}: unsupported output dtype {od}")
    if od.is_floating_point and (output_scale != 1.0 or output_zero_point != 0):
        raise RuntimeError(f"{name}: a {od} output takes output_scale 1.0 and output_zero_point 0")
    if post_op_name not in POST_OPS:
        raise RuntimeError(f"{name}: post op {post_op_name!r} is not supported (supported: {', '.join(POST_OPS)})")
    return od


def _qlinear(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale, output_zero_point,
             output_dtype, post_op_name, other=None, other_scale: float = 1.0, other_zp: int = 0):
    _on_cpu("onednn::qlinear_pointwise", qx, qw)
    od = _checks(D.FROM_NP[qx.dtype], qx.shape, _Meta(qw), _Meta(w_scale),
                 None if bias is None else _Meta(bias), output_scale, output_zero_point, output_dtype, post_op_name)
    n = qw.shape[1]
    scales = np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (n,))
    zps = np.broadcast_to(np.asarray(w_zero_point).reshape(-1), (n,))
    kernel_dtype = np.float32 if od.is_floating_point else od.np
    if other is not None:       # the kernel's accum: (M, N) float32 (bf16 widened exactly) or u8/s8
        other = np.ascontiguousarray(other).reshape(-1, n)
        if other.dtype not in cpu_int8.ACCUM_KINDS:
            other = other.astype(np.float32)
    out = cpu_int8.qlinear_packed(qx, x_scale, int(x_zero_point), qw, scales, zps, bias, output_scale, output_zero_point,
                           kernel_dtype, relu=post_op_name == "relu", accum=other, accum_scale=other_scale,
                           accum_zp=int(other_zp))
    return out if od.np == out.dtype else out.astype(od.np)


class _Meta:
    """Shape and dtype of a NumPy array, as the checks read them from metadata."""

    def __init__(self, a):
        self.shape, self.dtype = a.shape, D.FROM_NP[a.dtype]


def _qlinear_meta(qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale, output_zero_point,
                  output_dtype, post_op_name, post_op_args, post_op_algorithm):
    od = _checks(qx.dtype, qx.shape, qw, w_scale, bias, output_scale, output_zero_point, output_dtype, post_op_name)
    return TensorSpec(tuple(qx.shape[:-1]) + (qw.shape[1],), od)


def _scalar(t, what: str):
    if t.size != 1:
        raise RuntimeError(f"onednn::qlinear_pointwise: expected a one-element {what} tensor, got {t.size} elements")
    return t.reshape(()).item()


@defop("qlinear_pointwise(Tensor qx, float x_scale, int x_zero_point, Tensor qw, Tensor w_scale, "
       "Tensor w_zero_point, Tensor? bias, float output_scale, int output_zero_point, ScalarType? output_dtype, "
       "str post_op_name, Scalar?[] post_op_args, str post_op_algorithm) -> Tensor", op_namespace=ONEDNN,
       function=False, tags=(Tag.core, Tag.extern))
def qlinear_pointwise(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale,
                      output_zero_point, output_dtype, post_op_name, post_op_args, post_op_algorithm):
    return _qlinear(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale,
                    output_zero_point, output_dtype, post_op_name)


qlinear_pointwise.def_meta(_qlinear_meta)


@defop("qlinear_pointwise.tensor(Tensor qx, Tensor x_scale, Tensor x_zero_point, Tensor qw, Tensor w_scale, "
       "Tensor w_zero_point, Tensor? bias, float output_scale, int output_zero_point, ScalarType? output_dtype, "
       "str post_op_name, Scalar?[] post_op_args, str post_op_algorithm) -> Tensor", op_namespace=ONEDNN,
       function=False, tags=(Tag.core, Tag.extern))
def qlinear_pointwise_tensor(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale,
                             output_zero_point, output_dtype, post_op_name, post_op_args, post_op_algorithm):
    return _qlinear(xp, qx, float(_scalar(x_scale, "scale")), int(_scalar(x_zero_point, "zero point")), qw, w_scale,
                    w_zero_point, bias, output_scale, output_zero_point, output_dtype, post_op_name)


qlinear_pointwise_tensor.def_meta(_qlinear_meta)


BINARY_NAME = "onednn::qlinear_pointwise.binary"
BINARY_SCHEMA_TAIL = ("Tensor qw, Tensor w_scale, Tensor w_zero_point, Tensor? other, Tensor? bias, "
                      "float output_scale, int output_zero_point, ScalarType? output_dtype, float other_scale, "
                      "int other_zp, str binary_post_op, float binary_alpha, str unary_post_op, "
                      "Scalar?[] unary_post_op_args, str unary_post_op_algorithm) -> Tensor")


def _binary_checks(qx_dtype, x_shape, qw, w_scale, other, bias, output_scale, output_zero_point, output_dtype,
                   other_scale, other_zp, binary_post_op, binary_alpha, unary_post_op):
    """The output dtype after PyTorch's checks of the binary post-op's arguments (module docstring)."""
    if binary_post_op not in BINARY_POST_OPS:
        raise RuntimeError(f"{BINARY_NAME}: unsupported binary post op {binary_post_op!r} (supported: "
                           f"{', '.join(BINARY_POST_OPS)})")
    if binary_alpha != 1.0:
        raise RuntimeError(f"{BINARY_NAME}: alpha != 1 for binary post op is not yet supported (got {binary_alpha})")
    if binary_post_op != "none" and unary_post_op not in POST_OPS:
        raise RuntimeError(f"{BINARY_NAME}: unsupported unary post op {unary_post_op!r} with binary post op "
                           f"{binary_post_op} (supported: {', '.join(POST_OPS)})")
    od = _checks(qx_dtype, x_shape, qw, w_scale, bias, output_scale, output_zero_point, output_dtype, unary_post_op)
    if binary_post_op == "none":
        return od
    if other is None:
        raise RuntimeError(f"{BINARY_NAME}: the extra input is missing for post op {binary_post_op}")
    if od.is_floating_point and (other_scale != 1.0 or other_zp != 0):
        raise RuntimeError(f"{BINARY_NAME}: expect extra input scale = 1.0 and zero point = 0 when output dtype is "
                           f"{od}, but got {other_scale} and {other_zp}, respectively")
    if binary_post_op == "sum" and other.dtype is not od:
        raise RuntimeError(f"{BINARY_NAME}: the dtype of extra input for binary post op sum should be {od} (same as "
                           f"output dtype), but got {other.dtype}")
    if other.dtype not in ADD_OTHER_DTYPES:
        raise RuntimeError(f"{BINARY_NAME}: extra input of dtype {other.dtype} is not supported (supported: "
                           f"{', '.join(str(d) for d in ADD_OTHER_DTYPES)})")
    numel = int(np.prod(tuple(x_shape[:-1]) + (qw.shape[1],)))
    if int(np.prod(tuple(other.shape))) != numel:
        raise RuntimeError(f"{BINARY_NAME}: extra input of shape {tuple(other.shape)} does not have the output's "
                           f"{numel} elements (input {tuple(x_shape)}, {qw.shape[1]} output channels)")
    return od


def _qlinear_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, bias, output_scale,
                    output_zero_point, output_dtype, other_scale, other_zp, binary_post_op, binary_alpha,
                    unary_post_op):
    _on_cpu(BINARY_NAME, qx, qw, *(() if other is None else (other,)))
    _binary_checks(D.FROM_NP[qx.dtype], qx.shape, _Meta(qw), _Meta(w_scale), None if other is None else _Meta(other),
                   None if bias is None else _Meta(bias), output_scale, output_zero_point, output_dtype, other_scale,
                   other_zp, binary_post_op, binary_alpha, unary_post_op)
    if binary_post_op == "none":
        other = None
    elif binary_post_op == "add":       # other's values as they are
        other_scale, other_zp = 1.0, 0
    return _qlinear(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, bias, output_scale, output_zero_point,
                    output_dtype, unary_post_op, other, other_scale, other_zp)


def _qlinear_binary_meta(qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, bias, output_scale,
                         output_zero_point, output_dtype, other_scale, other_zp, binary_post_op, binary_alpha,
                         unary_post_op, unary_post_op_args, unary_post_op_algorithm):
    od = _binary_checks(qx.dtype, qx.shape, qw, w_scale, other, bias, output_scale, output_zero_point, output_dtype,
                        other_scale, other_zp, binary_post_op, binary_alpha, unary_post_op)
    return TensorSpec(tuple(qx.shape[:-1]) + (qw.shape[1],), od)


@defop("qlinear_pointwise.binary(Tensor qx, float x_scale, int x_zero_point, " + BINARY_SCHEMA_TAIL,
       op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qlinear_pointwise_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, bias, output_scale,
                             output_zero_point, output_dtype, other_scale, other_zp, binary_post_op, binary_alpha,
                             unary_post_op, unary_post_op_args, unary_post_op_algorithm):
    return _qlinear_binary(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, bias, output_scale,
                           output_zero_point, output_dtype, other_scale, other_zp, binary_post_op, binary_alpha,
                           unary_post_op)


qlinear_pointwise_binary.def_meta(_qlinear_binary_meta)


@defop("qlinear_pointwise.binary_tensor(Tensor qx, Tensor x_scale, Tensor x_zero_point, " + BINARY_SCHEMA_TAIL,
       op_namespace=ONEDNN, function=False, tags=(Tag.core, Tag.extern))
def qlinear_pointwise_binary_tensor(xp, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, bias,
                                    output_scale, output_zero_point, output_dtype, other_scale, other_zp,
                                    binary_post_op, binary_alpha, unary_post_op, unary_post_op_args,
                                    unary_post_op_algorithm):
    return _qlinear_binary(xp, qx, float(_scalar(x_scale, "scale")), int(_scalar(x_zero_point, "zero point")), qw,
                           w_scale, w_zero_point, other, bias, output_scale, output_zero_point, output_dtype,
                           other_scale, other_zp, binary_post_op, binary_alpha, unary_post_op)


qlinear_pointwise_binary_tensor.def_meta(_qlinear_binary_meta)


# ---- vmap batching rules ----------------------------------------------------------------------------
@qlinear_prepack.def_batching_rule
def _qlinear_prepack_batching(in_dims, weight, x_shape=None):
    ws = _batching.front(weight, in_dims[0])
    return EXPORTS["stack"]([_batching.call(qlinear_prepack, (w, x_shape)) for w in ws.unbind(0)]), 0


def _qlinear_batching(op):
    """A batched input folds into its leading dims (the weights and qparams unbatched); otherwise decline."""
    def rule(in_dims, qx, *rest):
        if any(d is not None for d in in_dims[1:]):
            return NotImplemented
        return _batching.call(op, (_batching.front(qx, in_dims[0]),) + rest), 0
    rule.__name__ = f"_{op.name.split('::')[-1].replace('.', '_')}_batching"
    return rule


qlinear_pointwise.def_batching_rule(_qlinear_batching(qlinear_pointwise))
qlinear_pointwise_tensor.def_batching_rule(_qlinear_batching(qlinear_pointwise_tensor))


def _qlinear_binary_batching(op):
    """A batched input and/or other fold into the input's leading dims (an unbatched one broadcast over
    the batch; weights and qparams unbatched); otherwise decline."""
    def rule(in_dims, qx, x_scale, x_zero_point, qw, w_scale, w_zero_point, other, *rest):
        dims = list(in_dims)
        if any(d is not None for i, d in enumerate(dims) if i not in (0, 6)) or other is None:
            return NotImplemented
        b = _batching.batch_size((qx, other), (dims[0], dims[6]))
        x, o = _batching.materialize(qx, dims[0], b), _batching.materialize(other, dims[6], b)
        return _batching.call(op, (x, x_scale, x_zero_point, qw, w_scale, w_zero_point, o) + rest), 0
    rule.__name__ = f"_{op.name.split('::')[-1].replace('.', '_')}_batching"
    return rule


qlinear_pointwise_binary.def_batching_rule(_qlinear_binary_batching(qlinear_pointwise_binary))
qlinear_pointwise_binary_tensor.def_batching_rule(_qlinear_binary_batching(qlinear_pointwise_binary_tensor))
