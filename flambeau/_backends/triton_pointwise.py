"""GELU (erf and tanh forms), SiLU and ReLU, forward and backward, on cuda as one Triton kernel each
(launched through CuPy by `triton_launch`) instead of a chain of CuPy ufuncs with temporaries.

Dense float32/bfloat16/float16 arrays of one layout (C-contiguous, or all channels-last, or any one
dense stride order: the kernels walk memory, the result takes the operands' strides); arithmetic in float32, results in the input's dtype.
tanh(u) is computed as 1 - 2 / (exp(2u) + 1) and sigmoid(x) as 1 / (1 + exp(-x)) (both saturate
cleanly at +-inf). ReLU keeps NaN and -0.0 (x < 0 ? 0 : x) and its gradient is PyTorch's
threshold_backward (x <= 0 ? 0 : grad).

`binary` is add/sub/mul/div of two float16/bfloat16 arrays of one shape and dtype (or one array and a
Python number) in one kernel: loaded, computed in float32 (division rounded to nearest), rounded
once to the storage type, as PyTorch's cuda kernels, instead of CuPy casting both operands up,
computing and casting the result down (four kernels, three of them copies). The same kernel takes a
float32 array with a half-precision one into a float32 result (CuPy: a cast copy, then the op).
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

GELU_ERF, GELU_TANH, SILU, RELU = 0, 1, 2, 3
KINDS = {("gelu", "none"): GELU_ERF, ("gelu", "tanh"): GELU_TANH, ("silu", None): SILU, ("relu", None): RELU}
BLOCK = 1024
NUM_WARPS = 4
SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
TANH_CUBIC = tl.constexpr(0.044715)
_DTYPES = frozenset(np.dtype(n) for n in ("float16", "float32")) | {np.dtype(ml_dtypes.bfloat16)}
BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}


@triton.jit
def _tanh(u):
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _act_fwd(X, Y, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    x = tl.load(X + idx, mask=m, other=0.0).to(tl.float32)
    if KIND == 0:
        y = 0.5 * x * (1.0 + tl.math.erf(x * SQRT1_2))
    elif KIND == 1:
        y = 0.5 * x * (1.0 + _tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC * x * x * x)))
    elif KIND == 2:
        y = x * _sigmoid(x)
    else:
        y = tl.where(x < 0.0, 0.0, x)
    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _act_bwd(G, X, DX, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    x = tl.load(X + idx, mask=m, other=0.0).to(tl.float32)
    g = tl.load(G + idx, mask=m, other=0.0).to(tl.float32)
    if KIND == 0:
        d = 0.5 * (1.0 + tl.math.erf(x * SQRT1_2)) + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    elif KIND == 1:
        t = _tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC * x * x * x))
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * TANH_CUBIC * x * x)
    elif KIND == 2:
        s = _sigmoid(x)
        d = s * (1.0 + x * (1.0 - s))
    if KIND == 3:
        gx = tl.where(x <= 0.0, 0.0, g)
    else:
        gx = g * d
    tl.store(DX + idx, gx.to(DX.dtype.element_ty), mask=m)


def _elem_strides(x) -> tuple:
    it = x.itemsize
    return tuple(b // it for b in x.strides)


def _dense(shape, strides) -> bool:
    """Whether these element strides cover exactly prod(shape) elements from the first, none twice."""
    acc = 1
    for st, n in sorted((st, n) for n, st in zip(shape, strides) if n != 1):
        if st != acc:
            return False
        acc *= n
    return True


def same_dense_layout(arrays) -> bool:
    """Whether these arrays (one shape) are all C-contiguous, or all dense with the same strides (a
    channels-last activation and its gradient): then element i of each is at offset i of its memory."""
    a = arrays[0]
    if a.flags.c_contiguous:
        return all(x.flags.c_contiguous for x in arrays)
    st = _elem_strides(a)
    if not _dense(a.shape, st):
        return False
    for x in arrays[1:]:
        if x.shape != a.shape or any(p != q for p, q, n in zip(_elem_strides(x), st, a.shape) if n != 1):
            return False
    return True


def new_like(x, dtype):
    """A new CuPy array of x's shape in x's (dense) layout."""
    if x.flags.c_contiguous:
        return cupy.ndarray(x.shape, dtype)
    it = np.dtype(dtype).itemsize
    flat = cupy.ndarray((x.size,), dtype)
    return cupy.lib.stride_tricks.as_strided(flat, x.shape, tuple(s * it for s in _elem_strides(x)))


def supported(*arrays) -> bool:
    """Whether these CuPy arrays (same shape and dense layout, float32/bfloat16/float16) can go here."""
    a = arrays[0]
    if not a.size:
        return False
    shape = a.shape
    for x in arrays:
        if x.dtype not in _DTYPES or x.shape != shape:
            return False
    return same_dense_layout(arrays)


def _sig(names):
    return {**names, "n": "i64", "KIND": "constexpr", "BLOCK": "constexpr"}


_kernels: dict = {}     # (direction, dtypes, kind, device) -> compiled kernel, so a launch builds no signature
# (a key holds a JITFunction's id, which the module keeps alive, not the function: hashing a JITFunction is a
# Python call taking a lock, `cache_key`, about a microsecond a lookup)


def _act_kernel(fn, names, dtypes, kind):
    key = (id(fn), dtypes, kind, TL.current_device())
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = TL.compile_kernel(fn, _sig({n: "*" + TL.type_of(d) for n, d in zip(names, dtypes)}),
                                              dict(KIND=kind, BLOCK=BLOCK), num_warps=NUM_WARPS, num_stages=1)
    return k


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def forward(x, kind: int):
    """The activation `kind` of CuPy array `x` (see `supported`), a new array of x's dtype."""
    y = new_like(x, x.dtype)
    dt = x.dtype
    TL.launch(_act_kernel(_act_fwd, ("X", "Y"), (dt, dt), kind), (_blocks(x.size),), x, y, x.size)
    return y


def backward(g, x, kind: int):
    """grad * activation'(x), a new array of x's dtype."""
    dx = new_like(x, x.dtype)
    kern = _act_kernel(_act_bwd, ("G", "X", "DX"), (g.dtype, x.dtype, x.dtype), kind)
    TL.launch(kern, (_blocks(x.size),), g, x, dx, x.size)
    return dx


@triton.jit
def _binary(A, B, Y, a_scalar, b_scalar, n, OP: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr,
            BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    if A_SCALAR:
        a = tl.zeros((BLOCK,), dtype=tl.float32) + a_scalar
    else:
        a = tl.load(A + idx, mask=m, other=0.0).to(tl.float32)
    if B_SCALAR:
        b = tl.zeros((BLOCK,), dtype=tl.float32) + b_scalar
    else:
        b = tl.load(B + idx, mask=m, other=1.0).to(tl.float32)
    if OP == 0:
        y = a + b
    elif OP == 1:
        y = a - b
    elif OP == 2:
        y = a * b
    else:
        y = tl.math.div_rn(a, b)
    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=m)


_HALF_DTYPES = frozenset((np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)))
_FLOAT32 = np.dtype(np.float32)


def _is_array(x, like) -> bool:
    return cupy is not None and isinstance(x, cupy.ndarray) and x.dtype in _DTYPES and x.shape == like.shape


def binary_supported(a, b, out_dtype) -> bool:
    """Whether `binary` takes these operands into `out_dtype` (a NumPy dtype): CuPy arrays of one shape
    and dense layout (`same_dense_layout`), or one array and a Python int/float; a float16/bfloat16 result from
    operands of its dtype, or a float32 result from two arrays of which one is half precision (a
    float32 residual stream plus a bfloat16 branch)."""
    arr = a if type(a) not in (int, float) else b
    if type(arr) in (int, float) or not _is_array(arr, arr) or not arr.size:
        return False
    arrays = [x for x in (a, b) if type(x) not in (int, float)]
    if not all(_is_array(x, arr) for x in arrays) or not same_dense_layout(arrays):
        return False
    out = np.dtype(out_dtype)
    if out in _HALF_DTYPES:
        return all(x.dtype == out for x in arrays)
    return out == _FLOAT32 and len(arrays) == 2 and any(x.dtype in _HALF_DTYPES for x in arrays)


def binary(a, b, op: str, out_dtype):
    """`op` ("add", "sub", "mul", "div") of operands accepted by `binary_supported`, a new array of
    `out_dtype`."""
    sa, sb = type(a) in (int, float), type(b) in (int, float)
    arr = b if sa else a
    y = new_like(arr, out_dtype)
    da, db = (b if sa else a).dtype, (a if sb else b).dtype
    key = ("binary", da, db, y.dtype, op, sa, sb, TL.current_device())
    kern = _kernels.get(key)
    if kern is None:
        sig = {"A": "*" + TL.type_of(da), "B": "*" + TL.type_of(db), "Y": "*" + TL.type_of(y.dtype),
               "a_scalar": "fp32", "b_scalar": "fp32", "n": "i64", "OP": "constexpr", "A_SCALAR": "constexpr",
               "B_SCALAR": "constexpr", "BLOCK": "constexpr"}
        kern = _kernels[key] = TL.compile_kernel(_binary, sig, dict(OP=BINARY_OPS[op], A_SCALAR=sa, B_SCALAR=sb,
                                                                    BLOCK=BLOCK), num_warps=NUM_WARPS, num_stages=1)
    TL.launch(kern, (_blocks(arr.size),), None if sa else a, None if sb else b, y, float(a) if sa else 0.0,
              float(b) if sb else 0.0, arr.size)
    return y

# ---- dropout -----------------------------------------------------------------------------------------
# Forward: each element draws a uniform number from Philox (`tl.rand(seed, i)`, i its position in memory),
# is kept when the draw is below 1 - p and comes out as x / (1 - p) or 0, the keep mask stored as bool;
# backward: grad * mask / (1 - p). The seed is drawn from the cuda generator's host stream at each call
# (manual_seed replays a run; no device value is read). One kernel each way replaces a chain of six
# CuPy kernels with an 8-byte uniform per element. The mask and output take the input's dense layout.
DROPOUT_MAX_ELEMENTS = 2 ** 31 - 1     # Philox offsets are 32-bit here


@triton.jit
def _dropout_fwd(X, Y, M, n, keep_below, scale, seed, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    x = tl.load(X + idx, mask=m, other=0.0).to(tl.float32)
    keep = tl.rand(seed, idx) < keep_below
    tl.store(Y + idx, tl.where(keep, x * scale, 0.0).to(Y.dtype.element_ty), mask=m)
    tl.store(M + idx, keep, mask=m)


@triton.jit
def _dropout_bwd(G, M, DX, n, scale, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    g = tl.load(G + idx, mask=m, other=0.0).to(tl.float32)
    keep = tl.load(M + idx, mask=m, other=0) != 0
    tl.store(DX + idx, tl.where(keep, g * scale, 0.0).to(DX.dtype.element_ty), mask=m)


def dropout_signatures(dtype) -> tuple:
    """The Triton signatures of `_dropout_fwd` and `_dropout_bwd` for arrays of `dtype` (BLOCK apart)."""
    t = "*" + TL.type_of(dtype)
    return ({"X": t, "Y": t, "M": "*i1", "n": "i32", "keep_below": "fp32", "scale": "fp32", "seed": "i64"},
            {"G": t, "M": "*i1", "DX": t, "n": "i64", "scale": "fp32"})


def _dropout_kernel(fn, sig: dict, key):
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = TL.compile_kernel(fn, {**sig, "BLOCK": "constexpr"}, dict(BLOCK=BLOCK),
                                              num_warps=NUM_WARPS, num_stages=1)
    return k


def dropout_supported(x) -> bool:
    """Whether CuPy array `x` (float32/bfloat16/float16, dense) can go through the dropout kernels."""
    return x.size <= DROPOUT_MAX_ELEMENTS and supported(x)


def dropout_backward_supported(g, mask) -> bool:
    return g.size <= DROPOUT_MAX_ELEMENTS and g.shape == mask.shape and supported(g) and mask.dtype == bool \
        and (g.flags.c_contiguous and mask.flags.c_contiguous or g.strides == mask.strides)


def dropout_forward(x, p: float, seed: int):
    """(x * mask / (1 - p), mask) for 0 < p < 1, mask ~ Bernoulli(1 - p) from Philox `seed`."""
    y, mask = new_like(x, x.dtype), new_like(x, bool)
    dev = TL.current_device()
    kern = _dropout_kernel(_dropout_fwd, dropout_signatures(x.dtype)[0], ("fwd", x.dtype, dev))
    TL.launch(kern, (_blocks(x.size),), x, y, mask, x.size, 1.0 - p, 1.0 / (1.0 - p), seed)
    return y, mask


def dropout_backward(g, mask, scale: float):
    """grad * mask * scale, a new array of g's dtype and layout."""
    dx = new_like(g, g.dtype)
    kern = _dropout_kernel(_dropout_bwd, dropout_signatures(g.dtype)[1], ("bwd", g.dtype, TL.current_device()))
    TL.launch(kern, (_blocks(g.size),), g, mask, dx, g.size, scale)
    return dx
