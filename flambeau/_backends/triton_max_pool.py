"""Max pooling (1-d, 2-d, 3-d) on cuda as Triton kernels launched through CuPy (`triton_launch`),
with PyTorch's indices: one launch forward, one launch backward.

Every pooling runs as a 3-d one over the planes (n, c) of an input of any strides (contiguous,
channels-last, sliced): a 1-d or 2-d pooling gets leading spatial dims of size 1 with kernel 1,
stride 1, no padding and dilation 1. Indices are flat in the plane, (d * H + h) * W + w, int64; the
outputs are contiguous (N, C, *out). Offsets are int32: `supported` refuses an input or output that
does not fit.

Outputs come in one of two element orders (constexpr `CL`): (N, C, *S) contiguous, or channels-last
(N, *S, C) contiguous, C fastest, for a channels-last input (`channels_last=True`, as PyTorch keeps the
input's memory format): then consecutive programs' lanes read consecutive channels, coalesced, and the
caller needs no conversion copy (a compiled channels-last ResNet-50's max-pool forward took 0.80 ms
reading NHWC in NCHW order on the H100, 0.22 ms on NCHW input, and two copies after it 1.2 ms).

- `_max_pool_fwd`: one program per BLOCK outputs. Each walks its window in (d, h, w) order from
  -inf at the window's first position inside the input (the start moved past the padding by whole
  dilations), and takes a value when it is greater than the running max or NaN: PyTorch's CUDA (and
  CPU) rule, so ties keep the first position and the last NaN wins. Values are compared in float32
  (float64 for float64), as ATen's accscalar_t, and stored back exactly.
- `_max_pool_bwd`: one program per BLOCK input elements, contiguous (N, C, *S). Each visits the
  outputs whose windows may cover it (per dim from PyTorch's p_start to p_end, at most
  ((k - 1) * d) // s + 1 of them) and adds the gradient of those whose saved index is its position,
  in float32 (float64 for float64) in ascending output order, as ATen's max_pool_backward_nchw: a
  gather, so no atomics, no zero fill, and the same sums.
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

BLOCK = 512               # outputs (forward) or input elements (backward) per program
NUM_WARPS = 4
MAX_OFFSET = 2**31 - 1    # offsets and sizes are int32
_DTYPES = frozenset(np.dtype(n) for n in ("float16", "float32", "float64")) | {np.dtype(ml_dtypes.bfloat16)}
_INT64 = np.dtype(np.int64)


@triton.jit
def _first_inside(start, dil):
    """A window's first position inside the input along one dim: `start` moved up by whole dilations
    while negative (ATen's `while (hstart < 0) hstart += dilation`)."""
    return tl.where(start < 0, start + ((dil - 1 - start) // dil) * dil, start)


@triton.jit
def _max_pool_fwd(X, Y, IDX, C, D, H, W, OD, OH, OW, sxn, sxc, sxd, sxh, sxw, KD, KH, KW, st_d, st_h, st_w,
                  pd_d, pd_h, pd_w, dl_d, dl_h, dl_w, n, ACC: tl.constexpr, BLOCK: tl.constexpr,
                  CL: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    if CL:                   # outputs (N, OD, OH, OW, C) in memory
        c = o % C
        t = o // C
    else:                    # outputs (N, C, OD, OH, OW) in memory
        t = o
    ow = t % OW
    t = t // OW
    oh = t % OH
    t = t // OH
    od = t % OD
    t = t // OD
    if CL:
        base = t * sxn + c * sxc
    else:
        base = (t // C) * sxn + (t % C) * sxc
    d0 = od * st_d - pd_d
    h0 = oh * st_h - pd_h
    w0 = ow * st_w - pd_w
    best = (_first_inside(d0, dl_d) * H + _first_inside(h0, dl_h)) * W + _first_inside(w0, dl_w)
    top = tl.full((BLOCK,), float("-inf"), ACC)
    for kd in range(0, KD):
        d = d0 + kd * dl_d
        okd = m & (d >= 0) & (d < D)
        for kh in range(0, KH):
            h = h0 + kh * dl_h
            okh = okd & (h >= 0) & (h < H)
            for kw in range(0, KW):
                w = w0 + kw * dl_w
                ok = okh & (w >= 0) & (w < W)
                v = tl.load(X + base + d * sxd + h * sxh + w * sxw, mask=ok, other=float("-inf")).to(ACC)
                take = ok & ((v > top) | (v != v))
                top = tl.where(take, v, top)
                best = tl.where(take, (d * H + h) * W + w, best)
    tl.store(Y + o, top.to(Y.dtype.element_ty), mask=m)
    tl.store(IDX + o, best.to(tl.int64), mask=m)


@triton.jit
def _window_range(pos, pad, extent, st, out):
    """[first, end) of the outputs whose windows (of `extent` = (k - 1) * d + 1 positions) may cover
    input position `pos` along one dim (ATen's p_start/p_end)."""
    q = pos + pad - extent
    return tl.where(q < 0, 0, q // st + 1), tl.minimum((pos + pad) // st + 1, out)


@triton.jit
def _max_pool_bwd(G, IDX, DX, C, D, H, W, OD, OH, OW, sgn, sgc, sgd, sgh, sgw, sin, sic, sid, sih, siw,
                  ext_d, ext_h, ext_w, st_d, st_h, st_w, pd_d, pd_h, pd_w, cand_d, cand_h, cand_w, n,
                  ACC: tl.constexpr, BLOCK: tl.constexpr, CL: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if CL:                   # the input gradient (N, D, H, W, C) in memory
        c = i % C
        t = i // C
    else:                    # (N, C, D, H, W)
        t = i
    w = t % W
    t = t // W
    h = t % H
    t = t // H
    d = t % D
    t = t // D
    if CL:
        nn = t
    else:
        nn = t // C
        c = t % C
    gbase = nn * sgn + c * sgc
    ibase = nn * sin + c * sic
    target = ((d * H + h) * W + w).to(tl.int64)
    d_lo, d_hi = _window_range(d, pd_d, ext_d, st_d, OD)
    h_lo, h_hi = _window_range(h, pd_h, ext_h, st_h, OH)
    w_lo, w_hi = _window_range(w, pd_w, ext_w, st_w, OW)
    acc = tl.zeros((BLOCK,), ACC)
    for a in range(0, cand_d):
        od = d_lo + a
        okd = m & (od < d_hi)
        for b in range(0, cand_h):
            oh = h_lo + b
            okh = okd & (oh < h_hi)
            for e in range(0, cand_w):
                ow = w_lo + e
                ok = okh & (ow < w_hi)
                at = ibase + od * sid + oh * sih + ow * siw
                hit = ok & (tl.load(IDX + at, mask=ok, other=-1) == target)
                g = tl.load(G + gbase + od * sgd + oh * sgh + ow * sgw, mask=hit, other=0.0)
                acc += g.to(ACC)
    tl.store(DX + i, acc.to(DX.dtype.element_ty), mask=m)


def _dims5(shape, strides, nd):
    """(sizes, element strides) of an (N, C, *S) or (C, *S) array as (N, C, D, H, W): missing leading
    dims of size 1 and stride 0."""
    lead = 2 - (len(shape) - nd)
    pad = 3 - nd
    sizes = (1,) * lead + tuple(shape[:len(shape) - nd]) + (1,) * pad + tuple(shape[len(shape) - nd:])
    st = (0,) * lead + tuple(strides[:len(shape) - nd]) + (0,) * pad + tuple(strides[len(shape) - nd:])
    return sizes, st


def _fits(a) -> bool:
    """Every element offset of CuPy/NumPy array `a` (any non-negative strides) and its size fit int32."""
    return a.size <= MAX_OFFSET and all(s >= 0 for s in a.strides) and \
        sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize <= MAX_OFFSET


def supported(x, nd: int, out: tuple) -> bool:
    """Whether CuPy array `x`, (N, C, *S) or (C, *S) with `nd` spatial dims, can be max-pooled here to
    spatial size `out`."""
    return x.dtype in _DTYPES and 1 <= nd <= 3 and x.ndim in (nd + 1, nd + 2) and x.size > 0 and _fits(x) \
        and all(s % x.itemsize == 0 for s in x.strides) \
        and int(np.prod(x.shape[:x.ndim - nd])) * int(np.prod(out)) <= MAX_OFFSET


def _pad3(v, fill):
    return (fill,) * (3 - len(v)) + tuple(v)


_kernels: dict = {}     # (kernel, dtype, device) -> compiled kernel: a launch builds no signature


def _kernel(fn, dtype, signature, cl: bool = False):
    """The compiled `fn` for storage `dtype` and element order `cl` (channels-last); `signature(dtype, cl)` ->
    (signature, constexprs) on the first use."""
    full = (fn, dtype, cl, TL.current_device())
    k = _kernels.get(full)
    if k is None:
        sig, const = signature(dtype, cl)
        k = _kernels[full] = TL.compile_kernel(fn, sig, const, num_warps=NUM_WARPS, num_stages=1)
    return k


def _acc(dtype):
    """The arithmetic type of a storage dtype (ATen's accscalar_t)."""
    return tl.float64 if dtype == np.float64 else tl.float32


def _ints(names: str) -> dict:
    return {n: "i32" for n in names.split()}


FWD_INTS = "C D H W OD OH OW sxn sxc sxd sxh sxw KD KH KW st_d st_h st_w pd_d pd_h pd_w dl_d dl_h dl_w n"
BWD_INTS = ("C D H W OD OH OW sgn sgc sgd sgh sgw sin sic sid sih siw ext_d ext_h ext_w st_d st_h st_w "
            "pd_d pd_h pd_w cand_d cand_h cand_w n")


def forward_signature(dtype, cl: bool = False) -> tuple:
    """(signature, constexprs) of `_max_pool_fwd` for an input of NumPy `dtype`, outputs channels-last if `cl`."""
    t = "*" + TL.type_of(dtype)
    return ({"X": t, "Y": t, "IDX": "*i64", **_ints(FWD_INTS), "ACC": "constexpr", "BLOCK": "constexpr",
             "CL": "constexpr"}, dict(ACC=_acc(dtype), BLOCK=BLOCK, CL=bool(cl)))


def backward_signature(dtype, cl: bool = False) -> tuple:
    """(signature, constexprs) of `_max_pool_bwd` for an output gradient of NumPy `dtype`, the input
    gradient channels-last if `cl`."""
    t = "*" + TL.type_of(dtype)
    return ({"G": t, "IDX": "*i64", "DX": t, **_ints(BWD_INTS), "ACC": "constexpr", "BLOCK": "constexpr",
             "CL": "constexpr"}, dict(ACC=_acc(dtype), BLOCK=BLOCK, CL=bool(cl)))


def forward_args(shape, strides, nd, out, ks, st, pd, dl) -> tuple:
    """The integer arguments of `_max_pool_fwd` (after X, Y, IDX) for an input of `shape` and element
    `strides` pooled to spatial size `out`."""
    (_, C, D, H, W), sx = _dims5(shape, strides, nd)
    n = int(np.prod(shape[:len(shape) - nd])) * int(np.prod(out))
    return (C, D, H, W) + _pad3(out, 1) + sx + _pad3(ks, 1) + _pad3(st, 1) + _pad3(pd, 0) + _pad3(dl, 1) + (n,)


def backward_args(shape, g_strides, i_strides, nd, out, ks, st, pd, dl) -> tuple:
    """The integer arguments of `_max_pool_bwd` (after G, IDX, DX) for an input of `shape` whose
    output gradient and indices, of spatial size `out`, have element strides `g_strides`, `i_strides`."""
    (_, C, D, H, W), _s = _dims5(shape, (0,) * len(shape), nd)
    sg = _dims5(tuple(shape[:len(shape) - nd]) + tuple(out), g_strides, nd)[1]
    si = _dims5(tuple(shape[:len(shape) - nd]) + tuple(out), i_strides, nd)[1]
    ext = tuple((k - 1) * d + 1 for k, d in zip(ks, dl))
    cand = tuple((e - 1) // s + 1 for e, s in zip(ext, st))
    return (C, D, H, W) + _pad3(out, 1) + sg + si + _pad3(ext, 1) + _pad3(st, 1) + _pad3(pd, 0) + \
        _pad3(cand, 1) + (int(np.prod(shape)),)


def _elements(a):
    return tuple(s // a.itemsize for s in a.strides)


def _channels_last_empty(shape, dtype):
    """An uninitialised CuPy array of (N, C, *S) `shape` packed channels-last: a view of (N, *S, C)."""
    nd = len(shape) - 2
    packed = cupy.ndarray((shape[0],) + tuple(shape[2:]) + (shape[1],), dtype)
    return packed.transpose((0, nd + 1) + tuple(range(1, nd + 1)))


def forward(x, nd: int, out: tuple, ks, st, pd, dl, channels_last: bool = False):
    """(values, indices) of max pooling CuPy array `x` ((N, C, *S) or (C, *S), any strides) to spatial
    size `out`; both contiguous, or packed channels-last with `channels_last` (batched input only),
    indices int64 and flat in each plane."""
    shape = tuple(x.shape[:x.ndim - nd]) + tuple(out)
    cl = bool(channels_last) and x.ndim == nd + 2 and nd >= 2
    empty = _channels_last_empty if cl else cupy.ndarray
    y, idx = empty(shape, x.dtype), empty(shape, _INT64)
    k = _kernel(_max_pool_fwd, x.dtype, forward_signature, cl)
    args = forward_args(x.shape, _elements(x), nd, out, ks, st, pd, dl)
    TL.launch(k, (-(-args[-1] // BLOCK),), x, y, idx, *args)
    return y, idx


def backward_supported(grad, indices, size: tuple, nd: int) -> bool:
    """Whether `backward` takes CuPy `grad` and `indices` (the pooling's output shape) for an input of `size`."""
    return grad.dtype in _DTYPES and indices.dtype == _INT64 and grad.shape == indices.shape and \
        len(size) in (nd + 1, nd + 2) and 0 < int(np.prod(size)) <= MAX_OFFSET and _fits(grad) and _fits(indices) \
        and all(s % grad.itemsize == 0 for s in grad.strides) and all(s % 8 == 0 for s in indices.strides)


def backward(grad, indices, size: tuple, nd: int, ks, st, pd, dl, channels_last: bool = False):
    """The gradient (contiguous, or packed channels-last with `channels_last` for a batched input; `size`,
    grad's dtype) of max pooling's input from CuPy `grad` and the saved `indices` (any strides)."""
    cl = bool(channels_last) and len(size) == nd + 2 and nd >= 2
    dx = (_channels_last_empty if cl else cupy.ndarray)(tuple(size), grad.dtype)
    k = _kernel(_max_pool_bwd, grad.dtype, backward_signature, cl)
    args = backward_args(tuple(size), _elements(grad), _elements(indices), nd, grad.shape[len(size) - nd:], ks, st,
                         pd, dl)
    TL.launch(k, (-(-args[-1] // BLOCK),), grad, indices, dx, *args)
    return dx
