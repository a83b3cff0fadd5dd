"""Dynamically quantized `Linear` (PyTorch's `torch.ao.nn.quantized.dynamic.Linear`) and the
`linear_dynamic` product that every dynamically quantized module runs.

The arithmetic is FBGEMM's `linear_dynamic`: the input's range (widened to hold 0) gives an
unsigned 8-bit scale and zero point by FBGEMM's ChooseQuantizationParams (7 bits under
reduce_range, as PyTorch's x86 default), the input is quantized with the weight-independent
rounding of `quantize_per_tensor`, the integer products are summed exactly (the int8 GEMM of
`flambeau/_backends/cpu_int8.cpp`, AVX-512 VNNI, on the weight that `Linear` packs once into the
kernel's layout when it is set, not per call), and
out = float(acc) * (input_scale * weight_scale) + bias in float32.
"""
from __future__ import annotations

import numpy as np

from ..... import _dtype as D
from ....._tensor import Tensor
from .....nn.modules.module import Module
from .....nn.modules.linear import Linear as FloatLinear
from ....._ops import EXPORTS as F
from ....._ops.quantized_tensor import _quantize_values
from ....._backends import cpu_int8
from ....quantization.observer import MinMaxObserver
from ....quantization.utils import choose_qparams

def linear_dynamic(x: Tensor, qweight: Tensor, bias: Tensor | None, reduce_range: bool = True,
                   packed=None) -> Tensor:
    """`quantized::linear_dynamic` (module docstring) for a per-tensor or per-channel qint8 weight;
    `packed`: its `cpu_int8.pack_weight` (else packed for this call)."""
    if x._dtype is not D.float32:
        raise RuntimeError(f"linear_dynamic: expected a float32 input, got {x._dtype}")
    a = np.asarray(x._data, dtype=np.float32)
    k = a.shape[-1]
    if qweight.shape[1] != k:
        raise RuntimeError(f"linear_dynamic: mat1 and mat2 shapes cannot be multiplied "
                           f"({int(np.prod(a.shape[:-1]))}x{k} and {qweight.shape[1]}x{qweight.shape[0]})")
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    x_scale, x_zp = choose_qparams(lo, hi, 0, 127 if reduce_range else 255)
    qx = _quantize_values(a.reshape(-1, k), np.float32(x_scale), x_zp, D.quint8)
    qz = qweight._quantizer
    n = qweight.shape[0]
    if qweight.qscheme() in (D.per_tensor_affine, D.per_tensor_symmetric):
        w_zps = np.full(n, qz.zero_point, np.int64)
        w_scale = np.float32(qz.scale)
    else:
        w_zps = qz.zero_points._data.reshape(-1)
        w_scale = qz.scales._data.astype(np.float32)
    # the exact int32 sums, as float32, from the int8 GEMM (AVX-512 VNNI; unit scales leave float(acc))
    if packed is None:
        packed = cpu_int8.pack_weight(qweight._data)
    acc = cpu_int8.qlinear_packed(qx, 1.0, x_zp, packed, np.ones(n, np.float32), w_zps, None, 1.0, 0, np.float32)
    mult = np.float32(x_scale) * w_scale
    if bias is None:
        out = acc * mult
    else:       # one rounding of acc * mult + bias, as the FMA in FBGEMM's requantization
        out = (acc.astype(np.float64) * mult.astype(np.float64)
               + np.asarray(bias._data, dtype=np.float32)).astype(np.float32)
    return Tensor._make(out.reshape(a.shape[:-1] + (qweight.shape[0],)), x._device)


class Linear(Module):
    """`torch.ao.nn.quantized.dynamic.Linear`: a qint8 weight, a float bias, float in and out."""
    _FLOAT_MODULE = FloatLinear

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, dtype=D.qint8):
        super().__init__()
        if dtype is not D.qint8:
            raise RuntimeError(f"Unsupported dtype specified for dynamic quantized Linear: {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.version = 4
        w = F["zeros"](out_features, in_features)
        self._bias = F["zeros"](out_features) if bias_ else None
        self.set_weight_bias(F["quantize_per_tensor"](w, 1.0, 0, D.qint8), self._bias)

    def _packed_weight(self):
        """The kernel's packed layout of the weight, made once per weight tensor set."""
        if self._packed[0] is not self._qweight:
            self._packed = (self._qweight, cpu_int8.pack_weight(self._qweight._data))
        return self._packed[1]

    def forward(self, x: Tensor) -> Tensor:
        return linear_dynamic(x, self._qweight, self._bias, reduce_range=True, packed=self._packed_weight())

    def weight(self) -> Tensor:
        return self._qweight

    def bias(self) -> Tensor | None:
        return self._bias

    def set_weight_bias(self, w: Tensor, b: Tensor | None) -> None:
        self._qweight, self._bias = w, b
        self._packed = (w, cpu_int8.pack_weight(w._data))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, dtype={self._qweight.dtype}, "
                f"qscheme={self._qweight.qscheme()}")

    @classmethod
    def from_float(cls, mod: Module, weight_observer=None) -> "Linear":
        """Quantize `mod.weight` with its qconfig's weight observer (default: MinMax, qint8, symmetric)."""
        if not isinstance(mod, cls._FLOAT_MODULE):
            raise AssertionError(f"nnqd.Linear.from_float only works for {cls._FLOAT_MODULE.__name__}, "
                                 f"got {type(mod).__name__}")
        if weight_observer is None:
            qconfig = getattr(mod, "qconfig", None)
            weight_observer = qconfig.weight() if qconfig is not None else \
                MinMaxObserver(dtype=D.qint8, qscheme=D.per_tensor_symmetric)
        w = mod.weight.detach().float()
        weight_observer(w)
        scale, zp = weight_observer.calculate_qparams()
        if weight_observer.qscheme in (D.per_channel_affine, D.per_channel_symmetric):
            qw = F["quantize_per_channel"](w, scale.double(), zp.long(), weight_observer.ch_axis, D.qint8)
        else:
            qw = F["quantize_per_tensor"](w, float(scale), int(zp), D.qint8)
        out = cls(mod.in_features, mod.out_features, mod.bias is not None)
        out.set_weight_bias(qw, mod.bias.detach().float().clone() if mod.bias is not None else None)
        return out
