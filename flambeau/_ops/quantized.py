"""Quantization operators on ordinary tensors: fake quantization with its straight-through gradient,
and the `quantized_decomposed` library (PyTorch's `torch.ops.quantized_decomposed`), whose
quantize/dequantize/choose_qparams ops carry the integers in uint8/int8/int32 tensors and the
scale and zero point as arguments. Each op has a decomposition into core ops (`flambeau._decomp.
decompositions_quant`), so compiled graphs of PT2E-converted models lower them like any pointwise chain.

Rounding is half-to-even (`nearbyint`), then clamping to [quant_min, quant_max], as PyTorch's.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._tags import Tag
from .._tensor import Tensor
from .._dispatch import type_name
from ._registry import defop, export, TensorSpec, EXPORTS
from ._batching import call, front, unary_rule
from .._backends import contiguous_strides

QDECOMPOSED = "quantized_decomposed"
# the integer range of each storage dtype the quantized_decomposed ops accept
QVALUE_BOUNDS = {D.uint8: (0, 255), D.int8: (-128, 127), D.int16: (-32768, 32767),
                 D.int32: (-2 ** 31, 2 ** 31 - 1), D.uint16: (0, 65535)}


def check_bounds(quant_min: int, quant_max: int, dtype) -> None:
    """PyTorch's `_quant_min_max_bounds_check` (AssertionError, as its Python implementation raises)."""
    if dtype not in QVALUE_BOUNDS:
        raise ValueError(f"Unsupported dtype: {dtype}")
    lo, hi = QVALUE_BOUNDS[dtype]
    if quant_min < lo:
        raise AssertionError(f"quant_min out of bounds for dtype, quant_min_lower_bound: {lo} quant_min: {quant_min}")
    if quant_max > hi:
        raise AssertionError(f"quant_max out of bounds for dtype, quant_max_upper_bound: {hi} quant_max: {quant_max}")


def _float_input(x, op: str):
    if x.dtype in (D.float16.np, D.bfloat16.np):
        return x.astype(np.float32)
    if x.dtype != np.float32:
        raise AssertionError(f"{op}: Expecting input to have dtype torch.float32, but got dtype: "
                             f"torch.{D.FROM_NP[x.dtype].name}")
    return x


def _spec(x, dtype) -> TensorSpec:
    return TensorSpec(x.shape, dtype, contiguous_strides(x.shape))


# ---- fake quantization -----------------------------------------------------------------------------
def _fq_checks(op: str, x_dtype, quant_min: int, quant_max: int, zero_points) -> None:
    if x_dtype not in (D.float32, D.float64, D.float16, D.bfloat16):
        raise RuntimeError(f"{op}: expected a floating point input, got {x_dtype}")
    if quant_min > quant_max:
        raise RuntimeError("`quant_min` should be less than or equal to `quant_max`.")
    if any(not quant_min <= z <= quant_max for z in zero_points):
        raise RuntimeError("`zero_point` must be between `quant_min` and `quant_max`.")


def fake_quant_values(xp, x, scale, zero_point, quant_min, quant_max, per_channel=False):
    """(output, mask): ATen's fake-quant loops. `scale` float32 and `zero_point` broadcast against x;
    q = nearbyint(x * (1/scale)) + zero_point in x's compute type (float64 for double, else float32),
    out = (clamp(q) - zero_point) * scale, in float32 per tensor and in the compute type per channel,
    mask = quant_min <= q <= quant_max."""
    ct = np.float64 if x.dtype == np.float64 else np.float32
    inv = (np.float32(1) / scale.astype(np.float32)).astype(ct)
    q = xp.rint(x.astype(ct) * inv) + zero_point.astype(ct)
    ot = ct if per_channel else np.float32
    out = (xp.clip(q, quant_min, quant_max) - zero_point.astype(ct)).astype(ot) * scale.astype(ot)
    return xp.ascontiguousarray(out.astype(x.dtype)), (q >= quant_min) & (q <= quant_max)


@defop("fake_quantize_per_tensor_affine(Tensor self, float scale, int zero_point, int quant_min, "
       "int quant_max) -> Tensor", function=False, tags=(Tag.cpu_autocast_fp32,))
def fake_quantize_per_tensor_affine(xp, self, scale, zero_point, quant_min, quant_max):
    _fq_checks("fake_quantize_per_tensor_affine", D.FROM_NP[self.dtype], quant_min, quant_max, (zero_point,))
    return fake_quant_values(xp, self, np.float32(scale), np.int64(zero_point), quant_min, quant_max)[0]


@fake_quantize_per_tensor_affine.def_meta
def _fake_quantize_per_tensor_affine_meta(self, scale, zero_point, quant_min, quant_max):
    _fq_checks("fake_quantize_per_tensor_affine", self.dtype, quant_min, quant_max, (zero_point,))
    return _spec(self, self.dtype)


def _straight_through(grad, self, scale, zero_point, quant_min, quant_max, axis=None):
    """PyTorch's `grad * mask`: the gradient passes where the rounded value lies in range."""
    E = EXPORTS
    ct = D.float64 if self.dtype is D.float64 else D.float32
    shape = [1] * self.ndim
    if axis is not None:
        shape[axis] = -1
        scale = E["reshape"](scale, shape)
        zero_point = E["reshape"](zero_point, shape)
    if isinstance(scale, float):
        inv = float(np.float32(1) / np.float32(scale))
    else:
        inv = E["reciprocal"](scale.to(D.float32)).to(ct)
    zp = zero_point if isinstance(zero_point, int) else zero_point.to(ct)
    q = E["add"](E["round"](E["mul"](self.to(ct), inv)), zp)
    mask = E["logical_and"](E["ge"](q, quant_min), E["le"](q, quant_max))
    return E["mul"](grad, mask)


@fake_quantize_per_tensor_affine.def_derivative
def _fake_quantize_per_tensor_affine_derivative(grad, self, scale, zero_point, quant_min, quant_max):
    return (_straight_through(grad, self, scale, zero_point, quant_min, quant_max),)


def check_cuda_zero_point(on_cuda: bool, zero_point_dtype) -> None:
    """ATen's cuda kernel of fake_quantize with tensor qparams reads the zero point as int32 (its cpu
    kernel converts): another dtype on cuda is its RuntimeError, eager and compiled alike."""
    if on_cuda and zero_point_dtype is not D.int32:
        raise RuntimeError(f"fake_quantize_per_tensor_affine: expected scalar type Int but found "
                           f"{type_name(zero_point_dtype)} (zero_point on cuda must be int32)")


@defop("fake_quantize_per_tensor_affine.tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, "
       "int quant_min, int quant_max) -> Tensor", function=False)
def fake_quantize_per_tensor_affine_tensor_qparams(xp, self, scale, zero_point, quant_min, quant_max):
    check_cuda_zero_point(xp is not np, D.FROM_NP[zero_point.dtype])
    _fq_checks("fake_quantize_per_tensor_affine", D.FROM_NP[self.dtype], quant_min, quant_max,
               [int(z) for z in zero_point.reshape(-1).tolist()])
    return fake_quant_values(xp, self, xp.asarray(scale).reshape(()), xp.asarray(zero_point).reshape(()),
                             quant_min, quant_max)[0]


fake_quantize_per_tensor_affine_tensor_qparams.def_meta(
    lambda self, scale, zero_point, quant_min, quant_max: _spec(self, self.dtype))


@fake_quantize_per_tensor_affine_tensor_qparams.def_derivative
def _fake_quantize_per_tensor_affine_tensor_qparams_derivative(grad, self, scale, zero_point, quant_min,
                                                               quant_max):
    return (_straight_through(grad, self, scale.reshape(()), zero_point.reshape(()), quant_min, quant_max),
            None, None)


@export("fake_quantize_per_tensor_affine")
def fake_quantize_per_tensor_affine_public(input, scale, zero_point, quant_min: int, quant_max: int):
    """`torch.fake_quantize_per_tensor_affine`: qparams as numbers or as one-element tensors."""
    if isinstance(scale, Tensor) or isinstance(zero_point, Tensor):
        return fake_quantize_per_tensor_affine_tensor_qparams(input, scale, zero_point, quant_min, quant_max)
    return fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max)


def _per_channel_checks(op: str, x_shape, scale, zero_point, axis: int):
    nd = len(x_shape)
    if not -nd <= axis < nd:
        raise RuntimeError(f"{op}: `axis` must be between 0 and number of dimensions of input, got {axis} "
                           f"for an input of shape {tuple(x_shape)}")
    axis %= nd
    if scale.dtype != np.float32:
        raise RuntimeError(f"Scale must be Float, found {type_name(D.FROM_NP[scale.dtype])}")
    if zero_point.dtype not in (np.int32, np.float32, np.float16):
        raise RuntimeError(f"Zero-point must be Int32, Float or Half, found {type_name(D.FROM_NP[zero_point.dtype])}")
    if len(scale.shape) != 1 or scale.shape[0] != x_shape[axis]:
        raise RuntimeError(f"{op}: dimensions of scale and zero-point are not consistent with input tensor "
                           f"(scale {tuple(scale.shape)}, input {tuple(x_shape)}, axis {axis})")
    if tuple(zero_point.shape) != tuple(scale.shape):
        raise RuntimeError(f"{op}: dimensions of scale and zero-point are not consistent with input tensor")
    return axis


@defop("fake_quantize_per_channel_affine(Tensor self, Tensor scale, Tensor zero_point, int axis, "
       "int quant_min, int quant_max) -> Tensor")
def fake_quantize_per_channel_affine(xp, self, scale, zero_point, axis, quant_min, quant_max):
    op = "fake_quantize_per_channel_affine"
    axis = _per_channel_checks(op, self.shape, scale, zero_point, axis)
    _fq_checks(op, D.FROM_NP[self.dtype], quant_min, quant_max, [int(z) for z in zero_point.reshape(-1).tolist()])
    shape = [1] * self.ndim
    shape[axis] = -1
    return fake_quant_values(xp, self, scale.reshape(shape), zero_point.reshape(shape), quant_min, quant_max,
                             per_channel=True)[0]


@fake_quantize_per_channel_affine.def_meta
def _fake_quantize_per_channel_affine_meta(self, scale, zero_point, axis, quant_min, quant_max):
    _per_channel_checks("fake_quantize_per_channel_affine", self.shape, scale._data, zero_point._data, axis)
    return _spec(self, self.dtype)


@fake_quantize_per_channel_affine.def_derivative
def _fake_quantize_per_channel_affine_derivative(grad, self, scale, zero_point, axis, quant_min, quant_max):
    return (_straight_through(grad, self, scale, zero_point, quant_min, quant_max, axis % self.ndim), None, None)


# ---- quantized_decomposed ----------------------------------------------------------------------------
def _affine_quantize(xp, x, inv_scale, zero_point, quant_min, quant_max, dtype):
    """clamp(round(x * inv_scale) + zero_point, quant_min, quant_max).to(dtype), computed in the
    dtype of x * inv_scale (the operands keep PyTorch's promotion: arrays of one dtype)."""
    r = xp.rint(x * inv_scale)
    r = r + zero_point.astype(r.dtype) if hasattr(zero_point, "astype") else r + r.dtype.type(zero_point)
    return xp.ascontiguousarray(xp.clip(r, quant_min, quant_max).astype(dtype.np))


@defop("quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
       "ScalarType dtype) -> Tensor", op_namespace=QDECOMPOSED, function=False)
def qd_quantize_per_tensor(xp, input, scale, zero_point, quant_min, quant_max, dtype):
    x = _float_input(input, "quantize_per_tensor")
    check_bounds(quant_min, quant_max, dtype)
    return _affine_quantize(xp, x, np.float32(1.0 / scale), zero_point, quant_min, quant_max, dtype)


def _quantize_meta(input, *args):
    dtype = args[-1]
    if input.dtype not in (D.float32, D.float16, D.bfloat16):
        raise AssertionError(f"Expecting input to have dtype torch.float32, but got dtype: {input.dtype}")
    return _spec(input, dtype)


qd_quantize_per_tensor.def_meta(_quantize_meta)


def _one_element(t, what: str):
    if t.size != 1:
        raise AssertionError(f"Expecting {what} tensor to be one element, but received : {t.size}")
    return t.reshape(()).item()


@defop("quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
       "int quant_max, ScalarType dtype) -> Tensor", op_namespace=QDECOMPOSED, function=False)
def qd_quantize_per_tensor_tensor(xp, input, scale, zero_point, quant_min, quant_max, dtype):
    return qd_quantize_per_tensor.kernel(xp, input, float(_one_element(scale, "scale")),
                                         int(_one_element(zero_point, "zero_point")), quant_min, quant_max, dtype)


qd_quantize_per_tensor_tensor.def_meta(_quantize_meta)


def _dequantize_checks(input_dtype, dtype) -> None:
    if input_dtype != dtype:
        raise AssertionError(f"Expecting input to have dtype: {dtype}, but got {input_dtype}")
    if dtype not in QVALUE_BOUNDS:
        raise ValueError(f"Unsupported dtype in dequantize_per_tensor: {dtype}")


@defop("dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
       "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor", op_namespace=QDECOMPOSED, function=False)
def qd_dequantize_per_tensor(xp, input, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    _dequantize_checks(D.FROM_NP[input.dtype], dtype)
    od = (out_dtype or D.float32).np
    return xp.ascontiguousarray((input.astype(od) - od.type(zero_point)) * od.type(scale))


def _dequantize_meta(input, *args, out_dtype=None):
    _dequantize_checks(input.dtype, args[-1])
    return _spec(input, out_dtype or D.float32)


qd_dequantize_per_tensor.def_meta(_dequantize_meta)


@defop("dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
       "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
       op_namespace=QDECOMPOSED, function=False)
def qd_dequantize_per_tensor_tensor(xp, input, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    return qd_dequantize_per_tensor.kernel(xp, input, float(_one_element(scale, "scale")),
                                           int(_one_element(zero_point, "zero_point")), quant_min, quant_max,
                                           dtype, out_dtype=out_dtype)


qd_dequantize_per_tensor_tensor.def_meta(_dequantize_meta)


def _channel_shape(ndim: int, axis: int, n: int) -> list:
    if axis >= ndim:
        raise AssertionError(f"Expecting axis to be < {ndim}")
    shape = [1] * ndim
    shape[axis] = n
    return shape


@defop("quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, "
       "int quant_max, ScalarType dtype) -> Tensor", op_namespace=QDECOMPOSED, function=False)
def qd_quantize_per_channel(xp, input, scales, zero_points, axis, quant_min, quant_max, dtype):
    x = _float_input(input, "quantize_per_channel")
    shape = _channel_shape(x.ndim, axis, scales.shape[0])
    check_bounds(quant_min, quant_max, dtype)
    inv = (1.0 / scales).reshape(shape)              # in the scales' dtype, as `1.0 / scales`
    ct = np.promote_types(x.dtype, inv.dtype)        # both dimensioned: ordinary promotion
    return _affine_quantize(xp, x.astype(ct), inv.astype(ct), zero_points.reshape(shape), quant_min, quant_max,
                            dtype)


@qd_quantize_per_channel.def_meta
def _qd_quantize_per_channel_meta(input, scales, zero_points, axis, quant_min, quant_max, dtype):
    _channel_shape(input.ndim, axis, scales.shape[0])
    check_bounds(quant_min, quant_max, dtype)
    return _quantize_meta(input, dtype)


@defop("dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, "
       "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
       op_namespace=QDECOMPOSED, function=False)
def qd_dequantize_per_channel(xp, input, scales, zero_points, axis, quant_min, quant_max, dtype, *,
                              out_dtype=None):
    _dequantize_checks(D.FROM_NP[input.dtype], dtype)
    shape = _channel_shape(input.ndim, axis, scales.shape[0])
    check_bounds(quant_min, quant_max, dtype)
    s = scales.reshape(shape)
    if zero_points is not None:
        d = input.astype(np.promote_types(input.dtype, zero_points.dtype)) - zero_points.reshape(shape)
    else:
        d = input
    ct = np.promote_types(d.dtype, s.dtype) if s.dtype.kind == "f" else np.float32
    return xp.ascontiguousarray((d.astype(ct) * s.astype(ct)).astype((out_dtype or D.float32).np))


@qd_dequantize_per_channel.def_meta
def _qd_dequantize_per_channel_meta(input, scales, zero_points, axis, quant_min, quant_max, dtype, *,
                                    out_dtype=None):
    _dequantize_checks(input.dtype, dtype)
    _channel_shape(input.ndim, axis, scales.shape[0])
    return _spec(input, out_dtype or D.float32)


def qparams_from_min_max(min_val, max_val, quant_min: int, quant_max: int, eps: float, xp=np):
    """Affine (scale float64, zero_point int64) arrays from float32 min/max arrays: PyTorch's
    `determine_qparams` for per_tensor_affine without a customised range. The scale is computed
    in float32 and widened; the zero point is quant_min - round(min / scale), clamped. `xp`: the
    arrays' namespace (NumPy, or CuPy for cuda tensors)."""
    zero = xp.zeros((), min_val.dtype)
    min_neg = xp.minimum(min_val, zero)
    max_pos = xp.maximum(max_val, zero)
    scale = (max_pos - min_neg) / min_val.dtype.type(float(quant_max - quant_min))
    scale = xp.maximum(scale, np.float32(eps).astype(scale.dtype))
    zp = quant_min - xp.rint(min_neg / scale).astype(np.int32)
    zp = xp.clip(zp, quant_min, quant_max)
    return scale.astype(np.float64), zp.astype(np.int64)


@defop("choose_qparams.tensor(Tensor input, int quant_min, int quant_max, float eps, ScalarType dtype) "
       "-> (Tensor, Tensor)", op_namespace=QDECOMPOSED, function=False)
def qd_choose_qparams_tensor(xp, input, quant_min, quant_max, eps, dtype):
    _choose_checks(D.FROM_NP[input.dtype], quant_min, quant_max, dtype)
    if input.size == 0:
        return xp.ones(1, np.float64), xp.zeros(1, np.int64)
    scale, zp = qparams_from_min_max(input.min().reshape(1), input.max().reshape(1), quant_min, quant_max, eps, xp)
    return scale, zp


def _choose_checks(input_dtype, quant_min, quant_max, dtype):
    if input_dtype not in (D.float32, D.float16, D.bfloat16):
        raise AssertionError(f"Expecting input to have dtype torch.float32/16/b16, but got dtype: {input_dtype}")
    if dtype not in QVALUE_BOUNDS:
        raise AssertionError(f"Expecting target dtype to be one of {list(QVALUE_BOUNDS)}, but got: {dtype}")
    if not quant_min <= 0 <= quant_max:
        raise AssertionError("Used-specified quantization range must include 0.")
    if quant_min >= quant_max:
        raise AssertionError("qmin must be strictly less than qmax for user-specified quantization range.")


@qd_choose_qparams_tensor.def_meta
def _qd_choose_qparams_tensor_meta(input, quant_min, quant_max, eps, dtype):
    _choose_checks(input.dtype, quant_min, quant_max, dtype)
    return TensorSpec((1,), D.float64, (1,)), TensorSpec((1,), D.int64, (1,))


# ---- vmap ------------------------------------------------------------------------------------------
def _channel_batching(op):
    """A per-channel op on a batched input (qparams unbatched): the batch dimension moved to the front,
    the channel axis shifted past it."""
    def rule(in_dims, x, scales, zero_points, axis, *rest):
        if any(d is not None for d in in_dims[1:]) or in_dims[0] is None:
            return NotImplemented
        x = front(x, in_dims[0])
        return call(op, (x, scales, zero_points, axis % (x.ndim - 1) + 1) + rest), 0
    rule.__name__ = f"_{op.__name__}_channel_batching"
    return rule


for _op in (fake_quantize_per_tensor_affine, fake_quantize_per_tensor_affine_tensor_qparams, qd_quantize_per_tensor,
            qd_quantize_per_tensor_tensor, qd_dequantize_per_tensor, qd_dequantize_per_tensor_tensor):
    _op.def_batching_rule(unary_rule(_op))
for _op in (fake_quantize_per_channel_affine, qd_quantize_per_channel, qd_dequantize_per_channel):
    _op.def_batching_rule(_channel_batching(_op))
