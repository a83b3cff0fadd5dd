"""int8 2-D convolution for the CPU (PyTorch's `onednn::qconv2d_pointwise`): an int8 im2col in
channels-last order feeding the VNNI GEMM of `cpu_int8` (int32 accumulation, the same fused
dequantize/requantize epilogue), one GEMM per group. On the VNNI kernel the im2col is implicit: the
GEMM gathers each block of patch rows from the channels-last input while it packs A (`flm_qconv`),
so no patch matrix is written (the NumPy fallback builds it).

    packed = pack_conv_weight(w (O, C/groups, kh, kw) int8, groups)      once per weight
    y = qconv2d_packed(qx (N, C, H, W), x_scale, x_zp, packed, groups, w_scales, w_zps, bias,
                       stride, padding, dilation, out_scale, out_zp, out_dtype, relu,
                       accum=None, accum_scale=1.0, accum_zp=0)

With `accum` (N, O, OH, OW; u8/s8 with its scale and zero point, or float) the sum post-op of
`qconv2d_pointwise.binary`: v = conv + (accum - accum_zp) * accum_scale in float32, then ReLU and
the output's requantization, as oneDNN's sum: in the GEMM's epilogue (f32/u8/s8 accum), or after it
in NumPy (bf16, `cpu_int8.finish_numpy`).

A patch row is (kh, kw, C/groups) of channels-last input, padded with the activation's zero point
(the integer of real 0, as oneDNN pads), so a 1x1 convolution of stride 1 without padding reads a
channels-last input in place. The packed weight is an opaque int8 array of shape (O, kh, kw, L) with
L = C/groups + ceil(PACK_EXTRA_ROWS / (kh kw)): group g's `cpu_int8.pack_weight` blob (K + 7 rows of
O/groups columns, K = kh kw C/groups) starts at byte g (O/groups) kh kw L; the shape carries O, kh, kw
and so C/groups. y is (N, O, OH, OW) in channels-last memory, as PyTorch's.
"""
from __future__ import annotations

import numpy as np

from . import cpu_int8


def conv_rows(C_per_group: int, kh: int, kw: int) -> int:
    """L, the last dimension of a packed convolution weight (module docstring)."""
    taps = kh * kw
    return C_per_group + (cpu_int8.PACK_EXTRA_ROWS + taps - 1) // taps


def _pack_groups(w, groups: int):
    O, Cg, kh, kw = w.shape
    og, k = O // groups, kh * kw * Cg
    out = np.zeros(O * kh * kw * conv_rows(Cg, kh, kw), np.int8)
    stride = og * kh * kw * conv_rows(Cg, kh, kw)
    for g in range(groups):
        wg = w[g * og:(g + 1) * og].transpose(0, 2, 3, 1).reshape(og, k)
        out[g * stride:g * stride + (k + cpu_int8.PACK_EXTRA_ROWS) * og] = cpu_int8.pack_weight(wg).reshape(-1)
    return out.reshape(O, kh, kw, conv_rows(Cg, kh, kw))


def pack_conv_weight(w, groups: int):
    """int8 weights (O, C/groups, kh, kw) -> the packed (O, kh, kw, L) array (module docstring), reused
    while the same memory holds the same bytes (`cpu_int8.cached`)."""
    return cpu_int8.cached(("conv", groups), w, lambda: _pack_groups(w, groups))


def packed_conv_dims(packed) -> tuple[int, int, int, int]:
    """(O, C/groups, kh, kw) of a packed convolution weight."""
    O, kh, kw, L = packed.shape
    taps = kh * kw
    return O, L - (cpu_int8.PACK_EXTRA_ROWS + taps - 1) // taps, kh, kw


def out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    """A spatial output extent of a convolution."""
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _patches(x_nhwc, x_zp: int, c0: int, cg: int, kh: int, kw: int, stride, padding, dilation, OH: int, OW: int):
    """(N OH OW, kh kw cg) patch rows of channels c0..c0+cg, padded with the zero point."""
    N, H, W, _ = x_nhwc.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0):
        return x_nhwc[..., c0:c0 + cg].reshape(N * OH * OW, cg)
    src = x_nhwc[..., c0:c0 + cg]
    if ph or pw:
        src = np.full((N, H + 2 * ph, W + 2 * pw, cg), x_zp, x_nhwc.dtype)
        src[:, ph:ph + H, pw:pw + W] = x_nhwc[..., c0:c0 + cg]
    n_s, h_s, w_s, c_s = src.strides
    windows = np.lib.stride_tricks.as_strided(
        src, (N, OH, OW, kh, kw, cg), (n_s, h_s * sh, w_s * sw, h_s * dh, w_s * dw, c_s), writeable=False)
    return windows.reshape(N * OH * OW, kh * kw * cg)


def qconv2d_packed(qx, x_scale: float, x_zp: int, packed, groups: int, w_scales, w_zps, bias, stride, padding,
                   dilation, out_scale: float, out_zp: int, out_dtype, relu: bool = False, accum=None,
                   accum_scale: float = 1.0, accum_zp: int = 0):
    """The quantized convolution (module docstring) of NumPy arrays with a `pack_conv_weight` weight."""
    if accum is not None and np.dtype(accum.dtype) not in cpu_int8.ACCUM_KINDS:     # bf16: added after
        conv = qconv2d_packed(qx, x_scale, x_zp, packed, groups, w_scales, w_zps, bias, stride, padding, dilation,
                              1.0, 0, np.float32).transpose(0, 2, 3, 1)         # channels-last memory, in place
        other = accum.transpose(0, 2, 3, 1).astype(np.float32)
        v = conv + (other - np.float32(accum_zp)) * np.float32(accum_scale)
        return cpu_int8.finish_numpy(v, relu, out_scale, out_zp, np.dtype(out_dtype)).transpose(0, 3, 1, 2)
    O, cg, kh, kw = packed_conv_dims(packed)
    N, C, H, W = qx.shape
    OH, OW = (out_size(H, kh, stride[0], padding[0], dilation[0]), out_size(W, kw, stride[1], padding[1], dilation[1]))
    og, k = O // groups, kh * kw * cg
    x_nhwc = np.ascontiguousarray(qx.transpose(0, 2, 3, 1))
    out = np.empty((N * OH * OW, O), np.dtype(out_dtype))
    blob = packed.reshape(-1)
    per_group = og * kh * kw * packed.shape[3]
    scales = np.broadcast_to(np.asarray(w_scales, np.float32).reshape(-1), (O,))
    zps = np.broadcast_to(np.asarray(w_zps).reshape(-1), (O,))
    acc_rows = None if accum is None else np.ascontiguousarray(accum.transpose(0, 2, 3, 1)).reshape(-1, O)
    in_place = (kh, kw, *stride, *padding) == (1, 1, 1, 1, 0, 0)
    for g in range(groups):
        wg = blob[g * per_group:g * per_group + (k + cpu_int8.PACK_EXTRA_ROWS) * og].reshape(-1, og)
        cols = slice(g * og, (g + 1) * og)
        b, acc = None if bias is None else bias[cols], None if acc_rows is None else acc_rows[:, cols]
        if not in_place and out.size and cpu_int8.qconv_implicit(
                x_nhwc, (g * cg, cg, kh, kw, *stride, *padding, *dilation, OH, OW), x_scale, x_zp, wg, scales[cols],
                zps[cols], b, out_scale, out_zp, relu, out[:, cols], acc, accum_scale, accum_zp):
            continue
        rows = _patches(x_nhwc, x_zp, g * cg, cg, kh, kw, stride, padding, dilation, OH, OW)
        cpu_int8.qlinear_packed(rows, x_scale, x_zp, wg, scales[cols], zps[cols], b, out_scale, out_zp, out.dtype,
                                relu, out=out[:, cols], accum=acc, accum_scale=accum_scale, accum_zp=accum_zp)
    return out.reshape(N, OH, OW, O).transpose(0, 3, 1, 2)
