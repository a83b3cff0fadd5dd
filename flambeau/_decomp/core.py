"""The core operator set: the only operators the compiler back end (`flambeau._inductor`) has to lower.

Every other registered operator either decomposes into these (recursively, see `flambeau._decomp`)
or is listed in `NO_DECOMPOSITION` with the reason it stays opaque. The set is PyTorch's Core ATen IR
cut down to what flambeau's operators need. It has two halves:

* the **lowered core** (`LOWERED`, 97 ops) that the code generator turns into loops:
  - pointwise math (58): arithmetic (add, sub, mul, div, div with rounding mode, neg, abs,
    remainder, fmod, pow), exp/log families that libm computes more accurately than any composite
    (exp, log, log1p, expm1, sqrt, rsqrt), trigonometry and hyperbolics with their inverses, atan2,
    erf/erfc, lgamma and nextafter (all in C's libm and CUDA's), rounding (floor, ceil, round, trunc),
    sign/signbit, comparisons, logical and bitwise ops, maximum/minimum, where, and sigmoid.
    `sigmoid` is core on purpose: `1 / (1 + exp(-x))` overflows `exp` for large negative x in low
    precision and every backend has a stable one-line form; `tanh` likewise. Composites such as
    reciprocal, log2/log10, exp2, softplus, gelu, clamp, lerp, isnan/isinf are decomposed: they cost
    the same fused loop and agree with the kernels to rounding (checked in float64 by the tests).
  - dtype conversion and copies (4): `_to_copy`, `clone`, `copy` and the mutation `copy_` (the only
    in-place op left: in-place ops decompose to their functional form plus `copy_`, which
    functionalization then turns into outputs; batch_norm's running statistics use it too);
  - reductions (8): sum, prod, amax, amin, argmax, argmin, any, all;
  - views (8): view, permute, expand, squeeze, unsqueeze, slice, select, as_strided;
  - data movement (11): cat, gather, scatter (src), scatter_add, scatter_reduce, index (advanced
    indexing), index_put, slice_scatter, select_scatter, diagonal_scatter, as_strided_scatter (the
    `*_scatter` ops are what functionalization writes for mutated views);
  - factories (8): full, empty, empty_strided, arange, linspace, logspace and the triangle indices.
* the **extern core** (`EXTERNS`, 70 ops) that stays opaque and is called as a library kernel: matrix
  products (mm, bmm), convolution (and its weight gradient, im2col/col2im), scans (cumsum, cumprod,
  cummax, cummin, logcumsumexp), sorting/selection (sort, topk, kthvalue, median, mode), pooling
  with indices, attention kernels, dense linear algebra, data-dependent output shapes (nonzero,
  masked_select, unique, bincount, histc, repeat_interleave, isin, searchsorted), random number
  generators (rand, randn, randint, normal, poisson, multinomial, randperm: the generator state is an
  effect the compiler must keep in order), and pointwise special functions with no C-library form
  (digamma, polygamma, i0, i1, erfinv, gcd, lcm) plus the complex helpers (conj_physical, real/imag).

The whole set has 167 ops. `CORE_OPS` is the union (names as in `flambeau._ops.OPS`); `is_core(op)` tests membership.
"""
from __future__ import annotations

POINTWISE = frozenset({
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "div.Tensor_mode", "neg", "abs",
    "remainder.Tensor", "fmod.Tensor", "pow.Tensor_Tensor",
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "erf", "erfc", "lgamma", "nextafter",
    "floor", "ceil", "round", "trunc", "sign", "signbit", "sigmoid",
    "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor", "ge.Tensor",
    "logical_and", "logical_or", "logical_not",
    "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "bitwise_not",
    "bitwise_left_shift.Tensor", "bitwise_right_shift.Tensor",
    "maximum", "minimum", "where.self",
})
CONVERSION = frozenset({"_to_copy", "clone", "copy", "copy_"})
REDUCTIONS = frozenset({"sum.dim_IntList", "prod.dim_int", "amax", "amin", "argmax", "argmin", "any.dims",
                        "all.dims"})
VIEWS = frozenset({"view", "permute", "expand", "squeeze.dims", "unsqueeze", "slice.Tensor", "select.int",
                   "as_strided"})
DATA_MOVEMENT = frozenset({"cat", "gather", "scatter.src", "scatter_add", "scatter_reduce.two", "index.Tensor",
                           "index_put", "slice_scatter", "select_scatter", "diagonal_scatter",
                           "as_strided_scatter"})
FACTORIES = frozenset({"full", "empty", "empty_strided", "arange.start_step", "linspace", "logspace",
                       "tril_indices", "triu_indices"})
LOWERED = POINTWISE | CONVERSION | REDUCTIONS | VIEWS | DATA_MOVEMENT | FACTORIES

EXTERNS = frozenset({
    # matrix products and convolution
    "mm", "bmm", "convolution", "_convolution_weight_grad", "im2col", "col2im",
    # scans, sorting and selection
    "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "sort", "topk", "kthvalue",
    "median", "median.dim", "nanmedian", "nanmedian.dim", "mode",
    # pooling with indices and the resampling gathers
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "_taps_gather", "_taps_gather_backward", "_plane_gather", "_plane_scatter_add",
    # attention
    "_sdpa_math", "_sdpa_math_backward", "_sdpa_blocked", "_sdpa_blocked_backward",
    # dense linear algebra
    "linalg_cholesky", "linalg_det", "linalg_eigh", "linalg_inv", "linalg_qr", "linalg_slogdet",
    "linalg_solve", "linalg_svd", "linalg_svdvals",
    # data-dependent output shapes (or data-dependent mutation)
    "nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "bincount", "histc",
    "repeat_interleave.Tensor", "isin.Tensor_Tensor", "searchsorted.Tensor", "embedding_renorm",
    # random number generation (the generator state is an effect the compiler must keep in order)
    "rand", "randn", "randint.low", "normal.float_float", "poisson", "multinomial", "randperm",
    # pointwise special functions without a C-library form, and complex parts
    "digamma", "polygamma", "i0", "special_i1", "erfinv", "gcd", "lcm", "conj_physical", "_pw_real", "_pw_imag",
})

CORE_OPS = LOWERED | EXTERNS

# Non-core ops left without a decomposition, each with the reason.
NO_DECOMPOSITION = {
    "einsum": "the contraction order (and hence the mm/bmm sequence) is a path-optimisation choice; "
              "the compiler calls it as an extern like mm",
}


def is_core(op) -> bool:
    """Whether `op` (an `Op` or its qualified name) is in the core set."""
    return (op if isinstance(op, str) else op.name) in CORE_OPS
