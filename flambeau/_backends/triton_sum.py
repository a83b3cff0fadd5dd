"""Column sums on cuda as Triton kernels launched through CuPy (`triton_launch`): the sum of a
contiguous (M, N) array over its rows, as a bias gradient is (the sum of an (batch..., features)
gradient over its leading dims). CuPy reduces over a leading axis with one thread block per
output column walking a strided column (about 80 GB/s on an H200 for GPT-2's bias gradients).

`_colsum_partial`, a (column blocks, S) grid: program (j, s) adds a BLOCK_M x BLOCK_N tile at a time
over its chunk of rows into float32 and writes one row of a (S, N) buffer; `_colsum_final` adds
the S rows per column and stores the result in the output dtype. float32/bfloat16/float16 inputs,
float32 accumulation.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import triton
import triton.language as tl

from . import triton_launch as TL

try:
    import cupy
except ImportError:     # the interpreter tests (tests/scripts) run these kernels on cpu without CuPy
    cupy = None

BLOCK_M = 32
BLOCK_N = 128
NUM_WARPS = 4
PROGRAMS_PER_SM = 4
MIN_ROWS = 64           # fewer rows: CuPy's reduction is as good
_DTYPES = frozenset(np.dtype(n) for n in ("float16", "float32")) | {np.dtype(ml_dtypes.bfloat16)}


@triton.jit
def _colsum_partial(X, PART, M, N, rows_per, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(1)
    cm = cols < N
    lo = s * rows_per
    hi = tl.minimum(lo + rows_per, M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(lo, hi, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        m = (rows < hi)[:, None] & cm[None, :]
        acc += tl.load(X + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(PART + s.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cm)


@triton.jit
def _colsum_final(PART, Y, S, N, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cm = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(PART + s * N + cols, mask=cm, other=0.0)
    tl.store(Y + cols, acc.to(Y.dtype.element_ty), mask=cm)


def supported(x, rows: int, out_dtype) -> bool:
    """Whether the sum of CuPy array `x` over its leading dims (`rows` elements per column) into
    `out_dtype` (a NumPy dtype) can go here."""
    return (x.dtype in _DTYPES and np.dtype(out_dtype) in _DTYPES and x.flags.c_contiguous
            and rows >= MIN_ROWS and x.size // rows > 0)


def splits(M: int, N: int, sms: int) -> tuple:
    """(S, rows_per): the M rows cut into S chunks (multiples of BLOCK_M) so that the column blocks
    times S fill about PROGRAMS_PER_SM programs per multiprocessor."""
    blocks = -(-M // BLOCK_M)
    want = max(1, min(blocks, -(-PROGRAMS_PER_SM * sms // -(-N // BLOCK_N))))
    rows_per = -(-blocks // want) * BLOCK_M
    return -(-M // rows_per), rows_per


_kernels: dict = {}      # (input dtype, output dtype, device) -> (partial kernel, final kernel);
#   ("final", output dtype, device) -> the final kernel alone (`sum_partials`)


def _column_kernels(x_dtype, out_dtype) -> tuple:
    """The two kernels of `column_sum` for these dtypes on the current device, compiled (or found in
    `TL.compile_kernel`'s cache, whose key costs a signature dict and a sort to build) once here."""
    key = (x_dtype, np.dtype(out_dtype), TL.current_device())
    ks = _kernels.get(key)
    if ks is None:
        sig = {"X": "*" + TL.type_of(x_dtype), "PART": "*fp32", "M": "i32", "N": "i32", "rows_per": "i32",
               "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
        kern = TL.compile_kernel(_colsum_partial, sig, dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N),
                                 num_warps=NUM_WARPS, num_stages=2)
        ks = _kernels[key] = (kern, _final_kernel(key[1]))
    return ks


def _final_kernel(out_dtype):
    key = ("final", np.dtype(out_dtype), TL.current_device())
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = _compile_final(key[1])
    return k


def _compile_final(out_dtype):
    return TL.compile_kernel(_colsum_final, {"PART": "*fp32", "Y": "*" + TL.type_of(out_dtype), "S": "i32",
                                             "N": "i32", "BLOCK_N": "constexpr"}, dict(BLOCK_N=BLOCK_N),
                             num_warps=NUM_WARPS, num_stages=1)


_plans: dict = {}        # (input dtype, output dtype, device, rows, N) -> `_column_plan`'s tuple
_PLANS_MAX = 1024


def _column_plan(key) -> tuple:
    """(partial kernel, final kernel, S, rows_per, partial grid, final grid) of `column_sum` for `key`."""
    x_dtype, out_dtype, _, rows, N = key
    S, rows_per = splits(rows, N, TL.multiprocessors())
    kern, fin = _column_kernels(x_dtype, out_dtype)
    blocks = (N + BLOCK_N - 1) // BLOCK_N
    if len(_plans) >= _PLANS_MAX:
        _plans.clear()
    p = _plans[key] = (kern, fin, S, rows_per, (blocks, S), (blocks,))
    return p


def column_sum(x, rows: int, out_dtype):
    """The (x.size // rows,) sums of CuPy array `x` seen as (rows, x.size // rows), in `out_dtype`. The
    kernels, row chunks and grids of a (dtypes, device, rows, N) seen before are one lookup (each linear
    layer's bias gradient of a training step: the device's multiprocessor count is a runtime query)."""
    N = x.size // rows
    key = (x.dtype, out_dtype, TL.current_device(), rows, N)
    kern, fin, S, rows_per, grid, final_grid = _plans.get(key) or _column_plan(key)
    part = cupy.ndarray((S, N), np.float32)
    TL.launch(kern, grid, x, part, rows, N, rows_per)
    y = cupy.ndarray((N,), out_dtype)
    TL.launch(fin, final_grid, part, y, S, N)
    return y


def sum_partials(part, out_dtype=np.float32):
    """The sums over the leading axis of a C-contiguous float32 (S, N...) CuPy array of partial sums,
    shaped N..., in one launch of `_colsum_final` (CuPy's `part.sum(axis=0)` costs a reduction's host
    time, 15 to 60 us a call)."""
    S = part.shape[0]
    N = part.size // S
    y = cupy.ndarray(part.shape[1:], out_dtype)
    TL.launch(_kernels.get(("final", y.dtype, TL.current_device())) or _final_kernel(y.dtype),
              ((N + BLOCK_N - 1) // BLOCK_N,), part, y, S, N)
    return y
