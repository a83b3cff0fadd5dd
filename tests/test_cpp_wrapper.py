"""config.cpp_wrapper: compiled graphs whose per-call wrapper is generated C++ (cpp_wrapper.py).

Each test compiles with `options={"cpp_wrapper": True}`, compares with eager (and gradients with
eager's), and asserts that the C++ wrapper ran: every compiled graph's artifact says so and its
source holds `fl_graph_run`. A graph with a step the C++ wrapper can't run keeps the Python wrapper,
counted in `counters["cpp_wrapper_fallbacks"]`.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import flambeau as fl
import flambeau.nn as nn
from tests.test_aoti import _model

compile_fx = sys.modules["flambeau._inductor.compile_fx"]
RTOL, ATOL = 1e-5, 1e-5
OPTIONS = {"cpp_wrapper": True}


@pytest.fixture
def graphs(monkeypatch):
    made = []
    orig = compile_fx.CompiledGraph.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(compile_fx.CompiledGraph, "__init__", init)
    fl._dynamo.reset()
    yield made
    fl._dynamo.reset()


def _assert_cpp(graphs):
    assert graphs and all(g.artifact is not None and g.artifact.cpp_wrapper for g in graphs)
    assert all("fl_graph_run" in g.source and "_run(" in g.artifact.wrapper_source for g in graphs)


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_cpp_wrapper_matches_eager(graphs, name):
    m, args = _model(name)
    with fl.no_grad():
        y = fl.compile(m, options=OPTIONS)(*args)
        ref = m(*args)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    _assert_cpp(graphs)


def test_cpp_wrapper_dynamic_sizes(graphs):
    m, _ = _model("mlp")
    c = fl.compile(m, options=OPTIONS, dynamic=True)
    with fl.no_grad():
        for b in (3, 9, 17):
            x = fl.randn(b, 8)
            np.testing.assert_allclose(c(x).numpy(), m(x).numpy(), rtol=RTOL, atol=ATOL)
    _assert_cpp(graphs)
    assert len(graphs) == 1 and graphs[0].size_names      # one graph for every size


def test_cpp_wrapper_training_step_gradients(graphs):
    m, (x,) = _model("mlp")
    ref = [p.detach().clone() for p in m.parameters()]
    c = fl.compile(m, options=OPTIONS)
    c(x).pow(2).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    for p in m.parameters():
        p.grad = None
    m(x).pow(2).sum().backward()
    for g, p in zip(got, m.parameters()):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert all(np.array_equal(a.numpy(), p.detach().numpy()) for a, p in zip(ref, m.parameters()))
    assert len(graphs) == 2                  # forward and backward, both with the C++ wrapper
    _assert_cpp(graphs)


def test_cpp_wrapper_views_mutations_and_kernel_errors(graphs):
    def f(x, idx):
        x.add_(1)
        return x.t(), x[idx].sum(1), x * 2

    x, idx = fl.randn(4, 3), fl.tensor([0, 3, 1])
    xe = x.clone()
    out = fl.compile(f, options=OPTIONS)(x, idx)
    ref = f(xe, idx)
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL)
        assert a.shape == b.shape and a.stride() == b.stride()
    np.testing.assert_array_equal(x.numpy(), xe.numpy())      # the input was written, as eager's
    _assert_cpp(graphs)
    g = fl.compile(lambda t, i: t[i] * 2, options=OPTIONS)
    with pytest.raises(IndexError, match="index out of range"):
        g(fl.randn(4, 3), fl.tensor([0, 9]))


def test_cpp_wrapper_keeps_python_wrapper_for_other_externs(graphs):
    before = compile_fx.counters["cpp_wrapper_fallbacks"]
    a = fl.randn(4, 4)
    y = fl.compile(lambda a: fl.linalg.inv(a) * 2, options=OPTIONS)(a)
    np.testing.assert_allclose(y.numpy(), np.linalg.inv(a.numpy()) * 2, rtol=1e-4, atol=1e-5)
    assert compile_fx.counters["cpp_wrapper_fallbacks"] == before + 1
    assert not graphs[-1].artifact.cpp_wrapper and "fl_graph_run" not in graphs[-1].source


def test_cpp_wrapper_runs_float64_products_with_double_sums(graphs):
    """float64 mm runs in the C++ wrapper (fl_dgemm), equal to float64 NumPy to 1e-12 (float sums would not be)."""
    a, b = fl.randn(40, 300, dtype=fl.float64), fl.randn(300, 30, dtype=fl.float64)
    y = fl.compile(lambda a, b: (a @ b).relu(), options=OPTIONS)(a, b)
    np.testing.assert_allclose(y.numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-12, atol=1e-12)
    _assert_cpp(graphs)
    assert "fl_dgemm(1, " in graphs[-1].source


def test_cpp_wrapper_module_with_buffers_inplace(graphs):
    m = nn.BatchNorm1d(4)                    # training: running statistics written by the graph
    x = fl.randn(6, 4)
    me = nn.BatchNorm1d(4)
    y = fl.compile(m, options=OPTIONS)(x)
    np.testing.assert_allclose(y.detach().numpy(), me(x).detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(m.running_var.numpy(), me.running_var.numpy(), rtol=RTOL, atol=ATOL)
    _assert_cpp(graphs)


def test_cpp_wrapper_with_freezing(graphs, monkeypatch):
    monkeypatch.setattr(fl._inductor.config, "freezing", True)
    m, args = _model("gpt")
    with fl.no_grad():
        y = fl.compile(m, options=OPTIONS)(*args)
        ref = m(*args)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    _assert_cpp(graphs)
    assert graphs[0].artifact.wrapper_source.startswith("def call(args):\n    _in0, = args")   # weights are constants


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpp_wrapper_calls_the_fused_attention_and_bf16_gemm(graphs, dtype):
    """The small GPT (and attention alone, its output being a graph output of the two-output op) compiled
    with the C++ wrapper call `_sdpa_flash_cpu` as an extern from C++ (not the math decomposition) and, in
    bfloat16, the Linear layers' bfloat16 GEMM; outputs vs eager."""
    from flambeau._backends import cpu_kernels
    if dtype == "bfloat16" and not cpu_kernels.bf16_native():
        pytest.skip("no AVX-512 BF16 here: bfloat16 products keep the Python wrapper in the JIT path")
    m, (x,) = _model("gpt")
    m = m.to(getattr(fl, dtype))
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2}[dtype]
    with fl.no_grad():
        y = fl.compile(m, options=OPTIONS)(x)
        ref = m(x)
        q, k, v = (fl.randn(2, 4, 8, 16, dtype=getattr(fl, dtype)) for _ in range(3))
        attn = fl.compile(lambda q, k, v: nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                          options=OPTIONS)
        np.testing.assert_allclose(attn(q, k, v).float().numpy(),
                                   nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().numpy(),
                                   rtol=tol, atol=tol)
    np.testing.assert_allclose(y.float().numpy(), ref.float().numpy(), rtol=tol, atol=tol)
    _assert_cpp(graphs)
    assert [g.source.count("fl_attention_forward(fl_sz") for g in graphs] == [2, 1]
    assert ("fl_gemm_bf16(1" in graphs[0].source) == (dtype == "bfloat16")
