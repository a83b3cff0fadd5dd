"""Decompositions that only the inductor backend applies, on top of the core set.

`_sdpa_math` and its backward are core operators (other backends run them as one NumPy kernel),
but that kernel makes a dozen passes over the L x S score matrix. Written as batched products
plus a softmax, the products become extern BLAS calls and the scale, mask and softmax fuse into
a few generated kernels (and the partitioner may recompute the probabilities instead of saving
them). Only the cases that need no random numbers and no broadcasting between query, key and
value are decomposed; the others keep the core op (run as an extern).

    inductor_decompositions() -> {Op: fn}; decomposition_table(core) -> the "inductor" backend's table
"""
from __future__ import annotations

import math

from .. import _dtype as D
from .._decomp._table import aten, full, reshape
from .cpp_wrapper import flash_reason

_FLOATS = (D.float32, D.float64)


def _plain(query, key, value, dropout_p, enable_gqa) -> bool:
    return (dropout_p == 0 and query.dtype in _FLOATS and query.dtype is key.dtype is value.dtype
            and query.ndim >= 3 and tuple(query.shape[:-2]) == tuple(key.shape[:-2]) == tuple(value.shape[:-2])
            and key.shape[-2] == value.shape[-2] and query.shape[-1] == key.shape[-1])


def _t(x):
    n = x.ndim
    return aten.permute(x, list(range(n - 2)) + [n - 1, n - 2])


def _scale(query, scale) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _sdpa_math_parts(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """(out, probabilities, keep, (row max, row sum)) of the math path, or NotImplemented."""
    if not _plain(query, key, value, dropout_p, enable_gqa) or (attn_mask is not None and is_causal):
        return NotImplemented
    L, S = query.shape[-2], key.shape[-2]
    s = aten.mul(query @ _t(key), _scale(query, scale))
    ninf = full((), -math.inf, s)
    if is_causal:
        rows = reshape(aten.arange(0, L, 1, dtype=D.int64, device=query.device), (L, 1))
        cols = reshape(aten.arange(0, S, 1, dtype=D.int64, device=query.device), (1, S))
        s = aten.where(aten.ge(rows, cols), s, ninf)
    if attn_mask is not None:
        if attn_mask.dtype is D.bool:
            s = aten.where(attn_mask, s, ninf)
        elif attn_mask.dtype is s.dtype:
            s = aten.add(s, attn_mask)
        else:
            return NotImplemented
    m = aten.amax(s, [-1], True)
    m = aten.where(aten.eq(aten.abs(m), full((), math.inf, m)), full((), 0.0, m), m)
    e = aten.exp(aten.sub(s, m))
    den = aten.sum(e, [-1], True)
    p = aten.div(e, aten.where(aten.eq(den, full((), 0.0, den)), full((), 1.0, den), den))
    keep = aten.full((0,), False, dtype=D.bool, device=query.device)
    return p @ value, p, keep, (m, den)


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    r = _sdpa_math_parts(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return r if r is NotImplemented else r[:3]


def sdpa_flash_cpu(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The fused CPU kernel's op (out, logsumexp) as the math decomposition, for graphs whose wrapper
    calls no Python extern (config.cpp_wrapper, AOTInductor) where that C++ wrapper can't call the
    kernel itself (cpp_wrapper.flash_reason: broadcast or mixed-rank operands, dynamic heads)."""
    shapes = [tuple(t.shape) for t in (query, key, value)]
    if not flash_reason(query.dtype, shapes, None if attn_mask is None else attn_mask.dtype, enable_gqa):
        return NotImplemented
    r = _sdpa_math_parts(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
    if r is NotImplemented:
        return NotImplemented
    out, _, _, (m, den) = r
    lse = aten.where(aten.eq(den, full((), 0.0, den)), full((), -math.inf, den), aten.add(m, aten.log(den)))
    return out, aten._to_copy(aten.squeeze(lse, [-1]), dtype=D.float32)


def sdpa_math_backward(grad_out, query, key, value, probs, keep, attn_mask, dropout_p, scale, enable_gqa):
    if not _plain(query, key, value, dropout_p, enable_gqa) or probs.dtype is not query.dtype \
            or grad_out.dtype is not query.dtype:
        return NotImplemented
    sc = _scale(query, scale)
    dv = _t(probs) @ grad_out
    dp = grad_out @ _t(value)
    ds = aten.mul(probs, aten.sub(dp, aten.sum(aten.mul(probs, dp), [-1], True)))
    dq = aten.mul(ds @ key, sc)
    dk = aten.mul(_t(ds) @ query, sc)
    dm = None
    if attn_mask is not None and attn_mask.dtype is not D.bool:
        dm = ds if attn_mask.dtype is ds.dtype else aten._to_copy(ds, dtype=attn_mask.dtype)
    return dq, dk, dv, dm


LOWERED_VIEWS = (aten.diagonal, aten.unfold)   # core-decomposed into as_strided (absolute storage offsets, traced
                                         # strides); the code generator lowers them as views of their input


def inductor_decompositions() -> dict:
    return {aten._sdpa_math: sdpa_math, aten._sdpa_math_backward: sdpa_math_backward}


def decomposition_table(core: dict, python_externs: bool = True) -> dict:
    """The inductor backend's table: the `core` decompositions less the views it lowers itself
    (LOWERED_VIEWS), plus `inductor_decompositions()`; without `python_externs` (a C++ wrapper) the
    fused CPU attention is decomposed too."""
    table = {op: fn for op, fn in core.items() if op not in LOWERED_VIEWS}
    table.update(inductor_decompositions())
    if not python_externs:
        table[aten._sdpa_flash_cpu] = sdpa_flash_cpu
    return table
