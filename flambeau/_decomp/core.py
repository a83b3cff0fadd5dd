"""The core operator set: the only operators the compiler back end (`flambeau._inductor`) has to lower.

Membership is declared with each operator: `defop(..., tags=(Tag.core, ...))`. Every other
registered operator either decomposes into these (recursively, see `flambeau._decomp`) or states
why it stays opaque in its declaration (`defop(..., no_decomposition="reason")`). The set is
PyTorch's Core ATen IR cut down to what flambeau's operators need. It has two halves:

* the **lowered core** (98 ops) that the code generator turns into loops (each has an
  `op.lowering`, see `flambeau._inductor.lowering`):
  - pointwise math (59): arithmetic (add, sub, mul, div, div with rounding mode, neg, abs,
    remainder, fmod, pow), exp/log families that libm computes more accurately than any composite
    (exp, log, log1p, expm1, sqrt, rsqrt), trigonometry and hyperbolics with their inverses, atan2, hypot,
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
    `*_scatter` ops are what functionalization writes for mutated views); scatter, scatter_add and
    index_put are generated loops (`_inductor/lowering_scatter.py`), scatter_reduce has no lowering
    yet and runs its eager kernel inside a compiled graph;
  - factories (8): full, empty, empty_strided, arange, linspace, logspace and the triangle indices.
* the **extern core** (70 ops, tagged `Tag.extern` too) that stays opaque and is called as a library kernel: matrix
  products (mm, bmm), convolution (and its weight gradient, im2col/col2im), scans (cumsum, cumprod,
  cummax, cummin, logcumsumexp), sorting/selection (sort, topk, kthvalue, median, mode), pooling
  with indices, attention kernels, dense linear algebra, data-dependent output shapes (nonzero,
  masked_select, unique, bincount, histc, repeat_interleave, isin, searchsorted), random number
  generators (rand, randn, randint, normal, poisson, multinomial, randperm: the generator state is an
  effect the compiler must keep in order), and pointwise special functions with no C-library form
  (digamma, polygamma, i0, i1, erfinv, gcd, lcm) plus the complex helpers (conj_physical, real/imag).

The whole set has 170 ops. `core_ops()` lists them; `is_core(op)` tests membership.
"""
from __future__ import annotations

from .._ops import OPS, Op
from .._tags import Tag


def is_core(op: Op) -> bool:
    """Whether `op` is in the core set (declared with `Tag.core`)."""
    return Tag.core in op.tags


def core_ops() -> frozenset:
    """Every registered core operator."""
    return frozenset(op for op in OPS.values() if Tag.core in op.tags)
