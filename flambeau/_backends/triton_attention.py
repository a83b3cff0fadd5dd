"""Flash attention for the cuda device, written in Triton and launched through CuPy (no PyTorch).

Forward (one program per BLOCK_M query rows of one batch*head): an online softmax over key blocks
in base 2 (scores pre-multiplied by scale*log2(e)), writing the output and the row log-sum-exp
(natural log; +inf for a row every key of which is masked, so the backward's exp gives 0 there).
Backward, FlashAttention-2's split: `_bwd_delta` computes D = rowsum(dO * O); `_bwd_dkdv` walks the
query blocks for one key block (dV += P^T dO, dK += dS^T Q); `_bwd_dq` walks the key blocks for one
query block (dQ += dS K), with P recomputed from the saved log-sum-exp and dS = P * (dP * Z - D).

Masks: causal (top-left aligned, column <= row, as PyTorch's is_causal), a boolean mask (True
keeps) or an additive mask, read through its broadcast strides (a stride of 0 repeats it; nothing
is materialised). Dropout: a Philox draw per (row, column), keyed by the seed read from device
memory plus the batch*head index; the backward redraws the same numbers. Z is keep/(1-p).
Grouped-query attention: query head h reads key/value head h // group; the backward writes dK, dV
per query head and the caller sums each group.
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from . import triton_launch as TL

LOG2E = tl.constexpr(1.4426950408889634)     # scores go to base 2: exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and head dim (64: the fastest of bench/sdpa_gpu.py --sweep)
FWD_CONFIG = {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 3)}
DKDV_CONFIG = {16: (32, 128, 4, 3), 32: (32, 128, 4, 3), 64: (32, 128, 4, 3), 128: (32, 64, 8, 2)}
DQ_CONFIG = {16: (128, 32, 4, 3), 32: (128, 32, 4, 3), 64: (128, 32, 4, 3), 128: (128, 32, 8, 2)}
HEAD_DIMS = tuple(FWD_CONFIG)
DELTA_BLOCK_M = 64
_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "uint8": "u8"}


@triton.jit
def _scores(s, r, c, M, stride_mm, stride_mn, L, S, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
            EVEN: tl.constexpr):
    """Apply bounds, the causal mask and the user mask to a tile of base-2 scores; `r` and `c` are the
    row and column indices broadcast along the tile's axes (rows x cols, or cols x rows transposed).
    EVEN: the tile lies inside L x S (no bounds test)."""
    if CAUSAL or MASK_KIND != 0 or not EVEN:
        valid = (r < L) & (c < S)
        if CAUSAL:
            valid = valid & (c <= r)
        if MASK_KIND == 1:
            keep = tl.load(M + r * stride_mm + c * stride_mn, mask=valid, other=0)
            valid = valid & (keep != 0)
        if MASK_KIND == 2:
            add = tl.load(M + r * stride_mm + c * stride_mn, mask=valid, other=0.0)
            s = s + add.to(tl.float32) * LOG2E
        s = tl.where(valid, s, float("-inf"))
    return s


@triton.jit
def _load_rows(ptrs, idx, n, EVEN: tl.constexpr):
    """Load a (rows x head dim) tile, zero past row `n` unless EVEN."""
    if EVEN:
        t = tl.load(ptrs)
    else:
        t = tl.load(ptrs, mask=idx[:, None] < n, other=0.0)
    return t


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, lo, hi,
               stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(K + cols[:, None] * stride_kn + offs_d[None, :], cols, S, EVEN)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = _scores(s, rows[:, None], cols[None, :], M, stride_mm, stride_mn, L, S, CAUSAL, MASK_KIND, EVEN)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = tl.rand(seed, rows[:, None] * S + cols[None, :]) >= dropout_p
            p = tl.where(keep, p * inv_keep, 0.0)
        v = _load_rows(V + cols[:, None] * stride_vn + offs_d[None, :], cols, S, EVEN)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, M, RNG, sm_scale, dropout_p,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              stride_mb, stride_mh, stride_mm, stride_mn, H, GROUP, L, S,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    M += b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = _load_rows(Q + rows[:, None] * stride_qm + offs_d[None, :], rows, L, EVEN)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    seed = tl.load(RNG) + bh
    inv_keep = 1.0 / (1.0 - dropout_p)
    if CAUSAL:
        # key blocks left of this row block's diagonal need no causal test; the diagonal ones do
        # (columns past S, when L > S, are masked off there)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, 0,
                                   start_m * BLOCK_M, stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM,
                                   BLOCK_N, False, MASK_KIND, DROPOUT, EVEN)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows,
                                   start_m * BLOCK_M, (start_m + 1) * BLOCK_M, stride_kn, stride_vn, stride_mm,
                                   stride_mn, L, S, HEAD_DIM, BLOCK_N, True, MASK_KIND, DROPOUT, EVEN)
    else:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, 0, S,
                                   stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM, BLOCK_N, False,
                                   MASK_KIND, DROPOUT, EVEN)
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    lse = tl.where(l_i > 0.0, (m_i + tl.math.log2(tl.where(l_i > 0.0, l_i, 1.0))) * LN2,
                   float("inf"))
    tl.store(LSE + bh.to(tl.int64) * L + rows, lse, mask=rows < L)
    tl.store(O + rows[:, None] * stride_om + offs_d[None, :], acc.to(O.dtype.element_ty), mask=rows[:, None] < L)


@triton.jit
def _bwd_delta(O, DO, DELTA, stride_ob, stride_oh, stride_om, stride_db, stride_dh, stride_dm, H, L,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = tl.load(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows[:, None] * stride_om
                + offs_d[None, :], mask=rows[:, None] < L, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh + rows[:, None] * stride_dm
                 + offs_d[None, :], mask=rows[:, None] < L, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * L + rows, delta, mask=rows < L)


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, M, seed, inv_keep, dropout_p, qk_scale, cols, lo, hi,
                stride_qm, stride_dm, stride_mm, stride_mn, L, S, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        q = _load_rows(Q + rows[:, None] * stride_qm + offs_d[None, :], rows, L, EVEN)
        do = _load_rows(DO + rows[:, None] * stride_dm + offs_d[None, :], rows, L, EVEN)
        if EVEN:
            lse2 = tl.load(LSE + rows) * LOG2E
            di = tl.load(DELTA + rows)
        else:
            lse2 = tl.load(LSE + rows, mask=rows < L, other=0.0) * LOG2E
            di = tl.load(DELTA + rows, mask=rows < L, other=0.0)
        # transposed tiles (key rows x query columns), so no register tile needs transposing
        s_t = tl.dot(k, tl.trans(q)) * qk_scale
        s_t = _scores(s_t, rows[None, :], cols[:, None], M, stride_mm, stride_mn, L, S, CAUSAL, MASK_KIND, EVEN)
        p_t = tl.math.exp2(s_t - lse2[None, :])
        dp_t = tl.dot(v, tl.trans(do))
        if DROPOUT:
            keep = tl.rand(seed, rows[None, :] * S + cols[:, None]) >= dropout_p
            pz_t = tl.where(keep, p_t * inv_keep, 0.0)
            dp_t = tl.where(keep, dp_t * inv_keep, 0.0)
        else:
            pz_t = p_t
        dv += tl.dot(pz_t.to(do.dtype), do)
        ds_t = p_t * (dp_t - di[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, M, RNG, sm_scale, dropout_p,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_db, stride_dh, stride_dm,
              stride_gb, stride_gh, stride_gn, stride_mb, stride_mh, stride_mm, stride_mn, H, GROUP, L, S,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
    DK += b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
    DV += b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
    M += b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    LSE += bh.to(tl.int64) * L
    DELTA += bh.to(tl.int64) * L
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = _load_rows(K + cols[:, None] * stride_kn + offs_d[None, :], cols, S, EVEN)
    v = _load_rows(V + cols[:, None] * stride_vn + offs_d[None, :], cols, S, EVEN)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * LOG2E
    seed = tl.load(RNG) + bh
    inv_keep = 1.0 / (1.0 - dropout_p)
    if CAUSAL:
        # query blocks on this key block's diagonal need the causal test, those below it do not
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, M, seed, inv_keep, dropout_p, qk_scale, cols,
                             start_n * BLOCK_N, (start_n + 1) * BLOCK_N, stride_qm, stride_dm, stride_mm, stride_mn,
                             L, S, HEAD_DIM, BLOCK_M, True, MASK_KIND, DROPOUT, EVEN)
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, M, seed, inv_keep, dropout_p, qk_scale, cols,
                             (start_n + 1) * BLOCK_N, L, stride_qm, stride_dm, stride_mm, stride_mn, L, S, HEAD_DIM,
                             BLOCK_M, False, MASK_KIND, DROPOUT, EVEN)
    else:
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, M, seed, inv_keep, dropout_p, qk_scale, cols, 0, L,
                             stride_qm, stride_dm, stride_mm, stride_mn, L, S, HEAD_DIM, BLOCK_M, False, MASK_KIND,
                             DROPOUT, EVEN)
    dk = dk * sm_scale
    tl.store(DK + cols[:, None] * stride_gn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=cols[:, None] < S)
    tl.store(DV + cols[:, None] * stride_gn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=cols[:, None] < S)


@triton.jit
def _dq_inner(dq, q, do, lse2, di, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, lo, hi,
              stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(K + cols[:, None] * stride_kn + offs_d[None, :], cols, S, EVEN)
        v = _load_rows(V + cols[:, None] * stride_vn + offs_d[None, :], cols, S, EVEN)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = _scores(s, rows[:, None], cols[None, :], M, stride_mm, stride_mn, L, S, CAUSAL, MASK_KIND, EVEN)
        p = tl.math.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v))
        if DROPOUT:
            keep = tl.rand(seed, rows[:, None] * S + cols[None, :]) >= dropout_p
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - di[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, M, RNG, sm_scale, dropout_p,
            stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_db, stride_dh, stride_dm,
            stride_gb, stride_gh, stride_gm, stride_mb, stride_mh, stride_mm, stride_mn, H, GROUP, L, S,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
    DQ += b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
    M += b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = _load_rows(Q + rows[:, None] * stride_qm + offs_d[None, :], rows, L, EVEN)
    do = _load_rows(DO + rows[:, None] * stride_dm + offs_d[None, :], rows, L, EVEN)
    lse2 = tl.load(LSE + bh.to(tl.int64) * L + rows, mask=rows < L, other=0.0) * LOG2E
    di = tl.load(DELTA + bh.to(tl.int64) * L + rows, mask=rows < L, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * LOG2E
    seed = tl.load(RNG) + bh
    inv_keep = 1.0 / (1.0 - dropout_p)
    if CAUSAL:
        dq = _dq_inner(dq, q, do, lse2, di, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, 0, start_m * BLOCK_M,
                       stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM, BLOCK_N, False, MASK_KIND, DROPOUT,
                       EVEN)
        dq = _dq_inner(dq, q, do, lse2, di, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, start_m * BLOCK_M,
                       (start_m + 1) * BLOCK_M, stride_kn, stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM, BLOCK_N,
                       True, MASK_KIND, DROPOUT, EVEN)
    else:
        dq = _dq_inner(dq, q, do, lse2, di, K, V, M, seed, inv_keep, dropout_p, qk_scale, rows, 0, S, stride_kn,
                       stride_vn, stride_mm, stride_mn, L, S, HEAD_DIM, BLOCK_N, False, MASK_KIND, DROPOUT, EVEN)
    dq = dq * sm_scale
    tl.store(DQ + rows[:, None] * stride_gm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=rows[:, None] < L)


# ---- host side -----------------------------------------------------------------------------------
_FWD_STRIDES = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
                "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om",
                "stride_mb", "stride_mh", "stride_mm", "stride_mn")
_ALIGNED = ("Q", "K", "V", "stride_qm", "stride_kn", "stride_vn")


def _flags(head_dim, causal, mask_kind, dropout, config, L, S):
    bm, bn, warps, stages = config[head_dim]
    # EVEN: every tile lies inside L x S (causal tiles reach column (block + 1) * BLOCK_M - 1 < S only if L <= S)
    even = L % bm == 0 and S % bn == 0 and (not causal or L <= S)
    return dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), MASK_KIND=mask_kind,
                DROPOUT=bool(dropout), EVEN=even), dict(num_warps=warps, num_stages=stages)


def fwd_spec(dtype: str, mask_type: str, head_dim: int, causal: bool, mask_kind: int, dropout: bool, L: int,
             S: int):
    """(kernel, signature, constexprs, options) of the forward for these inputs (`dtype` as
    'bf16'/'fp16', `mask_type` the mask's pointer type, L and S the lengths)."""
    const, opts = _flags(head_dim, causal, mask_kind, dropout, FWD_CONFIG, L, S)
    sig = {"Q": "*" + dtype, "K": "*" + dtype, "V": "*" + dtype, "O": "*" + dtype, "LSE": "*fp32",
           "M": mask_type, "RNG": "*i64", "sm_scale": "fp32", "dropout_p": "fp32",
           **dict.fromkeys(_FWD_STRIDES, "i64"), "H": "i32", "GROUP": "i32", "L": "i32", "S": "i32",
           **dict.fromkeys(const, "constexpr")}
    return _attn_fwd, sig, const, dict(opts, aligned=_ALIGNED + ("O", "stride_om"))


def delta_spec(dtype: str, head_dim: int):
    sig = {"O": "*" + dtype, "DO": "*" + dtype, "DELTA": "*fp32",
           **dict.fromkeys(("stride_ob", "stride_oh", "stride_om", "stride_db", "stride_dh", "stride_dm"), "i64"),
           "H": "i32", "L": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr"}
    return _bwd_delta, sig, dict(HEAD_DIM=head_dim, BLOCK_M=DELTA_BLOCK_M), dict(
        num_warps=4, num_stages=1, aligned=("O", "DO", "stride_om", "stride_dm"))


def bwd_spec(which: str, dtype: str, grad_dtype: str, mask_type: str, head_dim: int, causal: bool,
             mask_kind: int, dropout: bool, L: int, S: int):
    """Like `fwd_spec` for `which` = 'dkdv' or 'dq'."""
    fn, config, grads, last = ((_bwd_dkdv, DKDV_CONFIG, ("DK", "DV"), "stride_gn") if which == "dkdv" else
                               (_bwd_dq, DQ_CONFIG, ("DQ",), "stride_gm"))
    const, opts = _flags(head_dim, causal, mask_kind, dropout, config, L, S)
    strides = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn", "stride_vb",
               "stride_vh", "stride_vn", "stride_db", "stride_dh", "stride_dm", "stride_gb", "stride_gh", last,
               "stride_mb", "stride_mh", "stride_mm", "stride_mn")
    sig = {"Q": "*" + dtype, "K": "*" + dtype, "V": "*" + dtype, "DO": "*" + dtype, "LSE": "*fp32",
           "DELTA": "*fp32", **dict.fromkeys(grads, "*" + grad_dtype), "M": mask_type, "RNG": "*i64",
           "sm_scale": "fp32", "dropout_p": "fp32", **dict.fromkeys(strides, "i64"),
           "H": "i32", "GROUP": "i32", "L": "i32", "S": "i32", **dict.fromkeys(const, "constexpr")}
    return fn, sig, const, dict(opts, aligned=_ALIGNED + ("DO", "stride_dm"))


def _compile(spec):
    fn, sig, const, opts = spec
    return TL.compile_kernel(fn, sig, const, **opts)


def _ty(a) -> str:
    return _TYPES[a.dtype.name]


def _el_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def _mask_args(mask, shape4):
    """(pointer, kind, 4 element strides, pointer type) for a mask broadcast to (B, H, L, S)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if mask is None:
        return TL.Ptr(0), MASK_NONE, (0, 0, 0, 0), "*u8"
    m = cupy.broadcast_to(mask, shape4)
    kind = MASK_ADD
    if m.dtype == np.bool_:
        m, kind = m.view(np.uint8), MASK_BOOL
    return TL.Ptr(m.data.ptr), kind, _el_strides(m), "*" + _ty(m)


def _ready(a):
    """`a` itself when its rows are contiguous, 16-byte aligned and 16-element strided, else a copy."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    st = _el_strides(a)
    if st[-1] == 1 and a.data.ptr % 16 == 0 and all(s % 16 == 0 for s in st[:-1]):
        return a
    return cupy.ascontiguousarray(a)


def _p(a):
    return TL.Ptr(a.data.ptr)


def forward(q, k, v, mask, dropout_p: float, rng, is_causal: bool, scale: float):
    """q (B, H, L, E), k and v (B, Hk, S, E) CuPy arrays -> (out (B, H, L, E), lse (B, H, L) float32).
    `rng` is a device int64 array whose first element seeds the dropout draws."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    q, k, v = _ready(q), _ready(k), _ready(v)
    B, H, L, E = q.shape
    S = k.shape[2]
    out = cupy.empty_like(q, order="K")
    lse = cupy.empty((B, H, L), dtype=np.float32)
    mptr, kind, ms, mty = _mask_args(mask, (B, H, L, S))
    kern = _compile(fwd_spec(_ty(q), mty, E, is_causal, kind, dropout_p > 0, L, S))
    bm = FWD_CONFIG[E][0]
    TL.launch(kern, (triton.cdiv(L, bm), B * H), _p(q), _p(k), _p(v), _p(out), _p(lse), mptr, _p(rng), scale,
              dropout_p, *_el_strides(q)[:3], *_el_strides(k)[:3], *_el_strides(v)[:3], *_el_strides(out)[:3],
              *ms, H, H // k.shape[1], L, S)
    return out, lse


def backward(grad_out, q, k, v, out, lse, mask, dropout_p: float, rng, is_causal: bool, scale: float):
    """Gradients (dq, dk, dv) of `forward`'s output; dk and dv are summed over each query-head group."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    q, k, v, out, do = _ready(q), _ready(k), _ready(v), _ready(out), _ready(grad_out)
    B, H, L, E = q.shape
    Hk, S = k.shape[1], k.shape[2]
    group = H // Hk
    mptr, kind, ms, mty = _mask_args(mask, (B, H, L, S))
    delta = cupy.empty((B, H, L), dtype=np.float32)
    os_, ds = _el_strides(out), _el_strides(do)
    TL.launch(_compile(delta_spec(_ty(q), E)), (triton.cdiv(L, DELTA_BLOCK_M), B * H), _p(out), _p(do), _p(delta),
              *os_[:3], *ds[:3], H, L)
    dq = cupy.empty_like(q, order="K")
    gdt = q.dtype if group == 1 else np.dtype(np.float32)
    dk = cupy.empty((B, S, H, E), dtype=gdt).transpose(0, 2, 1, 3)
    dv = cupy.empty((B, S, H, E), dtype=gdt).transpose(0, 2, 1, 3)
    inputs = (_p(q), _p(k), _p(v), _p(do), _p(lse), _p(delta))
    tail = (mptr, _p(rng), scale, dropout_p, *_el_strides(q)[:3], *_el_strides(k)[:3], *_el_strides(v)[:3],
            *ds[:3])
    kern = _compile(bwd_spec("dkdv", _ty(q), _ty(dk), mty, E, is_causal, kind, dropout_p > 0, L, S))
    TL.launch(kern, (triton.cdiv(S, DKDV_CONFIG[E][1]), B * H), *inputs, _p(dk), _p(dv), *tail,
              *_el_strides(dk)[:3], *ms, H, group, L, S)
    kern = _compile(bwd_spec("dq", _ty(q), _ty(dq), mty, E, is_causal, kind, dropout_p > 0, L, S))
    TL.launch(kern, (triton.cdiv(L, DQ_CONFIG[E][0]), B * H), *inputs, _p(dq), *tail,
              *_el_strides(dq)[:3], *ms, H, group, L, S)
    if group > 1:
        dk = dk.reshape(B, Hk, group, S, E).sum(axis=2).astype(k.dtype)
        dv = dv.reshape(B, Hk, group, S, E).sum(axis=2).astype(v.dtype)
    return dq, dk, dv
