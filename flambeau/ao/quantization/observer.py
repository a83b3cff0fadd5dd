"""Observers (PyTorch's `torch.ao.quantization.observer`): modules that watch the tensors passing
through them during calibration and turn what they saw into quantization parameters.

Each computes with the same operators, in the same dtypes, as PyTorch's, so the same data gives
the same min/max, histogram, scales and zero points: `MinMaxObserver`, `MovingAverageMinMaxObserver`,
`PerChannelMinMaxObserver`, `MovingAveragePerChannelMinMaxObserver`, `HistogramObserver` (L2 search
over the histogram for the clipping range), `PlaceholderObserver`.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from ... import _dtype as D
from ... import _ops
from ..._tensor import Tensor
from ...nn.modules.module import Module
from .utils import (calculate_qmin_qmax, check_min_max_valid, is_per_channel, is_per_tensor, validate_qmin_qmax)

F = _ops.EXPORTS
FLOAT32_EPS = float(np.finfo(np.float32).eps)
_ALLOWED_DTYPES = (D.qint8, D.quint8, D.qint32, D.int8, D.uint8, D.int16, D.int32, D.uint16)


class _PartialWrapper:
    """`Observer.with_args(...)`: a constructor with some keywords bound, callable like the class."""

    def __init__(self, p: functools.partial):
        self.p = p

    def __call__(self, *args, **kwargs):
        return self.p(*args, **kwargs)

    def with_args(self, **kwargs) -> "_PartialWrapper":
        return _PartialWrapper(functools.partial(self.p, **kwargs))

    def __repr__(self):
        return f"{self.p.func.__name__}.with_args({self.p.keywords})"


class ObserverBase(Module):
    """Base of every observer: knows its target dtype; `forward` observes and returns its input."""

    def __init__(self, dtype, is_dynamic: bool = False):
        super().__init__()
        self.dtype = dtype
        self.is_dynamic = is_dynamic

    @classmethod
    def with_args(cls, **kwargs) -> _PartialWrapper:
        return _PartialWrapper(functools.partial(cls, **kwargs))

    def calculate_qparams(self):
        raise NotImplementedError(f"{type(self).__name__}.calculate_qparams")


class UniformQuantizationObserverBase(ObserverBase):
    """Observers of an affine map: the qscheme, range and eps, and PyTorch's `_calculate_qparams`."""

    def __init__(self, dtype=D.quint8, qscheme=D.per_tensor_affine, reduce_range: bool = False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps: float = FLOAT32_EPS, is_dynamic: bool = False, **kwargs):
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        if qscheme not in (D.per_tensor_affine, D.per_tensor_symmetric, D.per_channel_affine,
                           D.per_channel_symmetric, D.per_channel_affine_float_qparams):
            raise AssertionError(f"Default Observer only works for per_tensor_affine, per_tensor_symmetric, "
                                 f"per_channel_affine, per_channel_symmetric and per_channel_float_qparams "
                                 f"quantization scheme, got {qscheme}")
        if dtype not in _ALLOWED_DTYPES:
            raise AssertionError(f"Default Observer only works for {_ALLOWED_DTYPES} data type, got {dtype}")
        self.qscheme = qscheme
        self.reduce_range = reduce_range
        self.register_buffer("eps", F["tensor"]([eps]))
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        if self.has_customized_qrange:
            validate_qmin_qmax(quant_min, quant_max)
        self.quant_min, self.quant_max = calculate_qmin_qmax(quant_min, quant_max, self.has_customized_qrange,
                                                             dtype, reduce_range)

    def _calculate_qparams(self, min_val: Tensor, max_val: Tensor):
        """(scale, zero_point) tensors of shape [channels] (per tensor: [1]) from min and max."""
        if not check_min_max_valid(min_val, max_val):
            return F["tensor"]([1.0]), F["tensor"]([0])
        qmin, qmax = self.quant_min, self.quant_max
        min_neg = F["minimum"](min_val, F["zeros_like"](min_val))
        max_pos = F["maximum"](max_val, F["zeros_like"](max_val))
        zero_point = F["zeros"](tuple(min_neg.shape), dtype=D.int64)
        if self.qscheme in (D.per_tensor_symmetric, D.per_channel_symmetric):
            max_pos = F["maximum"](-min_neg, max_pos)
            scale = F["maximum"](max_pos / (float(qmax - qmin) / 2), self.eps)
            if self.dtype in (D.quint8, D.uint8):
                mid = (qmin + qmax) // 2 if self.has_customized_qrange else 128
                zero_point = F["full"](tuple(zero_point.shape), mid, dtype=D.int64)
            elif self.dtype is D.uint16:
                zero_point = F["full"](tuple(zero_point.shape), 2 ** 15, dtype=D.int64)
        elif self.qscheme is D.per_channel_affine_float_qparams:
            scale = (max_val - min_val) / float(qmax - qmin)
            scale = F["where"](scale > self.eps, scale, F["ones_like"](scale))
            zero_point = -1 * min_val / scale
        else:
            scale = F["maximum"]((max_pos - min_neg) / float(qmax - qmin), self.eps)
            zero_point = qmin - F["round"](min_neg / scale).to(D.int32)
            zero_point = F["clamp"](zero_point, qmin, qmax)
        if scale.ndim == 0:
            scale = F["tensor"]([float(scale)], dtype=scale.dtype)
        if zero_point.ndim == 0:
            zero_point = F["tensor"]([int(zero_point)], dtype=zero_point.dtype)
        return scale, zero_point

    def extra_repr(self) -> str:
        return f"min_val={getattr(self, 'min_val', None)}, max_val={getattr(self, 'max_val', None)}"


class MinMaxObserver(UniformQuantizationObserverBase):
    """Running minimum and maximum of every tensor seen (per tensor)."""

    def __init__(self, dtype=D.quint8, qscheme=D.per_tensor_affine, reduce_range: bool = False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps: float = FLOAT32_EPS, is_dynamic: bool = False, **kwargs):
        if not is_per_tensor(qscheme):
            raise NotImplementedError("MinMaxObserver's qscheme only support torch.per_tensor_symmetric and "
                                      "torch.per_tensor_affine.")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic)
        self.register_buffer("min_val", F["tensor"](float("inf")))
        self.register_buffer("max_val", F["tensor"](float("-inf")))
        if qscheme is D.per_tensor_symmetric and reduce_range and dtype is D.quint8:
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8")

    def forward(self, x_orig: Tensor) -> Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().to(self.min_val.dtype)
        lo, hi = F["aminmax"](x)
        self.min_val = F["minimum"](lo, self.min_val)
        self.max_val = F["maximum"](hi, self.max_val)
        return x_orig

    def calculate_qparams(self):
        return self._calculate_qparams(self.min_val, self.max_val)

    def reset_min_max_vals(self) -> None:
        self.min_val = F["tensor"](float("inf"))
        self.max_val = F["tensor"](float("-inf"))


class MovingAverageMinMaxObserver(MinMaxObserver):
    """min/max as exponential moving averages: m += c * (current - m)."""

    def __init__(self, averaging_constant: float = 0.01, dtype=D.quint8, qscheme=D.per_tensor_affine,
                 reduce_range: bool = False, quant_min=None, quant_max=None, eps: float = FLOAT32_EPS,
                 is_dynamic: bool = False, **kwargs):
        if not is_per_tensor(qscheme):
            raise NotImplementedError(f"MovingAverageMinMaxObserver's qscheme only support "
                                      f"torch.per_tensor_symmetric and torch.per_tensor_affine. but got: {qscheme}")
        if is_dynamic and averaging_constant != 1:
            raise NotImplementedError("MovingAverageMinMaxObserver doesn't support dynamic quantization for "
                                      f"averaging constant of {averaging_constant}")
        self.averaging_constant = averaging_constant
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
                         quant_max=quant_max, eps=eps, is_dynamic=is_dynamic)

    def forward(self, x_orig: Tensor) -> Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().to(self.min_val.dtype)
        lo, hi = F["aminmax"](x)
        if float(self.min_val) == float("inf") and float(self.max_val) == float("-inf"):
            self.min_val, self.max_val = lo, hi
        else:
            c = self.averaging_constant
            self.min_val = self.min_val + c * (lo - self.min_val)
            self.max_val = self.max_val + c * (hi - self.max_val)
        return x_orig


def _channel_rows(x: Tensor, ch_axis: int) -> Tensor:
    """x with `ch_axis` first and the rest flattened: one row per channel."""
    perm = list(range(x.ndim))
    perm[ch_axis], perm[0] = 0, ch_axis
    return F["flatten"](x.permute(perm), 1)


class PerChannelMinMaxObserver(UniformQuantizationObserverBase):
    """Running minimum and maximum of each channel along `ch_axis`."""

    def __init__(self, ch_axis: int = 0, dtype=D.quint8, qscheme=D.per_channel_affine, reduce_range: bool = False,
                 quant_min=None, quant_max=None, factory_kwargs=None, eps: float = FLOAT32_EPS,
                 is_dynamic: bool = False, **kwargs):
        if not is_per_channel(qscheme):
            raise NotImplementedError("PerChannelMinMaxObserver's qscheme only support torch.per_channel_symmetric, "
                                      "torch.per_channel_affine and torch.per_channel_affine_float_qparams.")
        if is_dynamic:
            raise NotImplementedError("PerChannelMinMaxObserver doesn't support dynamic quantization")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic)
        self.ch_axis = ch_axis
        self.register_buffer("min_val", F["tensor"]([]))
        self.register_buffer("max_val", F["tensor"]([]))
        if qscheme is D.per_channel_symmetric and reduce_range and dtype is D.quint8:
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8")

    def _update(self, lo: Tensor, hi: Tensor) -> None:
        if self.min_val.numel() == 0 or self.max_val.numel() == 0:
            self.min_val, self.max_val = lo, hi
        else:
            self.min_val = F["minimum"](lo, self.min_val)
            self.max_val = F["maximum"](hi, self.max_val)

    def forward(self, x_orig: Tensor) -> Tensor:
        if x_orig.numel() == 0:
            return x_orig
        y = _channel_rows(x_orig.detach(), self.ch_axis).to(self.min_val.dtype)
        self._update(*F["aminmax"](y, dim=1))
        return x_orig

    def calculate_qparams(self):
        return self._calculate_qparams(self.min_val, self.max_val)

    def reset_min_max_vals(self) -> None:
        self.min_val = F["tensor"]([])
        self.max_val = F["tensor"]([])


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel min/max as exponential moving averages."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype=D.quint8,
                 qscheme=D.per_channel_affine, reduce_range: bool = False, quant_min=None, quant_max=None,
                 eps: float = FLOAT32_EPS, is_dynamic: bool = False, **kwargs):
        super().__init__(ch_axis=ch_axis, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, eps=eps, is_dynamic=is_dynamic)
        self.averaging_constant = averaging_constant

    def _update(self, lo: Tensor, hi: Tensor) -> None:
        if self.min_val.numel() == 0 or self.max_val.numel() == 0:
            self.min_val, self.max_val = lo, hi
        else:
            c = self.averaging_constant
            self.min_val = self.min_val + c * (lo - self.min_val)
            self.max_val = self.max_val + c * (hi - self.max_val)


class PlaceholderObserver(ObserverBase):
    """Observes nothing; carries the dtype (and, for dynamic quantization, `is_dynamic`)."""

    def __init__(self, dtype=D.float32, custom_op_name: str = "", compute_dtype=None, quant_min=None,
                 quant_max=None, qscheme=None, eps=None, is_dynamic: bool = False):
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        self.qscheme = qscheme if qscheme is not None else D.per_tensor_affine
        self.quant_min, self.quant_max, self.eps = quant_min, quant_max, eps
        self.custom_op = custom_op_name

    def forward(self, x: Tensor) -> Tensor:
        return x

    def calculate_qparams(self):
        raise Exception("calculate_qparams should not be called for PlaceholderObserver")


def _linspace32(start: float, end: float, steps: int) -> Tensor:
    """ATen's float32 CPU linspace: start + step * i (first half) and end - step * (steps - 1 - i)
    (second half), each with one rounding (a fused multiply-add), step = (end - start) / (steps - 1)
    in float32. The bins of an upscaled histogram depend on these last bits."""
    a, b = np.float32(start), np.float32(end)
    step = np.float64((b - a) / np.float32(steps - 1))
    i = np.arange(steps, dtype=np.float64)
    out = np.where(i < steps // 2, np.float64(a) + step * i, np.float64(b) - step * (steps - 1 - i))
    return F["tensor"](out.astype(np.float32))


class HistogramObserver(UniformQuantizationObserverBase):
    """A histogram of everything seen (`bins` bins over the running range, merged by upsampling
    when the range grows); qparams from the sub-range minimising the L2 quantization error."""

    upsample_rate = 16       # sub-bins per bin when a histogram is mapped onto a wider range

    def __init__(self, bins: int = 2048, dtype=D.quint8, qscheme=D.per_tensor_affine, reduce_range: bool = False,
                 quant_min=None, quant_max=None, factory_kwargs=None, eps: float = FLOAT32_EPS,
                 is_dynamic: bool = False, **kwargs):
        if not is_per_tensor(qscheme):
            raise NotImplementedError("HistogramObserver's qscheme only support torch.per_tensor_symmetric and "
                                      "torch.per_tensor_affine.")
        if is_dynamic:
            raise NotImplementedError("HistogramObserver doesn't support dynamic quantization")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic)
        self.bins = bins
        self.register_buffer("histogram", F["zeros"](bins))
        self.register_buffer("min_val", F["tensor"](float("inf")))
        self.register_buffer("max_val", F["tensor"](float("-inf")))
        self.dst_nbins = 2 ** (8 * dtype.itemsize)

    # ---- the L2 search (caffe2's NonlinearQuantizationParamsSearch, as PyTorch runs it) ----
    def _get_norm(self, delta_begin, delta_end, density):
        return density * ((delta_end * delta_end * delta_end - delta_begin * delta_begin * delta_begin) / 3)

    def _compute_quantization_error(self, next_start_bin: int, next_end_bin: int) -> float:
        bin_width = (self.max_val.item() - self.min_val.item()) / self.bins
        dst_bin_width = bin_width * (next_end_bin - next_start_bin + 1) / self.dst_nbins
        if dst_bin_width == 0.0:
            return 0.0
        src_bin = F["arange"](self.bins)
        src_bin_begin = (src_bin - next_start_bin) * bin_width
        src_bin_end = src_bin_begin + bin_width
        last = self.dst_nbins - 1
        dst_of_begin = F["clamp"](F["div"](src_bin_begin, dst_bin_width, rounding_mode="floor"), 0, last)
        dst_of_begin_center = (dst_of_begin + 0.5) * dst_bin_width
        dst_of_end = F["clamp"](F["div"](src_bin_end, dst_bin_width, rounding_mode="floor"), 0, last)
        density = self.histogram / bin_width
        norm = F["zeros"](self.bins)
        norm = norm + self._get_norm(src_bin_begin - dst_of_begin_center,
                                     F["ones"](self.bins) * (dst_bin_width / 2), density)
        half = F["tensor"](dst_bin_width / 2)
        norm = norm + (dst_of_end - dst_of_begin - 1) * self._get_norm(-half, half, density)
        dst_of_end_center = dst_of_end * dst_bin_width + dst_bin_width / 2
        norm = norm + self._get_norm(F["tensor"](-dst_bin_width / 2), src_bin_end - dst_of_end_center, density)
        return norm.sum().item()

    def _non_linear_param_search(self):
        bin_width = (self.max_val - self.min_val) / self.bins
        total = F["sum"](self.histogram).item()
        csum = F["cumsum"](self.histogram, 0).numpy()       # float32, compared with float32 bounds
        stepsize, alpha, beta = 1e-5, 0.0, 1.0
        start_bin, end_bin = 0, self.bins - 1
        norm_min = float("inf")
        while alpha < beta:
            next_alpha, next_beta = alpha + stepsize, beta - stepsize
            lo, hi = start_bin, end_bin
            while lo < end_bin and csum[lo] < np.float32(next_alpha * total):
                lo += 1
            while hi > start_bin and csum[hi] > np.float32(next_beta * total):
                hi -= 1
            next_start, next_end = start_bin, end_bin
            if (lo - start_bin) > (end_bin - hi):
                next_start, alpha = lo, next_alpha
            else:
                next_end, beta = hi, next_beta
            if next_start == start_bin and next_end == end_bin:
                continue
            norm = self._compute_quantization_error(next_start, next_end)
            if norm > norm_min:
                break
            norm_min, start_bin, end_bin = norm, next_start, next_end
        return self.min_val + bin_width * start_bin, self.min_val + bin_width * (end_bin + 1)

    # ---- histogram maintenance ----
    def _upscale_histogram(self, histogram, orig_min, orig_max, update_min, update_max):
        n = self.bins * self.upsample_rate
        histogram = F["repeat_interleave"](histogram, self.upsample_rate) / self.upsample_rate
        bin_size = (orig_max - orig_min) / n
        mid_points = _linspace32(orig_min.item(), orig_max.item(), n + 1)[:-1] + 0.5 * bin_size
        boundaries = _linspace32(update_min.item(), update_max.item(), self.bins + 1)
        buckets = F["clamp"](F["bucketize"](mid_points, boundaries, right=True) - 1, 0, self.bins - 1)
        return F["bincount"](buckets, weights=histogram, minlength=self.bins)

    def _combine_histograms(self, orig_hist, orig_min, orig_max, update_hist, update_min, update_max):
        if bool(update_min == orig_min) and bool(update_max == orig_max):
            return orig_hist + update_hist
        if bool(orig_min == orig_max):
            moved = F["histc"](orig_min, bins=self.bins, min=update_min.item(), max=update_max.item())
            return moved * F["sum"](orig_hist) + update_hist
        return update_hist + self._upscale_histogram(orig_hist, orig_min, orig_max, update_min, update_max)

    def forward(self, x_orig: Tensor) -> Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        x_min, x_max = F["aminmax"](x)
        if float(x_min) == float("-inf") or float(x_max) == float("inf"):
            warnings.warn("torch.inf detected in input tensor, ignoring input", stacklevel=2)
            x = x[x.abs() != float("inf")]
            if x.numel() == 0:
                return x_orig
            x_min, x_max = F["aminmax"](x)
        if float(self.min_val) == float("inf") or float(self.max_val) == float("-inf"):
            self.min_val, self.max_val = x_min.clone(), x_max.clone()
            self.histogram = F["histc"](x, self.bins, min=x_min.item(), max=x_max.item())
            return x_orig
        new_min = F["minimum"](self.min_val, x_min)
        new_max = F["maximum"](self.max_val, x_max)
        update = F["histc"](x, self.bins, min=new_min.item(), max=new_max.item())
        if bool(new_min == self.min_val) and bool(new_max == self.max_val):
            self.histogram = self.histogram + update
        else:
            self.histogram = self._combine_histograms(self.histogram, self.min_val, self.max_val, update,
                                                      new_min, new_max)
            self.min_val, self.max_val = new_min, new_max
        return x_orig

    def calculate_qparams(self):
        if float(self.min_val) == float("inf") and float(self.max_val) == float("-inf"):
            warnings.warn("must run observer before calling calculate_qparams. Returning default scale and zero "
                          "point ", stacklevel=2)
            return F["tensor"]([1.0]), F["tensor"]([0])
        return self._calculate_qparams(*self._non_linear_param_search())


default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
default_weight_observer = MinMaxObserver.with_args(dtype=D.qint8, qscheme=D.per_tensor_symmetric)
default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(dtype=D.qint8,
                                                                         qscheme=D.per_channel_symmetric)
default_dynamic_quant_observer = PlaceholderObserver.with_args(dtype=D.quint8, quant_min=0, quant_max=255,
                                                               is_dynamic=True)
default_histogram_observer = HistogramObserver.with_args(quant_min=0, quant_max=127)
