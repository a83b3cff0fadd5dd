"""LayerNorm forward and backward on cuda as Triton kernels launched through CuPy (`triton_launch`).

Rows are the leading dimensions flattened, columns the normalised ones (at most `MAX_COLS`). Arithmetic
is float32 whatever the storage type (float32, bfloat16, float16), as PyTorch's cuda kernels.

Forward: one program per row computes the mean, rstd = 1/sqrt(var + eps) (biased variance) and
y = (x - mean) * rstd * w + b, storing y, mean and rstd.
Backward: each program walks `rows_per_program` rows; per row, with xhat = (x - mean) * rstd and
gh = dy * w, dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)); it accumulates dy * xhat and dy
over its rows and writes them as one row of a (programs, 2, cols) float32 buffer, summed over the
programs by `triton_sum.sum_partials` (one launch) into the weight and bias gradients.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import triton
import triton.language as tl

try:
    import cupy
except ImportError:     # the interpreter tests (tests/scripts) run these kernels on cpu without CuPy
    cupy = None

from . import triton_launch as TL, triton_sum

MAX_COLS = 16384
PROGRAMS_PER_SM = 4     # backward programs per multiprocessor (each owns one partial-sum row)
_DTYPES = frozenset(np.dtype(n) for n in ("float16", "float32")) | {np.dtype(ml_dtypes.bfloat16)}


@triton.jit
def _ln_fwd(X, W, B, Y, MEAN, RSTD, N, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean.to(MEAN.dtype.element_ty))
    tl.store(RSTD + row, rstd.to(RSTD.dtype.element_ty))


@triton.jit
def _ln_bwd(DY, X, W, MEAN, RSTD, DX, PART, M, N, rows_per_program, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(0, rows_per_program):
        row = pid.to(tl.int64) * rows_per_program + i
        ok = row < M
        m = mask & ok
        x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row, mask=ok, other=0.0).to(tl.float32)
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        if HAS_W:
            gh = dy * w
        else:
            gh = dy
        c1 = tl.sum(xhat * gh, axis=0) / N
        c2 = tl.sum(gh, axis=0) / N
        dx = rstd * (gh - c2 - xhat * c1)
        tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=m)
        dw += dy * xhat
        db += dy
    tl.store(PART + pid.to(tl.int64) * 2 * N + cols, dw, mask=mask)
    tl.store(PART + pid.to(tl.int64) * 2 * N + N + cols, db, mask=mask)


def block_cols(n: int) -> int:
    return triton.next_power_of_2(n)


def _warps(block: int) -> int:
    return int(min(16, max(1, block // 256)))


def supported(x, cols: int, *others) -> bool:
    """Whether a LayerNorm over the last `cols` elements of CuPy array `x` (and the weight/bias
    `others`, None allowed) can run here."""
    return (x.dtype in _DTYPES and 0 < cols <= MAX_COLS and x.size > 0
            and all(o is None or o.dtype in _DTYPES for o in others))


def _ty(a, default="fp32"):
    return "*" + (default if a is None else TL.type_of(a.dtype))


_kernels: dict = {}     # (direction, dtypes of the operands, columns, device) -> the compiled kernel


def _dtype_of(a):
    return None if a is None else a.dtype


def _forward_kernel(x, weight, bias, cols: int):
    """The forward kernel for these dtypes and columns on the current device, compiled (or found in
    `TL.compile_kernel`'s cache, whose key costs a signature dict and a sort to build) once here."""
    key = ("fwd", x.dtype, _dtype_of(weight), _dtype_of(bias), cols, TL.current_device())
    kern = _kernels.get(key)
    if kern is None:
        block = block_cols(cols)
        sig = {"X": _ty(x), "W": _ty(weight), "B": _ty(bias), "Y": _ty(x), "MEAN": _ty(x), "RSTD": _ty(x),
               "N": "i32", "eps": "fp32", "HAS_W": "constexpr", "HAS_B": "constexpr", "BLOCK_N": "constexpr"}
        kern = _kernels[key] = TL.compile_kernel(_ln_fwd, sig, dict(HAS_W=weight is not None, HAS_B=bias is not None,
                                                                    BLOCK_N=block),
                                                 num_warps=_warps(block), num_stages=1)
    return kern


def forward(x, weight, bias, cols: int, eps: float, stat_shape=None):
    """(y, mean, rstd) of a LayerNorm of CuPy array `x` over its last `cols` elements; mean and rstd
    have one value per row, in x's dtype, shaped `stat_shape` (C-contiguous; default (rows,))."""
    x = cupy.ascontiguousarray(x)
    rows = x.size // cols
    y = cupy.ndarray(x.shape, x.dtype)
    mean = cupy.ndarray(stat_shape or (rows,), x.dtype)
    rstd = cupy.ndarray(stat_shape or (rows,), x.dtype)
    kern = _kernels.get(("fwd", x.dtype, _dtype_of(weight), _dtype_of(bias), cols, TL.current_device())) or \
        _forward_kernel(x, weight, bias, cols)
    TL.launch(kern, (rows,), x, weight, bias, y, mean, rstd, cols, eps)
    return y, mean, rstd


def _backward_kernel(dy, x, weight, mean, rstd, cols: int):
    key = ("bwd", dy.dtype, x.dtype, _dtype_of(weight), mean.dtype, rstd.dtype, cols, TL.current_device())
    kern = _kernels.get(key)
    if kern is None:
        block = block_cols(cols)
        sig = {"DY": _ty(dy), "X": _ty(x), "W": _ty(weight), "MEAN": _ty(mean), "RSTD": _ty(rstd), "DX": _ty(x),
               "PART": "*fp32", "M": "i32", "N": "i32", "rows_per_program": "i32", "HAS_W": "constexpr",
               "BLOCK_N": "constexpr"}
        kern = _kernels[key] = TL.compile_kernel(_ln_bwd, sig, dict(HAS_W=weight is not None, BLOCK_N=block),
                                                 num_warps=_warps(block), num_stages=1)
    return kern


def backward(grad_out, x, mean, rstd, weight, cols: int):
    """(dx, partial sums (2, cols) float32 of dy * xhat and dy over the rows) for `forward`'s inputs."""
    x = cupy.ascontiguousarray(x)
    dy = cupy.ascontiguousarray(grad_out)
    mean, rstd = cupy.ascontiguousarray(mean), cupy.ascontiguousarray(rstd)
    rows = x.size // cols
    programs = int(min(rows, PROGRAMS_PER_SM * TL.multiprocessors()))
    per = -(-rows // programs)
    programs = -(-rows // per)
    dx = cupy.ndarray(x.shape, x.dtype)
    part = cupy.ndarray((programs, 2, cols), np.float32)
    kern = _kernels.get(("bwd", dy.dtype, x.dtype, _dtype_of(weight), mean.dtype, rstd.dtype, cols,
                         TL.current_device())) or _backward_kernel(dy, x, weight, mean, rstd, cols)
    TL.launch(kern, (programs,), dy, x, weight, mean, rstd, dx, part, rows, cols, per)
    return dx, triton_sum.sum_partials(part)
