"""int8 matrix products for the CPU: the quantized linear layer (`qlinear`), in C++ (`cpu_int8.cpp`,
AVX-512 VNNI `vpdpbusd`, int32 accumulation, a fused dequantize/requantize epilogue), loaded with ctypes.

`qlinear(qx, x_scale, x_zp, qw, w_scales, w_zps, bias, out_scale, out_zp, out_dtype, relu)` takes
NumPy arrays: u8 or s8 activations (..., K), int8 weights (K, N) of any strides (PyTorch's
prepacked `onednn::qlinear_prepack` layout: the transposed weight), float32 per-channel scales
and integer zero points (N,), an optional float32 bias; it returns (..., N) in float32 (the
dequantized product) or, requantized with `out_scale`/`out_zp`, in uint8/int8. The integers are
exact and the epilogue rounds as oneDNN's (see the C++ file), so results equal PyTorch's
`onednn::qlinear_pointwise`.

The library is built once through `flambeau._cpp_builder`, like the float GEMM. Without a compiler,
without VNNI, or with `FLAMBEAU_GEMM=0`, `vnni()` is False and the same arithmetic runs in NumPy.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from .. import _cpp_builder
from . import cpu_kernels

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_int8.cpp")
OUT_KINDS = {np.dtype(np.float32): 0, np.dtype(np.uint8): 1, np.dtype(np.int8): 2}
QMIN_QMAX = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}
_state: dict = {}


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
                q = lib.flm_qlinear
                q.argtypes = [i64, i64, i64, p, i64, i, ctypes.c_int32, p, i64, i64, p, fl, p, p, i, i, fl,
                              ctypes.c_int32, p, i64, i]
                q.restype = None
                fns = q
        except (_cpp_builder.CppCompileError, _cpp_builder.NoCompilerError, OSError):
            fns = None
    _state["fns"] = fns
    return fns


def vnni() -> bool:
    """Whether int8 products run on the AVX-512 VNNI kernel here (else NumPy computes the same numbers)."""
    return _load() is not None


def _epilogue_numpy(acc, x_scale, w_scales, bias, relu, out_scale, out_zp, out_dtype):
    v = (acc.astype(np.float32) * np.float32(x_scale)) * w_scales
    if bias is not None:
        v = v + bias
    if relu:
        v = np.maximum(v, np.float32(0))
    if out_dtype == np.float32:
        return v
    lo, hi = QMIN_QMAX[out_dtype]
    q = np.rint(v * (np.float32(1) / np.float32(out_scale))) + np.float32(out_zp)
    return np.clip(q, lo, hi).astype(out_dtype)


def qlinear(qx, x_scale: float, x_zp: int, qw, w_scales, w_zps, bias, out_scale: float, out_zp: int,
            out_dtype, relu: bool = False):
    """The quantized linear layer (module docstring) of NumPy arrays."""
    out_dtype = np.dtype(out_dtype)
    K, N = qw.shape
    lead = qx.shape[:-1]
    a = np.ascontiguousarray(qx.reshape(-1, K))
    M = a.shape[0]
    scales = np.ascontiguousarray(w_scales, dtype=np.float32)
    zps = np.ascontiguousarray(w_zps, dtype=np.int32)
    b32 = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    fns = _load()
    if fns is None or M == 0 or N == 0:
        acc = (a.astype(np.int64) - x_zp) @ (qw.astype(np.int64) - zps.astype(np.int64))
        return _epilogue_numpy(acc, x_scale, scales, b32, relu, out_scale, out_zp, out_dtype).reshape(lead + (N,))
    out = np.empty((M, N), out_dtype)
    threads = cpu_kernels._threads(M * N * K) if cpu_kernels.available() else 1
    fns(M, N, K, a.ctypes.data, K, int(a.dtype == np.int8), int(x_zp), qw.ctypes.data, qw.strides[0], qw.strides[1],
       zps.ctypes.data if zps.any() else None, float(np.float32(x_scale)), scales.ctypes.data,
       None if b32 is None else b32.ctypes.data, int(relu), OUT_KINDS[out_dtype],
       float(np.float32(1) / np.float32(out_scale)), int(out_zp), out.ctypes.data, N, threads)
    return out.reshape(lead + (N,))
