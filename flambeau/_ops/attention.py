"""scaled_dot_product_attention: a math path (materialises the L x S attention matrix) and a
memory-efficient blocked path (online softmax over key blocks, never holding more than one
block_q x block_k tile per batch/head), each an op with a fused backward op.

The blocked backward recomputes each tile from the saved log-sum-exp:
P = exp(S - lse), dV += (P*Z)^T dO, dS = P * ((dO V^T)*Z - rowsum(dO*O)), dQ += dS K, dK += dS^T Q
(Z is the dropout keep mask over (1-p), regenerated per tile from a seed drawn in the forward).

The backend flags (`sdpa_kernel`, flambeau.backends.cuda.enable_*_sdp) live here; the choice among
the paths, and the fused cuda kernels, are in attention_fused.py. On cpu the blocked path serves
FLASH_ATTENTION and EFFICIENT_ATTENTION and is chosen when L*S reaches `AUTO_BLOCKED_ELEMENTS`.
"""
from __future__ import annotations

import contextlib
import enum
import math

import numpy as np

from .. import _dtype as D
from ._registry import defop, TensorSpec, Tag
from ._helpers import opmath, broadcast_shapes
from .activation import _rng

AUTO_BLOCKED_ELEMENTS = 1 << 20
BLOCK = [128, 128]          # (block_q, block_k) of the blocked path


class SDPBackend(enum.IntEnum):
    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


# Which backends scaled_dot_product_attention may use, in the order it tries them on cuda
# (flambeau.backends.cuda.enable_*_sdp and sdpa_kernel set these, as torch's global SDP flags).
_FLAGS = {SDPBackend.CUDNN_ATTENTION: True, SDPBackend.FLASH_ATTENTION: True, SDPBackend.EFFICIENT_ATTENTION: True,
          SDPBackend.MATH: True}
DEFAULT_PRIORITY = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH)
_priority = list(DEFAULT_PRIORITY)


def set_backend_enabled(backend: SDPBackend, enabled: bool) -> None:
    _FLAGS[SDPBackend(backend)] = bool(enabled)


def backend_enabled(backend: SDPBackend) -> bool:
    return _FLAGS[SDPBackend(backend)]


def priority_order() -> tuple:
    """The enabled backends in the order they are tried."""
    return tuple(b for b in _priority if _FLAGS[b])


@contextlib.contextmanager
def sdpa_kernel(backends, set_priority: bool = False):
    """Enable only the given backend(s) inside the block (torch.nn.attention.sdpa_kernel); with
    `set_priority`, the list's order is also the order they are tried in."""
    if not isinstance(backends, (list, SDPBackend)):
        raise AssertionError("Backend must be an instance of SDPBackend or a list of SDPBackend instances, "
                             f"got {type(backends).__name__}")
    if isinstance(backends, SDPBackend):
        backends = [backends]
    backends = list(dict.fromkeys(backends))
    saved_flags, saved_priority = dict(_FLAGS), list(_priority)
    for b in _FLAGS:
        _FLAGS[b] = b in backends
    if set_priority:
        _priority[:] = [b for b in backends if b in _FLAGS] + [b for b in _priority if b not in backends]
    try:
        yield {}
    finally:
        _FLAGS.update(saved_flags)
        _priority[:] = saved_priority


# ---- shared pieces ------------------------------------------------------------------------------
def _expand_gqa(xp, q, k, v, enable_gqa):
    if not enable_gqa or q.ndim < 3 or k.shape[-3] == q.shape[-3]:
        return k, v, 1
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hq % hk or hq % hv or hk != hv:
        raise RuntimeError(f"Number of heads in key and value must divide the number of heads in query, "
                           f"got query heads {hq}, key heads {hk}, value heads {hv}")
    rep = hq // hk
    return xp.repeat(k, rep, axis=-3), xp.repeat(v, rep, axis=-3), rep


def _fold_gqa(g, rep):
    if rep == 1:
        return g
    shp = g.shape
    return g.reshape(shp[:-3] + (shp[-3] // rep, rep) + shp[-2:]).sum(axis=-3)


def _bias(xp, attn_mask, is_causal, rows, cols, cd):
    """Additive bias for the tile rows x cols (None when there is no mask)."""
    b = None
    if is_causal:
        r = xp.arange(rows.start, rows.stop)[:, None]
        c = xp.arange(cols.start, cols.stop)[None, :]
        b = xp.where(c <= r, 0.0, -xp.inf).astype(cd)
    if attn_mask is not None:
        m = attn_mask[..., rows, cols] if attn_mask.ndim >= 2 else attn_mask
        if m.dtype == bool:
            m = xp.where(m, 0.0, -xp.inf).astype(cd)
        else:
            m = m.astype(cd, copy=False)
        b = m if b is None else b + m
    return b


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _keep(xp, seed, i, j, shape, p):
    if xp is np:
        rng = np.random.default_rng([seed, i, j])
    else:
        rng = xp.random.default_rng((seed * 1000003 + i * 7919 + j) & 0x7FFFFFFFFFFFFFFF)
    return rng.random(shape) >= p


def _check(query, key, value, attn_mask, is_causal):
    if attn_mask is not None and is_causal:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                           "is_causal=True")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{_tn(query)} key.dtype: {_tn(key)} and value.dtype: {_tn(value)} instead.")


def _tn(t):
    dt = t._dtype if hasattr(t, "_dtype") else D.FROM_NP[t.dtype]
    return {"float32": "float", "float64": "double", "float16": "c10::Half",
            "bfloat16": "c10::BFloat16"}.get(dt.name, dt.name)


def _out_shape(query, key, value, enable_gqa):
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if enable_gqa and len(qs) >= 3:
        ks = ks[:-3] + (qs[-3],) + ks[-2:]
        vs = vs[:-3] + (qs[-3],) + vs[-2:]
    batch = broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
    return batch, qs[-2], ks[-2], vs[-1]


def _f(x, cd):
    return x.astype(cd, copy=False)


# ---- math path ----------------------------------------------------------------------------------
@defop("_sdpa_math(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, "
       "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> (Tensor, Tensor, Tensor)",
       function=False,
       tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision,
             Tag.optional_output_grads))
def _sdpa_math(xp, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    _check(query, key, value, attn_mask, is_causal)
    dt = D.FROM_NP[query.dtype]
    cd = opmath(dt)
    k, v, _ = _expand_gqa(xp, query, key, value, enable_gqa)
    q, k, v = _f(query, cd), _f(k, cd), _f(v, cd)
    L, S = q.shape[-2], k.shape[-2]
    s = (q * _scale(q, scale)) @ xp.swapaxes(k, -1, -2)
    b = _bias(xp, attn_mask, is_causal, slice(0, L), slice(0, S), cd)
    if b is not None:
        s = s + b
    m = s.max(axis=-1, keepdims=True) if S else s.sum(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    p = e / xp.where(den == 0, 1, den)
    if dropout_p > 0:
        keep = xp.asarray(_rng(xp).random(p.shape) >= dropout_p)
        pd = p * keep / (1 - dropout_p) if dropout_p < 1 else p * 0
    else:
        keep = xp.ones((0,), dtype=bool)
        pd = p
    return (pd @ v).astype(dt.np), p.astype(dt.np), keep


@_sdpa_math.def_meta
def _(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    _check(query, key, value, attn_mask, is_causal)
    batch, L, S, ev = _out_shape(query, key, value, enable_gqa)
    pshape = batch + (L, S)
    return (TensorSpec(batch + (L, ev), query.dtype), TensorSpec(pshape, query.dtype),
            TensorSpec(pshape if dropout_p > 0 else (0,), D.bool))


@defop("_sdpa_math_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor probs, Tensor keep, "
       "Tensor? attn_mask, float dropout_p, float? scale, bool enable_gqa) -> (Tensor, Tensor, Tensor, Tensor)",
       function=False, tags=(Tag.core, Tag.extern))
def _sdpa_math_backward(xp, grad_out, query, key, value, probs, keep, attn_mask, dropout_p, scale, enable_gqa):
    dt = D.FROM_NP[query.dtype]
    cd = opmath(dt)
    k, v, rep = _expand_gqa(xp, query, key, value, enable_gqa)
    q, k, v, p, g = _f(query, cd), _f(k, cd), _f(v, cd), _f(probs, cd), _f(grad_out, cd)
    sc = _scale(q, scale)
    z = keep / (1 - dropout_p) if dropout_p > 0 and dropout_p < 1 else (0.0 if dropout_p >= 1 else 1.0)
    dv = xp.swapaxes(p * z, -1, -2) @ g
    dp = (g @ xp.swapaxes(v, -1, -2)) * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = (ds @ k) * sc
    dk = (xp.swapaxes(ds, -1, -2) @ q) * sc
    dm = None if attn_mask is None or attn_mask.dtype == bool else ds.astype(attn_mask.dtype)
    return (dq.astype(dt.np), _fold_gqa(dk, rep).astype(dt.np), _fold_gqa(dv, rep).astype(dt.np), dm)


@_sdpa_math_backward.def_meta
def _(grad_out, query, key, value, probs, keep, attn_mask, dropout_p, scale, enable_gqa):
    return (TensorSpec(grad_out.shape[:-1] + (query.shape[-1],), query.dtype),
            TensorSpec(key.shape, key.dtype), TensorSpec(value.shape, value.dtype),
            None if attn_mask is None or attn_mask.dtype == D.bool else TensorSpec(probs.shape, attn_mask.dtype))


@_sdpa_math.def_derivative
def _(grad, query, key, value, attn_mask, dropout_p, scale, enable_gqa, result):
    return _sdpa_math_backward(grad[0], query, key, value, result[1], result[2], attn_mask, dropout_p, scale,
                               enable_gqa)


# ---- blocked (memory-efficient) path --------------------------------------------------------------
@defop("_sdpa_blocked(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, "
       "bool is_causal=False, float? scale=None, bool enable_gqa=False, int block_q=128, int block_k=128) "
       "-> (Tensor, Tensor, Tensor)", function=False,
       tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision,
             Tag.optional_output_grads))
def _sdpa_blocked(xp, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, block_q=128, block_k=128):
    _check(query, key, value, attn_mask, is_causal)
    dt = D.FROM_NP[query.dtype]
    cd = opmath(dt)
    k, v, _ = _expand_gqa(xp, query, key, value, enable_gqa)
    q, k, v = _f(query, cd), _f(k, cd), _f(v, cd)
    sc = _scale(q, scale)
    L, S = q.shape[-2], k.shape[-2]
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = xp.zeros(batch + (L, v.shape[-1]), dtype=cd)
    lse = xp.full(batch + (L,), -xp.inf, dtype=cd)
    seed = 0
    if dropout_p > 0:
        seed = int(_rng(xp).integers(0, 2 ** 62))
    for bi, i0 in enumerate(range(0, L, block_q)):
        rows = slice(i0, min(i0 + block_q, L))
        qi = q[..., rows, :] * sc
        m = xp.full(batch + (rows.stop - i0, 1), -xp.inf, dtype=cd)
        l = xp.zeros_like(m)
        acc = xp.zeros(batch + (rows.stop - i0, v.shape[-1]), dtype=cd)
        for bj, j0 in enumerate(range(0, S, block_k)):
            if is_causal and j0 > rows.stop - 1:
                break
            cols = slice(j0, min(j0 + block_k, S))
            s = qi @ xp.swapaxes(k[..., cols, :], -1, -2)
            b = _bias(xp, attn_mask, is_causal, rows, cols, cd)
            if b is not None:
                s = s + b
            mnew = xp.maximum(m, s.max(axis=-1, keepdims=True))
            msafe = xp.where(xp.isfinite(mnew), mnew, 0)
            p = xp.exp(s - msafe)
            alpha = xp.exp(m - msafe)
            l = l * alpha + p.sum(axis=-1, keepdims=True)
            if dropout_p > 0:
                p = p * _keep(xp, seed, bi, bj, p.shape, dropout_p) / (1 - dropout_p) if dropout_p < 1 else p * 0
            acc = acc * alpha + p @ v[..., cols, :]
            m = mnew
        out[..., rows, :] = acc / xp.where(l == 0, 1, l)
        lse[..., rows] = xp.where(l[..., 0] > 0, m[..., 0] + xp.log(xp.where(l[..., 0] > 0, l[..., 0], 1)), -xp.inf)
    return out.astype(dt.np), lse, xp.asarray(seed, dtype=np.int64)


@_sdpa_blocked.def_meta
def _(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
      block_q=128, block_k=128):
    _check(query, key, value, attn_mask, is_causal)
    batch, L, S, ev = _out_shape(query, key, value, enable_gqa)
    return (TensorSpec(batch + (L, ev), query.dtype), TensorSpec(batch + (L,), D.FROM_NP[opmath(query.dtype)]),
            TensorSpec((), D.int64))


@defop("_sdpa_blocked_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
       "Tensor seed, Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, bool enable_gqa, "
       "int block_q, int block_k) -> (Tensor, Tensor, Tensor, Tensor)", function=False, tags=(Tag.core, Tag.extern))
def _sdpa_blocked_backward(xp, grad_out, query, key, value, out, lse, seed, attn_mask, dropout_p, is_causal,
                           scale, enable_gqa, block_q, block_k):
    dt = D.FROM_NP[query.dtype]
    cd = opmath(dt)
    k, v, rep = _expand_gqa(xp, query, key, value, enable_gqa)
    q, k, v, g, o = _f(query, cd), _f(k, cd), _f(v, cd), _f(grad_out, cd), _f(out, cd)
    sc = _scale(q, scale)
    seed = int(seed)
    L, S = q.shape[-2], k.shape[-2]
    batch = g.shape[:-2]
    dq = xp.zeros(batch + q.shape[-2:], dtype=cd)
    dk = xp.zeros(batch + k.shape[-2:], dtype=cd)
    dv = xp.zeros(batch + v.shape[-2:], dtype=cd)
    float_mask = attn_mask is not None and attn_mask.dtype != bool
    dm = xp.zeros(batch + (L, S), dtype=cd) if float_mask else None
    dd = (g * o).sum(axis=-1, keepdims=True)
    for bi, i0 in enumerate(range(0, L, block_q)):
        rows = slice(i0, min(i0 + block_q, L))
        qi = q[..., rows, :] * sc
        gi = g[..., rows, :]
        li = lse[..., rows][..., None]
        lsafe = xp.where(xp.isfinite(li), li, 0)
        for bj, j0 in enumerate(range(0, S, block_k)):
            if is_causal and j0 > rows.stop - 1:
                break
            cols = slice(j0, min(j0 + block_k, S))
            kj, vj = k[..., cols, :], v[..., cols, :]
            s = qi @ xp.swapaxes(kj, -1, -2)
            b = _bias(xp, attn_mask, is_causal, rows, cols, cd)
            if b is not None:
                s = s + b
            p = xp.where(xp.isfinite(li), xp.exp(s - lsafe), 0)
            if dropout_p > 0:
                z = _keep(xp, seed, bi, bj, p.shape, dropout_p) / (1 - dropout_p) if dropout_p < 1 else 0.0
            else:
                z = 1.0
            dv[..., cols, :] += xp.swapaxes(p * z, -1, -2) @ gi
            ds = p * ((gi @ xp.swapaxes(vj, -1, -2)) * z - dd[..., rows, :])
            dq[..., rows, :] += (ds @ kj) * sc
            dk[..., cols, :] += (xp.swapaxes(ds, -1, -2) @ q[..., rows, :]) * sc
            if float_mask:
                dm[..., rows, cols] = ds
    return (dq.astype(dt.np), _fold_gqa(dk, rep).astype(dt.np), _fold_gqa(dv, rep).astype(dt.np),
            None if dm is None else dm.astype(attn_mask.dtype))


@_sdpa_blocked_backward.def_meta
def _(grad_out, query, key, value, out, lse, seed, attn_mask, dropout_p, is_causal, scale, enable_gqa,
      block_q, block_k):
    batch = tuple(grad_out.shape[:-2])
    return (TensorSpec(batch + tuple(query.shape[-2:]), query.dtype), TensorSpec(key.shape, key.dtype),
            TensorSpec(value.shape, value.dtype),
            None if attn_mask is None or attn_mask.dtype == D.bool else
            TensorSpec(batch + (query.shape[-2], key.shape[-2]), attn_mask.dtype))


@_sdpa_blocked.def_derivative
def _(grad, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, block_q, block_k, result):
    return _sdpa_blocked_backward(grad[0], query, key, value, result[0], result[1], result[2], attn_mask,
                                  dropout_p, is_causal, scale, enable_gqa, block_q, block_k)
