"""int8 average pooling: the kernel behind a converted PT2E graph's dequantize -> avg_pool2d /
adaptive_avg_pool2d -> quantize with one set of qparams (X86InductorQuantizer shares the pool's input
observer with its output, as PyTorch's recipe), run on the uint8/int8 integers themselves.

    y = _avg_pool2d_int8(qx (N, C, H, W), h_start, h_len, h_div, w_start, w_len, w_div, zero_point, adaptive)

Output (n, c, oh, ow) averages rows [h_start[oh], + h_len[oh]) by columns [w_start[ow], + w_len[ow]) of
plane (n, c), divided by d = h_div[oh] * w_div[ow]: acc = sum(qx) - h_len * w_len * zero_point (int32,
exact), m = 1.0f / d, then y = nearbyint(float(acc) * m) + zero_point (PyTorch's quantized channels-last
`avg_pool2d`: its vector lanes) or, `adaptive`, y = nearbyint(fma(acc, 1.0f / (1.0f / m), zero_point))
(its `adaptive_avg_pool2d`, which quantizes with scale 1 / m as quantize_per_tensor does), clamped to
the dtype's range: int_repr equal to PyTorch's bit for bit (equal input and output scales, as here).
The two roundings differ only on exact halves (an even divisor) with an odd zero point. The float q/dq
graph these replace rounds a float mean: within one integer of these, where the mean lies within float
rounding of a half. Windows cover PyTorch's padding rules: `avg_pool2d_windows` and
`adaptive_avg_pool2d_windows` build them from the pooling arguments, `taps_windows` from the tables of
the float `_taps_gather` the pools are captured as (None when those tables do not average a window).
The output keeps a channels-last input's layout; C++ in `cpu_kernels.cpp`, NumPy where it declines.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._backends import cpu_kernels
from ._registry import defop, TensorSpec, Tag
from . import _batching
from .memory_format import meta_strides, suggest_memory_format
from .._tensor import channels_last, contiguous_format

_RANGE = {D.uint8: (0, 255), D.int8: (-128, 127)}


def _two(v) -> list:
    return [int(v[0]), int(v[-1])] if isinstance(v, (list, tuple)) else [int(v)] * 2


def avg_pool2d_windows(H: int, W: int, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                       divisor_override=None):
    """((h_start, h_len, h_div), (w_start, w_len, w_div)) of PyTorch's avg_pool2d over an H x W plane."""
    ks = _two(kernel_size)
    st = ks if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _two(stride)
    pd = _two(padding)
    out = []
    for i, S in enumerate((H, W)):
        k, s, p = ks[i], st[i], pd[i]
        n = (S + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
        if ceil_mode and (n - 1) * s >= S + p:
            n -= 1
        starts, lens, divs = [], [], []
        for o in range(n):
            start = o * s - p
            end = min(start + k, S + p)
            s0, e0 = max(start, 0), min(end, S)
            starts.append(s0)
            lens.append(e0 - s0)
            divs.append((int(divisor_override) if i == 0 else 1) if divisor_override else
                        (end - start if count_include_pad else e0 - s0))
        out.append((starts, lens, divs))
    return tuple(out)


def adaptive_avg_pool2d_windows(H: int, W: int, output_size):
    """The windows of PyTorch's adaptive_avg_pool2d to `output_size` (start floor(o*S/O), end ceil)."""
    osz = list(output_size) if isinstance(output_size, (list, tuple)) else [output_size] * 2
    out = []
    for S, O in zip((H, W), osz):
        O = S if O is None else int(O)
        start = [(o * S) // O for o in range(O)]
        end = [-((-(o + 1) * S) // O) for o in range(O)]
        ln = [e - s for s, e in zip(start, end)]
        out.append((start, ln, ln))
    return tuple(out)


def taps_windows(idx, w):
    """(start, length, divisor) lists of one dim of a `_taps_gather`'s tables (idx, w: (O, T) arrays)
    when each output averages a run of consecutive positions with one weight 1/divisor (avg pooling,
    adaptive average pooling), else None (an interpolation)."""
    idx, w = np.asarray(idx), np.asarray(w)
    if idx.ndim != 2 or idx.shape != w.shape:
        return None
    start, length, div = [], [], []
    for pos, wt in zip(idx, w):
        nz = np.flatnonzero(wt)
        if not len(nz) or nz[-1] - nz[0] + 1 != len(nz) or np.any(wt[nz] != wt[nz[0]]):
            return None
        p = pos[nz]
        if np.any(np.diff(p) != 1):
            return None
        d = int(round(1.0 / float(wt[nz[0]])))
        if d < 1 or wt.dtype.type(1.0 / d) != wt[nz[0]]:
            return None
        start.append(int(p[0]))
        length.append(len(nz))
        div.append(d)
    return start, length, div


def _check(self_shape, self_dtype, tables, zero_point):
    name = "_avg_pool2d_int8"
    if self_dtype not in _RANGE or len(self_shape) != 4:
        raise RuntimeError(f"{name}: expected a 4-D uint8 or int8 input, got {self_dtype} of shape {tuple(self_shape)}")
    lo, hi = _RANGE[self_dtype]
    if not lo <= zero_point <= hi:
        raise RuntimeError(f"{name}: zero point {zero_point} outside the {self_dtype} range [{lo}, {hi}]")
    out = []
    for axis, (start, length, div) in zip((2, 3), (tables[:3], tables[3:])):
        S = self_shape[axis]
        if not len(start) == len(length) == len(div):
            raise RuntimeError(f"{name}: window tables of lengths {len(start)}, {len(length)}, {len(div)} differ")
        for s, n, d in zip(start, length, div):
            if s < 0 or n < 1 or s + n > S or d < 1:
                raise RuntimeError(f"{name}: window [{s}, {s + n}) with divisor {d} does not fit a dim of size {S}")
        out.append(len(start))
    return tuple(self_shape[:2]) + tuple(out)


def _format(x):
    return channels_last if suggest_memory_format(x, (4,)) is channels_last else contiguous_format


@defop("_avg_pool2d_int8(Tensor self, int[] h_start, int[] h_len, int[] h_div, int[] w_start, int[] w_len, "
       "int[] w_div, int zero_point, bool adaptive=False) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
def _avg_pool2d_int8(xp, self, h_start, h_len, h_div, w_start, w_len, w_div, zero_point, adaptive=False):
    dt = D.FROM_NP[self.dtype]
    shape = _check(self.shape, dt, (h_start, h_len, h_div, w_start, w_len, w_div), zero_point)
    windows = tuple(tuple(np.asarray(t, np.int64) for t in ts) for ts in ((h_start, h_len, h_div),
                                                                         (w_start, w_len, w_div)))
    if _format(self) is channels_last:
        y = xp.empty((shape[0], shape[2], shape[3], shape[1]), self.dtype).transpose(0, 3, 1, 2)
    else:
        y = xp.empty(shape, self.dtype)
    if xp is np and cpu_kernels.avg_pool2d_int8(self, y, windows, zero_point, adaptive):
        return y
    y[...] = _avg_pool_numpy(xp, self, windows, zero_point, dt, adaptive)
    return y


def _avg_pool_numpy(xp, x, windows, zp, dt, adaptive):
    """The same integers with array operations: window sums from cumulative sums along H, then W."""
    (hs, hl, hd), (ws, wl, wd) = [[xp.asarray(t) for t in ts] for ts in windows]
    c = xp.cumsum(x.astype(xp.int64), axis=2)
    c = xp.concatenate([xp.zeros_like(c[:, :, :1]), c], axis=2)
    s = c[:, :, hs + hl] - c[:, :, hs]
    c = xp.cumsum(s, axis=3)
    c = xp.concatenate([xp.zeros_like(c[..., :1]), c], axis=3)
    s = c[..., ws + wl] - c[..., ws]
    acc = s - (hl[:, None] * wl[None, :]) * zp
    m = xp.float32(1) / (hd[:, None] * wd[None, :]).astype(xp.float32)
    if adaptive:        # fma(acc, 1 / (1 / m), zp): exact in float64, then one rounding to float32
        inv = (xp.float32(1) / (xp.float32(1) / m)).astype(xp.float64)
        r = xp.rint((acc.astype(xp.float64) * inv + zp).astype(xp.float32))
    else:
        r = xp.rint(acc.astype(xp.float32) * m) + zp
    lo, hi = _RANGE[dt]
    return xp.clip(r, lo, hi).astype(x.dtype)


@_avg_pool2d_int8.def_meta
def _avg_pool2d_int8_meta(self, h_start, h_len, h_div, w_start, w_len, w_div, zero_point, adaptive=False):
    shape = _check(self.shape, self.dtype, (h_start, h_len, h_div, w_start, w_len, w_div), zero_point)
    return TensorSpec(shape, self.dtype, meta_strides(shape, _format(self)))



def _constant(gm, node):
    """The value (a NumPy array) of a get_attr node of `gm`, else None."""
    if getattr(node, "op", None) != "get_attr":
        return None
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part, None)
    return obj.numpy() if hasattr(obj, "numpy") else None


def taps_windows_of(gm, node):
    """The windows (as `avg_pool2d_windows`) of a `_taps_gather` node of `gm` over the last two dims, its
    tables get_attr constants that average windows; else None."""
    if len(node.args) < 3 or len(node.args[1]) != 2 or len(node.args[2]) != 2:
        return None
    tables = [_constant(gm, t) for t in (*node.args[1], *node.args[2])]
    if any(t is None for t in tables):
        return None
    out = tuple(taps_windows(i, w) for i, w in zip(tables[:2], tables[2:]))
    return None if None in out else out


@_avg_pool2d_int8.def_batching_rule
def _avg_pool2d_int8_batching(in_dims, self, *params):
    """vmap: the batch joins N (the windows and the zero point are per plane, so unchanged)."""
    if in_dims[0] is None:
        return NotImplemented
    x = _batching.front(self, in_dims[0])
    out = _avg_pool2d_int8(x.reshape((-1,) + tuple(x.shape[2:])), *params)
    return out.reshape(tuple(x.shape[:2]) + tuple(out.shape[1:])), 0
