"""int8 matrix products for the CPU: the quantized linear layer (`qlinear`), in C++ (`cpu_int8.cpp`,
AVX-512 VNNI `vpdpbusd`, int32 accumulation, a fused dequantize/requantize epilogue), loaded with ctypes.

    packed = pack_weight(w)          int8 weights (N, K) -> the kernel's layout, once per weight
    qlinear_packed(qx, x_scale, x_zp, packed, w_scales, w_zps, bias, out_scale, out_zp, out_dtype, relu)
    qlinear(qx, ..., qw (K, N), ...)  the same, packing qw (any strides) for this one call

take NumPy arrays: u8 or s8 activations (..., K), float32 per-channel scales and integer zero
points (N,), an optional float32 bias; they return (..., N) in float32 (the dequantized product)
or, requantized with `out_scale`/`out_zp`, in uint8/int8. The integers are exact and the epilogue
rounds as oneDNN's (see the C++ file), so results equal PyTorch's `onednn::qlinear_pointwise`.

The packed weight is an opaque int8 array of shape (K + PACK_EXTRA_ROWS, N) (so K and N read off
its shape): the VNNI panels of NR columns, 4 k a group (the C++ file's header), then the int32
column sums for the activation zero point's correction; `onednn::qlinear_prepack` returns it, so a
compiled graph (frozen: at compile time) or a dynamically quantized Linear packs each weight once.

The library is built once through `flambeau._cpp_builder`, like the float GEMM. Without a compiler,
without VNNI, or with `FLAMBEAU_GEMM=0`, `vnni()` is False and the same arithmetic runs in NumPy.
"""
from __future__ import annotations

import collections
import ctypes
import os
import threading

import numpy as np

from .. import _cpp_builder
from . import cpu_kernels

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_int8.cpp")
OUT_KINDS = {np.dtype(np.float32): 0, np.dtype(np.uint8): 1, np.dtype(np.int8): 2}
ACCUM_KINDS = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3}   # the C++ ACCUM_*
QMIN_QMAX = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}
_state: dict = {}
NR = 32                 # columns per panel (the C++ kernel's NR)
K_GROUP = 4             # k per vpdpbusd group
PACK_EXTRA_ROWS = 7     # rows of the packed weight beyond K: k padding (<= 3) and the int32 column sums (4)
PACK_CACHE_ENTRIES = 256  # packed weights kept by `pack_weight_cached` (least recently used dropped)
_pack_cache: collections.OrderedDict = collections.OrderedDict()
_pack_lock = threading.Lock()


def _load():
    """The ctypes function, or None where the kernel can't run (decided once)."""
    if "fns" in _state:
        return _state["fns"]
    fns = None
    if os.environ.get("FLAMBEAU_GEMM", "1") not in ("", "0"):
        try:
            info = dict(_cpp_builder.detect_flags())
            with open(_SRC) as f:
                lib, _ = _cpp_builder.load(f.read(), info)
            if lib.flm_int8_vnni():
                i64, p, i, fl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
                q, c = lib.flm_qlinear, lib.flm_qconv
                q.argtypes = [i64, i64, i64, p, i64, i, ctypes.c_int32, p, p, fl, p, p, i, i, fl,
                              ctypes.c_int32, p, i64, i, p, i, fl, ctypes.c_int32, i64]
                c.argtypes = [i64, i64, i64, p, p] + q.argtypes[5:]
                q.restype = c.restype = None
                fns = q
                _state["conv"] = c
        except (_cpp_builder.CppCompileError, _cpp_builder.NoCompilerError, OSError):
            fns = None
    _state["fns"] = fns
    return fns


def vnni() -> bool:
    """Whether int8 products run on the AVX-512 VNNI kernel here (else NumPy computes the same numbers)."""
    return _load() is not None


def _epilogue_numpy(acc, x_scale, w_scales, bias, relu, out_scale, out_zp, out_dtype, accum=None,
                    accum_scale: float = 1.0, accum_zp: int = 0):
    v = (acc.astype(np.float32) * np.float32(x_scale)) * w_scales
    if bias is not None:
        v = v + bias
    if accum is not None:
        v = v + (accum.astype(np.float32) - np.float32(accum_zp)) * np.float32(accum_scale)
    return finish_numpy(v, relu, out_scale, out_zp, out_dtype)


def finish_numpy(v, relu: bool, out_scale: float, out_zp: int, out_dtype):
    """The end of the epilogue on float32 values v: ReLU, then v itself (float32) or requantized as
    clamp(nearbyint(v * (1 / out_scale)) + out_zp) into u8/s8, as the C++ kernel."""
    if relu:
        v = np.maximum(v, np.float32(0))
    if out_dtype == np.float32:
        return v
    lo, hi = QMIN_QMAX[np.dtype(out_dtype)]
    q = np.rint(v * (np.float32(1) / np.float32(out_scale))) + np.float32(out_zp)
    return np.clip(q, lo, hi).astype(out_dtype)


def _kp(K: int) -> int:
    return (K + K_GROUP - 1) // K_GROUP * K_GROUP


def pack_weight(w):
    """int8 weights (N, K), any strides -> the packed (K + PACK_EXTRA_ROWS, N) int8 array (module docstring)."""
    N, K = w.shape
    kp = _kp(K)
    padded = np.zeros((N, kp), np.int8)
    padded[:, :K] = w
    blob = np.zeros((K + PACK_EXTRA_ROWS) * N, np.int8)
    for n0 in range(0, N, NR):
        width = min(NR, N - n0)
        panel = padded[n0:n0 + width].reshape(width, kp // K_GROUP, K_GROUP).transpose(1, 0, 2)
        blob[n0 * kp:(n0 + width) * kp] = panel.reshape(-1)
    blob[kp * N:(kp + 4) * N] = padded.sum(axis=1, dtype=np.int32).view(np.int8)
    return blob.reshape(K + PACK_EXTRA_ROWS, N)


def cached(tag, w, make):
    """`make()`, the packing of weight `w`, reusing the one made for an earlier call with the same `tag`
    on the same memory (address, shape, strides) whose bytes are unchanged; the cached array is shared
    and read-only."""
    key = (tag, w.__array_interface__["data"][0], w.shape, w.strides)
    raw = w.tobytes()
    with _pack_lock:
        hit = _pack_cache.get(key)
        if hit is not None and hit[0] == raw:
            _pack_cache.move_to_end(key)
            return hit[1]
    packed = make()
    packed.flags.writeable = False
    with _pack_lock:
        _pack_cache[key] = (raw, packed)
        _pack_cache.move_to_end(key)
        while len(_pack_cache) > PACK_CACHE_ENTRIES:
            _pack_cache.popitem(last=False)
    return packed


def pack_weight_cached(w):
    """`pack_weight(w)` through the cache (`cached`)."""
    return cached("linear", w, lambda: pack_weight(w))


def packed_dims(packed) -> tuple[int, int]:
    """(K, N) of a packed weight."""
    return packed.shape[0] - PACK_EXTRA_ROWS, packed.shape[1]


def unpack_weight(packed):
    """The (K, N) int8 weight of a packed one (the NumPy fallback's operand)."""
    K, N = packed_dims(packed)
    kp = _kp(K)
    blob = np.ascontiguousarray(packed).reshape(-1)
    out = np.empty((N, kp), np.int8)
    for n0 in range(0, N, NR):
        width = min(NR, N - n0)
        panel = blob[n0 * kp:(n0 + width) * kp].reshape(kp // K_GROUP, width, K_GROUP).transpose(1, 0, 2)
        out[n0:n0 + width] = panel.reshape(width, kp)
    return out[:, :K].T


def qlinear(qx, x_scale: float, x_zp: int, qw, w_scales, w_zps, bias, out_scale: float, out_zp: int,
            out_dtype, relu: bool = False):
    """The quantized linear layer (module docstring) of NumPy arrays, qw (K, N) packed for this call."""
    return qlinear_packed(qx, x_scale, x_zp, pack_weight(qw.T), w_scales, w_zps, bias, out_scale, out_zp, out_dtype,
                          relu)


def qconv_implicit(x_nhwc, geometry, x_scale: float, x_zp: int, packed, w_scales, w_zps, bias, out_scale: float,
                   out_zp: int, relu: bool, out, accum=None, accum_scale: float = 1.0, accum_zp: int = 0) -> bool:
    """One group of a 2-D convolution on the VNNI kernel, its patch rows gathered while A is packed (no
    im2col in memory): x_nhwc a contiguous (N, H, W, C) u8/s8 array; geometry (c0, cg, kh, kw, sh, sw,
    ph, pw, dh, dw, OH, OW); packed the group's `pack_weight` blob (K = kh kw cg rows); `out` the
    (N OH OW, columns) block receiving the result, `accum` as `qlinear_packed`'s. False (nothing done)
    where the kernel can't run: the caller computes the patch rows and calls `qlinear_packed`."""
    if _load() is None:
        return False
    N, H, W, C = x_nhwc.shape
    c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW = geometry
    geom = np.array([H, W, C, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW], np.int64)
    x = np.ascontiguousarray(x_nhwc)
    _run(_state["conv"], N * OH * OW, x, geom.ctypes.data, int(x.dtype == np.int8), x_scale, x_zp, packed, w_scales,
         w_zps, bias, out_scale, out_zp, out.dtype, relu, out, accum, accum_scale, accum_zp)
    return True


def qlinear_packed(qx, x_scale: float, x_zp: int, packed, w_scales, w_zps, bias, out_scale: float, out_zp: int,
                   out_dtype, relu: bool = False, out=None, accum=None, accum_scale: float = 1.0, accum_zp: int = 0):
    """The quantized linear layer (module docstring) of NumPy arrays with a `pack_weight` weight; `out`, a
    2-D (rows, N) array of out_dtype with unit column stride, receives the result (a column block of a
    wider output: the groups of a convolution). `accum`, a (rows, N) float32/u8/s8 array with unit
    column stride, is the sum post-op's operand: (accum - accum_zp) * accum_scale added before the ReLU."""
    out_dtype = np.dtype(out_dtype)
    K, N = packed_dims(packed)
    lead = qx.shape[:-1]
    a = np.ascontiguousarray(qx.reshape(-1, K))
    M = a.shape[0]
    scales = np.ascontiguousarray(w_scales, dtype=np.float32)
    zps = np.ascontiguousarray(w_zps, dtype=np.int32)
    b32 = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    fns = _load()
    if fns is None or M == 0 or N == 0:
        qw = unpack_weight(packed)
        acc = (a.astype(np.int64) - x_zp) @ (qw.astype(np.int64) - zps.astype(np.int64))
        r = _epilogue_numpy(acc, x_scale, scales, b32, relu, out_scale, out_zp, out_dtype, accum, accum_scale,
                            accum_zp)
        if out is None:
            return r.reshape(lead + (N,))
        out[...] = r
        return out
    out = _run(fns, M, a, K, int(a.dtype == np.int8), x_scale, x_zp, packed, scales, zps, b32, out_scale, out_zp,
               out_dtype, relu, out, accum, accum_scale, accum_zp)
    return out.reshape(lead + (N,))


def _run(fn, M: int, a, lda_or_geometry, a_signed: int, x_scale, x_zp, packed, w_scales, w_zps, bias, out_scale,
         out_zp, out_dtype, relu, out, accum, accum_scale, accum_zp):
    """Call the C++ product `fn` (flm_qlinear: A rows of stride lda; flm_qconv: A a convolution's input,
    the geometry array's address) into `out` (made when None); returns out (M, N)."""
    out_dtype = np.dtype(out_dtype)
    K, N = packed_dims(packed)
    scales = np.ascontiguousarray(w_scales, dtype=np.float32)
    zps = np.ascontiguousarray(w_zps, dtype=np.int32)
    b32 = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    packed = np.ascontiguousarray(packed)
    if accum is not None and (accum.dtype not in ACCUM_KINDS or accum.shape != (M, N) or
                              accum.strides[1] != accum.itemsize):
        raise ValueError(f"qlinear_packed: accum must be a ({M}, {N}) float32/uint8/int8 array with unit column "
                         f"stride, got {accum.dtype} {accum.shape} strides {accum.strides}")
    if out is None:
        out = np.empty((M, N), out_dtype)
    elif out.dtype != out_dtype or out.shape != (M, N) or out.strides[1] != out.itemsize:
        raise ValueError(f"qlinear_packed: out must be a ({M}, {N}) {out_dtype} array with unit column stride, got "
                         f"{out.dtype} {out.shape} strides {out.strides}")
    threads = cpu_kernels._threads(M * N * K) if cpu_kernels.available() else 1
    fn(M, N, K, a.ctypes.data, lda_or_geometry, a_signed, int(x_zp), packed.ctypes.data,
       zps.ctypes.data if zps.any() else None, float(np.float32(x_scale)), scales.ctypes.data,
       None if b32 is None else b32.ctypes.data, int(relu), OUT_KINDS[out_dtype],
       float(np.float32(1) / np.float32(out_scale)), int(out_zp), out.ctypes.data, out.strides[0] // out.itemsize,
       threads, None if accum is None else accum.ctypes.data, 0 if accum is None else ACCUM_KINDS[accum.dtype],
       float(np.float32(accum_scale)), int(accum_zp), 0 if accum is None else accum.strides[0] // accum.itemsize)
    return out
