"""Fused Adam/AdamW (`fused=True`, and the default on cuda): one Triton multi-tensor kernel per step
(flambeau/_backends/triton_adam.py).

On the CPU: the kernel's arithmetic under Triton's interpreter against float64 NumPy
(tests/scripts/triton_adam_interp.py), and PyTorch's argument errors. On the GPU (marked `cuda`):
parameters after several steps against PyTorch's own `fused=True` on cuda, with weight decay,
amsgrad, maximize, a learning rate held in a cuda tensor, uneven step counts, and the default path."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import flambeau

SHAPES = ((70001,), (3, 5), (768,), (300, 301), (1,), (65536,))
STEPS = 4


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernel_under_the_interpreter():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(root, "tests", "scripts", "triton_adam_interp.py")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("kw", [dict(foreach=True), dict(differentiable=True)])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_argument_errors_like_torch(name, kw):
    with pytest.raises(RuntimeError) as theirs:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], fused=True, **kw)
    with pytest.raises(RuntimeError) as ours:
        getattr(flambeau.optim, name)([flambeau.zeros(2, requires_grad=True)], fused=True, **kw)
    assert str(ours.value) == str(theirs.value)


def _run_both(name, kw, skip=None, lr_tensor=False):
    """Parameters after STEPS steps under PyTorch (cuda, fused=True) and flambeau (cuda, `kw`)."""
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    tp = [torch.tensor(a, device="cuda", requires_grad=True) for a in init]
    fp = [flambeau.tensor(a, device="cuda", requires_grad=True) for a in init]
    t_lr = torch.tensor(hyper["lr"], device="cuda") if lr_tensor else hyper["lr"]
    f_lr = flambeau.tensor(hyper["lr"], device="cuda") if lr_tensor else hyper["lr"]
    topt = getattr(torch.optim, name)(tp, **dict(hyper, lr=t_lr), fused=True,
                                      **{k: v for k, v in kw.items() if k not in ("fused", "foreach")})
    fopt = getattr(flambeau.optim, name)(fp, **dict(hyper, lr=f_lr), **kw)
    for step, gs in enumerate(grads):
        for i, (t, f, g) in enumerate(zip(tp, fp, gs)):
            has = skip is None or not (i == skip and step % 2 == 0)
            t.grad = torch.tensor(g, device="cuda") if has else None
            f.grad = flambeau.tensor(g, device="cuda") if has else None
        topt.step()
        fopt.step()
    return [t.detach().cpu().numpy() for t in tp], [f.detach().cpu().numpy() for f in fp]


@pytest.mark.cuda
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_matches_torch_fused_on_cuda(name, amsgrad, maximize, monkeypatch):
    from flambeau._backends import triton_adam
    calls = []
    real = triton_adam.step
    monkeypatch.setattr(triton_adam, "step", lambda *a, **k: calls.append(1) or real(*a, **k))
    theirs, ours = _run_both(name, dict(fused=True, amsgrad=amsgrad, maximize=maximize))
    assert len(calls) == STEPS, "the fused kernel did not run once per step"
    for t, f in zip(theirs, ours):
        np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["default", "lr_tensor", "uneven_steps"])
def test_fused_cases_on_cuda(case, monkeypatch):
    from flambeau._backends import triton_adam
    calls = []
    real = triton_adam.step
    monkeypatch.setattr(triton_adam, "step", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = {} if case == "default" else dict(fused=True)
    theirs, ours = _run_both("AdamW", kw, skip=1 if case == "uneven_steps" else None,
                             lr_tensor=case == "lr_tensor")
    assert calls, "the fused kernel did not run"
    for t, f in zip(theirs, ours):
        np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-6)
