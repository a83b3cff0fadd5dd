"""Quantization range helpers shared by observers and quantizers (PyTorch's
`torch.ao.quantization.utils`): the integer range of a dtype, qscheme predicates, min/max checks."""
from __future__ import annotations

import warnings

import numpy as np

from ... import _dtype as D
from ..._tensor import Tensor

PER_TENSOR = (D.per_tensor_affine, D.per_tensor_symmetric)
PER_CHANNEL = (D.per_channel_affine, D.per_channel_symmetric, D.per_channel_affine_float_qparams)
# the integer range of each dtype an observer accepts, without and with reduce_range
_RANGES = {D.qint8: ((-128, 127), (-64, 63)), D.int8: ((-128, 127), (-64, 63)),
           D.quint8: ((0, 255), (0, 127)), D.uint8: ((0, 255), (0, 127)),
           D.qint32: ((-2 ** 31, 2 ** 31 - 1), (-2 ** 31, 2 ** 31 - 1)),
           D.int32: ((-2 ** 31, 2 ** 31 - 1), (-2 ** 31, 2 ** 31 - 1)),
           D.int16: ((-2 ** 15, 2 ** 15 - 1), (-2 ** 15, 2 ** 15 - 1)),
           D.uint16: ((0, 2 ** 16 - 1), (0, 2 ** 16 - 1))}


def is_per_tensor(qscheme) -> bool:
    return qscheme in PER_TENSOR


def is_per_channel(qscheme) -> bool:
    return qscheme in PER_CHANNEL


def validate_qmin_qmax(quant_min: int, quant_max: int) -> None:
    if not quant_min <= 0 <= quant_max:
        raise AssertionError("Used-specified quantization range must include 0.")
    if not quant_min < quant_max:
        raise AssertionError("qmin must be strictly less than qmax for user-specified quantization range.")


def calculate_qmin_qmax(quant_min, quant_max, has_customized_qrange: bool, dtype, reduce_range: bool):
    """The (quant_min, quant_max) an observer quantizes to: the customised range (halved under
    reduce_range), else the dtype's 8-bit (or wider) range."""
    if has_customized_qrange:
        span = quant_max - quant_min + 1
        if dtype in (D.qint8, D.int8) and not 0 < span <= 256:
            raise AssertionError("quantization range should be positive and not exceed the maximum bit range (=256).")
        if dtype in (D.qint32, D.int32) and not 0 < span <= 2 ** 32:
            raise AssertionError("quantization range should be positive and not exceed the maximum bit range "
                                 "(=4294967296).")
        if reduce_range:
            quant_min, quant_max = quant_min // 2, quant_max // 2
        return quant_min, quant_max
    if dtype not in _RANGES:
        raise ValueError(f"no default quantization range for {dtype}")
    return _RANGES[dtype][1 if reduce_range else 0]


def check_min_max_valid(min_val: Tensor, max_val: Tensor) -> bool:
    """False (with PyTorch's warning) before any observation; AssertionError when min > max."""
    if min_val.numel() == 0 or max_val.numel() == 0:
        warnings.warn("must run observer before calling calculate_qparams. Returning default values.", stacklevel=3)
        return False
    if min_val.dim() == 0 or max_val.dim() == 0:
        if float(min_val) == float("inf") and float(max_val) == float("-inf"):
            warnings.warn("must run observer before calling calculate_qparams. Returning default values.",
                          stacklevel=3)
            return False
        if float(min_val) > float(max_val):
            raise AssertionError(f"min {min_val} should be less than max {max_val}")
    elif bool((min_val > max_val).any()):
        raise AssertionError(f"min {min_val} should be less than max {max_val}")
    return True


SMALL_SCALE_THRESHOLD = 6.1e-5      # FBGEMM's floor for a scale (float)


def choose_qparams(lo: float, hi: float, qmin: int, qmax: int, preserve_sparsity: bool = False) -> tuple[float, int]:
    """FBGEMM's ChooseQuantizationParams (no power-of-two scale), as dynamic quantization and PyTorch's
    fused observer + fake quantization (`fused_moving_avg_obs_fake_quant`) compute them. With
    `preserve_sparsity` (symmetric qschemes) a range holding both signs is first widened to
    s * [-((qmax - qmin) // 2 + 1), (qmax - qmin) // 2] with the smallest s that holds it."""
    lo, hi = np.float32(lo), np.float32(hi)
    if preserve_sparsity and lo < 0 < hi:
        sym_min, sym_max = -((qmax - qmin) // 2 + 1), (qmax - qmin) // 2
        s = float(max(abs(lo / np.float32(sym_min)), abs(hi / np.float32(sym_max))))
        lo, hi = np.float32(s * sym_min), np.float32(s * sym_max)
    lo, hi = np.float32(min(lo, 0.0)), np.float32(max(hi, 0.0))
    scale = (float(hi) - float(lo)) / (float(qmax) - qmin)
    if np.float32(scale) == 0 or np.isinf(np.float32(1) / np.float32(scale)):
        scale = 0.1
    if scale < np.float32(SMALL_SCALE_THRESHOLD):
        small = float(np.float32(SMALL_SCALE_THRESHOLD))
        if lo == 0:
            hi = np.float32(small * (qmax - qmin))
        elif hi == 0:
            lo = np.float32(-small * (qmax - qmin))
        else:
            amplifier = np.float32(small / scale)
            lo, hi = lo * amplifier, hi * amplifier
        scale = small
    from_min = qmin - float(lo) / scale
    from_max = qmax - float(hi) / scale
    from_min_error = abs(qmin) - abs(float(lo) / scale)
    from_max_error = abs(qmax) - abs(float(hi) / scale)
    initial = from_min if from_min_error < from_max_error else from_max
    zero_point = qmin if initial < qmin else qmax if initial > qmax else int(np.rint(initial))
    return float(np.float32(scale)), zero_point
