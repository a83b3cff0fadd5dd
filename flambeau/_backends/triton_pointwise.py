"""GELU (erf and tanh forms) and SiLU, forward and backward, on cuda as one Triton kernel each
(launched through CuPy by `triton_launch`) instead of a chain of CuPy ufuncs with temporaries.

Contiguous float32/bfloat16/float16 arrays; arithmetic in float32, results in the input's dtype.
tanh(u) is computed as 1 - 2 / (exp(2u) + 1) and sigmoid(x) as 1 / (1 + exp(-x)) (both saturate
cleanly at +-inf).
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import triton_launch as TL

GELU_ERF, GELU_TANH, SILU = 0, 1, 2
KINDS = {("gelu", "none"): GELU_ERF, ("gelu", "tanh"): GELU_TANH, ("silu", None): SILU}
BLOCK = 1024
NUM_WARPS = 4
SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
TANH_CUBIC = tl.constexpr(0.044715)
_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


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
    else:
        y = x * _sigmoid(x)
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
    else:
        s = _sigmoid(x)
        d = s * (1.0 + x * (1.0 - s))
    tl.store(DX + idx, (g * d).to(DX.dtype.element_ty), mask=m)


def supported(*arrays) -> bool:
    """Whether these CuPy arrays (same shape, C-contiguous, float32/bfloat16/float16) can go here."""
    a = arrays[0]
    return (a.size > 0 and all(x.dtype.name in _TYPES and x.flags.c_contiguous and x.shape == a.shape
                                 for x in arrays))


def _sig(names):
    return {**names, "n": "i64", "KIND": "constexpr", "BLOCK": "constexpr"}


def forward(x, kind: int):
    """The activation `kind` of CuPy array `x` (see `supported`), a new array of x's dtype."""
    import cupy  # deferred: CuPy, optional (cuda only)
    y = cupy.empty_like(x)
    kern = TL.compile_kernel(_act_fwd, _sig({"X": "*" + _TYPES[x.dtype.name], "Y": "*" + _TYPES[y.dtype.name]}),
                             dict(KIND=kind, BLOCK=BLOCK), num_warps=NUM_WARPS, num_stages=1)
    TL.launch(kern, (triton.cdiv(x.size, BLOCK),), TL.Ptr(x.data.ptr), TL.Ptr(y.data.ptr), x.size)
    return y


def backward(g, x, kind: int):
    """grad * activation'(x), a new array of x's dtype."""
    import cupy  # deferred: CuPy, optional (cuda only)
    dx = cupy.empty_like(x)
    kern = TL.compile_kernel(_act_bwd, _sig({"G": "*" + _TYPES[g.dtype.name], "X": "*" + _TYPES[x.dtype.name],
                                             "DX": "*" + _TYPES[dx.dtype.name]}),
                             dict(KIND=kind, BLOCK=BLOCK), num_warps=NUM_WARPS, num_stages=1)
    TL.launch(kern, (triton.cdiv(x.size, BLOCK),), TL.Ptr(g.data.ptr), TL.Ptr(x.data.ptr), TL.Ptr(dx.data.ptr),
              x.size)
    return dx
