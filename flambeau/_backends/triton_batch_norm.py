"""BatchNorm in training on cuda as Triton kernels launched through CuPy (`triton_launch`).

The input is (N, C, *spatial), contiguous (or channels-last, below); a channel's M = N * prod(spatial) elements are its
positions j = n * HW + s, at offset n * C * HW + c * HW + s. Arithmetic is float32 whatever the
storage type (float32, bfloat16, float16), as PyTorch's cuda kernels; the saved mean and rstd are
float32.

Forward, three launches:
- `_bn_stats`, a (C, S) grid: program (c, s) walks its chunk of channel c block by block, merging
  each block's count, mean and sum of squared deviations into its own (Chan et al.'s pairwise
  update: no E[x^2] - E[x]^2 cancellation), and writes them as one row of a (S, 3, C) buffer;
- `_bn_finalize`: merges the S partials per channel the same way, writes mean and
  rstd = 1/sqrt(var + eps) (biased variance), updates the running statistics in place
  (running_var with the unbiased variance, as PyTorch) and the per-channel scale rstd * w and shift b;
- `_bn_apply`: y = (x - mean[c]) * scale[c] + shift[c], one program per block of elements.
Backward, three launches: `_bn_bwd_reduce` sums dy and dy * (x - mean) per (channel, chunk),
`_bn_bwd_finalize` gives the weight and bias gradients and the coefficients of
dx = (dy - mean(dy)) * rstd * w - (x - mean) * rstd^3 * w * mean(dy * (x - mean)), and `_bn_bwd_apply`
computes dx.

A channel of at most ONCHIP_MAX elements, when there are at least as many channels as
multiprocessors (ResNet-50's 14x14 and 7x7 stages at batch 64: 256-2048 channels of 12544 and 3136),
is one program's block instead: `_bn_fwd_onchip` loads it once, takes the mean and the sum of
squared deviations from the loaded values (two passes on chip, no merging), and writes y, the saved
and the running statistics; `_bn_bwd_onchip` loads dy and x once and writes dx and the parameter
gradients. One launch each way, and x (forward) or dy and x (backward) are read from memory once,
not twice; the same formulas as the split kernels (NCHW inputs only).

Channels-last inputs (N, C, *spatial packed with C fastest: a channel's position j is at offset
j * C + c) run without copies: `_bn_stats_cl` and `_bn_bwd_reduce_cl` read (BLOCK_M, BLOCK_CL)
tiles, rows of positions by a block of channels (contiguous loads along C), and write the same
partial buffers as their NCHW forms; the apply kernels find an element's channel as idx % C (CL).
The outputs take the input's layout. An input in neither layout, or a gradient in another layout
than the input's, is copied first (`copies` counts those).
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

from . import triton_launch as TL
from .channels_last import empty as _empty_channels_last, strides as channels_last_strides

BLOCK = 2048              # elements per block of a reduction or pointwise program
ONCHIP_MAX = 16384        # channels of at most this many elements run as one program each way
ONCHIP_ELEMENTS_PER_THREAD = 16
BLOCK_C = 128             # channels per finalize program
NUM_WARPS = 8
PROGRAMS_PER_SM = 4       # reduction programs aimed for per multiprocessor (C * S of them)
MAX_ELEMENTS = 2**31 - 1  # offsets are int32
BLOCK_M = 64              # positions per tile row block of the channels-last reductions
BLOCK_CL = 32             # channels per tile of the channels-last reductions
copies = {"forward": 0, "backward": 0}     # operands re-laid out before a launch
_DTYPES = frozenset((np.dtype(np.float16), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)))
_FLOAT32 = np.dtype(np.float32)


@triton.jit
def _offsets(j, c, C, HW):
    return (j // HW) * (C * HW) + c * HW + j % HW


@triton.jit
def _bn_stats(X, PART, C, HW, M, chunk, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    s = tl.program_id(1)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, M)
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    for start in range(lo, hi, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < hi
        x = tl.load(X + _offsets(j, c, C, HW), mask=m, other=0.0).to(tl.float32)
        nb = tl.sum(m.to(tl.float32), axis=0)
        mb = tl.sum(x, axis=0) / nb
        d = tl.where(m, x - mb, 0.0)
        tot = cnt + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * (cnt * nb / tot)
        cnt = tot
    base = PART + s * 3 * C + c
    tl.store(base, cnt)
    tl.store(base + C, mean)
    tl.store(base + 2 * C, m2)


@triton.jit
def _bn_stats_cl(X, PART, C, M, chunk, BLOCK_M: tl.constexpr, BLOCK_CL: tl.constexpr):
    cs = tl.program_id(0) * BLOCK_CL + tl.arange(0, BLOCK_CL)
    s = tl.program_id(1)
    okc = cs < C
    lo = s * chunk
    hi = tl.minimum(lo + chunk, M)
    cnt = tl.zeros((BLOCK_CL,), dtype=tl.float32)
    mean = tl.zeros((BLOCK_CL,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_CL,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_M):
        j = start + tl.arange(0, BLOCK_M)
        mj = j < hi
        m = mj[:, None] & okc[None, :]
        x = tl.load(X + j[:, None] * C + cs[None, :], mask=m, other=0.0).to(tl.float32)
        nb = tl.sum(mj.to(tl.float32), axis=0)
        mb = tl.sum(x, axis=0) / nb
        d = tl.where(m, x - mb[None, :], 0.0)
        tot = cnt + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * (cnt * nb / tot)
        cnt = tot
    base = PART + s * 3 * C + cs
    tl.store(base, cnt, mask=okc)
    tl.store(base + C, mean, mask=okc)
    tl.store(base + 2 * C, m2, mask=okc)


@triton.jit
def _bn_finalize(PART, S, C, MEAN, RSTD, COEF, W, B, RM, RV, momentum, eps, HAS_W: tl.constexpr,
                 HAS_B: tl.constexpr, HAS_RUN: tl.constexpr, BLOCK_C: tl.constexpr):
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cs < C
    cnt = tl.zeros((BLOCK_C,), dtype=tl.float32)
    mean = tl.zeros((BLOCK_C,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for s in range(0, S):
        base = PART + s * 3 * C + cs
        nb = tl.load(base, mask=ok, other=1.0)
        mb = tl.load(base + C, mask=ok, other=0.0)
        m2b = tl.load(base + 2 * C, mask=ok, other=0.0)
        tot = cnt + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + delta * delta * (cnt * nb / tot)
        cnt = tot
    var = m2 / cnt
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(MEAN + cs, mean, mask=ok)
    tl.store(RSTD + cs, rstd, mask=ok)
    scale = rstd
    if HAS_W:
        scale = scale * tl.load(W + cs, mask=ok, other=0.0).to(tl.float32)
    shift = tl.zeros((BLOCK_C,), dtype=tl.float32)
    if HAS_B:
        shift = tl.load(B + cs, mask=ok, other=0.0).to(tl.float32)
    tl.store(COEF + cs, scale, mask=ok)
    tl.store(COEF + C + cs, shift, mask=ok)
    if HAS_RUN:
        unbiased = m2 / (cnt - 1.0)          # one element: 0 / 0, NaN as PyTorch
        rm = tl.load(RM + cs, mask=ok, other=0.0).to(tl.float32)
        rv = tl.load(RV + cs, mask=ok, other=0.0).to(tl.float32)
        tl.store(RM + cs, ((1.0 - momentum) * rm + momentum * mean).to(RM.dtype.element_ty), mask=ok)
        tl.store(RV + cs, ((1.0 - momentum) * rv + momentum * unbiased).to(RV.dtype.element_ty), mask=ok)


@triton.jit
def _channel(idx, C, HW, CL: tl.constexpr):
    if CL:
        return idx % C
    return (idx // HW) % C


@triton.jit
def _bn_apply(X, Y, MEAN, COEF, C, HW, n, CL: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    c = _channel(idx, C, HW, CL)
    x = tl.load(X + idx, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + c, mask=m, other=0.0)
    scale = tl.load(COEF + c, mask=m, other=0.0)
    shift = tl.load(COEF + C + c, mask=m, other=0.0)
    tl.store(Y + idx, ((x - mean) * scale + shift).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _bn_bwd_reduce(DY, X, MEAN, PART, C, HW, M, chunk, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    s = tl.program_id(1)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, M)
    mean = tl.load(MEAN + c)
    sdy = tl.zeros((BLOCK,), dtype=tl.float32)
    sdyxc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < hi
        off = _offsets(j, c, C, HW)
        dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        sdy += dy
        sdyxc += dy * tl.where(m, x - mean, 0.0)
    tl.store(PART + s * 2 * C + c, tl.sum(sdy, axis=0))
    tl.store(PART + s * 2 * C + C + c, tl.sum(sdyxc, axis=0))


@triton.jit
def _bn_bwd_reduce_cl(DY, X, MEAN, PART, C, M, chunk, BLOCK_M: tl.constexpr, BLOCK_CL: tl.constexpr):
    cs = tl.program_id(0) * BLOCK_CL + tl.arange(0, BLOCK_CL)
    s = tl.program_id(1)
    okc = cs < C
    lo = s * chunk
    hi = tl.minimum(lo + chunk, M)
    mean = tl.load(MEAN + cs, mask=okc, other=0.0).to(tl.float32)
    sdy = tl.zeros((BLOCK_CL,), dtype=tl.float32)
    sdyxc = tl.zeros((BLOCK_CL,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_M):
        j = start + tl.arange(0, BLOCK_M)
        m = (j < hi)[:, None] & okc[None, :]
        off = j[:, None] * C + cs[None, :]
        dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        sdy += tl.sum(dy, axis=0)
        sdyxc += tl.sum(dy * tl.where(m, x - mean[None, :], 0.0), axis=0)
    tl.store(PART + s * 2 * C + cs, sdy, mask=okc)
    tl.store(PART + s * 2 * C + C + cs, sdyxc, mask=okc)


@triton.jit
def _bn_bwd_finalize(PART, S, C, M, RSTD, W, COEF, GW, GB, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cs < C
    sdy = tl.zeros((BLOCK_C,), dtype=tl.float32)
    sdyxc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for s in range(0, S):
        sdy += tl.load(PART + s * 2 * C + cs, mask=ok, other=0.0)
        sdyxc += tl.load(PART + s * 2 * C + C + cs, mask=ok, other=0.0)
    rstd = tl.load(RSTD + cs, mask=ok, other=0.0).to(tl.float32)
    k = rstd
    if HAS_W:
        k = k * tl.load(W + cs, mask=ok, other=0.0).to(tl.float32)
        tl.store(GW + cs, (sdyxc * rstd).to(GW.dtype.element_ty), mask=ok)
    if HAS_B:
        tl.store(GB + cs, sdy.to(GB.dtype.element_ty), mask=ok)
    tl.store(COEF + cs, k, mask=ok)
    tl.store(COEF + C + cs, sdy / M, mask=ok)
    tl.store(COEF + 2 * C + cs, k * rstd * rstd * sdyxc / M, mask=ok)


@triton.jit
def _bn_bwd_apply(DY, X, MEAN, COEF, DX, C, HW, n, CL: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    c = _channel(idx, C, HW, CL)
    dy = tl.load(DY + idx, mask=m, other=0.0).to(tl.float32)
    x = tl.load(X + idx, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + c, mask=m, other=0.0).to(tl.float32)
    k = tl.load(COEF + c, mask=m, other=0.0)
    a = tl.load(COEF + C + c, mask=m, other=0.0)
    p = tl.load(COEF + 2 * C + c, mask=m, other=0.0)
    tl.store(DX + idx, ((dy - a) * k - (x - mean) * p).to(DX.dtype.element_ty), mask=m)


@triton.jit
def _bn_fwd_onchip(X, Y, MEAN, RSTD, W, B, RM, RV, C, HW, M, momentum, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                   HAS_RUN: tl.constexpr, BLOCK_M: tl.constexpr):
    c = tl.program_id(0)
    j = tl.arange(0, BLOCK_M)
    m = j < M
    off = _offsets(j, c, C, HW)
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / M
    d = tl.where(m, x - mean, 0.0)
    m2 = tl.sum(d * d, axis=0)
    rstd = 1.0 / tl.sqrt(m2 / M + eps)
    scale = rstd
    if HAS_W:
        scale = scale * tl.load(W + c).to(tl.float32)
    shift = 0.0
    if HAS_B:
        shift = tl.load(B + c).to(tl.float32)
    tl.store(Y + off, (d * scale + shift).to(Y.dtype.element_ty), mask=m)
    tl.store(MEAN + c, mean)
    tl.store(RSTD + c, rstd)
    if HAS_RUN:
        unbiased = m2 / (M - 1.0)          # one element: 0 / 0, NaN as PyTorch
        rm = tl.load(RM + c).to(tl.float32)
        rv = tl.load(RV + c).to(tl.float32)
        tl.store(RM + c, ((1.0 - momentum) * rm + momentum * mean).to(RM.dtype.element_ty))
        tl.store(RV + c, ((1.0 - momentum) * rv + momentum * unbiased).to(RV.dtype.element_ty))


@triton.jit
def _bn_bwd_onchip(DY, X, MEAN, RSTD, W, DX, GW, GB, C, HW, M, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                   BLOCK_M: tl.constexpr):
    c = tl.program_id(0)
    j = tl.arange(0, BLOCK_M)
    m = j < M
    off = _offsets(j, c, C, HW)
    dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + c).to(tl.float32)
    rstd = tl.load(RSTD + c).to(tl.float32)
    xc = tl.where(m, x - mean, 0.0)
    sdy = tl.sum(dy, axis=0)
    sdyxc = tl.sum(dy * xc, axis=0)
    k = rstd
    if HAS_W:
        k = k * tl.load(W + c).to(tl.float32)
        tl.store(GW + c, (sdyxc * rstd).to(GW.dtype.element_ty))
    if HAS_B:
        tl.store(GB + c, sdy.to(GB.dtype.element_ty))
    dx = (dy - sdy / M) * k - xc * (k * rstd * rstd * sdyxc / M)
    tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=m)


def _onchip(C: int, M: int) -> bool:
    """Whether channels of M elements run as one program each (`_bn_fwd_onchip`): they fit, and the C
    programs fill the multiprocessors (fewer, larger channels go faster split)."""
    return M <= ONCHIP_MAX and C >= TL.multiprocessors()


def onchip_block(M: int) -> int:
    """The power-of-two block of `_bn_fwd_onchip`/`_bn_bwd_onchip` for channels of M elements."""
    return max(16, 1 << (M - 1).bit_length())


def onchip_warps(block: int) -> int:
    """Warps of an on-chip program: about ONCHIP_ELEMENTS_PER_THREAD elements per thread, 1 to 32 warps."""
    return min(32, max(1, block // (32 * ONCHIP_ELEMENTS_PER_THREAD)))


def supported(x, *others) -> bool:
    """Whether a training-mode BatchNorm of CuPy array `x` (N, C, ...) with the per-channel arrays
    `others` (weight, bias, running statistics, saved statistics; None allowed) can run here."""
    if x.dtype not in _DTYPES or x.ndim < 2 or not 0 < x.size <= MAX_ELEMENTS or x.shape[1] <= 0:
        return False
    for o in others:
        if o is not None and (o.dtype not in _DTYPES or o.ndim != 1 or not o.flags.c_contiguous):
            return False
    return True


def splits(C: int, M: int, sms: int, block: int = BLOCK) -> tuple:
    """(S, chunk): each channel's M elements cut into S chunks of `chunk` (a multiple of `block`), so
    that the C * S reduction programs (channels-last: C is the count of channel blocks) fill about
    PROGRAMS_PER_SM per multiprocessor."""
    blocks = -(-M // block)
    want = max(1, min(blocks, -(-PROGRAMS_PER_SM * sms // C)))
    chunk = -(-blocks // want) * block
    return -(-M // chunk), chunk


def _has_strides(a, want) -> bool:
    it = a.itemsize
    return all(b == w * it for b, w, n in zip(a.strides, want, a.shape) if n != 1)


def is_channels_last(a) -> bool:
    """Whether array `a` (4-d or 5-d) is packed channels-last and not also C-contiguous."""
    return a.ndim in (4, 5) and not a.flags.c_contiguous and _has_strides(a, channels_last_strides(a.shape))


def _like(x, cl: bool):
    """A new CuPy array of x's shape and dtype, packed channels-last when `cl` (`_backends.channels_last.empty`)."""
    if not cl:
        return cupy.ndarray(x.shape, x.dtype)
    return _empty_channels_last(cupy, x.shape, x.dtype)


def _packed(a, cl: bool, kind: str):
    """`a` itself when it is packed in the layout asked for, else a copy (counted)."""
    if (_has_strides(a, channels_last_strides(a.shape)) if cl else a.flags.c_contiguous):
        return a
    copies[kind] += 1
    out = _like(a, cl)
    out[...] = a
    return out


def _ty(a, default="fp32"):
    return "*" + (default if a is None else TL.type_of(a.dtype))


def _dt(a):
    return None if a is None else a.dtype


_kernels: dict = {}     # (id of the kernel, dtypes and flags, device) -> compiled kernel: a launch builds no signature


def _kernel(fn, key: tuple, make):
    """The compiled `fn` for `key`; `make()` -> (signature, constexprs, num_warps) on the first use. The
    key holds the JITFunction's id (the module keeps each one alive), not the function: hashing a
    JITFunction is a Python call taking a lock (`cache_key`), about a microsecond a lookup."""
    full = (id(fn), key, TL.current_device())
    k = _kernels.get(full)
    if k is None:
        sig, const, warps = make()
        k = _kernels[full] = TL.compile_kernel(fn, sig, const, num_warps=warps, num_stages=1)
    return k


def _geometry(x, cl: bool = False):
    C = x.shape[1]
    HW = x.size // (x.shape[0] * C)
    M = x.size // C
    if cl:
        S, chunk = splits(-(-C // BLOCK_CL), M, TL.multiprocessors(), BLOCK_M)
    else:
        S, chunk = splits(C, M, TL.multiprocessors())
    return C, HW, M, S, chunk


def stats_cl_signature(x) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_stats_cl` for input dtype `x`."""
    return ({"X": _ptr(x), "PART": "*fp32", "C": "i32", "M": "i32", "chunk": "i32", "BLOCK_M": "constexpr",
             "BLOCK_CL": "constexpr"}, dict(BLOCK_M=BLOCK_M, BLOCK_CL=BLOCK_CL), 4)


def apply_signature(x, cl: bool) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_apply` for input dtype `x`, NCHW or channels-last."""
    return ({"X": _ptr(x), "Y": _ptr(x), "MEAN": "*fp32", "COEF": "*fp32", "C": "i32", "HW": "i32", "n": "i32",
             "CL": "constexpr", "BLOCK": "constexpr"}, dict(CL=cl, BLOCK=BLOCK), NUM_WARPS)


def bwd_reduce_cl_signature(dy, x, mean) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_bwd_reduce_cl` for these dtypes."""
    return ({"DY": _ptr(dy), "X": _ptr(x), "MEAN": _ptr(mean), "PART": "*fp32", "C": "i32", "M": "i32",
             "chunk": "i32", "BLOCK_M": "constexpr", "BLOCK_CL": "constexpr"},
            dict(BLOCK_M=BLOCK_M, BLOCK_CL=BLOCK_CL), 4)


def bwd_apply_signature(dy, x, mean, cl: bool) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_bwd_apply` for these dtypes, NCHW or channels-last."""
    return ({"DY": _ptr(dy), "X": _ptr(x), "MEAN": _ptr(mean), "COEF": "*fp32", "DX": _ptr(x), "C": "i32",
             "HW": "i32", "n": "i32", "CL": "constexpr", "BLOCK": "constexpr"}, dict(CL=cl, BLOCK=BLOCK), NUM_WARPS)


def _f32(shape):
    return cupy.ndarray(shape, _FLOAT32)


_scratch: dict = {}     # (device, stream, role) -> a float32 buffer kept and grown (`_scratch_f32`)


def _scratch_f32(role: str, n: int, dev=None, stream=None):
    """A float32 buffer of at least n elements for a call's partial statistics or coefficients (`role`),
    read only by this call's own launches: the calls queued on one stream run one after another, so the
    stream's buffer is reused call after call (no allocation or free per BatchNorm), grown to the
    largest size asked for. `release_scratch` drops them. `dev`, `stream`: the current ones, where the
    caller has read them."""
    key = (TL.current_device() if dev is None else dev, TL.current_stream() if stream is None else stream, role)
    a = _scratch.get(key)
    if a is None or a.size < n:
        _scratch.pop(key, None)             # (the old one back to the pool first)
        a = _scratch[key] = cupy.ndarray((n,), _FLOAT32)
    return a


def release_scratch() -> None:
    """Drop the kept scratch buffers (`flambeau.cuda.empty_cache`)."""
    _scratch.clear()


# A call's launches follow from its input's layout and the operands' dtypes: `forward` and `backward` keep
# them per (shapes, strides, dtypes, device) in `_plans` (the layout test, the chunking and the kernel lookups
# ran for each of ResNet-50's 106 BatchNorm calls a step), for inputs that need no copy.
_plans: dict = {}
_MAX_PLANS = 4096


def _remember(key, plan) -> None:
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def forward(x, weight, bias, running_mean, running_var, momentum: float, eps: float):
    """(y, save_mean, save_rstd) of a training-mode BatchNorm of CuPy array `x`; the running
    statistics (both or neither) are updated in place; the saved statistics are float32."""
    has_run = running_mean is not None and running_var is not None
    rm, rv = (running_mean, running_var) if has_run else (None, None)
    dev = TL.current_device()
    key = ("forward", x.shape, x.strides, x.dtype, None if weight is None else weight.dtype,
           None if bias is None else bias.dtype, None if rm is None else rm.dtype, None if rv is None else rv.dtype, dev)
    plan = _plans.get(key)
    if plan is None:
        cl = is_channels_last(x)
        if cl or x.flags.c_contiguous:
            plan = _forward_plan(x, cl, weight, bias, rm, rv)
            _remember(key, plan)
        else:                                     # a copy first (counted), each call
            x = _packed(x, cl, "forward")
            plan = _forward_plan(x, cl, weight, bias, rm, rv)
    onchip, cl, C, HW, M, S, chunk, stats, fin, apply = plan
    if onchip:
        y, mean, rstd = cupy.ndarray(x.shape, x.dtype), _f32((C,)), _f32((C,))
        TL.launch(stats, (C,), x, y, mean, rstd, weight, bias, rm, rv, C, HW, M, momentum, eps)
        return y, mean, rstd
    stream = TL.current_stream()
    part = _scratch_f32("part", S * 3 * C, dev, stream)        # (S, 3, C)
    if cl:
        TL.launch(stats, (-(-C // BLOCK_CL), S), x, part, C, M, chunk)
    else:
        TL.launch(stats, (C, S), x, part, C, HW, M, chunk)
    mean = _f32((C,))
    rstd = _f32((C,))
    coef = _scratch_f32("coef", 2 * C, dev, stream)           # (2, C)
    TL.launch(fin, ((C + BLOCK_C - 1) // BLOCK_C,), part, S, C, mean, rstd, coef, weight, bias, rm, rv,
              momentum, eps)
    y = _like(x, cl)
    TL.launch(apply, ((x.size + BLOCK - 1) // BLOCK,), x, y, mean, coef, C, HW, x.size)
    return y, mean, rstd


def _forward_plan(x, cl, weight, bias, rm, rv) -> tuple:
    """`forward`'s plan for packed `x`: (one program per channel?, channels-last, C, HW, M, S, chunk, and
    the kernels: the one-program kernel, or the stats, finalize and apply kernels)."""
    C, HW, M, S, chunk = _geometry(x, cl)
    if not cl and _onchip(C, M):
        key = (x.dtype, _dt(weight), _dt(bias), _dt(rm), _dt(rv), onchip_block(M))
        return True, False, C, HW, M, S, chunk, _kernel(_bn_fwd_onchip, key, lambda: fwd_onchip_signature(*key)), \
            None, None
    if cl:
        stats = _kernel(_bn_stats_cl, (x.dtype,), lambda: stats_cl_signature(x.dtype))
    else:
        stats = _kernel(_bn_stats, (x.dtype,), lambda: (
            {"X": _ty(x), "PART": "*fp32", "C": "i32", "HW": "i32", "M": "i32", "chunk": "i32",
             "BLOCK": "constexpr"}, dict(BLOCK=BLOCK), NUM_WARPS))
    fin = _kernel(_bn_finalize, (_dt(weight), _dt(bias), _dt(rm), _dt(rv)), lambda: (
        {"PART": "*fp32", "S": "i32", "C": "i32", "MEAN": "*fp32", "RSTD": "*fp32", "COEF": "*fp32",
         "W": _ty(weight), "B": _ty(bias), "RM": _ty(rm), "RV": _ty(rv), "momentum": "fp32",
         "eps": "fp32", "HAS_W": "constexpr", "HAS_B": "constexpr", "HAS_RUN": "constexpr", "BLOCK_C": "constexpr"},
        dict(HAS_W=weight is not None, HAS_B=bias is not None, HAS_RUN=rm is not None, BLOCK_C=BLOCK_C), 4))
    apply = _kernel(_bn_apply, (x.dtype, cl), lambda: apply_signature(x.dtype, cl))
    return False, cl, C, HW, M, S, chunk, stats, fin, apply


def backward(grad_out, x, weight, bias, save_mean, save_rstd):
    """(dx, grad_weight or None, grad_bias or None) of `forward` (training mode), the parameter
    gradients in their parameters' dtypes."""
    dev = TL.current_device()
    key = ("backward", x.shape, x.strides, grad_out.strides, x.dtype, grad_out.dtype, save_mean.dtype,
           save_rstd.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype, dev)
    plan = _plans.get(key)
    if plan is None:
        cl = is_channels_last(x)
        if _packed_as(x, cl) and _packed_as(grad_out, cl):
            plan = _backward_plan(grad_out, x, cl, weight, bias, save_mean, save_rstd)
            _remember(key, plan)
        else:                                     # copies first (counted), each call
            x = _packed(x, cl, "backward")
            grad_out = _packed(grad_out, cl, "backward")
            plan = _backward_plan(grad_out, x, cl, weight, bias, save_mean, save_rstd)
    dy = grad_out
    onchip, cl, C, HW, M, S, chunk, red, fin, apply = plan
    gw = None if weight is None else cupy.ndarray((C,), weight.dtype)
    gb = None if bias is None else cupy.ndarray((C,), bias.dtype)
    if onchip:
        dx = cupy.ndarray(x.shape, x.dtype)
        TL.launch(red, (C,), dy, x, save_mean, save_rstd, weight, dx, gw, gb, C, HW, M)
        return dx, gw, gb
    stream = TL.current_stream()
    part = _scratch_f32("part", S * 2 * C, dev, stream)        # (S, 2, C)
    if cl:
        TL.launch(red, (-(-C // BLOCK_CL), S), dy, x, save_mean, part, C, M, chunk)
    else:
        TL.launch(red, (C, S), dy, x, save_mean, part, C, HW, M, chunk)
    coef = _scratch_f32("coef", 3 * C, dev, stream)           # (3, C)
    TL.launch(fin, ((C + BLOCK_C - 1) // BLOCK_C,), part, S, C, float(M), save_rstd, weight, coef, gw, gb)
    dx = _like(x, cl)
    TL.launch(apply, ((x.size + BLOCK - 1) // BLOCK,), dy, x, save_mean, coef, dx, C, HW, x.size)
    return dx, gw, gb


def _packed_as(a, cl: bool) -> bool:
    """Whether `_packed(a, cl)` would return `a` itself."""
    return _has_strides(a, channels_last_strides(a.shape)) if cl else a.flags.c_contiguous


def _backward_plan(dy, x, cl, weight, bias, save_mean, save_rstd) -> tuple:
    """`backward`'s plan for packed `dy`, `x`: as `_forward_plan`'s, with the reduce, finalize and apply
    kernels."""
    C, HW, M, S, chunk = _geometry(x, cl)
    if not cl and _onchip(C, M):
        key = (dy.dtype, x.dtype, save_mean.dtype, save_rstd.dtype, _dt(weight), _dt(bias), onchip_block(M))
        return True, False, C, HW, M, S, chunk, _kernel(_bn_bwd_onchip, key, lambda: bwd_onchip_signature(*key)), \
            None, None
    if cl:
        red = _kernel(_bn_bwd_reduce_cl, (dy.dtype, x.dtype, save_mean.dtype),
                      lambda: bwd_reduce_cl_signature(dy.dtype, x.dtype, save_mean.dtype))
    else:
        red = _kernel(_bn_bwd_reduce, (dy.dtype, x.dtype, save_mean.dtype), lambda: (
            {"DY": _ty(dy), "X": _ty(x), "MEAN": _ty(save_mean), "PART": "*fp32", "C": "i32", "HW": "i32",
             "M": "i32", "chunk": "i32", "BLOCK": "constexpr"}, dict(BLOCK=BLOCK), NUM_WARPS))
    gw_dt = None if weight is None else weight.dtype
    gb_dt = None if bias is None else bias.dtype
    fin = _kernel(_bn_bwd_finalize, (save_rstd.dtype, _dt(weight), gw_dt, gb_dt), lambda: (
        {"PART": "*fp32", "S": "i32", "C": "i32", "M": "fp32", "RSTD": _ty(save_rstd), "W": _ty(weight),
         "COEF": "*fp32", "GW": _ptr(gw_dt), "GB": _ptr(gb_dt), "HAS_W": "constexpr", "HAS_B": "constexpr",
         "BLOCK_C": "constexpr"}, dict(HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_C=BLOCK_C), 4))
    apply = _kernel(_bn_bwd_apply, (dy.dtype, x.dtype, save_mean.dtype, cl),
                    lambda: bwd_apply_signature(dy.dtype, x.dtype, save_mean.dtype, cl))
    return False, cl, C, HW, M, S, chunk, red, fin, apply


def _ptr(dtype) -> str:
    return "*" + ("fp32" if dtype is None else TL.type_of(dtype))


def fwd_onchip_signature(x, weight, bias, rm, rv, block: int) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_fwd_onchip` for these dtypes (None: absent) and block."""
    return ({"X": _ptr(x), "Y": _ptr(x), "MEAN": "*fp32", "RSTD": "*fp32", "W": _ptr(weight), "B": _ptr(bias),
             "RM": _ptr(rm), "RV": _ptr(rv), "C": "i32", "HW": "i32", "M": "i32", "momentum": "fp32", "eps": "fp32",
             "HAS_W": "constexpr", "HAS_B": "constexpr", "HAS_RUN": "constexpr", "BLOCK_M": "constexpr"},
            dict(HAS_W=weight is not None, HAS_B=bias is not None, HAS_RUN=rm is not None, BLOCK_M=block),
            onchip_warps(block))


def bwd_onchip_signature(dy, x, mean, rstd, weight, bias, block: int) -> tuple:
    """(signature, constexprs, num_warps) of `_bn_bwd_onchip` for these dtypes (None: absent) and block;
    the parameter gradients take their parameters' dtypes."""
    return ({"DY": _ptr(dy), "X": _ptr(x), "MEAN": _ptr(mean), "RSTD": _ptr(rstd), "W": _ptr(weight), "DX": _ptr(x),
             "GW": _ptr(weight), "GB": _ptr(bias), "C": "i32", "HW": "i32", "M": "i32", "HAS_W": "constexpr",
             "HAS_B": "constexpr", "BLOCK_M": "constexpr"},
            dict(HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_M=block), onchip_warps(block))


