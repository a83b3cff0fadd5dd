"""Dropout on cuda as one Triton kernel each way (flambeau/_backends/triton_pointwise.py `_dropout_fwd`,
`_dropout_bwd`; replaced a chain of six CuPy kernels with a float64 uniform per element).

On the CPU: the kernels under Triton's interpreter (tests/scripts/triton_dropout_interp.py: output =
x / (1 - p) where kept, kept fraction 1 - p per block, one seed one mask, the backward). On the GPU
(marked `cuda`): `F.dropout` / `nn.Dropout` through flambeau's ops with the kernels spied on, their
output and gradient against the float64 product with the mask they drew, the kept fraction, the input's
layout kept, and `manual_seed` replaying the mask."""
import importlib.util
import math

import numpy as np
import pytest

import flambeau
from tests.conftest import run_interpreted_script


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_dropout_kernels_under_the_interpreter():
    run_interpreted_script("triton_dropout_interp.py")


def _spy(monkeypatch):
    from flambeau._backends import triton_pointwise as P
    calls = {"forward": 0, "backward": 0}
    fwd, bwd = P.dropout_forward, P.dropout_backward

    def forward(*a):
        calls["forward"] += 1
        return fwd(*a)

    def backward(*a):
        calls["backward"] += 1
        return bwd(*a)
    monkeypatch.setattr(P, "dropout_forward", forward)
    monkeypatch.setattr(P, "dropout_backward", backward)
    return calls


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("p", [0.2, 0.7])
def test_cuda_dropout_is_the_masked_scaled_input_and_its_gradient(monkeypatch, dtype, p):
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(0)
    x64 = rng.standard_normal((64, 257)) + 3.0                       # no zeros: out == 0 means dropped
    x = flambeau.tensor(x64, device="cuda").to(getattr(flambeau, dtype)).requires_grad_()
    out = flambeau.nn.functional.dropout(x, p, training=True)
    g64 = rng.standard_normal(x64.shape)
    out.backward(flambeau.tensor(g64, device="cuda").to(x.dtype))
    assert calls == {"forward": 1, "backward": 1}
    xs = x.detach().float().cpu().numpy().astype(np.float64)
    o = out.detach().float().cpu().numpy().astype(np.float64)
    keep = o != 0
    q = 1.0 - p
    assert abs(keep.mean() - q) < 5 * math.sqrt(p * q / keep.size)
    tol = dict(rtol=1e-6, atol=0) if dtype == "float32" else dict(rtol=2 ** -7, atol=0)
    np.testing.assert_allclose(o, np.where(keep, xs / q, 0.0), **tol)
    gs = flambeau.tensor(g64).to(x.dtype).float().numpy().astype(np.float64)
    np.testing.assert_allclose(x.grad.float().cpu().numpy(), np.where(keep, gs / q, 0.0), **tol)


@pytest.mark.cuda
def test_cuda_dropout_replays_under_manual_seed_and_keeps_layout(monkeypatch):
    calls = _spy(monkeypatch)
    x = flambeau.randn(8, 16, 10, 10, device="cuda").contiguous(memory_format=flambeau.channels_last)
    flambeau.manual_seed(3)
    a = flambeau.nn.functional.dropout(x, 0.5)
    flambeau.manual_seed(3)
    b = flambeau.nn.functional.dropout(x, 0.5)
    c = flambeau.nn.functional.dropout(x, 0.5)
    assert calls["forward"] == 3
    assert a.stride() == x.stride()                                     # empty_like(input)'s layout
    assert bool((a == b).all()) and not bool((a == c).all())
    model = flambeau.nn.Sequential(flambeau.nn.Linear(32, 32), flambeau.nn.Dropout(0.1)).cuda()
    model.eval()
    y = flambeau.randn(4, 32, device="cuda")
    assert bool((model(y) == model[0](y)).all())                        # eval: the identity, no kernel
    assert calls["forward"] == 3
