"""Decompositions of the quantization ops (`flambeau._ops.quantized`) into core ops, so a compiled
graph of a PT2E-converted model lowers each quantize/dequantize into the pointwise kernels around it.

Each one computes in the dtypes of the eager kernel (float32 products, float64 per-channel scales
where PyTorch promotes to them), so compiled integers equal eager ones bit for bit.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._ops import quantized as Q
from .._ops.quantized import check_bounds, _fq_checks, _choose_checks, _dequantize_checks, _channel_shape
from ._table import aten, register_decomposition, maximum, minimum, to, full


def _clamp(x, lo, hi):
    return minimum(maximum(x, lo), hi)


def _float32_reciprocal(scale: float) -> float:
    """1.0f / float(scale), the inverse ATen's fake-quant loop multiplies by."""
    return float(np.float32(1) / np.float32(scale))


def _fake_quant(x, inv, scale, zero_point, quant_min, quant_max, out_dtype=D.float32):
    """The eager kernel's steps (`fake_quant_values`); the product with the scale in `out_dtype`."""
    ct = D.float64 if x.dtype is D.float64 else D.float32
    zp = zero_point if isinstance(zero_point, int) else to(zero_point, ct)
    q = aten.add(aten.round(aten.mul(to(x, ct), inv)), zp)
    back = aten.sub(_clamp(q, quant_min, quant_max), zp)
    return to(aten.mul(to(back, out_dtype), scale if isinstance(scale, float) else to(scale, out_dtype)), x.dtype)


@register_decomposition(Q.fake_quantize_per_tensor_affine)
def fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max):
    _fq_checks("fake_quantize_per_tensor_affine", x.dtype, quant_min, quant_max, (zero_point,))
    return _fake_quant(x, _float32_reciprocal(scale), float(np.float32(scale)), zero_point, quant_min, quant_max)


@register_decomposition(Q.fake_quantize_per_tensor_affine_tensor_qparams)
def fake_quantize_per_tensor_affine_tensor_qparams(x, scale, zero_point, quant_min, quant_max):
    Q.check_cuda_zero_point(zero_point.device.type == "cuda", zero_point.dtype)
    ct = D.float64 if x.dtype is D.float64 else D.float32
    s = aten.view(to(scale, D.float32), [])
    return _fake_quant(x, to(aten.reciprocal(s), ct), s, aten.view(zero_point, []), quant_min, quant_max)


@register_decomposition(Q.fake_quantize_per_channel_affine)
def fake_quantize_per_channel_affine(x, scale, zero_point, axis, quant_min, quant_max):
    ct = D.float64 if x.dtype is D.float64 else D.float32
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    s = aten.view(to(scale, D.float32), shape)
    return _fake_quant(x, to(aten.reciprocal(s), ct), s, aten.view(zero_point, shape), quant_min, quant_max, ct)


def _as_float32(x, op: str):
    if x.dtype in (D.float16, D.bfloat16):
        return to(x, D.float32)
    if x.dtype is not D.float32:
        raise AssertionError(f"{op}: Expecting input to have dtype torch.float32, but got dtype: {x.dtype}")
    return x


def _affine(x, inv, zero_point, quant_min, quant_max, dtype):
    r = aten.add(aten.round(aten.mul(x, inv)), zero_point)
    return to(_clamp(r, quant_min, quant_max), dtype)


@register_decomposition(Q.qd_quantize_per_tensor)
def quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype):
    x = _as_float32(x, "quantize_per_tensor")
    check_bounds(quant_min, quant_max, dtype)
    return _affine(x, float(np.float32(1.0 / scale)), zero_point, quant_min, quant_max, dtype)


@register_decomposition(Q.qd_quantize_per_tensor_tensor)
def quantize_per_tensor_tensor(x, scale, zero_point, quant_min, quant_max, dtype):
    x = _as_float32(x, "quantize_per_tensor")
    check_bounds(quant_min, quant_max, dtype)
    inv = to(aten.reciprocal(to(aten.view(scale, []), D.float64)), D.float32)
    return _affine(x, inv, to(aten.view(zero_point, []), D.float32), quant_min, quant_max, dtype)


@register_decomposition(Q.qd_dequantize_per_tensor)
def dequantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    _dequantize_checks(x.dtype, dtype)
    return aten.mul(aten.sub(to(x, out_dtype or D.float32), zero_point), scale)


@register_decomposition(Q.qd_dequantize_per_tensor_tensor)
def dequantize_per_tensor_tensor(x, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    _dequantize_checks(x.dtype, dtype)
    od = out_dtype or D.float32
    return aten.mul(aten.sub(to(x, od), to(aten.view(zero_point, []), od)), to(aten.view(scale, []), od))


@register_decomposition(Q.qd_quantize_per_channel)
def quantize_per_channel(x, scales, zero_points, axis, quant_min, quant_max, dtype):
    x = _as_float32(x, "quantize_per_channel")
    shape = _channel_shape(x.ndim, axis, scales.shape[0])
    check_bounds(quant_min, quant_max, dtype)
    inv = aten.view(aten.reciprocal(scales), shape)
    return _affine(x, inv, aten.view(zero_points, shape), quant_min, quant_max, dtype)


@register_decomposition(Q.qd_dequantize_per_channel)
def dequantize_per_channel(x, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype=None):
    _dequantize_checks(x.dtype, dtype)
    shape = _channel_shape(x.ndim, axis, scales.shape[0])
    d = aten.sub(x, aten.view(zero_points, shape)) if zero_points is not None else x
    s = aten.view(scales, shape)
    if s.dtype.category < D.FLOATING:
        s = to(s, D.float32)
    return to(aten.mul(d, s), out_dtype or D.float32)


@register_decomposition(Q.qd_choose_qparams_tensor)
def choose_qparams_tensor(x, quant_min, quant_max, eps, dtype):
    _choose_checks(x.dtype, quant_min, quant_max, dtype)
    lo = aten.view(aten.amin(x, []), [1])
    hi = aten.view(aten.amax(x, []), [1])
    min_neg = minimum(lo, 0)
    scale = aten.div(aten.sub(maximum(hi, 0), min_neg), float(quant_max - quant_min))
    scale = aten.maximum(scale, full((1,), eps, scale, D.float32))
    zp = aten.sub(quant_min, to(aten.round(aten.div(min_neg, scale)), D.int32))
    return to(scale, D.float64), to(_clamp(zp, quant_min, quant_max), D.int64)
