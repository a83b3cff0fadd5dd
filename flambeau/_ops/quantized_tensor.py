"""Quantized tensors (PyTorch's QuantizedCPU tensors, dtypes quint8/qint8/qint32): the integers in
the tensor's array, the affine map to reals in its `_quantizer` (one scale and zero point, or one per
channel along an axis).

`quantize_per_tensor`/`quantize_per_channel` make one, `dequantize`, `int_repr` and the `q_*`
accessors read it. The integers are ATen's bit for bit: for quint8/qint8 FBGEMM's
`nearbyint(fma(x, 1.0f/scale, zero_point))` (one rounding of the product plus the zero point),
for qint32 the product rounded to float, plus the zero point, then rounded half to even; then
clamped to the dtype's range. Other operators do not take quantized tensors (PyTorch runs them
through its `quantized::` kernels, which flambeau has not).
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._device import CPU, QUANTIZED_CPU
from .._tensor import Tensor
from .._tensor_str import tensor_repr
from ._registry import export

_STORAGE = {D.quint8: D.uint8, D.qint8: D.int8, D.qint32: D.int32}


class _Quantizer:
    __slots__ = ()

    def repr_of(self, t: Tensor) -> str:
        return quantized_repr(t)


class PerTensorAffine(_Quantizer):
    """A quantized tensor's map: real = (q - zero_point) * scale."""
    __slots__ = ("scale", "zero_point")
    qscheme = D.per_tensor_affine

    def __init__(self, scale: float, zero_point: int):
        self.scale = float(scale)
        self.zero_point = int(zero_point)


class PerChannelAffine(_Quantizer):
    """Per-channel map along `axis`: scales float64, zero points int64, one per channel."""
    __slots__ = ("scales", "zero_points", "axis")
    qscheme = D.per_channel_affine

    def __init__(self, scales, zero_points, axis: int):
        self.scales = scales
        self.zero_points = zero_points
        self.axis = axis


def _check_target(op: str, input: Tensor, dtype) -> None:
    if dtype not in _STORAGE:
        raise RuntimeError(f"{op}: Quantize only works on Float Tensor's dtype to quantized dtypes "
                           f"(torch.quint8, torch.qint8, torch.qint32), got {dtype}")
    if input._dtype not in (D.float32, D.float16, D.bfloat16, D.float64):
        raise RuntimeError(f"{op}: Quantize only works on Float Tensor, got {input._dtype}")
    if input._device.type != "cpu":
        raise NotImplementedError(f"{op}: quantized tensors live on the cpu only (input on {input._device})")


def _quantize_values(x, scale, zero_point, dtype):
    """The integers ATen stores (module docstring), from float32 values and float32 scales."""
    inv = np.float32(1) / scale.astype(np.float32)
    if dtype is D.qint32:
        r = np.rint((x * inv).astype(np.float32) + np.asarray(zero_point).astype(np.float32))
    else:       # the product of two float32 is exact in float64: one rounding to float32, like an FMA
        r = np.rint((x.astype(np.float64) * inv.astype(np.float64) + zero_point).astype(np.float32))
    info = np.iinfo(_STORAGE[dtype].np)
    return np.clip(r.astype(np.float64), info.min, info.max).astype(_STORAGE[dtype].np)


def _quantized(data, like: Tensor, dtype, quantizer) -> Tensor:
    t = Tensor._make(np.ascontiguousarray(data), QUANTIZED_CPU, dtype)
    t._quantizer = quantizer
    return t


def _float32(input: Tensor):
    return np.asarray(input._data, dtype=np.float32)


@export("quantize_per_tensor")
def quantize_per_tensor(input: Tensor, scale, zero_point, dtype) -> Tensor:
    """`torch.quantize_per_tensor(input, scale, zero_point, dtype)`."""
    _check_target("quantize_per_tensor", input, dtype)
    scale = float(scale.item() if isinstance(scale, Tensor) else scale)
    zero_point = int(zero_point.item() if isinstance(zero_point, Tensor) else zero_point)
    q = _quantize_values(_float32(input), np.float32(scale), zero_point, dtype)
    return _quantized(q, input, dtype, PerTensorAffine(scale, zero_point))


@export("quantize_per_channel")
def quantize_per_channel(input: Tensor, scales: Tensor, zero_points: Tensor, axis: int, dtype) -> Tensor:
    """`torch.quantize_per_channel(input, scales, zero_points, axis, dtype)`."""
    _check_target("quantize_per_channel", input, dtype)
    nd = input.ndim
    if not 0 <= axis < nd:
        raise RuntimeError(f"quantize_per_channel: axis {axis} out of range for a tensor of {nd} dimensions")
    n = input.shape[axis]
    if scales.ndim != 1 or scales.numel() != n or zero_points.ndim != 1 or zero_points.numel() != n:
        raise RuntimeError(f"quantize_per_channel: length of scales ({scales.numel()}) and zero_points "
                           f"({zero_points.numel()}) must match input.size({axis}) = {n}")
    shape = [1] * nd
    shape[axis] = n
    s = np.asarray(scales._data, dtype=np.float64)
    z = np.asarray(zero_points._data, dtype=np.int64)
    q = _quantize_values(_float32(input), s.reshape(shape), z.reshape(shape), dtype)
    quantizer = PerChannelAffine(Tensor._make(s.copy(), input._device), Tensor._make(z.copy(), input._device), axis)
    return _quantized(q, input, dtype, quantizer)


def _quantizer_of(t: Tensor, what: str):
    if t._quantizer is None:
        raise RuntimeError(f"{what} expects a quantized tensor, got a tensor of dtype {t._dtype}")
    return t._quantizer


@export("dequantize", method=True)
def dequantize(input: Tensor) -> Tensor:
    """Reals of a quantized tensor as float32 (a non-quantized tensor is returned as it is)."""
    qz = input._quantizer
    if qz is None:
        return input
    q = input._data
    if isinstance(qz, PerTensorAffine):     # in int32 for qint32, wrapping as ATen's
        it = np.int32 if input._dtype is D.qint32 else np.int64
        with np.errstate(over="ignore"):
            d = q.astype(it) - it(qz.zero_point)
        out = d.astype(np.float32) * np.float32(qz.scale)
    else:
        shape = [1] * q.ndim
        shape[qz.axis] = -1
        d = q.astype(np.int64) - qz.zero_points._data.reshape(shape)
        out = (d * qz.scales._data.reshape(shape)).astype(np.float32)
    return Tensor._make(out, CPU)


@export("int_repr", method=True)
def int_repr(input: Tensor) -> Tensor:
    """The stored integers (uint8 for quint8, int8 for qint8, int32 for qint32), a copy."""
    _quantizer_of(input, "int_repr")
    return Tensor._make(input._data.copy(), CPU)


def _per_tensor(t: Tensor, what: str) -> PerTensorAffine:
    qz = _quantizer_of(t, what)
    if not isinstance(qz, PerTensorAffine):
        raise RuntimeError("Expected quantizer->qscheme() == kPerTensorAffine to be true, but got false.")
    return qz


def _per_channel(t: Tensor, what: str) -> PerChannelAffine:
    qz = _quantizer_of(t, what)
    if not isinstance(qz, PerChannelAffine):
        raise RuntimeError(f"Expected quantizer->qscheme() == kPerChannelAffine to be true, but got false. "
                           f"({what} of a per-tensor quantized tensor)")
    return qz


@export("q_scale", method=True)
def q_scale(input: Tensor) -> float:
    return _per_tensor(input, "q_scale").scale


@export("q_zero_point", method=True)
def q_zero_point(input: Tensor) -> int:
    return _per_tensor(input, "q_zero_point").zero_point


@export("q_per_channel_scales", method=True)
def q_per_channel_scales(input: Tensor) -> Tensor:
    return _per_channel(input, "q_per_channel_scales").scales.clone()


@export("q_per_channel_zero_points", method=True)
def q_per_channel_zero_points(input: Tensor) -> Tensor:
    return _per_channel(input, "q_per_channel_zero_points").zero_points.clone()


@export("q_per_channel_axis", method=True)
def q_per_channel_axis(input: Tensor) -> int:
    return _per_channel(input, "q_per_channel_axis").axis


@export("qscheme", method=True, function=False)
def qscheme(input: Tensor):
    return _quantizer_of(input, "qscheme").qscheme


def quantized_repr(t: Tensor) -> str:
    """PyTorch's repr of a quantized tensor: the dequantized values, then the map."""
    body = tensor_repr(dequantize(t))
    body = body[:-1] if body.endswith(")") else body
    qz = t._quantizer
    if isinstance(qz, PerTensorAffine):
        extra = f"scale={qz.scale}, zero_point={qz.zero_point}"
    else:
        extra = (f"scale={tensor_repr(qz.scales)}, zero_point={tensor_repr(qz.zero_points)}, "
                 f"axis={qz.axis}")
    return (f"{body}, size={tuple(t.shape)}, dtype={t.dtype},\n       "
            f"quantization_scheme={qz.qscheme}, {extra})")
