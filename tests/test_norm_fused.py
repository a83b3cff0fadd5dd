"""Triton LayerNorm (flambeau/_backends/triton_norm.py), GELU/SiLU (triton_pointwise.py) and
cross-entropy (triton_cross_entropy.py) on cuda.

On the CPU: the kernels under Triton's interpreter against float64 PyTorch (tests/scripts/
triton_norm_interp.py, triton_pointwise_interp.py, triton_cross_entropy_interp.py). On the GPU (marked `cuda`): forward and backward
through flambeau's ops against PyTorch on cuda, float32 and bfloat16, with the kernels spied on."""
import importlib.util

import numpy as np
import pytest
import torch

import flambeau
from tests.conftest import run_interpreted_script


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
@pytest.mark.parametrize("script", ["triton_norm_interp.py", "triton_pointwise_interp.py",
                                    "triton_cross_entropy_interp.py"])
def test_kernels_under_the_interpreter(script):
    out = run_interpreted_script(script)
    if script == "triton_cross_entropy_interp.py":      # every case ran: kernels, wrappers, through flambeau
        assert out.count(" ok") == 25, out


TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}
# bfloat16 LayerNorm keeps mean and rstd in bfloat16, as flambeau's other devices (PyTorch's cuda
# kernel keeps float32), so the weight gradient, a sum over rows, may differ by a fraction of its scale
SCALED_ATOL = {"float32": 0.0, "bfloat16": 1e-2}


def _close(f, t, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(f, t, rtol=tol["rtol"], atol=max(tol["atol"], SCALED_ATOL[dtype] * np.abs(t).max()))


def _both(fn_t, fn_f, shape, dtype, n_params=0, seed=0):
    """Outputs and input/parameter gradients of fn(x, *params) under PyTorch and flambeau on cuda."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) * 2]
    arrays += [rng.standard_normal(shape[-1:]).astype(np.float32) for _ in range(n_params)]
    dy = rng.standard_normal(shape).astype(np.float32)
    out = []
    for lib, fn in ((torch, fn_t), (flambeau, fn_f)):
        dt = getattr(lib, dtype)
        ts = [lib.tensor(a, device="cuda").to(dt).requires_grad_() for a in arrays]
        y = fn(*ts)
        y.backward(lib.tensor(dy, device="cuda").to(dt))
        out.append([y.detach().float().cpu().numpy()] + [t.grad.float().cpu().numpy() for t in ts])
    return out


def _spy(monkeypatch, module, names):
    calls = []
    for n in names:
        real = getattr(module, n)
        monkeypatch.setattr(module, n, lambda *a, _r=real, _n=n, **k: calls.append(_n) or _r(*a, **k))
    return calls


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,affine", [((8, 64, 768), 2), ((3, 5, 7), 2), ((6, 33), 0), ((2, 3000), 1)])
def test_layer_norm_matches_torch_on_cuda(shape, affine, dtype, monkeypatch):
    from flambeau._backends import triton_norm
    calls = _spy(monkeypatch, triton_norm, ["forward", "backward"])
    n = shape[-1]

    def fn(lib):
        return lambda x, *p: lib.nn.functional.layer_norm(x, (n,), *p)
    theirs, ours = _both(fn(torch), fn(flambeau), shape, dtype, affine)
    assert calls == ["forward", "backward"]
    for t, f in zip(theirs, ours):
        _close(f, t, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu"])
def test_activations_match_torch_on_cuda(act, dtype, monkeypatch):
    from flambeau._backends import triton_pointwise
    calls = _spy(monkeypatch, triton_pointwise, ["forward", "backward"])
    name, kw = ("gelu", dict(approximate="tanh")) if act == "gelu_tanh" else (act, {})

    def fn(lib):
        return lambda x: getattr(lib.nn.functional, name)(x, **kw)
    theirs, ours = _both(fn(torch), fn(flambeau), (4, 1000, 3), dtype)
    assert calls == ["forward", "backward"]
    for t, f in zip(theirs, ours):
        _close(f, t, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch_on_cuda(reduction, monkeypatch):
    from flambeau._backends import triton_cross_entropy
    calls = _spy(monkeypatch, triton_cross_entropy, ["forward", "backward"])
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 5003)) * 3).astype(np.float32)
    t = rng.integers(0, 5003, 64)
    t[3] = -100
    g = rng.standard_normal(64).astype(np.float32) if reduction == "none" else np.float32(1.5)
    res = []
    for lib in (torch, flambeau):
        xl = lib.tensor(x, device="cuda", requires_grad=True)
        loss = lib.nn.functional.cross_entropy(xl, lib.tensor(t, device="cuda"), reduction=reduction)
        loss.backward(lib.tensor(g, device="cuda"))
        res.append((loss.detach().cpu().numpy(), xl.grad.cpu().numpy()))
    assert calls == ["forward", "backward"]
    for f, t_ in zip(res[1], res[0]):
        np.testing.assert_allclose(f, t_, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", ["some", "all"])
def test_cross_entropy_reduces_in_its_kernels_on_cuda(reduction, dtype, ignored, monkeypatch):
    """A mean or sum cross-entropy on cuda is two Triton launches forward (row losses, one reduction
    program) and one or two backward (mean: the shared g / count first), no CuPy reduction: the values,
    NaN of a mean over no target, and the gradients as PyTorch's on cuda."""
    from flambeau._backends import triton_cross_entropy as X
    launched = []
    real = X.TL.launch
    monkeypatch.setattr(X.TL, "launch", lambda k, *a: launched.append(k) or real(k, *a))
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 256)) * 3).astype(np.float32)
    t = rng.integers(0, 256, 64)
    t[[3, 40] if ignored == "some" else slice(None)] = -100
    res = []
    for lib in (torch, flambeau):
        xl = lib.tensor(x, device="cuda").to(getattr(lib, dtype)).requires_grad_()
        loss = lib.nn.functional.cross_entropy(xl, lib.tensor(t, device="cuda"), reduction=reduction)
        n_fwd = len(launched)
        loss.backward()
        res.append((loss.detach().float().cpu().numpy(), xl.grad.float().cpu().numpy(), loss.dtype))
    assert (n_fwd, len(launched)) == (2, 4 if reduction == "mean" else 3)
    assert str(res[1][2]).split(".")[-1] == str(res[0][2]).split(".")[-1] == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(res[1][0], res[0][0], **tol)         # (NaN where PyTorch has NaN)
    np.testing.assert_allclose(res[1][1], res[0][1], **tol)
