"""Fused scaled-dot-product attention for the CPU: the flash-attention kernels of `cpu_attention.cpp`
(forward with an online softmax, backward recomputing each block from the saved log-sum-exp),
loaded with ctypes.

`forward(q, k, v, mask, is_causal, scale, enable_gqa) -> (out, lse)` and `backward(...)
-> (dq, dk, dv)` take NumPy arrays of float32, bfloat16 or float16 of any strides and PyTorch's
shapes: (..., L, E) with broadcast batch dims, grouped-query attention on dim -3, a bool or
additive mask broadcastable to (..., L, S). They bring the operands to 4-d (batch, heads, L, E)
views (a copy only when more than one batch dim must be broadcast), pass element strides (0 where
broadcast) and reduce the gradients of broadcast operands back to their shapes. The float workspace
(`flm_attention_workspace` floats, O(L + S) per head) is a NumPy array, so tracemalloc sees the
kernels' whole memory (bench/sdpa_memory.py). The library is built
once through `flambeau._cpp_builder`; `available()` is False without a C++ compiler, and callers
then keep their NumPy paths.
"""
from __future__ import annotations

import ctypes
import math
import os

import numpy as np

from .. import _cpp_builder, _dtype as D
from . import cpp_headers, cpu_kernels
from .cpu_kernels import ptr

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_attention.cpp")
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(D.bfloat16.np): 1, np.dtype(np.float16): 2}
_F32 = np.dtype(np.float32)
_state: dict = {}


def _load():
    """(forward, backward, workspace size) ctypes functions, or None where the kernels can't be built (decided once)."""
    if "fns" in _state:
        return _state["fns"]
    fns = None
    try:
        info = dict(_cpp_builder.detect_flags())
        info["flags"] = list(info["flags"]) + ["-ffp-contract=fast"] + \
            (["-DFLM_SIMD_MATH"] if info.get("simd_math") else [])
        with open(_SRC) as f:
            lib, _ = _cpp_builder.load(cpp_headers.with_headers(f.read()), info)
        p, i, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        fwd, bwd, ws = lib.flm_attention_forward, lib.flm_attention_backward, lib.flm_attention_workspace
        fwd.argtypes = [p, p, i, p, p, p, p, i, fl, p, p, p, i]
        bwd.argtypes = [p, p, i, p, p, p, p, i, fl, p, p, p, p, p, p, p, i]
        fwd.restype = bwd.restype = None
        ws.argtypes, ws.restype = [p, i, i], ctypes.c_int64
        fns = (fwd, bwd, ws)
    except (_cpp_builder.CppCompileError, _cpp_builder.NoCompilerError, OSError):
        fns = None
    _state["fns"] = fns
    return fns


def available() -> bool:
    return _load() is not None


def extern_pointers() -> dict:
    """{symbol: address} of flm_attention_forward and flm_attention_workspace, for generated C++ that
    calls them (the C++ wrapper, `flambeau._inductor.cpp_wrapper`); empty when unavailable."""
    fns = _load()
    if fns is None:
        return {}
    return {"flm_attention_forward": ctypes.cast(fns[0], ctypes.c_void_p).value,
            "flm_attention_workspace": ctypes.cast(fns[2], ctypes.c_void_p).value}


def supports(dtype) -> bool:
    """Whether the kernels take operands of this (flambeau) dtype."""
    return np.dtype(dtype.np) in DTYPE_CODES


class _Layout:
    """The 4-d (B, H, L, E) problem of one call: the operands as 4-d views and the sizes."""

    def __init__(self, q, k, v, mask, enable_gqa):
        self.shapes = (q.shape, k.shape, v.shape)
        nd = max(q.ndim, k.ndim, v.ndim)
        self.lead = np.broadcast_shapes(*(x.shape[:-3] for x in (q, k, v))) if nd > 3 else ()
        q, k, v = (self._four(x) for x in (q, k, v))
        hq, hk = q.shape[1], k.shape[1]
        self.rep = hq // hk if enable_gqa and hk != hq and hq % hk == 0 else 1
        B = np.broadcast_shapes((q.shape[0],), (k.shape[0],), (v.shape[0],))[0]
        H = hq if self.rep > 1 else np.broadcast_shapes((hq,), (hk,), (v.shape[1],))[0]
        Hk = H // self.rep
        self.q = np.broadcast_to(q, (B, H) + q.shape[2:])
        self.k = np.broadcast_to(k, (B, Hk) + k.shape[2:])
        self.v = np.broadcast_to(v, (B, Hk) + v.shape[2:])
        self.B, self.H, self.Hk = B, H, Hk
        self.L, self.E = q.shape[2], q.shape[3]
        self.S, self.Ev = k.shape[2], v.shape[3]
        self.batch = self.lead + (H,)          # the output's batch dims
        self.mask = None
        if mask is not None:
            m = np.where(mask, np.float32(0), np.float32(-np.inf)) if mask.dtype == bool else mask.astype(_F32, copy=False)
            self.mask = self._four(np.broadcast_to(m, self.batch + (self.L, self.S)))
        self.operand_strides = [s // a.itemsize for a in (self.q, self.k, self.v) for s in a.strides]
        self.operand_strides += [s // 4 for s in self.mask.strides] if self.mask is not None else [0, 0, 0, 0]
        self.sz = np.array([self.B, self.H, self.Hk, self.L, self.S, self.E, self.Ev], np.int64)
        self.workspace = {}             # (backward, threads) -> floats

    def _four(self, x):
        """x as (batch, heads, rows, cols): one batch dim kept as is (broadcast later by strides),
        several broadcast to the common ones and flattened (a copy)."""
        if x.ndim == 3:
            return x[None]
        if len(self.lead) == 1:
            return x
        return np.broadcast_to(x, self.lead + x.shape[-3:]).reshape((-1,) + x.shape[-3:])

    def strides(self, *extra):
        """The kernel's element strides: q, k, v, the mask's (0 without one), then `extra` arrays'."""
        return np.array(self.operand_strides + [s // a.itemsize for a in extra for s in a.strides], np.int64)

    def work(self, backward: int, threads: int) -> np.ndarray:
        """A fresh float workspace for a forward or backward call on `threads` threads."""
        n = self.workspace.get((backward, threads))
        if n is None:
            n = self.workspace[backward, threads] = _load()[2](ptr(self.sz), backward, threads)
        return np.empty(n, _F32)

    def reduce_to(self, g, shape):
        """A gradient computed at the 4-d broadcast shape, summed back to an operand's `shape`."""
        g = g.reshape(self.lead + g.shape[1:])
        if g.shape == tuple(shape):
            return g
        extra = g.ndim - len(shape)
        axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
        return g.astype(_F32).sum(axis=axes).reshape(shape).astype(g.dtype)


_LAYOUTS: dict = {}
MAX_LAYOUTS = 512       # distinct unmasked 4-d call signatures remembered (a model has a handful)


def _layout(q, k, v, mask, enable_gqa):
    """(_Layout, the arrays the kernel reads for q, k and v). Unmasked 4-d operands are read where they
    are, so their layout (sizes, strides, the forward's strides array) is made once per shapes and
    strides and holds no arrays; other calls build theirs (broadcast copies, the mask)."""
    if mask is not None or not q.ndim == k.ndim == v.ndim == 4:
        lay = _Layout(q, k, v, mask, enable_gqa)
        lay.st = lay.strides()
        return lay, lay.q, lay.k, lay.v
    key = (q.shape, q.strides, k.shape, k.strides, v.shape, v.strides, q.itemsize, enable_gqa)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _Layout(q, k, v, None, enable_gqa)
        lay.st = lay.strides()
        lay.q = lay.k = lay.v = None
        if len(_LAYOUTS) < MAX_LAYOUTS:
            _LAYOUTS[key] = lay
    return lay, q, k, v


def _threads(work: int) -> int:
    return cpu_kernels._threads(work) if cpu_kernels.available() else 1


def forward(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """(out, lse): attention of NumPy arrays q, k, v (one dtype of DTYPE_CODES); lse float32."""
    fwd = _load()[0]
    lay, qa, ka, va = _layout(q, k, v, mask, enable_gqa)
    sc = 1.0 / math.sqrt(lay.E) if scale is None else float(scale)
    out = np.empty((lay.B, lay.H, lay.L, lay.Ev), q.dtype)
    lse = np.empty((lay.B, lay.H, lay.L), _F32)
    if out.size:
        threads = _threads(out.size * lay.S * 4)
        work = lay.work(0, threads)
        fwd(ptr(lay.sz), ptr(lay.st), DTYPE_CODES[q.dtype], ptr(qa), ptr(ka), ptr(va),
            None if lay.mask is None else ptr(lay.mask), int(bool(is_causal)), sc, ptr(out), ptr(lse), ptr(work),
            threads)
    return out.reshape(lay.batch + (lay.L, lay.Ev)), lse.reshape(lay.batch + (lay.L,))


def backward(dout, q, k, v, out, lse, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """(dq, dk, dv) of `forward`'s attention, shaped as q, k, v."""
    bwd = _load()[1]
    lay, qa, ka, va = _layout(q, k, v, mask, enable_gqa)
    sc = 1.0 / math.sqrt(lay.E) if scale is None else float(scale)
    four = (lay.B, lay.H, lay.L)
    d4 = np.ascontiguousarray(dout, dtype=q.dtype).reshape(four + (lay.Ev,))
    o4 = np.ascontiguousarray(out).reshape(four + (lay.Ev,))
    lse4 = np.ascontiguousarray(lse, dtype=_F32).reshape(four)
    dq = np.zeros(four + (lay.E,), q.dtype)
    dk = np.zeros((lay.B, lay.Hk, lay.S, lay.E), q.dtype)
    dv = np.zeros((lay.B, lay.Hk, lay.S, lay.Ev), q.dtype)
    if dq.size and lay.S:
        threads = _threads(dq.size * lay.S * 8)
        work, st = lay.work(1, threads), lay.strides(d4, o4)      # st alive until the call returns
        bwd(ptr(lay.sz), ptr(st), DTYPE_CODES[q.dtype], ptr(qa),
            ptr(ka), ptr(va), None if lay.mask is None else ptr(lay.mask),
            int(bool(is_causal)), sc, ptr(d4), ptr(o4), ptr(lse4), ptr(dq),
            ptr(dk), ptr(dv), ptr(work), threads)
    qs, ks, vs = lay.shapes
    return lay.reduce_to(dq, qs), lay.reduce_to(dk, ks), lay.reduce_to(dv, vs)
