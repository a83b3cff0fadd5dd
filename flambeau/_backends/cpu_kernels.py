"""float32 kernels for the CPU, in C++ (`cpu_kernels.cpp`), loaded with ctypes.

- `matmul(a, b, out=None)`: `np.matmul` for 2-D and batched (broadcast) float32 operands, through a
  packed AVX-512 GEMM (12x32 register tile, one OpenMP fork/join per product). NumPy's OpenBLAS
  reaches ~60% of this machine's float32 peak on the shapes networks use (64x256x256 linear
  layers); this kernel reaches 85-98% on one core.
- `gemm_plan(a_layout, b_layout)`: the same product planned once for fixed shapes and layouts (the
  compiled graphs' matrix-product externs): a call passes the two arrays as objects and gets the
  result, without the ~10 us of checks and argument conversion that `matmul` spends per call.
- `matmul_bf16(a, b)`: bfloat16 products on AVX-512 BF16 dot products (float accumulation) where the
  CPU has them (`bf16_native()`); elsewhere callers compute bfloat16 products in float32.
- `conv2d`: convolution as an implicit GEMM (B panels packed straight from the input, no column
  buffer); with few output channels, direct (16 output columns by all channels in registers).
- `softmax_lastdim`: softmax / log_softmax in one pass per row.
- `zero_where_negative`: ReLU's select (forward and backward) in one pass.
- `batched_outer`: products over an inner size of 1 (`matmul`'s (..., M, 1) @ (..., 1, N)) in one pass.
- `conv2d_weight_grad`: a grouped convolution's weight gradient (vmap's per-example gradients: the
  examples are the groups), per group without a column buffer.
- `max_pool2d`: max pooling with indices, one pass per window (ATen's tie and NaN rules);
  `avg_pool2d_int8`: average pooling of uint8/int8 integers with PyTorch's quantized rounding;
  `plane_scatter_add`: its backward, float32 additions in ATen's order.
- `ce_forward`, `ce_backward`: cross-entropy over class-index targets of 2-D float32 logits (no class
  weight, no label smoothing), one pass per row each way.
- `layer_norm`, `layer_norm_backward`: LayerNorm over the last dims of contiguous float32/float64
  rows (native_layer_norm and its backward, output mask included), one pass per row each way.
- `adam_step`: one Adam/AdamW update, bit for bit the NumPy rule of flambeau/optim/adam.py.

The library is built once by the system C++ compiler through `flambeau._cpp_builder` (and its
on-disk cache). Without a compiler, without AVX-512, or with `FLAMBEAU_GEMM=0`, every entry point
declines (returns None/False, or calls `np.matmul`) and the caller's NumPy code runs instead.
"""
from __future__ import annotations

import ctypes
import math
import os

import numpy as np

from .. import _cpp_builder, _dtype as D
from . import cpp_headers

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(D.bfloat16.np)
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_kernels.cpp")
_state: dict = {}
# Below this many multiply-adds a product runs on one thread (waking the OpenMP team costs more).
PARALLEL_MACS = 1 << 20
# Below this many multiply-adds NumPy's call is cheaper than ours (packing dominates).
MIN_MACS = 1 << 19
# A batch of products this small each (attention's 32x32 by 32x16 per head) goes to NumPy's BLAS
# whatever the batch: OpenBLAS multiplies such small matrices without packing them, 2-7x faster per
# item than our packed kernel (one thread; bench/cpu_models.py's small GPT).
SMALL_ITEM_MACS = 1 << 16
# Likewise a batch of products of at most this many rows each (per-example convolution weight
# gradients under vmap: 64 x 16x121 by 121x72): our 12-row tiles run a third empty and each item is
# packed alone; NumPy's BLAS was 2.5-4x faster on such batches (one thread, process CPU time).
SMALL_ITEM_ROWS = 16
# A convolution with at most this many output channels (and column stride 1) runs direct
# (`flm_conv2d_direct`: no column panels, one accumulator register per output channel); with more, the
# implicit GEMM's packing is shared by enough channels to pay.
DIRECT_CONV_MAX_O = 16
# A planned product's integers, in the order of flm_sgemm_planned's PLAN_* enum.
PLAN_FIELDS = ("batch", "M", "N", "K", "a_offset", "a_batch_stride", "a_row_stride", "a_col_stride", "b_offset",
               "b_batch_stride", "b_row_stride", "b_col_stride", "c_batch_stride", "c_row_stride", "threads",
               "data_offset")
PLAN_THREADS = PLAN_FIELDS.index("threads")
NR = 32                 # the GEMM's panel width (cpu_kernels.cpp's NR): packed operands are padded to it
ALIGN_FLOATS = 16       # packed panels are read as 64-byte vectors


def array_data_offset() -> int | None:
    """Where a NumPy array object holds its data pointer (`PyArrayObject_fields.data`, right after
    the object header), checked on live arrays and views; None where that does not hold. C code
    given an array as a `ctypes.py_object` reads its data there (compiled kernels, planned GEMMs)."""
    off = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
    base = np.arange(8, dtype=np.float32)
    for a in (base, base[3:], base[::-2], base.reshape(2, 4).T):
        if ctypes.c_void_p.from_address(id(a) + off).value != a.ctypes.data:
            return None
    return off


DATA_OFFSET = array_data_offset()
_VOID_AT = ctypes.c_void_p.from_address


def ptr(a) -> int | None:
    """The address of NumPy array `a`'s data (`a.ctypes.data`; NULL as None): read at DATA_OFFSET in the array
    object, ~0.2 us where `.ctypes.data` builds a helper object (~1-2 us); a small op passes 2-6 of them."""
    if DATA_OFFSET is None:
        return a.ctypes.data
    return _VOID_AT(id(a) + DATA_OFFSET).value


def _load():
    """The ctypes function, or None when the kernel can't be used here (decided once)."""
    if "fn" in _state:
        return _state["fn"]
    fn = None
    if os.environ.get("FLAMBEAU_GEMM", "1") not in ("", "0"):
        try:
            info = dict(_cpp_builder.detect_flags())
            info["flags"] = list(info["flags"]) + ["-ffp-contract=fast"] + \
                (["-DFLM_SIMD_MATH"] if info.get("simd_math") else [])
            with open(_SRC) as f:
                lib, _ = _cpp_builder.load(cpp_headers.with_headers(f.read()), info)
            if lib.flm_gemm_native():
                fn = lib.flm_sgemm
                i64, p = ctypes.c_int64, ctypes.c_void_p
                fn.argtypes = [i64, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, p, i64, i64,
                               ctypes.c_int, ctypes.c_int]
                fn.restype = None
                _state["threads"] = int(lib.flm_gemm_threads())
                _state["lib"] = lib
                _state["sgemm_packed"], _state["pack_b"] = lib.flm_sgemm_packed, lib.flm_pack_b
                lib.flm_packed_b_floats.restype = ctypes.c_int64
                if lib.flm_packed_b_floats(ctypes.c_int64(1), ctypes.c_int64(1)) != NR:
                    raise RuntimeError("cpu_kernels.NR differs from cpu_kernels.cpp's panel width")
                conv = lib.flm_conv2d
                conv.argtypes = [i64] * 15 + [p, p, p, p, ctypes.c_int]
                conv.restype = None
                _state["conv2d"] = conv
                direct = lib.flm_conv2d_direct
                direct.argtypes = conv.argtypes
                direct.restype = ctypes.c_int
                _state["conv2d_direct"] = direct
                sm = lib.flm_softmax_f32
                sm.argtypes = [i64, i64, p, p, ctypes.c_int, ctypes.c_int]
                sm.restype = None
                _state["softmax"] = sm
                cf = lib.flm_ce_forward_f32
                cf.argtypes = [i64, i64, p, p, p, ctypes.c_int]
                cf.restype = None
                _state["ce_forward"] = cf
                cb = lib.flm_ce_backward_f32
                cb.argtypes = [i64, i64, p, p, p, p, p, ctypes.c_int]
                cb.restype = None
                _state["ce_backward"] = cb
                sa = lib.flm_plane_scatter_add_f32
                sa.argtypes = [i64, i64, i64, p, p, p]
                sa.restype = i64
                _state["plane_scatter_add"] = sa
                for suffix, dt in (("f32", _F32), ("f64", np.dtype(np.float64))):
                    zw = getattr(lib, "flm_zero_where_negative_" + suffix)
                    zw.argtypes = [i64, p, p, p, ctypes.c_int, ctypes.c_int]
                    zw.restype = None
                    _state["zero_where_negative", dt] = zw
                bo = lib.flm_batched_outer_f32
                bo.argtypes = [i64, i64, i64, p, i64, i64, p, i64, i64, p, ctypes.c_int]
                bo.restype = None
                _state["batched_outer"] = bo
                wg = lib.flm_conv2d_weight_grad_f32
                wg.argtypes = [i64] * 14 + [p, p, p, ctypes.c_int]
                wg.restype = None
                _state["conv2d_weight_grad"] = wg
                for dt, name in ((_F32, "flm_max_pool2d_f32"), (np.dtype(np.uint8), "flm_max_pool2d_u8")):
                    mp = getattr(lib, name)
                    mp.argtypes = [i64] * 11 + [p, p, p, ctypes.c_int]
                    mp.restype = None
                    _state["max_pool2d", dt] = mp
                ap = lib.flm_avg_pool2d_int8
                ap.argtypes = [ctypes.c_int] + [i64] * 4 + [p] * 10 + [ctypes.c_int32, ctypes.c_int, ctypes.c_int]
                ap.restype = None
                _state["avg_pool2d_int8"] = ap
                for suffix, dt in (("f32", _F32), ("f64", np.dtype(np.float64))):
                    lf = getattr(lib, "flm_layer_norm_" + suffix)
                    o = ctypes.py_object
                    lf.argtypes = [i64, i64, o, o, o, ctypes.c_double, o, o, o, i64, ctypes.c_int, ctypes.c_int]
                    lf.restype = None
                    lb = getattr(lib, "flm_layer_norm_backward_" + suffix)
                    lb.argtypes = [i64, i64] + [o] * 9 + [i64, ctypes.c_int, ctypes.c_int]
                    lb.restype = None
                    _state["layer_norm", dt] = lf
                    _state["layer_norm_backward", dt] = lb
                ad = lib.flm_adam_f32
                f = ctypes.c_float
                ad.argtypes = [i64, p, p, p, p, p] + [f] * 8 + [ctypes.c_int]
                ad.restype = None
                _state["adam"] = ad
                if lib.flm_gemm_bf16_native():
                    bf = lib.flm_gemm_bf16
                    bf.argtypes = [i64, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, p, p, ctypes.c_int]
                    bf.restype = None
                    _state["bf16"] = bf
                pp = lib.flm_sgemm_packed_planned
                pp.argtypes = [p, ctypes.py_object, p, ctypes.py_object]
                pp.restype = None
                _state["packed_planned"] = pp
                lib.flm_pack_b.argtypes = [i64, i64, p, i64, i64, p]
                lib.flm_pack_b.restype = None
                planned = lib.flm_sgemm_planned
                planned.argtypes = [p, ctypes.py_object, ctypes.py_object, ctypes.py_object]
                planned.restype = None
                _state["planned"] = planned if lib.flm_plan_size() == len(PLAN_FIELDS) else None
                _state["pid"] = os.getpid()
        except Exception:       # no compiler, no OpenMP, ...: NumPy's BLAS serves
            fn = None
    _state["fn"] = fn
    return fn


def available() -> bool:
    return _load() is not None


def _threads(macs: int) -> int:
    """OpenMP threads for a product of `macs` multiply-adds: one below PARALLEL_MACS, and one in a
    forked child (libgomp's thread pool does not survive fork; a parallel region there would hang)."""
    if macs < PARALLEL_MACS or _state["pid"] != os.getpid():
        return 1
    return _state["threads"]


def _strides(x):
    return tuple(s // 4 for s in x.strides)


def gemm_is_outer(a, b) -> bool:
    """PyTorch's CPU GEMM (a product `mm` or a folded `matmul` with a 2-D right operand) over an
    inner size of 1 with M, N >= 2 stores the exact products a[i] * b[j]: a -0.0 product stays
    -0.0, where a sum started from +0.0 (NumPy, our kernel; PyTorch's own matrix-vector and bmm
    paths) gives +0.0. Floating operands only (integers have no signed zero)."""
    return (b.ndim == 2 and a.ndim >= 2 and a.shape[-1] == 1 and b.shape[0] == 1 and b.shape[1] >= 2
            and a.size >= 2 and a.dtype.kind == "f")


def bf16_native() -> bool:
    """Whether bfloat16 products run on AVX-512 BF16 dot products here (`matmul_bf16`)."""
    return _load() is not None and "bf16" in _state


def matmul_bf16(a, b, bias=None):
    """a @ b (+ bias, a float32 or bfloat16 vector added to the float sums before the one rounding) of
    bfloat16 arrays (2-D by 2-D, or 3-D by 3-D of one batch size) as a bfloat16 array, accumulated in
    float by `flm_gemm_bf16`; None where that does not apply (the caller computes in float32, as
    PyTorch's fallback)."""
    if not bf16_native() or a.dtype != _BF16 or b.dtype != _BF16 or a.ndim != b.ndim or a.ndim not in (2, 3):
        return None
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = a.shape[0] if a.ndim == 3 else None
    if b.shape[-2] != K or (batch is not None and b.shape[0] != batch) or min(M, N, K) < 2 or \
            not _uses_kernel(batch, M, N, K):
        return None
    sa, sb = tuple(s // 2 for s in a.strides), tuple(s // 2 for s in b.strides)
    items = batch or 1
    out = np.empty(a.shape[:-2] + (M, N), _BF16)
    work = np.empty(out.shape, _F32)
    _state["bf16"](items, M, N, K, ptr(a), sa[0] if batch else 0, sa[-2], sa[-1],
                   ptr(b), sb[0] if batch else 0, sb[-2], sb[-1], ptr(work), ptr(out),
                   _threads(items * M * N * K))
    if bias is not None:
        work += bias.astype(_F32, copy=False)
        return work.astype(_BF16)          # round to nearest even, once
    return out


def matmul(a, b, out=None):
    """`np.matmul(a, b, out=out)` for NumPy arrays, through our kernel when it applies."""
    if gemm_is_outer(a, b):
        return np.multiply(a, b, out=out)
    if a.shape[-1] == 1 and a.ndim >= 2 and b.ndim >= 2 and a.dtype.kind == "f" and a.dtype == b.dtype \
            and b.shape[-2] == 1 and (out is None or out.dtype == a.dtype):
        # a batched inner size of 1 (vmap's per-example outer products): the broadcast product, 4x
        # NumPy's matmul; + 0.0 makes a -0.0 product +0.0, as a sum started from zero (PyTorch's bmm)
        if out is None:
            r = batched_outer(a, b)
            if r is not None:
                return r
        r = np.multiply(a, b, out=out)
        return np.add(r, 0.0, out=r)
    fn = _state.get("fn", 0)
    if fn == 0:
        fn = _load()
    if fn is None or a.dtype != _F32 or b.dtype != _F32 or a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b, out=out)
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if b.shape[-2] != K or (out is not None and out.dtype != _F32):
        return np.matmul(a, b, out=out)
    batched = a.ndim > 2 or b.ndim > 2       # batched: the whole product's size decides
    if not _uses_kernel(max(math.prod(a.shape[:-2]), math.prod(b.shape[:-2])) if batched else None, M, N, K):
        return np.matmul(a, b, out=out)
    if a.ndim == 2 and b.ndim == 2:
        if out is None:
            out = np.empty((M, N), _F32)
        elif out.shape != (M, N) or out.strides[1] != 4 or np.may_share_memory(out, a) or np.may_share_memory(out, b):
            return np.matmul(a, b, out=out)
        sa, sb = a.strides, b.strides
        if (sa[0] | sa[1] | sb[0] | sb[1] | out.strides[0]) & 3:
            return np.matmul(a, b, out=out)
        fn(1, M, N, K, ptr(a), 0, sa[0] >> 2, sa[1] >> 2, ptr(b), 0, sb[0] >> 2, sb[1] >> 2,
           ptr(out), 0, out.strides[0] >> 2, 0, _threads(M * N * K))
        return out
    if b.ndim == 2 and out is None and a.flags.c_contiguous:
        # a C-contiguous stack of matrices times one matrix: one 2-D product over all their rows (ATen's fold)
        return matmul(a.reshape(-1, K), b).reshape(a.shape[:-1] + (N,))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if out is None:
        out = np.empty(batch + (M, N), _F32)
    elif (out.shape != batch + (M, N) or out.strides[-1] != 4 or np.may_share_memory(out, a)
          or np.may_share_memory(out, b)):
        return np.matmul(a, b, out=out)
    if any(s % 4 for s in a.strides + b.strides + out.strides):
        return np.matmul(a, b, out=out)
    ab = np.broadcast_to(a, batch + (M, K))
    bb = np.broadcast_to(b, batch + (K, N))
    a3, b3, c3 = _flat3(ab, batch), _flat3(bb, batch), _flat3(out, batch)
    if a3 is None or b3 is None or c3 is None:      # batch layout not one stride: item by item
        for idx in np.ndindex(*batch):
            matmul(ab[idx], bb[idx], out=out[idx])
        return out
    B = out.size // (M * N) if out.size else 0
    sa, sb = _strides(ab)[-2:], _strides(bb)[-2:]
    fn(B, M, N, K, ptr(ab), a3, sa[0], sa[1], ptr(bb), b3, sb[0], sb[1],
       ptr(out), c3, out.strides[-2] // 4, 0, _threads(B * M * N * K))
    return out


def zero_where_negative(x, v, inclusive: bool):
    """`where(x <= 0 if inclusive else x < 0, 0, v)` for C-contiguous float32/float64 arrays of one shape
    and dtype, as a fresh array in one pass; None where that does not apply."""
    if _load() is None or x.dtype != v.dtype or x.shape != v.shape or not x.flags.c_contiguous \
            or not v.flags.c_contiguous:
        return None
    fn = _state.get(("zero_where_negative", x.dtype))
    if fn is None:
        return None
    out = np.empty(x.shape, x.dtype)
    fn(x.size, ptr(x), ptr(v), ptr(out), int(inclusive), _threads(x.size * 4))
    return out


def batched_outer(a, b):
    """`a @ b` for float32 a (..., M, 1) and b (..., 1, N) with broadcast batch dims, in one pass of
    `flm_batched_outer_f32` into a fresh C-contiguous array (a -0.0 product is +0.0, as PyTorch's bmm);
    None where it does not apply (the caller computes it with NumPy)."""
    if _load() is None or a.dtype != _F32 or b.dtype != _F32 or a.ndim < 2 or b.ndim < 2 \
            or a.shape[-1] != 1 or b.shape[-2] != 1 or any(s % 4 for s in a.strides + b.strides):
        return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, N = a.shape[-2], b.shape[-1]
    ab, bb = np.broadcast_to(a, batch + (M, 1)), np.broadcast_to(b, batch + (1, N))
    a3, b3 = _flat3(ab, batch), _flat3(bb, batch)
    if a3 is None or b3 is None:
        return None
    out = np.empty(batch + (M, N), _F32)
    if out.size:
        _state["batched_outer"](out.size // (M * N), M, N, ptr(ab), a3, ab.strides[-2] // 4, ptr(bb),
                                b3, bb.strides[-1] // 4, ptr(out), _threads(out.size))
    return out


def _uses_kernel(batch: int | None, M: int, N: int, K: int) -> bool:
    """Whether `matmul` gives a float32 product of these sizes (batch None: 2-D) to our kernel."""
    macs = M * N * K
    if batch is not None:
        if macs < SMALL_ITEM_MACS or M <= SMALL_ITEM_ROWS:
            return False
        macs *= batch
    return macs >= MIN_MACS


def gemm_plan(a_layout, b_layout):
    """`fn(a, b) -> a @ b` for float32 arrays whose layouts are fixed: each layout is (shape,
    element strides, element offset) relative to the data pointer of the array `fn` will get (a
    view is described by its base's array and the view's strides and offset). 2-D by 2-D or 3-D
    by 3-D of one batch size; the result is a fresh C-contiguous array. None when `matmul` would
    not give the product to our kernel (sizes, an inner size of 1, no kernel here): the caller
    then calls `matmul` on views."""
    if _load() is None or DATA_OFFSET is None or _state["planned"] is None:
        return None
    (sa, sta, oa), (sb, stb, ob) = a_layout, b_layout
    if len(sa) != len(sb) or len(sa) not in (2, 3) or sa[-1] != sb[-2] or (len(sa) == 3 and sa[0] != sb[0]):
        return None
    M, K = sa[-2:]
    N = sb[-1]
    batch = sa[0] if len(sa) == 3 else None
    if min(M, N, K) < 2 or batch == 0 or not _uses_kernel(batch, M, N, K):
        return None
    out_shape = (M, N) if batch is None else (batch, M, N)
    items = batch or 1
    plan = np.array([items, M, N, K, oa, 0 if batch is None else sta[0], sta[-2], sta[-1],
                     ob, 0 if batch is None else stb[0], stb[-2], stb[-1],
                     M * N, N, _threads(items * M * N * K), DATA_OFFSET], np.int64)
    ptr, run, empty = plan.ctypes.data, _state["planned"], np.empty

    def planned_gemm(a, b):
        out = empty(out_shape, _F32)
        run(ptr, a, b, out)
        return out
    planned_gemm.plan = plan        # keeps the plan's memory alive with the function
    return planned_gemm


def gemm_plan_packed(a_layout, b: np.ndarray):
    """`fn(a) -> a @ b` for a constant 2-D float32 `b` (a frozen weight, any strides) packed into the
    GEMM's panels here, once; `a`'s layout is fixed as in `gemm_plan`. None where `gemm_plan` would
    not use the kernel."""
    if _load() is None or DATA_OFFSET is None or _state["planned"] is None:
        return None
    sa, sta, oa = a_layout
    if len(sa) != 2 or b.ndim != 2 or b.dtype != _F32 or sa[1] != b.shape[0]:
        return None
    (M, K), N = sa, b.shape[1]
    if min(M, N, K) < 2 or not _uses_kernel(None, M, N, K):
        return None
    packed = aligned_empty(K * ((N + NR - 1) // NR * NR))
    rsb, csb = _strides(b)
    _state["pack_b"](N, K, b.ctypes.data, rsb, csb, packed.ctypes.data)
    plan = np.array([1, M, N, K, oa, 0, sta[0], sta[1], 0, 0, 0, 0, M * N, N, _threads(M * N * K), DATA_OFFSET],
                    np.int64)
    ptr, bptr, run, empty = plan.ctypes.data, packed.ctypes.data, _state["packed_planned"], np.empty

    def packed_gemm(a):
        out = empty((M, N), _F32)
        run(ptr, a, bptr, out)
        return out
    packed_gemm.keep = (plan, packed)        # the plan's and the panels' memory live with the function
    return packed_gemm


def _flat3(x, batch):
    """One element stride that walks all batch dims of `x` in order, or None."""
    st = _strides(x)[:len(batch)]
    dims = [(d, s) for d, s in zip(batch, st) if d != 1]
    if not dims:
        return 0
    step = dims[-1][1]
    size = dims[-1][0]
    for d, s in reversed(dims[:-1]):
        if s != step * size:
            return None
        size *= d
    return step


def conv2d(x, w, bias, stride, pads, dilation, out_hw):
    """Float32 2-D convolution (groups=1) of contiguous NCHW `x` with OIHW `w` as one implicit-GEMM
    call (no column buffer); `pads` = ((top, bottom), (left, right)). None when the kernel can't
    take it (the caller then uses im2col + GEMM)."""
    if _load() is None or x.dtype != _F32 or w.dtype != _F32 or (bias is not None and bias.dtype != _F32):
        return None
    x = np.ascontiguousarray(x)
    w = np.ascontiguousarray(w)
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    OH, OW = out_hw
    y = np.empty((N, O, OH, OW), _F32)
    if y.size == 0:
        return y
    b = None if bias is None else np.ascontiguousarray(bias)
    args = (N, C, H, W, O, KH, KW, stride[0], stride[1], pads[0][0], pads[1][0], dilation[0], dilation[1], OH, OW,
            ptr(x), ptr(w), None if b is None else ptr(b), ptr(y),
            _threads(N * O * OH * OW * C * KH * KW))
    if O <= DIRECT_CONV_MAX_O and _state["conv2d_direct"](*args):
        return y
    _state["conv2d"](*args)
    return y


def conv2d_plan_packed(w: np.ndarray):
    """`fn(x, bias, stride, padding, dilation) -> y` for a constant float32 (O, C, KH, KW) weight `w` (a
    frozen weight) whose GEMM tiles are packed here, once (`flm_conv_pack_w`): each call runs
    `flm_conv2d_packed` on the NCHW float32 `x` (symmetric padding), where `conv2d` packs per call.
    None where the kernel is not built."""
    if _load() is None or w.dtype != _F32 or w.ndim != 4:
        return None
    lib = _state["lib"]
    if "conv2d_packed" not in _state:
        i64, p = ctypes.c_int64, ctypes.c_void_p
        lib.flm_conv_packed_w_floats.restype = i64
        lib.flm_conv_packed_w_floats.argtypes = [i64, i64]
        lib.flm_conv_pack_w.argtypes = [i64, i64, p, p]
        lib.flm_conv_pack_w.restype = None
        lib.flm_conv2d_packed.argtypes = [i64] * 15 + [p, p, p, p, ctypes.c_int]
        lib.flm_conv2d_packed.restype = None
        _state["conv2d_packed"] = lib.flm_conv2d_packed
    w = np.ascontiguousarray(w)
    O, C, KH, KW = w.shape
    packed = aligned_empty(int(lib.flm_conv_packed_w_floats(O, C * KH * KW)))
    lib.flm_conv_pack_w(O, C * KH * KW, ptr(w), ptr(packed))
    run, wptr = _state["conv2d_packed"], ptr(packed)

    def packed_conv(x, bias, stride, padding, dilation):
        x = np.ascontiguousarray(x, _F32)
        N, _, H, W = x.shape
        OH = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
        OW = (W + 2 * padding[1] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
        y = np.empty((N, O, OH, OW), _F32)
        if y.size:
            b = None if bias is None else np.ascontiguousarray(bias, _F32)
            run(N, C, H, W, O, KH, KW, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], OH, OW,
                ptr(x), wptr, None if b is None else ptr(b), ptr(y),
                _threads(N * O * OH * OW * C * KH * KW))
        return y
    packed_conv.keep = packed               # the packed tiles live with the function
    return packed_conv


def conv2d_weight_grad(x, gy, wshape, groups, stride, dilation):
    """The weight gradient (`wshape` = (O, C/groups, KH, KW)) of a float32 2-D convolution of the padded
    NCHW `x` with output gradient `gy`, group by group without a column buffer
    (`flm_conv2d_weight_grad_f32`); None when the kernel can't take it."""
    if _load() is None or x.dtype != _F32 or gy.dtype != _F32 or x.ndim != 4 or gy.ndim != 4:
        return None
    x, gy = np.ascontiguousarray(x), np.ascontiguousarray(gy)
    N, C, H, W = x.shape
    O, Cg, KH, KW = wshape
    OH, OW = gy.shape[2:]
    gw = np.empty(wshape, _F32)
    if gw.size:
        _state["conv2d_weight_grad"](N, groups, Cg, H, W, O // groups, KH, KW, stride[0], stride[1], dilation[0],
                                     dilation[1], OH, OW, ptr(x), ptr(gy), ptr(gw),
                                     _threads(N * O * OH * OW * Cg * KH * KW) if groups > 1 else 1)
    return gw


def max_pool2d(x, out_hw, ks, st, dl):
    """Max pooling with indices of a float32 or uint8 array (..., H, W) whose windows lie inside the plane:
    (values, int64 flat indices in the plane) of shape (..., *out_hw), or None when not handled."""
    if _load() is None or x.dtype not in (_F32, np.dtype(np.uint8)) or x.ndim < 2:
        return None
    x = np.ascontiguousarray(x)
    H, W = x.shape[-2:]
    OH, OW = out_hw
    y = np.empty(x.shape[:-2] + (OH, OW), x.dtype)
    idx = np.empty(y.shape, np.int64)
    if y.size:
        _state["max_pool2d", x.dtype](y.size // (OH * OW), H, W, OH, OW, ks[0], ks[1], st[0], st[1], dl[0], dl[1],
                             ptr(x), ptr(y), ptr(idx), _threads(y.size * ks[0] * ks[1] * 16))
    return y, idx


def avg_pool2d_int8(x, y, windows, zero_point: int, adaptive: bool = False) -> bool:
    """Average pooling of the uint8/int8 array x (N, C, H, W), any strides, into y (N, C, OH, OW), any
    strides, over integer windows ((h_start, h_len, h_div), (w_start, w_len, w_div), int64 arrays of OH /
    OW): PyTorch's quantized rounding, `adaptive` its adaptive_avg_pool2d's (`_ops/quantized_pool.py`).
    False when not handled here."""
    if _load() is None or x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)) or x.ndim != 4 or \
            y.dtype != x.dtype:
        return False
    N, C = x.shape[:2]
    OH, OW = y.shape[2:]
    xs = np.array([s // x.itemsize for s in x.strides], np.int64)
    ys = np.array([s // y.itemsize for s in y.strides], np.int64)
    tables = [np.ascontiguousarray(t, np.int64) for w in windows for t in w]
    if y.size:
        taps = int(tables[1].mean() * tables[4].mean()) if OH and OW else 1
        _state["avg_pool2d_int8"](int(x.dtype == np.int8), N, C, OH, OW, xs.ctypes.data, ys.ctypes.data, x.ctypes.data,
                                  y.ctypes.data, *[t.ctypes.data for t in tables], int(zero_point), int(adaptive),
                                  _threads(y.size * max(taps, 1) * 16))
    return True


def plane_scatter_add(g, idx, planes: int, P: int):
    """(planes, P) float32 zeros with each plane's `g` values added at its flat `idx` positions in
    order, in float32 (max pooling's backward, as ATen's loop); None when not handled here (another
    dtype, no kernel, an index outside its plane)."""
    if _load() is None or g.dtype != _F32 or idx.dtype != np.int64 or g.size != idx.size:
        return None
    g, idx = np.ascontiguousarray(g), np.ascontiguousarray(idx)
    out = np.empty((planes, P), _F32)
    if _state["plane_scatter_add"](planes, P, g.size // planes if planes else 0, ptr(g), ptr(idx),
                                   ptr(out)) >= 0:
        return None
    return out


def softmax_lastdim(x, log: bool):
    """softmax (or log_softmax) of a C-contiguous float32 array over its last dim, or None."""
    if _load() is None or x.dtype != _F32 or not x.flags.c_contiguous or x.ndim == 0 or x.size == 0:
        return None
    cols = x.shape[-1]
    y = np.empty_like(x)
    _state["softmax"](x.size // cols, cols, ptr(x), ptr(y), int(log), _threads(x.size * 8))
    return y


def _ce_operands(x, t) -> bool:
    return (type(x) is np.ndarray and x.dtype == _F32 and x.ndim == 2 and x.flags.c_contiguous and x.size > 0
            and type(t) is np.ndarray and t.dtype == np.int64 and t.shape == x.shape[:1] and t.flags.c_contiguous
            and _load() is not None)


def ce_forward(x, t):
    """The log-softmax at each row's target of a C-contiguous 2-D float32 array (`t`: int64 targets in
    range, one per row), as a float32 vector; None where the kernel does not take these operands."""
    if not _ce_operands(x, t):
        return None
    y = np.empty(x.shape[0], _F32)
    _state["ce_forward"](x.shape[0], x.shape[1], ptr(x), ptr(t), ptr(y), _threads(x.size * 8))
    return y


def ce_backward(x, t, a, b):
    """softmax(x) scaled by `a` per row, minus `b` per row at the targets `t` (float32 vectors): the
    gradient of cross-entropy over 2-D float32 logits; None where the kernel does not take the operands."""
    if not _ce_operands(x, t) or any(type(v) is not np.ndarray or v.dtype != _F32 or v.shape != t.shape
                                     or not v.flags.c_contiguous for v in (a, b)):
        return None
    g = np.empty_like(x)
    _state["ce_backward"](x.shape[0], x.shape[1], ptr(x), ptr(t), ptr(a), ptr(b),
                          ptr(g), _threads(x.size * 8))
    return g


def _ln_rows(x, cols, *others):
    """The row kernel for LayerNorm of `x` over its last `cols` elements: `x` and `others` (None or
    arrays of x's dtype) C-contiguous NumPy arrays, float32 or float64; None where it does not apply."""
    if type(x) is not np.ndarray or x.size == 0 or cols <= 0 or not x.flags.c_contiguous or DATA_OFFSET is None:
        return None
    fn = _state.get(("layer_norm", x.dtype), 0)
    if fn == 0:
        if _load() is None or ("layer_norm", x.dtype) not in _state:
            return None
        fn = _state["layer_norm", x.dtype]
    for o in others:
        if o is not None and (type(o) is not np.ndarray or o.dtype != x.dtype or not o.flags.c_contiguous):
            return None
    return fn


# which optional arrays a LayerNorm kernel call passes (cpu_kernels.cpp's LN_* bits)
LN_W, LN_B, LN_DX, LN_DW, LN_DB, LN_SCRATCH = 1, 2, 4, 8, 16, 32


def layer_norm(x, cols: int, w, b, eps: float):
    """(y, mean, rstd) of LayerNorm over the last `cols` elements of a C-contiguous float32/float64
    array (`w`, `b`: None or `cols` elements of x's dtype); mean and rstd flat, one per row. None where
    the kernel does not take these operands (the caller's NumPy path serves). Arrays go to C as
    objects (their data pointer read at DATA_OFFSET): `.ctypes.data` costs ~1 us each."""
    fn = _ln_rows(x, cols, w, b)
    if fn is None or (w is not None and w.size != cols) or (b is not None and b.size != cols):
        return None
    rows = x.size // cols
    y = np.empty_like(x)
    mean = np.empty(rows, x.dtype)
    rstd = np.empty(rows, x.dtype)
    has = (0 if w is None else LN_W) | (0 if b is None else LN_B)
    fn(rows, cols, x, x if w is None else w, x if b is None else b, eps, y, mean, rstd, DATA_OFFSET, has,
       _threads(x.size * 8))
    return y, mean, rstd


def layer_norm_backward(dy, x, cols: int, mean, rstd, w, output_mask=(True, True, True)):
    """(dx, dw, db) of LayerNorm over the last `cols` elements (PyTorch's native_layer_norm_backward
    on C-contiguous float32/float64 arrays of one dtype; `mean`, `rstd` one per row): an output is None
    where `output_mask` leaves it out (dw, db flat, `cols` long). None where the kernel does not take
    these operands."""
    if _ln_rows(x, cols, dy, mean, rstd, w) is None or dy.shape != x.shape or \
            mean.size * cols != x.size or rstd.size != mean.size or (w is not None and w.size != cols):
        return None
    rows = x.size // cols
    dx = np.empty_like(x) if output_mask[0] else None
    dw = np.empty(cols, x.dtype) if output_mask[1] else None
    db = np.empty(cols, x.dtype) if output_mask[2] else None
    if dx is None and dw is None and db is None:
        return None, None, None
    threads = _threads(x.size * 8)
    scratch = np.zeros((threads, 2 * cols), x.dtype) if threads > 1 and (dw is not None or db is not None) else None
    has = ((0 if w is None else LN_W) | (0 if dx is None else LN_DX) | (0 if dw is None else LN_DW)
           | (0 if db is None else LN_DB) | (0 if scratch is None else LN_SCRATCH))
    _state["layer_norm_backward", x.dtype](rows, cols, dy, x, mean, rstd, x if w is None else w, x if dx is None else dx,
                                           x if dw is None else dw, x if db is None else db,
                                           x if scratch is None else scratch, DATA_OFFSET, has, threads)
    return dx, dw, db


def adam_step(p, g, m, v, vmax, decay, wd, b1, b2, bc2_sqrt, eps, step_size) -> bool:
    """One Adam/AdamW update of float32 arrays in place (see flm_adam_f32); False when not handled.
    The scalars are rounded to float32 exactly as the NumPy rule's Python-float operands are."""
    if _load() is None:
        return False
    shape = p.shape
    for a in (p, g, m, v) if vmax is None else (p, g, m, v, vmax):     # a loop: this runs per parameter per step
        if a.dtype != _F32 or not a.flags.c_contiguous or a.shape != shape:
            return False
    if not (p.flags.writeable and m.flags.writeable and v.flags.writeable):
        return False
    _state["adam"](p.size, ptr(p), ptr(g), ptr(m), ptr(v),
                   None if vmax is None else ptr(vmax), decay, wd, 1 - b1, b2, 1 - b2, bc2_sqrt, eps,
                   step_size, _threads(p.size * 16))
    return True


def matmul_for(xp):
    """The matrix product of an array namespace: ours for NumPy, the namespace's own otherwise."""
    return matmul if xp is np else xp.matmul


def extern_pointers() -> dict | None:
    """{symbol: address} of the loaded library's functions that generated C++ calls directly (the C++
    wrapper, `flambeau._inductor.cpp_wrapper`): the GEMM and convolution with their packed-operand
    forms, and flm_gemm_bf16 where the CPU has AVX-512 BF16; None when unavailable."""
    if _load() is None:
        return None
    lib = _state["lib"]
    fns = {sym: getattr(lib, sym) for sym in ("flm_sgemm", "flm_conv2d", "flm_sgemm_packed", "flm_pack_b",
                                              "flm_packed_b_floats", "flm_conv2d_packed", "flm_conv_pack_w",
                                              "flm_conv_packed_w_floats")}
    if "bf16" in _state:
        fns["flm_gemm_bf16"] = _state["bf16"]
    return {sym: ctypes.cast(f, ctypes.c_void_p).value for sym, f in fns.items()}


def gemm_threads() -> int:
    """The threads the library's products may use (1 where it is unavailable)."""
    return _state["threads"] if _load() is not None else 1


def aligned_empty(n: int) -> np.ndarray:
    """An uninitialised float32 array of `n` elements whose data is 64-byte aligned (packed panels)."""
    raw = np.empty(n + ALIGN_FLOATS, _F32)
    skip = (-ptr(raw) % (4 * ALIGN_FLOATS)) // 4
    return raw[skip:skip + n]
