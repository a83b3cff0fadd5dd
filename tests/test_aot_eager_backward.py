"""A training graph's backward compiled right after its forward (`flambeau._functorch.config.
force_non_lazy_backward_lowering`, PyTorch's name; the inductor backend sets it for a cuda graph compiled on an
empty kernel cache so the backward's kernels compile beside the forward's): the first backward then runs the
graph compiled ahead, laid out as the compiled forward returns its saved values (no second compile), with
PyTorch's gradients; with the setting off the backward is compiled at its first use, as in PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._functorch import config as functorch_config
from tests.conftest import spy_compile_fx


def _models():
    fl.manual_seed(0)
    m = fl.nn.Sequential(fl.nn.Linear(8, 16), fl.nn.GELU(), fl.nn.LayerNorm(16), fl.nn.Linear(16, 4))
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p, q in zip(tm.parameters(), m.parameters()):
            p.copy_(torch.tensor(q.detach().numpy()))
    return m, tm


@pytest.mark.parametrize("eager", [True, False])
def test_backward_compiled_with_the_forward_runs_as_compiled(monkeypatch, eager):
    monkeypatch.setattr(functorch_config, "force_non_lazy_backward_lowering", eager)
    compiled = spy_compile_fx(monkeypatch, [])
    m, tm = _models()
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    loss = fl.compile(m)(fl.tensor(x)).logsumexp(1).sum()
    assert len(compiled) == (2 if eager else 1)          # forward (+ backward) before the first backward
    loss.backward()
    assert len(compiled) == 2
    bw = compiled[1]
    assert bw.artifact is not None and bw.kernel_count > 0
    assert len(bw.variants) == 1                         # the first use took the graph compiled ahead as is
    tm(torch.tensor(x)).logsumexp(1).sum().backward()
    np.testing.assert_allclose(loss.item(), tm(torch.tensor(x)).logsumexp(1).sum().item(), rtol=1e-5)
    for p, q in zip(tm.parameters(), m.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_only_a_cold_cuda_compile_turns_it_on(monkeypatch):
    from flambeau._dynamo.backends import inductor as backend
    from flambeau._inductor import triton_runtime
    monkeypatch.setattr(functorch_config, "eager_backward_on_cold_cuda", False)
    assert not backend._cold_cuda()                                    # FLAMBEAU_EAGER_BACKWARD=0
    monkeypatch.setattr(functorch_config, "eager_backward_on_cold_cuda", True)
    monkeypatch.setattr(triton_runtime, "_cubin_cache_empty", lambda: True)
    monkeypatch.setattr(triton_runtime.config, "compile_threads", 8)
    assert triton_runtime.cold_cache() and backend._cold_cuda()
    monkeypatch.setattr(triton_runtime, "_cubin_cache_empty", lambda: False)
    assert not triton_runtime.cold_cache()
