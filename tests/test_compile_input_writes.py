"""Mutated inputs stored in place by the compiled graph (`_inductor/wrapper.in_place_writes`, AOT autograd's
`_input_writes`): the kernel computing a mutated input's final value (a BatchNorm running statistic)
stores it into the input, so AOT autograd's write-back has nothing to copy, where that is safe; where
it is not (the input read at another element, another input sharing its memory) the value is copied
back after the call as before. Values are compared with PyTorch; each test asserts which path ran,
through the C++ backend and Triton's interpreter (the cuda path's generated code).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._functorch import aot_autograd
from flambeau._inductor import config
from tests.conftest import spy_compile_fx


@pytest.fixture(params=["cpp", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton":
        triton = pytest.importorskip("triton")
        if not triton.knobs.runtime.interpret:
            pytest.skip("Triton imported without its interpreter (a cuda machine)")
    monkeypatch.setattr(config, "backend", request.param)
    fl._dynamo.reset()
    yield request.param
    fl._dynamo.reset()


@pytest.fixture
def copies(monkeypatch) -> list:
    """The write-backs AOT autograd copies (each a `write_into` of a mutated input)."""
    seen = []
    real = aot_autograd.write_into

    def spy(x, final, *a, **k):
        seen.append(tuple(x.shape))
        return real(x, final, *a, **k)
    monkeypatch.setattr(aot_autograd, "write_into", spy)
    return seen


def _net(T):
    T.manual_seed(0)
    return T.nn.Sequential(T.nn.Conv2d(3, 6, 3, padding=1), T.nn.BatchNorm2d(6), T.nn.ReLU(),
                           T.nn.Conv2d(6, 4, 1), T.nn.BatchNorm2d(4, momentum=0.3))


def test_batchnorm_running_stats_are_stored_in_place_and_match_pytorch(backend, copies, monkeypatch):
    made = spy_compile_fx(monkeypatch, [])
    m, ref = _net(fl), _net(torch)
    ref.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in m.state_dict().items()})
    f = fl.compile(m)
    x = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)
    for step in range(3):
        xs = x * (step + 1)
        f(fl.tensor(xs)).square().mean().backward()
        ref(torch.from_numpy(xs)).square().mean().backward()
    assert made and any("if _own" in c.artifact.wrapper_source for c in made)
    assert copies == []                                  # all six running statistics written by the kernels
    for (k, v), (_, r) in zip(m.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(torch.from_numpy(np.array(v.numpy())), r, rtol=1e-5, atol=1e-6, msg=k)
    for p, r in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(torch.from_numpy(np.array(p.grad.numpy())), r.grad, rtol=1e-4, atol=1e-5)


def test_an_input_read_at_another_element_is_copied_back(backend, copies):
    """x.copy_(x.t() * 2 + x) reads element (j, i) of x for element (i, j): storing into x in place would
    overwrite elements still to be read, so the value is copied back after the call."""
    def f(T, x):
        x.copy_(x.t() * 2 + x)
        return x.sum()
    a = np.arange(36, dtype=np.float32).reshape(6, 6) / 7
    x, xt = fl.tensor(a), torch.from_numpy(a.copy())
    out = fl.compile(lambda x: f(fl, x))(x)
    ref = f(torch, xt)
    np.testing.assert_allclose(x.numpy(), xt.numpy(), rtol=1e-6)
    np.testing.assert_allclose(float(out), float(ref), rtol=1e-6)
    assert copies == [(6, 6)]


def test_an_input_sharing_memory_with_a_written_input_takes_the_copy(backend, copies):
    """g(x, y) with y a transposed view of x: x's new value (x * 3) is stored in place only while no
    other input shares x's memory (`wrapper.unaliased`); here it is copied back, after y was read."""
    def g(T, x, y):
        out = y * 2 + 1
        x.mul_(3)
        return out
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    cg = fl.compile(lambda x, y: g(fl, x, y))
    x0 = fl.tensor(a)
    cg(x0, fl.tensor(a))                                 # unaliased inputs: stored in place
    assert copies == []
    np.testing.assert_allclose(x0.numpy(), a * 3)
    x, xt = fl.tensor(a), torch.from_numpy(a.copy())
    out, ref = cg(x, x.t()), g(torch, xt, xt.t())
    np.testing.assert_allclose(out.numpy(), ref.numpy())
    np.testing.assert_allclose(x.numpy(), xt.numpy())
    assert copies == [(4, 4)]


def test_frozen_graph_writes_the_buffer_not_the_input_at_its_old_position(backend, copies, monkeypatch):
    """With `config.freezing` the parameter placeholder becomes a constant and the graph's inputs shift
    (freezing.compile_frozen renumbers `input_writes`): the buffer's new value goes into the buffer, the
    input x (of the same shape and dtype, now at the buffer's old position) keeps its values."""
    class M(fl.nn.Module):
        def __init__(self, T):
            super().__init__()
            self.w = T.nn.Parameter(T.arange(4.0) + 1)
            self.register_buffer("b", T.ones(4))

        def forward(self, x):
            self.b.add_(x)
            return x * self.w + self.b
    made = spy_compile_fx(monkeypatch, [])
    monkeypatch.setattr(config, "freezing", True)
    m = M(fl)
    a = np.arange(4, dtype=np.float32) - 1.5
    x = fl.tensor(a)
    with fl.no_grad():
        out = fl.compile(m)(x)
    np.testing.assert_allclose(x.numpy(), a)
    np.testing.assert_allclose(m.b.numpy(), 1 + a)
    np.testing.assert_allclose(out.numpy(), a * (np.arange(4) + 1) + 1 + a)
    assert copies == [] and any("if _own" in c.artifact.wrapper_source for c in made)



# ---- on the GPU machine ----------------------------------------------------------------------------
@pytest.mark.cuda
def test_cuda_conv_batchnorm_training_stores_running_stats_in_place_with_an_arena(copies, monkeypatch):
    """The compiled conv/BatchNorm training step on cuda: its running statistics stored by the kernels
    (no copy-back), its temporaries views of the call's arena (`_amem` in a wrapper), values equal to
    PyTorch's on the CPU (TF32 convolutions allowed: loose tolerances)."""
    made = spy_compile_fx(monkeypatch, [])
    fl._dynamo.reset()
    m, ref = _net(fl), _net(torch)
    ref.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in m.state_dict().items()})
    m = m.cuda()
    f = fl.compile(m)
    x = np.random.default_rng(0).standard_normal((8, 3, 12, 12)).astype(np.float32)
    for step in range(3):
        xs = x * (step + 1)
        f(fl.tensor(xs).cuda()).square().mean().backward()
        ref(torch.from_numpy(xs)).square().mean().backward()
    fl._dynamo.reset()
    srcs = [c.artifact.wrapper_source for c in made if c.artifact is not None]
    assert any("if _own" in s for s in srcs) and any("_amem" in s for s in srcs)
    assert copies == []
    for (k, v), (_, r) in zip(m.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(torch.from_numpy(np.array(v.cpu().numpy())), r, rtol=2e-3, atol=2e-3, msg=k)
    for p, r in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(torch.from_numpy(np.array(p.grad.cpu().numpy())), r.grad, rtol=2e-2, atol=2e-3)
