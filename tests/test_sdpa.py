"""scaled_dot_product_attention vs PyTorch: forward and gradients on the math path and on the blocked
(memory-efficient) path, each forced with sdpa_kernel; masks, causal, scale, GQA, dropout."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau
import flambeau.nn.functional as F
from flambeau._ops import attention as A

PATHS = {"math": A.SDPBackend.MATH, "blocked": A.SDPBackend.EFFICIENT_ATTENTION}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(A, "BLOCK", [8, 16])


def _pair(arr, rg=True):
    return (flambeau.tensor(arr).requires_grad_(rg), torch.tensor(arr).requires_grad_(rg))


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
    "bool_mask": dict(mask="bool"),
    "float_mask": dict(mask="float"),
    "bcast_mask": dict(mask="bcast"),
    "gqa": dict(enable_gqa=True),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_vs_torch(path, case):
    cfg = dict(CASES[case])
    rng = np.random.default_rng(0)
    B, H, L, S, E, Ev = 2, 4, 19, 37, 8, 6
    hk = 2 if cfg.get("enable_gqa") else H
    if cfg.get("is_causal"):
        S = L
    q, k, v = rng.standard_normal((B, H, L, E)), rng.standard_normal((B, hk, S, E)), rng.standard_normal((B, hk, S, Ev))
    (fq, tq), (fk, tk), (fv, tv) = _pair(q), _pair(k), _pair(v)
    fkw, tkw = {}, {}
    mask = cfg.pop("mask", None)
    if mask == "bool":
        m = rng.random((B, 1, L, S)) > 0.3
        m[0, 0, 3] = False          # a fully masked row
        fkw["attn_mask"], tkw["attn_mask"] = flambeau.tensor(m), torch.tensor(m)
    elif mask == "float":
        fm, tm = _pair(rng.standard_normal((B, H, L, S)))
        fkw["attn_mask"], tkw["attn_mask"] = fm, tm
    elif mask == "bcast":
        m = rng.standard_normal((L, S))
        fkw["attn_mask"], tkw["attn_mask"] = flambeau.tensor(m), torch.tensor(m)
    fkw.update(cfg)
    tkw.update(cfg)
    with A.sdpa_kernel(PATHS[path]):
        fo = F.scaled_dot_product_attention(fq, fk, fv, **fkw)
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **tkw)
    if mask == "bool":
        to = torch.nan_to_num(to)   # torch's math path gives nan on fully masked rows in some versions
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-7, atol=1e-9)
    go = rng.standard_normal(fo.shape)
    leaves_f, leaves_t = [fq, fk, fv], [tq, tk, tv]
    if mask == "float":
        leaves_f.append(fkw["attn_mask"])
        leaves_t.append(tkw["attn_mask"])
    gf = flambeau.autograd.grad(fo, leaves_f, flambeau.tensor(go))
    keep = torch.isfinite(to)
    gt = torch.autograd.grad(to, leaves_t, torch.tensor(go) * keep)
    for a, b in zip(gf, gt):
        np.testing.assert_allclose(a.numpy(), torch.nan_to_num(b).numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("path", list(PATHS))
def test_sdpa_float32_and_3d(path):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, 10, 4)).astype(np.float32) for _ in range(3))
    with A.sdpa_kernel(PATHS[path]):
        fo = F.scaled_dot_product_attention(*(flambeau.tensor(x) for x in (q, k, v)))
    to = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(x) for x in (q, k, v)))
    assert fo.dtype == flambeau.float32
    np.testing.assert_allclose(fo.numpy(), to.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", list(PATHS))
def test_sdpa_dropout(path):
    """Dropout replays under a fixed generator state, and the gradient is consistent with the forward
    (numerical check through that state). The statistics (kept fraction, scale, E[out], the mask in
    backward) are checked in tests/test_dropout.py."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 12, 4)) for _ in range(3))
    fq, fk, fv = (flambeau.tensor(x, requires_grad=True) for x in (q, k, v))
    with A.sdpa_kernel(PATHS[path]):
        flambeau.manual_seed(0)
        o = F.scaled_dot_product_attention(fq, fk, fv, dropout_p=0.5)
        g = flambeau.autograd.grad(o.sum(), [fv])[0]
        # d(sum out)/dv: column sums of the dropped, rescaled attention matrix
        flambeau.manual_seed(0)
        o2 = F.scaled_dot_product_attention(fq, fk, fv, dropout_p=0.5)
    np.testing.assert_allclose(o.detach().numpy(), o2.detach().numpy())
    eps = 1e-6
    vp = v.copy()
    vp[0, 0, 3, 1] += eps
    with A.sdpa_kernel(PATHS[path]):
        flambeau.manual_seed(0)
        o3 = F.scaled_dot_product_attention(fq.detach(), fk.detach(), flambeau.tensor(vp), dropout_p=0.5)
    num = (o3.sum().item() - o.sum().item()) / eps
    assert abs(num - g[0, 0, 3, 1].item()) < 1e-4


def test_sdpa_auto_selects_blocked(monkeypatch):
    """Long float64 inputs (which the fused cpu kernel does not take) run the blocked path."""
    monkeypatch.setattr(A, "AUTO_BLOCKED_ELEMENTS", 100)
    calls = []
    orig = A._sdpa_blocked.kernel
    monkeypatch.setattr(A._sdpa_blocked, "kernel", lambda *a, **k: calls.append(1) or orig(*a, **k))
    x = flambeau.ones(1, 20, 4, dtype=flambeau.float64)
    F.scaled_dot_product_attention(x, x, x)
    assert calls


def test_sdpa_errors():
    x = flambeau.ones(1, 4, 4)
    with pytest.raises(RuntimeError, match="attn_mask"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=flambeau.ones(4, 4), is_causal=True)
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(x, x.double(), x)


def test_sdpa_meta():
    q = flambeau.ones(2, 4, 5, 8, device="meta")
    k = flambeau.ones(2, 2, 7, 8, device="meta")
    v = flambeau.ones(2, 2, 7, 3, device="meta")
    for path in PATHS.values():
        with A.sdpa_kernel(path):
            o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert tuple(o.shape) == (2, 4, 5, 3) and o.device.type == "meta"
