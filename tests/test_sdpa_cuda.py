"""Fused scaled_dot_product_attention on cuda (cuDNN through nvidia-cudnn-frontend, the Triton flash
kernel) against PyTorch on the same GPU: forward and gradients for causal / no mask / boolean and
additive masks / odd lengths / grouped-query heads, bf16 and fp16; dropout statistically (kept
fraction, expectation, and the backward using the forward's mask); the default choice; and that
flambeau never imports torch on this path. Marked `cuda`: skipped without a GPU."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flambeau
import flambeau.nn.functional as F
from flambeau._ops import attention as A
from flambeau._ops import attention_fused as AF
from flambeau._backends import cudnn_attention

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.cuda

FUSED = {"cudnn": A.SDPBackend.CUDNN_ATTENTION, "flash": A.SDPBackend.FLASH_ATTENTION,
         "efficient": A.SDPBackend.EFFICIENT_ATTENTION}
DTYPES = {"bf16": (flambeau.bfloat16, torch.bfloat16), "fp16": (flambeau.float16, torch.float16)}
CASES = {
    "causal": dict(L=128, S=128, is_causal=True),
    "nomask": dict(L=96, S=160),
    "odd": dict(L=37, S=53),
    "odd_causal": dict(L=77, S=77, is_causal=True),
    "causal_rect": dict(L=40, S=100, is_causal=True),
    "bool_mask": dict(L=64, S=80, mask="bool"),
    "float_mask": dict(L=50, S=70, mask="float"),
    "gqa": dict(L=64, S=64, is_causal=True, gqa=True),
    "head128": dict(L=64, S=64, E=128),
}
# relative error of bf16 results against a float32 computation from the same bf16 inputs
REL_TOL = {"bf16": 2e-2, "fp16": 4e-3}


def _needs(backend):
    if backend == "cudnn" and not cudnn_attention.available():
        pytest.skip(f"cuDNN frontend not available: {cudnn_attention.load_error()}")


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _to_torch(t):
    return torch.tensor(t.detach().float().cpu().numpy()).cuda()


def _inputs(case, dtype, seed=0):
    rng = np.random.default_rng(seed)
    B, H, E = 2, 4, case.get("E", 64)
    Hk = 2 if case.get("gqa") else H
    L, S = case["L"], case["S"]
    arrs = [rng.standard_normal(s).astype(np.float32) for s in ((B, H, L, E), (B, Hk, S, E), (B, Hk, S, E))]
    fdt, tdt = DTYPES[dtype]
    fl = [flambeau.tensor(a, device="cuda").to(fdt).requires_grad_() for a in arrs]
    tl = [torch.tensor(a, device="cuda").to(tdt).requires_grad_() for a in arrs]
    fkw, tkw = {}, {}
    if case.get("mask") == "bool":
        m = rng.random((B, 1, L, S)) > 0.3
        m[..., 0] = True                       # no fully masked row (PyTorch's kernels differ there)
        fkw["attn_mask"], tkw["attn_mask"] = flambeau.tensor(m, device="cuda"), torch.tensor(m, device="cuda")
    elif case.get("mask") == "float":
        m = rng.standard_normal((1, H, L, S)).astype(np.float32)
        fkw["attn_mask"] = flambeau.tensor(m, device="cuda").to(fdt)
        tkw["attn_mask"] = torch.tensor(m, device="cuda").to(tdt)
    for k in ("is_causal",):
        if k in case:
            fkw[k] = tkw[k] = case[k]
    if case.get("gqa"):
        fkw["enable_gqa"] = tkw["enable_gqa"] = True
    return fl, tl, fkw, tkw, rng


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", list(FUSED))
def test_fused_sdpa_vs_torch(backend, case, dtype):
    _needs(backend)
    cfg = CASES[case]
    if cfg.get("mask") and backend != "efficient":
        pytest.skip("masks run on the memory-efficient kernel")
    fl, tl, fkw, tkw, rng = _inputs(cfg, dtype)
    calls = []
    kern = AF._sdpa_fused.kernel
    AF._sdpa_fused.kernel = lambda *a, **k: calls.append(k.get("impl", a[-1])) or kern(*a, **k)
    try:
        with A.sdpa_kernel(FUSED[backend]):
            fo = F.scaled_dot_product_attention(*fl, **fkw)
    finally:
        AF._sdpa_fused.kernel = kern
    assert calls, "the fused op did not run"
    # reference: PyTorch's math path in float32 from the same low-precision inputs
    t32 = [t.detach().float().requires_grad_() for t in tl]
    tkw32 = dict(tkw)
    if "attn_mask" in tkw32 and tkw32["attn_mask"].dtype != torch.bool:
        tkw32["attn_mask"] = tkw32["attn_mask"].float()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(*t32, **tkw32)
    peer = torch.nn.functional.scaled_dot_product_attention(*tl, **tkw)   # PyTorch's own fused kernel
    go = rng.standard_normal(tuple(fo.shape)).astype(np.float32)
    gf = flambeau.autograd.grad(fo, fl, flambeau.tensor(go, device="cuda").to(fo.dtype))
    gr = torch.autograd.grad(ref, t32, torch.tensor(go, device="cuda"))
    gp = torch.autograd.grad(peer, tl, torch.tensor(go, device="cuda").to(peer.dtype))
    tol = REL_TOL[dtype]
    assert fo.dtype == DTYPES[dtype][0] and tuple(fo.shape) == tuple(ref.shape)
    err_out = _rel(_to_torch(fo), ref)
    assert err_out < tol, (err_out, _rel(peer.float(), ref))
    for name, a, b, p in zip("qkv", gf, gr, gp):
        assert tuple(a.shape) == tuple(b.shape)
        err = _rel(_to_torch(a), b)
        # as accurate as PyTorch's own kernel on the same inputs, within a factor
        assert err < max(tol, 3 * _rel(p.float(), b)), (name, err, _rel(p.float(), b))


@pytest.mark.parametrize("backend", list(FUSED))
def test_fused_dropout_statistics(backend):
    """v = identity makes the output the dropped, rescaled attention matrix itself: the kept fraction
    is 1-p, kept entries are P/(1-p) (P from PyTorch), and dV = out^T dO (the backward drops the
    same entries as the forward)."""
    _needs(backend)
    p = 0.25
    rng = np.random.default_rng(3)
    B, H, L, S = 2, 4, 256, 64
    q, k = (rng.standard_normal((B, H, n, S)).astype(np.float32) for n in (L, S))
    v = np.broadcast_to(np.eye(S, dtype=np.float32), (B, H, S, S)).copy()
    fq, fk, fv = (flambeau.tensor(a, device="cuda").to(flambeau.bfloat16).requires_grad_() for a in (q, k, v))
    with A.sdpa_kernel(FUSED[backend]):
        flambeau.manual_seed(7)
        out = F.scaled_dot_product_attention(fq, fk, fv, dropout_p=p)
        go = flambeau.tensor(rng.standard_normal((B, H, L, S)).astype(np.float32), device="cuda")
        dv = flambeau.autograd.grad(out, [fv], go.to(out.dtype))[0]
        flambeau.manual_seed(7)
        out2 = F.scaled_dot_product_attention(fq, fk, fv, dropout_p=p)
    o = out.detach().float().cpu().numpy()
    assert np.array_equal(o, out2.detach().float().cpu().numpy()), "dropout does not replay under manual_seed"
    kept = o != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    tq, tk = (torch.tensor(a, device="cuda").to(torch.bfloat16).float() for a in (q, k))
    probs = torch.softmax(tq @ tk.transpose(-1, -2) / np.sqrt(S), -1).cpu().numpy()
    np.testing.assert_allclose(o[kept], probs[kept] / (1 - p), rtol=3e-2, atol=1e-3)
    ref_dv = np.swapaxes(o, -1, -2) @ go.float().cpu().numpy()
    err = np.linalg.norm(dv.float().cpu().numpy() - ref_dv) / np.linalg.norm(ref_dv)
    assert err < 2e-2


def test_default_choice_on_cuda():
    q = flambeau.ones(1, 2, 16, 64, device="cuda", dtype=flambeau.bfloat16)
    first = A.SDPBackend.CUDNN_ATTENTION if cudnn_attention.available() else A.SDPBackend.FLASH_ATTENTION
    assert AF.select_backend(q, q, q, is_causal=True) == first
    assert AF.select_backend(q, q, q, attn_mask=flambeau.ones(16, 16, device="cuda", dtype=flambeau.bool)) == \
        A.SDPBackend.EFFICIENT_ATTENTION
    assert AF.select_backend(q.float(), q.float(), q.float()) == A.SDPBackend.MATH
    with flambeau.autocast("cuda", dtype=flambeau.bfloat16):
        assert AF.select_backend(q.float(), q.float(), q.float()) == first
    with A.sdpa_kernel(A.SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q.float(), q.float(), q.float())


def test_autocast_fused_training_step_matches_torch():
    rng = np.random.default_rng(5)
    arrs = [rng.standard_normal((2, 3, 64, 32)).astype(np.float32) for _ in range(3)]
    fl = [flambeau.tensor(a, device="cuda", requires_grad=True) for a in arrs]
    tl = [torch.tensor(a, device="cuda", requires_grad=True) for a in arrs]
    with flambeau.autocast("cuda", dtype=flambeau.bfloat16):
        fo = F.scaled_dot_product_attention(*fl, is_causal=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        to = torch.nn.functional.scaled_dot_product_attention(*tl, is_causal=True)
    assert fo.dtype == flambeau.bfloat16
    fo.float().sum().backward()
    to.float().sum().backward()
    assert _rel(_to_torch(fo), to.float()) < 2e-2
    for a, b in zip(fl, tl):
        assert a.grad.dtype == flambeau.float32
        assert _rel(_to_torch(a.grad), b.grad) < 3e-2


def test_fused_path_never_imports_torch():
    code = ("import sys, flambeau, flambeau.nn.functional as F\n"
            "from flambeau._ops import attention as A\n"
            "for b in (A.SDPBackend.CUDNN_ATTENTION, A.SDPBackend.FLASH_ATTENTION):\n"
            "    q = flambeau.randn(1, 2, 64, 64, device='cuda', dtype=flambeau.bfloat16, requires_grad=True)\n"
            "    try:\n"
            "        with A.sdpa_kernel(b):\n"
            "            F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1).sum().backward()\n"
            "    except RuntimeError as e:\n"
            "        assert 'No available kernel' in str(e), e\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_multihead_attention_uses_fused_kernel():
    calls = []
    kern = AF._sdpa_fused.kernel
    AF._sdpa_fused.kernel = lambda *a, **k: calls.append(1) or kern(*a, **k)
    try:
        torch.manual_seed(0)
        tm = torch.nn.MultiheadAttention(128, 4, batch_first=True).cuda().to(torch.bfloat16)
        fm = flambeau.nn.MultiheadAttention(128, 4, batch_first=True).cuda().to(flambeau.bfloat16)
        fm.load_state_dict({k: flambeau.tensor(v.float().cpu().numpy()).to(flambeau.bfloat16)
                            for k, v in tm.state_dict().items()})
        x = np.random.default_rng(0).standard_normal((2, 48, 128)).astype(np.float32)
        fx = flambeau.tensor(x, device="cuda").to(flambeau.bfloat16)
        tx = torch.tensor(x, device="cuda").to(torch.bfloat16)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(48, device="cuda", dtype=torch.bfloat16)
        fo = fm(fx, fx, fx, need_weights=False, attn_mask=flambeau.tensor(mask.float().cpu().numpy(), device="cuda")
                .to(flambeau.bfloat16), is_causal=True)[0]
        to = tm(tx, tx, tx, need_weights=False, attn_mask=mask, is_causal=True)[0]
    finally:
        AF._sdpa_fused.kernel = kern
    assert calls, "MultiheadAttention did not reach the fused kernel"
    assert _rel(_to_torch(fo), to.float()) < 3e-2
