"""Cross-entropy with class-index targets on cuda as Triton kernels (launched through CuPy by `triton_launch`):
no log-softmax or one-hot matrix is materialised, and no CuPy reduction runs.

Rows are samples, columns classes (input (N, C), C-contiguous, float32/bfloat16/float16; targets int64).
Forward: one program per row walks the classes in blocks with an online maximum and sum, giving lse =
log(sum(exp(x))) and the row loss lse - x[target] (0 where target == ignore_index), stored in the input's
dtype for reduction='none'; a target outside [0, C) (not ignore_index) is recorded in `device_checks`' error
buffer there, raised at the next synchronisation. For 'mean' and 'sum' the row losses stay float32 and one
more program (`_ce_reduce`) adds them in a fixed order (deterministic, no atomics), counts the targets that
are not ignore_index and stores sum / count ('mean': 0 / 0 = NaN when every target is ignored, as PyTorch) or
the sum, in the input's dtype: two launches. Backward: one program per row recomputes lse and writes g *
(exp(x - lse) - onehot(target)), g being the row's incoming gradient read in its own dtype with its own stride
(0: one shared value) and 0 for ignored rows; for 'mean' one program first (`_ce_scale`) stores g / count as
float32, which the rows then share. Arithmetic in float32.
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

from . import device_checks, triton_launch as TL

BLOCK_C = 2048
BLOCK_N = 1024          # rows per step of the one-program reductions (`_ce_reduce`, `_ce_scale`)
NUM_WARPS = 8
REDUCE_WARPS = 4
_DTYPES = frozenset((np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)))
_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)
NONE, MEAN, SUM = 0, 1, 2   # the `reduction` codes of cross_entropy_loss
_kernels: dict = {}     # (kernel name, dtypes, reduction, device) -> compiled kernel


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
def _ce_fwd(X, T, LOSS, ERR, C, ignore_index, code, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse = _row_lse(X, row, C, BLOCK_C)
    t = tl.load(T + row)
    valid = t != ignore_index
    inside = (t >= 0) & (t < C)
    if valid & (inside == 0):       # the first bad target: its code and value into `device_checks`' buffer
        zero = tl.zeros_like(t).to(tl.uint64, bitcast=True)
        old = tl.atomic_cas(ERR, zero, code.to(tl.int64).to(tl.uint64, bitcast=True))
        if old == 0:
            tl.store(ERR + 1, t.to(tl.uint64, bitcast=True))
    xt = tl.load(X + row * C + t, mask=valid & inside, other=0.0).to(tl.float32)     # (a bad one must not fault)
    tl.store(LOSS + row, tl.where(valid, lse - xt, 0.0).to(LOSS.dtype.element_ty))


@triton.jit
def _valid_count(T, N, ignore_index, BLOCK_N: tl.constexpr):
    """The number of targets among T[0:N] that are not ignore_index, as float32."""
    offs = tl.arange(0, BLOCK_N)
    n = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        i = start + offs
        t = tl.load(T + i, mask=i < N, other=ignore_index)
        n += tl.where(t != ignore_index, 1.0, 0.0)
    return tl.sum(n, axis=0)


@triton.jit
def _ce_reduce(LOSS, T, OUT, N, ignore_index, MEAN: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[0] = sum(LOSS[0:N]) (/ the count of targets not ignored, when MEAN): one program."""
    offs = tl.arange(0, BLOCK_N)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        i = start + offs
        s += tl.load(LOSS + i, mask=i < N, other=0.0)
    total = tl.sum(s, axis=0)
    if MEAN:
        total = total / _valid_count(T, N, ignore_index, BLOCK_N)
    tl.store(OUT, total.to(OUT.dtype.element_ty))


@triton.jit
def _ce_scale(T, G, S, N, ignore_index, BLOCK_N: tl.constexpr):
    """S[0] = G[0] / the count of targets not ignored (float32): the shared row gradient of a mean."""
    g = tl.load(G).to(tl.float32)
    tl.store(S, g / _valid_count(T, N, ignore_index, BLOCK_N))


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
            and x.shape[1] > 0 and x.dtype in _DTYPES and target.dtype == _INT64)


def _type(dtype) -> str:
    return "*" + TL.type_of(dtype)


def _kernel(name: str, dtypes: tuple, dev: int, reduction: int = NONE):
    """Kernel `name` ("fwd", "reduce", "scale", "bwd") compiled for its arrays' dtypes (`_types`) and the
    reduction, made once per device `dev` (the key holds no JITFunction: its hash is a Python call)."""
    key = (name, dtypes, reduction, dev)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = _build(_FUNCTIONS[name], _types(name, dtypes, reduction), reduction == MEAN)
    return k


def _types(name: str, dtypes: tuple, reduction: int) -> tuple:
    """The element types of kernel `name`'s pointer parameters, in order, for the dtypes it is keyed by:
    the input's (fwd, reduce), the incoming gradient's (scale), both (bwd)."""
    t = _type(dtypes[0])
    if name == "fwd":
        return t, "*i64", t if reduction == NONE else "*fp32", "*u64"
    if name == "reduce":
        return "*fp32", "*i64", t
    if name == "scale":
        return "*i64", t, "*fp32"
    return t, "*i64", _type(dtypes[1]), t


def _build(fn, types: tuple, mean: bool):
    it = iter(types)
    sig = {n: next(it) if n in _POINTERS else "i64" for n in fn.arg_names if n not in _CONSTEXPRS}
    rows = fn is _ce_fwd or fn is _ce_bwd
    const = dict(BLOCK_C=BLOCK_C) if rows else dict(BLOCK_N=BLOCK_N)
    if fn is _ce_reduce:
        const["MEAN"] = mean
    sig.update(dict.fromkeys(const, "constexpr"))
    return TL.compile_kernel(fn, sig, const, num_warps=NUM_WARPS if rows else REDUCE_WARPS, num_stages=1)


_FUNCTIONS = {"fwd": _ce_fwd, "reduce": _ce_reduce, "scale": _ce_scale, "bwd": _ce_bwd}
_POINTERS = frozenset(("X", "T", "LOSS", "ERR", "OUT", "G", "S", "DX"))
_CONSTEXPRS = frozenset(("BLOCK_C", "BLOCK_N", "MEAN"))


def _contiguous(a):
    c = getattr(a, "_c_contiguous", None)       # CuPy's own flag: `a.flags` makes an object per read
    return a if (a.flags.c_contiguous if c is None else c) else cupy.ascontiguousarray(a)


TARGET_ERROR = (IndexError, "Target {} is out of bounds.")   # PyTorch's message for a target outside [0, C)


def forward(x, target, ignore_index: int, reduction: int = NONE):
    """cross_entropy of CuPy `x` (N, C) against int64 `target` (N,) in x's dtype: the N row losses
    (reduction NONE) or their mean over the targets not ignored (MEAN) or sum (SUM), a 0-d array. A
    target outside [0, C) other than ignore_index is raised as PyTorch's IndexError at the next
    synchronisation (`device_checks`: the kernel records it; no separate check launch)."""
    x, target = _contiguous(x), _contiguous(target)
    n, c = x.shape
    dt, dev = (x.dtype,), TL.current_device()
    loss = cupy.ndarray((n,), x.dtype if reduction == NONE else _FLOAT32)
    kernel = _kernel("fwd", dt, dev, reduction)
    err, code = device_checks.error_slot(cupy, dev, *TARGET_ERROR)
    TL.launch(kernel, (n,), x, target, loss, err, c, ignore_index, code)
    if reduction == NONE:
        return loss
    out = cupy.ndarray((), x.dtype)
    TL.launch(_kernel("reduce", dt, dev, reduction), (1,), loss, target, out, n, ignore_index)
    return out


def backward(grad, x, target, ignore_index: int, reduction: int = NONE):
    """d loss / d x (x's dtype) for the loss's gradient `grad`: N values (reduction NONE, any stride) or
    one (MEAN, SUM), float32/bfloat16/float16, else taken as float32."""
    x, target = _contiguous(x), _contiguous(target)
    n, c = x.shape
    dev = TL.current_device()
    if grad.dtype not in _DTYPES:
        grad = grad.astype(_FLOAT32)
    if grad.ndim == 1 and grad.size > 1:
        if grad.strides[0] < 0:
            grad = cupy.ascontiguousarray(grad)
        g_stride = grad.strides[0] // grad.itemsize
    else:
        g_stride = 0
    if reduction == MEAN:
        scale = cupy.ndarray((1,), _FLOAT32)
        TL.launch(_kernel("scale", (grad.dtype,), dev), (1,), target, grad, scale, n, ignore_index)
        grad, g_stride = scale, 0
    dx = cupy.ndarray(x.shape, x.dtype)
    TL.launch(_kernel("bwd", (x.dtype, grad.dtype), dev), (n,), x, target, grad, dx, c, ignore_index, g_stride)
    return dx
