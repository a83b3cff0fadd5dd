"""Run flambeau's Triton attention kernels under Triton's interpreter (TRITON_INTERPRET=1, set by the
caller) on small float32 CPU tensors and compare forward and backward with a float64 reference.
Prints one line per case and exits non-zero on a mismatch. Used by tests/test_sdpa_select.py."""
import math
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)

from flambeau._backends import triton_attention as T


FWD_MN, DKDV_MN, DQ_MN = (32, 16), (16, 32), (32, 16)     # (BLOCK_M, BLOCK_N) per kernel, as the real ones


def reference(q, k, v, mask, causal, scale, z):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    L, S = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    p = torch.nan_to_num(torch.softmax(s, -1))
    return (p * z) @ v


def run(B, H, Hk, L, S, E, causal, mask_kind, dropout_p, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g)
    k, v = torch.randn(B, Hk, S, E, generator=g), torch.randn(B, Hk, S, E, generator=g)
    do = torch.randn(B, H, L, E, generator=g)
    if dropout_p > 0:       # v = identity: the output is the dropped, rescaled attention matrix itself
        v = torch.eye(S).expand(B, Hk, S, E).contiguous()
    mask = None
    if mask_kind == T.MASK_BOOL:
        mask = torch.rand(B, 1, L, S, generator=g) > 0.3
        mask[0, 0, 1] = False
    elif mask_kind == T.MASK_ADD:
        mask = torch.randn(1, H, L, S, generator=g)
    scale = 1 / math.sqrt(E)
    rng = torch.tensor([1234, 0], dtype=torch.int64)
    out, lse = torch.empty(B, H, L, E), torch.empty(B, H, L)
    m = torch.zeros(1, dtype=torch.uint8) if mask is None else (mask.to(torch.uint8) if mask.dtype == torch.bool else mask)
    mb = m.expand(B, H, L, S) if mask is not None else m
    ms = tuple(mb.stride()) if mask is not None else (0, 0, 0, 0)
    flags = dict(HEAD_DIM=E, CAUSAL=causal, MASK_KIND=mask_kind, DROPOUT=dropout_p > 0)

    def blocks(mn):
        even = L % mn[0] == 0 and S % mn[1] == 0 and (not causal or L <= S)
        return dict(BLOCK_M=mn[0], BLOCK_N=mn[1], EVEN=even, **flags)
    sq, sk, sv = q.stride()[:3], k.stride()[:3], v.stride()[:3]
    T._attn_fwd[(math.ceil(L / FWD_MN[0]), B * H)](q, k, v, out, lse, mb, rng, scale, dropout_p, *sq, *sk, *sv,
                                             *out.stride()[:3], *ms, H, H // Hk, L, S, **blocks(FWD_MN))
    delta = torch.empty(B, H, L)
    T._bwd_delta[(math.ceil(L / 16), B * H)](out, do, delta, *out.stride()[:3], *do.stride()[:3], H, L,
                                              HEAD_DIM=E, BLOCK_M=16)
    dq, dk, dv = torch.empty(B, H, L, E), torch.empty(B, H, S, E), torch.empty(B, H, S, E)
    T._bwd_dkdv[(math.ceil(S / DKDV_MN[1]), B * H)](q, k, v, do, lse, delta, dk, dv, mb, rng, scale, dropout_p, *sq, *sk,
                                             *sv, *do.stride()[:3], *dk.stride()[:3], *ms, H, H // Hk, L, S,
                                             **blocks(DKDV_MN))
    T._bwd_dq[(math.ceil(L / DQ_MN[0]), B * H)](q, k, v, do, lse, delta, dq, mb, rng, scale, dropout_p, *sq, *sk, *sv,
                                           *do.stride()[:3], *dq.stride()[:3], *ms, H, H // Hk, L, S,
                                           **blocks(DQ_MN))
    dk = dk.reshape(B, Hk, H // Hk, S, E).sum(2)
    dv = dv.reshape(B, Hk, H // Hk, S, E).sum(2)
    z = (out != 0).double() / (1 - dropout_p) if dropout_p > 0 else 1.0
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    errs = []
    if dropout_p > 0:
        errs.append(abs(float((out != 0).double().mean()) - (1 - dropout_p)))   # kept fraction
    ref = reference(*leaves, None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                    causal, scale, z)
    gref = torch.autograd.grad(ref, leaves, do.double())
    errs += [rel(out, ref)] + [rel(a, b) for a, b in zip((dq, dk, dv), gref)]
    return errs


def rel(a, b):
    a, b = a.double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


CASES = [
    dict(B=1, H=2, Hk=2, L=64, S=64, E=16, causal=True, mask_kind=T.MASK_NONE, dropout_p=0.0),     # EVEN tiles
    dict(B=1, H=2, Hk=2, L=32, S=64, E=16, causal=False, mask_kind=T.MASK_NONE, dropout_p=0.0),
    dict(B=1, H=2, Hk=2, L=64, S=32, E=16, causal=True, mask_kind=T.MASK_NONE, dropout_p=0.0),     # L > S
    dict(B=1, H=2, Hk=2, L=37, S=37, E=16, causal=True, mask_kind=T.MASK_NONE, dropout_p=0.0),
    dict(B=2, H=2, Hk=2, L=19, S=45, E=16, causal=False, mask_kind=T.MASK_NONE, dropout_p=0.0),
    dict(B=1, H=2, Hk=2, L=24, S=33, E=16, causal=False, mask_kind=T.MASK_BOOL, dropout_p=0.0),
    dict(B=1, H=2, Hk=2, L=24, S=33, E=16, causal=False, mask_kind=T.MASK_ADD, dropout_p=0.0),
    dict(B=1, H=4, Hk=2, L=20, S=20, E=16, causal=True, mask_kind=T.MASK_NONE, dropout_p=0.0),
    dict(B=2, H=2, Hk=2, L=40, S=16, E=16, causal=False, mask_kind=T.MASK_NONE, dropout_p=0.3),
]

if __name__ == "__main__":
    bad = 0
    for c in CASES:
        errs = run(**c)
        ok = all(e < 1e-5 for e in errs[-4:]) and all(e < 0.06 for e in errs[:-4])
        bad += not ok
        print(("ok  " if ok else "BAD ") + str(c) + " " + " ".join(f"{e:.2e}" for e in errs), flush=True)
    sys.exit(1 if bad else 0)
