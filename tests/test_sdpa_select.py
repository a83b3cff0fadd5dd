"""scaled_dot_product_attention's backend choice and switches, on any machine: sdpa_kernel and the
flambeau.backends.cuda enable_*_sdp flags (against PyTorch's behaviour), the cuda decision rules
(on stand-in tensors that only carry metadata), MultiheadAttention's route through SDPA, and the
Triton kernels' arithmetic under Triton's interpreter (when Triton is installed)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import flambeau
import flambeau.backends.cuda as C
from flambeau._ops import attention as A
from flambeau._ops import attention_fused as AF
from tests.conftest import run_interpreted_script

B = A.SDPBackend


class Meta:
    """Just the metadata select_backend reads."""

    def __init__(self, shape, dtype=flambeau.bfloat16, device="cuda", requires_grad=False):
        self.shape, self.dtype, self.requires_grad = tuple(shape), dtype, requires_grad
        self.device = SimpleNamespace(type=device)

    def dim(self):
        return len(self.shape)


@pytest.fixture
def kernels_ready(monkeypatch):
    monkeypatch.setattr(AF, "_cudnn_ready", lambda: True)
    monkeypatch.setattr(AF, "_cudnn_supports", lambda q, k, dtype, causal, p: q.shape[-1] != 120)
    monkeypatch.setattr(AF, "_triton_ready", lambda: True)
    monkeypatch.setattr(AF, "_effective_dtype", lambda t, dev: t.dtype)


def test_sdpa_kernel_sets_and_restores_flags_like_torch():
    from torch.nn.attention import sdpa_kernel as tk, SDPBackend as TB
    with A.sdpa_kernel([B.MATH, B.EFFICIENT_ATTENTION]) as f, tk([TB.MATH, TB.EFFICIENT_ATTENTION]):
        assert f == {}
        ours = (C.flash_sdp_enabled(), C.mem_efficient_sdp_enabled(), C.math_sdp_enabled(), C.cudnn_sdp_enabled())
        theirs = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                  torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())
        assert ours == theirs == (False, True, True, False)
    assert C.flash_sdp_enabled() and C.mem_efficient_sdp_enabled() and C.math_sdp_enabled() and C.cudnn_sdp_enabled()
    with pytest.raises(AssertionError, match="SDPBackend"), tk((TB.MATH,)):
        pass
    with pytest.raises(AssertionError, match="SDPBackend"), A.sdpa_kernel((B.MATH,)):
        pass


def test_set_priority_orders_the_backends():
    with A.sdpa_kernel([B.MATH, B.FLASH_ATTENTION], set_priority=True):
        assert A.priority_order() == (B.MATH, B.FLASH_ATTENTION)
    assert A.priority_order() == A.DEFAULT_PRIORITY


def test_enable_flags_act_on_the_choice(kernels_ready):
    q = Meta((2, 4, 16, 64))
    try:
        assert AF.select_backend(q, q, q, is_causal=True) == B.CUDNN_ATTENTION
        C.enable_cudnn_sdp(False)
        assert not C.cudnn_sdp_enabled()
        assert AF.select_backend(q, q, q, is_causal=True) == B.FLASH_ATTENTION
        C.enable_flash_sdp(False)
        assert AF.select_backend(q, q, q) == B.EFFICIENT_ATTENTION
        C.enable_mem_efficient_sdp(False)
        assert AF.select_backend(q, q, q) == B.MATH
        C.enable_math_sdp(False)
        with pytest.raises(RuntimeError, match="No available kernel"):
            AF.select_backend(q, q, q)
    finally:
        for b in A.DEFAULT_PRIORITY:
            A.set_backend_enabled(b, True)


@pytest.mark.parametrize("kw, expect", [
    (dict(), B.CUDNN_ATTENTION),
    (dict(attn_mask=Meta((16, 16), flambeau.bool)), B.EFFICIENT_ATTENTION),
    (dict(attn_mask=Meta((16, 16), flambeau.bfloat16)), B.EFFICIENT_ATTENTION),
    (dict(attn_mask=Meta((16, 16), flambeau.float64)), B.MATH),                      # mask dtype
    (dict(attn_mask=Meta((16, 16), requires_grad=True)), B.MATH),                    # mask needs grad
    (dict(dtype=flambeau.float32), B.MATH),
    (dict(E=80), B.CUDNN_ATTENTION),                                                  # cuDNN: multiple of 8
    (dict(E=80, attn_mask=Meta((16, 16), flambeau.bool)), B.MATH),                    # Triton: power of 2
    (dict(E=136), B.MATH),
    (dict(E=120), B.MATH),                                                            # cuDNN builds no plan
    (dict(kshape=(2, 2, 16, 64)), B.MATH),                                            # heads differ, no gqa
    (dict(kshape=(2, 2, 16, 64), enable_gqa=True), B.CUDNN_ATTENTION),
    (dict(qshape=(4, 16, 64)), B.MATH),                                               # 3-d
    (dict(device="cpu"), B.FLASH_ATTENTION),                                          # the fused cpu kernel
])
def test_cuda_choice_rules(kernels_ready, kw, expect):
    E = kw.pop("E", 64)
    dtype = kw.pop("dtype", flambeau.bfloat16)
    dev = kw.pop("device", "cuda")
    q = Meta(kw.pop("qshape", (2, 4, 16, E)), dtype, dev)
    k = Meta(kw.pop("kshape", (2, 4, 16, E)), dtype, dev)
    assert AF.select_backend(q, k, k, **kw) == expect


def test_only_unusable_backends_raise(kernels_ready, monkeypatch):
    q = Meta((2, 4, 16, 64))
    with A.sdpa_kernel(B.FLASH_ATTENTION), pytest.raises(RuntimeError, match="flash attention takes no attn_mask"):
        AF.select_backend(q, q, q, attn_mask=Meta((16, 16), flambeau.bool))
    monkeypatch.setattr(AF, "_cudnn_ready", lambda: False)
    assert AF.select_backend(q, q, q) == B.FLASH_ATTENTION
    with A.sdpa_kernel(B.CUDNN_ATTENTION), pytest.raises(RuntimeError, match="cuDNN frontend is not available"):
        AF.select_backend(q, q, q)


def test_forced_efficient_runs_blocked_where_the_kernel_cannot(kernels_ready):
    q = Meta((2, 4, 16, 4), flambeau.float32)
    assert AF._choose(q, q, q, None, 0.0, False, False) == (B.MATH, False)
    with A.sdpa_kernel(B.EFFICIENT_ATTENTION):
        assert AF._choose(q, q, q, None, 0.0, False, False) == (B.EFFICIENT_ATTENTION, False)
    with A.sdpa_kernel([B.EFFICIENT_ATTENTION, B.MATH]):
        assert AF._choose(q, q, q, None, 0.0, False, False) == (B.MATH, False)
    q16 = Meta((2, 4, 16, 64))
    with A.sdpa_kernel(B.EFFICIENT_ATTENTION):
        assert AF._choose(q16, q16, q16, None, 0.0, False, False) == (B.EFFICIENT_ATTENTION, True)


def test_cpu_choice_keeps_math_and_blocked_paths():
    """float32/bfloat16/float16 on cpu: the fused kernel (FLASH_ATTENTION, attention_cpu.py) unless only
    the math or the memory-efficient (blocked) path is enabled; float64: math, or blocked when forced."""
    x, x64 = flambeau.ones(1, 2, 8, 4), flambeau.ones(1, 2, 8, 4, dtype=flambeau.float64)
    assert AF.select_backend(x, x, x) == B.FLASH_ATTENTION
    assert AF._choose(x, x, x, None, 0.0, False, False) == (B.FLASH_ATTENTION, AF.CPU_FLASH)
    assert AF.select_backend(x64, x64, x64) == B.MATH
    with A.sdpa_kernel(B.MATH):
        assert AF.select_backend(x, x, x) == B.MATH
    with A.sdpa_kernel(B.EFFICIENT_ATTENTION):
        assert AF.select_backend(x, x, x) == B.EFFICIENT_ATTENTION        # the blocked path
    with A.sdpa_kernel(B.FLASH_ATTENTION):
        assert AF.select_backend(x64, x64, x64) == B.EFFICIENT_ATTENTION  # the blocked path
    with A.sdpa_kernel(B.CUDNN_ATTENTION), pytest.raises(RuntimeError, match="No available kernel"):
        flambeau.nn.functional.scaled_dot_product_attention(x, x, x)


def test_deprecated_sdp_kernel_context():
    with pytest.warns(FutureWarning), C.sdp_kernel(enable_flash=False, enable_mem_efficient=False):
        assert C.math_sdp_enabled() and not C.flash_sdp_enabled() and C.cudnn_sdp_enabled()
    assert C.flash_sdp_enabled()


@pytest.mark.parametrize("masks", ["none", "kpm", "attn", "both", "causal"])
def test_multihead_attention_without_weights_runs_sdpa(masks, monkeypatch):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    fm = flambeau.nn.MultiheadAttention(16, 4, batch_first=True).double()
    fm.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    kw_t, kw_f = {}, {}
    if masks in ("kpm", "both"):
        kpm = np.zeros((2, 5), dtype=bool)
        kpm[1, 3:] = True
        kw_t["key_padding_mask"], kw_f["key_padding_mask"] = torch.tensor(kpm), flambeau.tensor(kpm)
    if masks in ("attn", "both", "causal"):
        am = np.triu(np.ones((5, 5), dtype=bool), 1)
        kw_t["attn_mask"], kw_f["attn_mask"] = torch.tensor(am), flambeau.tensor(am)
    if masks == "causal":
        kw_t["is_causal"] = kw_f["is_causal"] = True
    calls = []
    kern = A._sdpa_math.kernel
    monkeypatch.setattr(A._sdpa_math, "kernel", lambda *a, **k: calls.append(1) or kern(*a, **k))
    fo = fm(*(flambeau.tensor(x),) * 3, need_weights=False, **kw_f)[0]
    to = tm(*(torch.tensor(x),) * 3, need_weights=False, **kw_t)[0]
    assert calls, "MultiheadAttention did not go through scaled_dot_product_attention"
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernels_under_the_interpreter():
    """Forward and backward of the Triton kernels (causal, masks, odd lengths, grouped heads, dropout)
    against float64 PyTorch, run by Triton's interpreter on the CPU."""
    run_interpreted_script("triton_attention_interp.py")


def test_transformer_encoder_layer_runs_sdpa(monkeypatch):
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True).double()
    fl = flambeau.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True).double()
    fl.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in tl.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((2, 6, 16))
    calls = []
    kern = A._sdpa_math.kernel
    monkeypatch.setattr(A._sdpa_math, "kernel", lambda *a, **k: calls.append(1) or kern(*a, **k))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    fo = fl(flambeau.tensor(x), src_mask=flambeau.tensor(mask.numpy()), is_causal=True)
    to = tl(torch.tensor(x), src_mask=mask, is_causal=True)
    assert calls, "TransformerEncoderLayer did not go through scaled_dot_product_attention"
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-7, atol=1e-9)


def _projection_heads(lib, B=2, T=16, H=4, E=8):
    """q, k, v as GPT-2 makes them: (B, T, 3 * H * E) split and viewed (B, H, T, E) (meta tensors)."""
    qkv = lib.empty(B, T, 3 * H * E, device="meta", dtype=lib.bfloat16)
    return [t.view(B, T, H, E).transpose(1, 2) for t in qkv.split(H * E, 2)]


def test_fused_attention_meta_lays_outputs_out_as_the_kernels_and_pytorch():
    """The fused op's meta gives the layouts the kernels return (compiled code reads them in place):
    for heads viewed out of a (B, T, H*E) projection, out and the cuDNN gradients dense in the
    inputs' (B, T, H, E) order, as PyTorch's _scaled_dot_product_cudnn_attention(_backward) metas;
    the Triton backward's dk and dv (B, S, H, E) memory whatever the inputs' layout."""
    q, k, v = _projection_heads(flambeau)
    o, lse, rng = AF._sdpa_fused(q, k, v, None, 0.0, True, None, int(B.CUDNN_ATTENTION))
    tq, tk, tv = _projection_heads(torch)
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(tq, tk, tv, None, True, 0.0, True, False)
    assert o.stride() == r[0].stride() and lse.shape == r[1].shape[:3]
    grads = AF._sdpa_fused_backward(o, q, k, v, o, lse, rng, None, 0.0, True, None, int(B.CUDNN_ATTENTION))
    want = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(r[0], tq, tk, tv, r[0], r[1], r[6], r[7], None,
                                                                       r[2], r[3], 16, 16, 0.0, True)
    assert [g.stride() for g in grads] == [w.stride() for w in want]
    qc, kc, vc = (flambeau.empty(2, 4, 16, 8, device="meta", dtype=flambeau.bfloat16) for _ in range(3))
    grads = AF._sdpa_fused_backward(qc, qc, kc, vc, qc, lse, rng, None, 0.0, True, None, int(B.FLASH_ATTENTION))
    assert grads[0].stride() == (512, 128, 8, 1) and grads[1].stride() == grads[2].stride() == (512, 8, 32, 1)


@pytest.mark.skipif(importlib.util.find_spec("cudnn") is None, reason="nvidia-cudnn-frontend is not installed")
def test_cudnn_frontend_is_imported_without_torch():
    """nvidia-cudnn-frontend 1.15+ imports torch at import when it is installed (cudnn/wrapper.py); the
    cuDNN attention backend must load it without torch coming along (flambeau never imports torch), and
    torch stays importable afterwards. Fails with a plain `import cudnn` in `_import_frontend`."""
    code = ("import sys\n"
            "from flambeau._backends import cudnn_attention as c\n"
            "m = c._import_frontend()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import torch\n"
            "print('OK', m.__version__, torch.__version__)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-2000:]
