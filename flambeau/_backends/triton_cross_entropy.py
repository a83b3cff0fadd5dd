"""Cross-entropy with class-index targets on cuda as Triton kernels (launched through CuPy by
`triton_launch`): no log-softmax or one-hot matrix is materialised.

Rows are samples, columns classes (input (N, C), C-contiguous, float32/bfloat16/float16; targets
int64). Forward: one program per row walks the classes in blocks with an online maximum and sum,
giving lse = log(sum(exp(x))) and the row loss lse - x[target] (0 where target == ignore_index).
Backward: one program per row recomputes lse and writes g * (exp(x - lse) - onehot(target)), g being
the row's incoming gradient (0 for ignored rows). Arithmetic in float32. The caller reduces.
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from . import triton_launch as TL

BLOCK_C = 2048
NUM_WARPS = 8
_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


@triton.jit
def _row_lse(X, row, C, BLOCK_C: tl.constexpr):
    """log(sum(exp(x))) of one row, in one pass (online maximum)."""
    cols = tl.arange(0, BLOCK_C)
    m = tl.full((BLOCK_C,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for start in range(0, C, BLOCK_C):
        c = start + cols
        x = tl.load(X + row * C + c, mask=c < C, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    mx = tl.max(m, axis=0)
    safe_mx = tl.where(mx == float("-inf"), 0.0, mx)
    total = tl.sum(s * tl.exp(m - safe_mx), axis=0)
    return safe_mx + tl.log(total)


@triton.jit
def _ce_fwd(X, T, LOSS, C, ignore_index, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse = _row_lse(X, row, C, BLOCK_C)
    t = tl.load(T + row)
    valid = t != ignore_index
    xt = tl.load(X + row * C + t, mask=valid, other=0.0).to(tl.float32)
    tl.store(LOSS + row, tl.where(valid, lse - xt, 0.0))


@triton.jit
def _ce_bwd(X, T, G, DX, C, ignore_index, g_stride, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse = _row_lse(X, row, C, BLOCK_C)
    t = tl.load(T + row)
    g = tl.load(G + row * g_stride).to(tl.float32)
    g = tl.where(t != ignore_index, g, 0.0)
    cols = tl.arange(0, BLOCK_C)
    for start in range(0, C, BLOCK_C):
        c = start + cols
        m = c < C
        x = tl.load(X + row * C + c, mask=m, other=0.0).to(tl.float32)
        d = g * (tl.exp(x - lse) - tl.where(c == t, 1.0, 0.0))
        tl.store(DX + row * C + c, d.to(DX.dtype.element_ty), mask=m)


def supported(x, target, weight, label_smoothing: float) -> bool:
    """Whether cross_entropy(x, target) of CuPy arrays can run here: 2-D input, 1-D int64 targets."""
    return (weight is None and not label_smoothing and x.ndim == 2 and target.ndim == 1 and x.shape[0] > 0
            and x.shape[1] > 0 and x.dtype.name in _TYPES and target.dtype == np.int64)


def _compile(fn, sig):
    return TL.compile_kernel(fn, {**sig, "BLOCK_C": "constexpr"}, dict(BLOCK_C=BLOCK_C), num_warps=NUM_WARPS,
                             num_stages=1)


def forward(x, target, ignore_index: int):
    """Per-row losses (float32, one per row) of CuPy `x` (N, C) against int64 `target` (N,)."""
    import cupy  # deferred: CuPy, optional (cuda only)
    x, target = cupy.ascontiguousarray(x), cupy.ascontiguousarray(target)
    loss = cupy.empty(x.shape[0], dtype=np.float32)
    kern = _compile(_ce_fwd, {"X": "*" + _TYPES[x.dtype.name], "T": "*i64", "LOSS": "*fp32", "C": "i64",
                              "ignore_index": "i64"})
    TL.launch(kern, (x.shape[0],), TL.Ptr(x.data.ptr), TL.Ptr(target.data.ptr), TL.Ptr(loss.data.ptr), x.shape[1],
              ignore_index)
    return loss


def backward(g_rows, x, target, ignore_index: int):
    """d loss / d x for incoming per-row gradients `g_rows` (float32, N values or one shared value)."""
    import cupy  # deferred: CuPy, optional (cuda only)
    x, target = cupy.ascontiguousarray(x), cupy.ascontiguousarray(target)
    g_rows = cupy.ascontiguousarray(g_rows, dtype=np.float32)
    dx = cupy.empty_like(x)
    kern = _compile(_ce_bwd, {"X": "*" + _TYPES[x.dtype.name], "T": "*i64", "G": "*fp32",
                              "DX": "*" + _TYPES[dx.dtype.name], "C": "i64", "ignore_index": "i64",
                              "g_stride": "i64"})
    TL.launch(kern, (x.shape[0],), TL.Ptr(x.data.ptr), TL.Ptr(target.data.ptr), TL.Ptr(g_rows.data.ptr),
              TL.Ptr(dx.data.ptr), x.shape[1], ignore_index, 1 if g_rows.size > 1 else 0)
    return dx
