"""Op-database entries of the quantization ops: fake quantization (straight-through gradients) and
the `quantized_decomposed` library, compared with `torch.ops.quantized_decomposed`; the int8 linear
layer `onednn::qlinear_prepack` + `qlinear_pointwise` (+ `.binary`) and the int8 convolution `onednn::qconv_prepack` +
`qconv2d_pointwise`, compared with PyTorch's x86 (oneDNN) ops."""
from __future__ import annotations

import importlib

from flambeau._ops import quantized_pool as QP
from tests.opdb import OpInfo, S, T

QD = "quantized_decomposed::"
importlib.import_module("torch.ao.quantization.fx._decomposed")    # registers torch.ops.quantized_decomposed
# the straight-through gradient is the op's derivative; its decomposition (the inference path) rounds,
# whose derivative is zero (compiled training keeps the op's derivative: test_quantization.py)
STE = {"decomposition_grad": "straight-through gradient: the op's derivative, not its decomposition's"}


def _qd(m):
    return m.ops.quantized_decomposed


def _fq_samples(dtype):
    return [S(T((4, 5)), 0.1, 3, 0, 255), S(T((3, 4), low=-2, high=2), 0.05, -3, -10, 10),
            S(T((2, 3, 4), noncontig=True), 0.37, 0, -128, 127), S(T((0, 3)), 0.1, 0, 0, 255)]


def _fq_qparams_samples(dtype):
    return [S(T((4, 5)), T((1,), dtype="float32", values=[0.1], requires_grad=False),
              T((1,), dtype="int32", values=[3]), 0, 255),
            S(T((3, 4), low=-2, high=2), T((), dtype="float32", values=0.05, requires_grad=False),
              T((), dtype="int64", values=-3), -10, 10)]


def _fq_channel_samples(dtype):
    return [S(T((4, 5), low=-2, high=2), T((5,), dtype="float32", low=0.05, high=0.3, requires_grad=False),
              T((5,), dtype="int32", low=-3, high=3), 1, -10, 10),
            S(T((3, 2, 4)), T((3,), dtype="float32", low=0.01, high=0.1, requires_grad=False),
              T((3,), dtype="int32", low=0, high=5), 0, 0, 255)]


def _fq_channel_errors():
    from tests.opdb import ErrorSample
    return [ErrorSample(S(T((4, 5)), T((5,), dtype="float32", values=[0.1] * 5), T((5,), dtype="int64", values=[0] * 5),
                          1, 0, 255), RuntimeError, "Zero-point must be Int32"),
            ErrorSample(S(T((4, 5)), T((5,), dtype="float64", values=[0.1] * 5), T((5,), dtype="int32", values=[0] * 5),
                          1, 0, 255), RuntimeError, "Scale must be Float"),
            ErrorSample(S(T((4, 5)), T((4,), dtype="float32", values=[0.1] * 4), T((4,), dtype="int32", values=[0] * 4),
                          1, 0, 255), RuntimeError)]


def _fq_errors():
    from tests.opdb import ErrorSample
    return [ErrorSample(S(T((3,)), 0.1, 300, 0, 255), RuntimeError, "zero_point"),
            ErrorSample(S(T((3,)), 0.1, 0, 10, 5), RuntimeError, "quant_min")]


def _q_samples(dtype):
    return [S(T((4, 5), low=-4, high=4), 0.037, 7, 0, 255, "uint8"),
            S(T((3, 6), low=-4, high=4, noncontig=True), 0.05, -3, -128, 127, "int8"),
            S(T((3, 6), low=-40, high=40), 0.5, 0, -20, 20, "int8")]


def _q_tensor_samples(dtype):
    return [S(T((4, 5), low=-4, high=4), T((1,), dtype="float64", values=[0.037]), T((1,), dtype="int64", values=[7]),
              0, 255, "uint8")]


def _dq_samples(dtype):
    return [S(T((4, 5), dtype="uint8", low=0, high=255), 0.037, 7, 0, 255, "uint8"),
            S(T((3, 6), dtype="int8", low=-128, high=127, noncontig=True), 0.05, -3, -128, 127, "int8")]


def _dq_tensor_samples(dtype):
    return [S(T((4, 5), dtype="uint8", low=0, high=255), T((), dtype="float64", values=0.037),
              T((), dtype="int64", values=7), 0, 255, "uint8")]


def _qc_samples(dtype):
    return [S(T((4, 5), low=-4, high=4), T((5,), dtype="float64", low=0.01, high=0.1),
              T((5,), dtype="int64", low=-3, high=3), 1, -128, 127, "int8"),
            S(T((3, 2, 4), low=-4, high=4), T((3,), dtype="float32", low=0.01, high=0.1),
              T((3,), dtype="int64", low=0, high=9), 0, 0, 255, "uint8")]


def _dqc_samples(dtype):
    return [S(T((4, 5), dtype="int8", low=-128, high=127), T((5,), dtype="float64", low=0.01, high=0.1),
              T((5,), dtype="int64", low=-3, high=3), 1, -128, 127, "int8"),
            S(T((3, 2, 4), dtype="uint8", low=0, high=255), T((3,), dtype="float32", low=0.01, high=0.1),
              None, 0, 0, 255, "uint8")]


def _choose_samples(dtype):
    return [S(T((4, 5), low=-3, high=2), 0, 255, 1e-5, "uint8"), S(T((7,), low=0.5, high=2), -128, 127,
                                                                    2 ** -12, "int8")]


def _qlinear_samples(dtype):
    def qx(shape, signed=False, noncontig=False):
        return T(shape, dtype="int8" if signed else "uint8", low=-128 if signed else 0, high=127 if signed else 255,
                 noncontig=noncontig)

    def w(n, k):
        return (T((n, k), dtype="int8", low=-127, high=127), T((n,), dtype="float32", low=0.002, high=0.02,
                                                                 requires_grad=False),
                T((n,), dtype="int64", values=[0] * n), T((n,), dtype="float32", low=-1, high=1, requires_grad=False))
    qw, ws, wz, b = w(6, 20)
    qw2, ws2, wz2, b2 = w(33, 40)
    return [S(qx((5, 20)), 0.05, 128, qw, ws, wz, b, 1.0, 0, "float32", "none"),
            S(qx((5, 20)), 0.05, 128, qw, ws, wz, None, 0.03, 7, None, "relu"),
            S(qx((2, 13, 40), noncontig=True), 0.021, 100, qw2, ws2, wz2, b2, 0.08, 0, "uint8", "none"),
            S(qx((14, 40), signed=True), 0.04, 3, qw2, ws2, wz2, b2, 0.05, -4, "int8", "relu"),
            S(qx((3, 40)), 0.04, 0, qw2, ws2, wz2, b2, 1.0, 0, "bfloat16", "relu")]


def _qlinear(m, qx, x_scale, x_zp, qw, w_scale, w_zp, bias, out_scale, out_zp, out_dtype, post_op):
    packed = m.ops.onednn.qlinear_prepack(qw, list(qx.shape))
    return m.ops.onednn.qlinear_pointwise(qx, x_scale, x_zp, packed, w_scale, w_zp, bias, out_scale, out_zp,
                                          out_dtype and getattr(m, out_dtype), post_op, [], "")


def _qlinear_tensor(m, qx, x_scale, x_zp, qw, w_scale, w_zp, bias, out_scale, out_zp, out_dtype, post_op):
    packed = m.ops.onednn.qlinear_prepack(qw, list(qx.shape))
    return m.ops.onednn.qlinear_pointwise.tensor(qx, m.tensor(x_scale), m.tensor(x_zp), packed, w_scale, w_zp, bias,
                                                 out_scale, out_zp, out_dtype and getattr(m, out_dtype), post_op,
                                                 [], "")


def _qlinear_errors():
    from tests.opdb import ErrorSample
    qw, ws, wz = (T((6, 20), dtype="int8", low=-127, high=127), T((6,), dtype="float32", values=[0.01] * 6),
                  T((6,), dtype="int64", values=[0] * 6))
    return [ErrorSample(S(T((5, 20)), 0.05, 128, qw, ws, wz, None, 1.0, 0, "float32", "none"), RuntimeError,
                        "uint8 or int8 input"),
            ErrorSample(S(T((5, 21), dtype="uint8", low=0, high=255), 0.05, 128, qw, ws, wz, None, 1.0, 0, "float32",
                          "none"), RuntimeError, "cannot be multiplied"),
            ErrorSample(S(T((5, 20), dtype="uint8", low=0, high=255), 0.05, 128, qw, ws, wz, None, 1.0, 0, "float32",
                          "foo"), RuntimeError, "post op")]

def _qconv_samples(dtype):
    def qx(shape, noncontig=False):
        return T(shape, dtype="uint8", low=0, high=255, noncontig=noncontig)

    def w(o, cg, kh, kw):
        return (T((o, cg, kh, kw), dtype="int8", low=-127, high=127),
                T((o,), dtype="float32", low=0.002, high=0.02, requires_grad=False), T((o,), dtype="int64", values=[0] * o),
                T((o,), dtype="float32", low=-1, high=1, requires_grad=False))
    qw, ws, wz, b = w(6, 4, 3, 3)
    dw, dws, dwz, db = w(8, 1, 3, 3)
    return [S(qx((2, 4, 7, 7)), 0.05, 128, qw, ws, wz, b, [1, 1], [1, 1], [1, 1], 1, 1.0, 0, "float32", "none"),
            S(qx((1, 4, 9, 6), noncontig=True), 0.03, 7, qw, ws, wz, None, [2, 1], [0, 1], [1, 2], 1, 0.04, 5, None,
              "relu"),
            S(qx((2, 8, 5, 5)), 0.02, 0, dw, dws, dwz, db, [1, 1], [1, 1], [1, 1], 8, 0.05, -3, "int8", "relu"),
            S(qx((1, 4, 5, 5)), 0.04, 9, qw, ws, wz, b, [1, 1], [0, 0], [1, 1], 1, 1.0, 0, "bfloat16", "none")]


def _qconv(m, qx, x_scale, x_zp, qw, w_scale, w_zp, bias, stride, padding, dilation, groups, out_scale, out_zp,
           out_dtype, attr, tensor_qparams=False):
    packed = m.ops.onednn.qconv_prepack(qw, w_scale, x_scale, x_zp, stride, padding, dilation, groups, list(qx.shape))
    op = m.ops.onednn.qconv2d_pointwise
    xs, xz = (m.tensor(x_scale), m.tensor(x_zp)) if tensor_qparams else (x_scale, x_zp)
    return (op.tensor if tensor_qparams else op.default)(qx, xs, xz, packed, w_scale, w_zp, bias, stride, padding,
                                                         dilation, groups, out_scale, out_zp,
                                                         out_dtype and getattr(m, out_dtype), attr, [], "")


def _qconv_errors():
    from tests.opdb import ErrorSample
    qw, ws, wz = (T((6, 4, 3, 3), dtype="int8", low=-127, high=127), T((6,), dtype="float32", values=[0.01] * 6),
                  T((6,), dtype="int64", values=[0] * 6))
    geometry = ([1, 1], [1, 1], [1, 1], 1)
    return [ErrorSample(S(T((1, 4, 5, 5), dtype="int8", low=-128, high=127), 0.05, 0, qw, ws, wz, None, *geometry,
                          1.0, 0, "float32", "none"), RuntimeError, "uint8"),
            ErrorSample(S(T((1, 4, 5, 5), dtype="uint8", low=0, high=255), 0.05, 0, qw, ws, wz, None, *geometry,
                          1.0, 0, "float32", "gelu"), RuntimeError, "Unsupported post op gelu"),
            ErrorSample(S(T((1, 4, 5, 5), dtype="uint8", low=0, high=255), 0.05, 0, qw, ws, wz, None, *geometry,
                          0.5, 0, "float32", "none"), RuntimeError, "output_scale must be 1.0")]


def _qconv_binary_samples(dtype):
    qw, ws, wz, b = (T((6, 4, 3, 3), dtype="int8", low=-127, high=127),
                     T((6,), dtype="float32", low=0.0001, high=0.0005, requires_grad=False),
                     T((6,), dtype="int64", values=[0] * 6), T((6,), dtype="float32", low=-1, high=1,
                                                                requires_grad=False))
    qx = T((2, 4, 7, 7), dtype="uint8", low=0, high=255)
    geometry = ([1, 1], [1, 1], [1, 1], 1)
    return [S(qx, 0.05, 128, qw, ws, wz, T((2, 6, 7, 7), dtype="uint8", low=0, high=255), b, *geometry, 0.05, 3,
              "uint8", 0.04, 5, "relu"),
            S(qx, 0.05, 128, qw, ws, wz, T((2, 6, 7, 7), dtype="float32", requires_grad=False), None, *geometry,
              1.0, 0, "float32", 1.0, 0, "none")]


def _qconv_binary(m, qx, x_scale, x_zp, qw, w_scale, w_zp, accum, bias, stride, padding, dilation, groups, out_scale,
                  out_zp, out_dtype, accum_scale, accum_zp, unary, tensor_qparams=False):
    """PyTorch's op writes into a channels-last accum: each call gets a channels-last copy of the sample's."""
    packed = m.ops.onednn.qconv_prepack(qw, w_scale, x_scale, x_zp, stride, padding, dilation, groups, list(qx.shape))
    op = m.ops.onednn.qconv2d_pointwise
    xs, xz = (m.tensor(x_scale), m.tensor(x_zp)) if tensor_qparams else (x_scale, x_zp)
    accum = accum.clone().contiguous(memory_format=m.channels_last)
    return (op.binary_tensor if tensor_qparams else op.binary)(
        qx, xs, xz, packed, w_scale, w_zp, accum, bias, stride, padding, dilation, groups, out_scale, out_zp,
        getattr(m, out_dtype), accum_scale, accum_zp, "sum", 1.0, unary, [], "")


def _qlinear_binary_samples(dtype):
    qw, ws, wz, b = (T((33, 40), dtype="int8", low=-127, high=127),
                     T((33,), dtype="float32", low=0.0005, high=0.002, requires_grad=False),
                     T((33,), dtype="int64", values=[0] * 33), T((33,), dtype="float32", low=-1, high=1,
                                                                  requires_grad=False))
    qx = T((2, 13, 40), dtype="uint8", low=0, high=255)
    return [S(qx, 0.05, 128, qw, ws, wz, T((2, 13, 33), dtype="float32", requires_grad=False), b, 1.0, 0, "float32",
              1.0, 0, "add", "relu"),
            S(qx, 0.05, 128, qw, ws, wz, T((2, 13, 33), dtype="float32", requires_grad=False), None, 0.06, 3, "uint8",
              1.0, 0, "add", "none"),
            S(qx, 0.05, 128, qw, ws, wz, T((2, 13, 33), dtype="uint8", low=0, high=255), b, 0.05, 3, "uint8", 0.04, 5,
              "sum", "relu")]


def _qlinear_binary(m, qx, x_scale, x_zp, qw, w_scale, w_zp, other, bias, out_scale, out_zp, out_dtype, other_scale,
                    other_zp, binary, unary, tensor_qparams=False):
    """PyTorch's "sum" writes into other: each call gets a copy of the sample's."""
    packed = m.ops.onednn.qlinear_prepack(qw, list(qx.shape))
    op = m.ops.onednn.qlinear_pointwise
    xs, xz = (m.tensor(x_scale), m.tensor(x_zp)) if tensor_qparams else (x_scale, x_zp)
    return (op.binary_tensor if tensor_qparams else op.binary)(
        qx, xs, xz, packed, w_scale, w_zp, other.clone(), bias, out_scale, out_zp, getattr(m, out_dtype), other_scale,
        other_zp, binary, 1.0, unary, [], "")


def _avg_int8_samples(dtype):
    def qx(shape, noncontig=False):
        return T(shape, dtype="uint8", low=0, high=255, noncontig=noncontig)
    return [S(qx((2, 16, 7, 7)), (3, 3), (2, 2), (1, 1), False, True, None, 128, None),
            S(qx((1, 4, 9, 8), noncontig=True), (2, 3), (2, 1), (1, 0), True, False, None, 100, None),
            S(qx((1, 6, 6, 6)), (2, 2), (2, 2), (0, 0), False, True, 3, 8, None),
            S(qx((2, 16, 7, 7)), None, None, None, None, None, None, 131, (1, 1)),
            S(qx((1, 16, 7, 7)), None, None, None, None, None, None, 130, (3, 2))]


def _avg_int8(m, qx, ks, st, pd, ceil, cip, div, zp, adaptive_size):
    """flambeau's int8 average pool vs PyTorch's quantized avg_pool2d / adaptive_avg_pool2d (same scale in and
    out), compared on the integers."""
    if m.__name__ == "torch":
        tq = m._make_per_tensor_quantized_tensor(qx, 0.1, zp)
        F = m.nn.functional
        out = F.adaptive_avg_pool2d(tq, adaptive_size) if adaptive_size else F.avg_pool2d(tq, ks, st, pd, ceil, cip,
                                                                                          div)
        return out.int_repr()
    H, W = qx.shape[-2:]
    win = QP.adaptive_avg_pool2d_windows(H, W, adaptive_size) if adaptive_size else \
        QP.avg_pool2d_windows(H, W, ks, st, pd, ceil, cip, div)
    return m.ops.aten._avg_pool2d_int8(qx, *win[0], *win[1], zp, bool(adaptive_size))


def _avg_int8_errors():
    from tests.opdb import ErrorSample
    return [ErrorSample(S(T((1, 2, 4, 4), dtype="float32"), (2, 2), (2, 2), (0, 0), False, True, None, 0, None),
                        RuntimeError, "uint8 or int8")]


OPS = [
    OpInfo("_avg_pool2d_int8", _avg_int8_samples, dtypes=("float32",), grad=False, call=_avg_int8,
           errors=_avg_int8_errors, ops=("_avg_pool2d_int8",),
           skip={"cuda": "the reference, PyTorch's quantized avg_pool2d, has no CUDA kernel (the op serves the "
                         "x86 int8 lowering of PT2E graphs, a CPU path)"}),
    OpInfo("onednn.qconv2d_pointwise.binary", _qconv_binary_samples, dtypes=("float32",), grad=False,
           call=_qconv_binary, ops=("onednn::qconv2d_pointwise.binary",)),
    OpInfo("onednn.qconv2d_pointwise.binary_tensor", _qconv_binary_samples, dtypes=("float32",), grad=False,
           call=lambda m, *a: _qconv_binary(m, *a, tensor_qparams=True),
           ops=("onednn::qconv2d_pointwise.binary_tensor",)),
    OpInfo("onednn.qconv2d_pointwise", _qconv_samples, dtypes=("float32",), grad=False, call=_qconv,
           errors=_qconv_errors, ops=("onednn::qconv_prepack", "onednn::qconv2d_pointwise")),
    OpInfo("onednn.qconv2d_pointwise.tensor", _qconv_samples, dtypes=("float32",), grad=False,
           call=lambda m, *a: _qconv(m, *a, tensor_qparams=True), ops=("onednn::qconv2d_pointwise.tensor",)),
    OpInfo("onednn.qlinear_pointwise", _qlinear_samples, dtypes=("float32",), grad=False, call=_qlinear,
           errors=_qlinear_errors, ops=("onednn::qlinear_prepack", "onednn::qlinear_pointwise")),
    OpInfo("onednn.qlinear_pointwise.tensor", _qlinear_samples, dtypes=("float32",), grad=False,
           call=_qlinear_tensor, ops=("onednn::qlinear_pointwise.tensor",)),
    OpInfo("onednn.qlinear_pointwise.binary", _qlinear_binary_samples, dtypes=("float32",), grad=False,
           call=_qlinear_binary, ops=("onednn::qlinear_pointwise.binary",)),
    OpInfo("onednn.qlinear_pointwise.binary_tensor", _qlinear_binary_samples, dtypes=("float32",), grad=False,
           call=lambda m, *a: _qlinear_binary(m, *a, tensor_qparams=True),
           ops=("onednn::qlinear_pointwise.binary_tensor",)),
    OpInfo("fake_quantize_per_tensor_affine", _fq_samples, ops=("fake_quantize_per_tensor_affine",),
           gradcheck=False, errors=_fq_errors, skip=STE),
    OpInfo("fake_quantize_per_tensor_affine.tensor_qparams", _fq_qparams_samples,
           fn="fake_quantize_per_tensor_affine", ops=("fake_quantize_per_tensor_affine.tensor_qparams",),
           gradcheck=False, skip=STE),
    OpInfo("fake_quantize_per_channel_affine", _fq_channel_samples, ops=("fake_quantize_per_channel_affine",),
           gradcheck=False, errors=_fq_channel_errors, skip=STE),
    OpInfo("quantized_decomposed.quantize_per_tensor", _q_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, lo, hi, dt: _qd(m).quantize_per_tensor.default(x, s, z, lo, hi, getattr(m, dt)),
           ops=(QD + "quantize_per_tensor",)),
    OpInfo("quantized_decomposed.quantize_per_tensor.tensor", _q_tensor_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, lo, hi, dt: _qd(m).quantize_per_tensor.tensor(x, s, z, lo, hi, getattr(m, dt)),
           ops=(QD + "quantize_per_tensor.tensor",)),
    OpInfo("quantized_decomposed.dequantize_per_tensor", _dq_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, lo, hi, dt: _qd(m).dequantize_per_tensor.default(x, s, z, lo, hi, getattr(m, dt)),
           ops=(QD + "dequantize_per_tensor",)),
    OpInfo("quantized_decomposed.dequantize_per_tensor.tensor", _dq_tensor_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, lo, hi, dt: _qd(m).dequantize_per_tensor.tensor(x, s, z, lo, hi, getattr(m, dt)),
           ops=(QD + "dequantize_per_tensor.tensor",)),
    OpInfo("quantized_decomposed.quantize_per_channel", _qc_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, a, lo, hi, dt: _qd(m).quantize_per_channel.default(x, s, z, a, lo, hi,
                                                                                      getattr(m, dt)),
           ops=(QD + "quantize_per_channel",)),
    OpInfo("quantized_decomposed.dequantize_per_channel", _dqc_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, s, z, a, lo, hi, dt: _qd(m).dequantize_per_channel.default(x, s, z, a, lo, hi,
                                                                                        getattr(m, dt)),
           ops=(QD + "dequantize_per_channel",)),
    OpInfo("quantized_decomposed.choose_qparams.tensor", _choose_samples, dtypes=("float32",), grad=False,
           call=lambda m, x, lo, hi, eps, dt: _qd(m).choose_qparams.tensor(x, lo, hi, eps, getattr(m, dt)),
           ops=(QD + "choose_qparams.tensor",)),
]
