"""Nothing silent: every eager fallback inside compiled code is counted
(`flambeau._dynamo.utils.counters`, like `torch._dynamo.utils.counters`), logged under
`FLAMBEAU_LOGS=fallbacks`, listed by `flambeau._dynamo.explain`, and checkable with
`flambeau._dynamo.testing.no_unexpected_fallbacks`.

The deliberately unsupported node is a complex product: the code generator takes no complex
dtype, so the node runs eagerly in the wrapper. Values are checked against PyTorch.
"""
import logging
import warnings

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._dynamo.testing import CompileCounter, no_unexpected_fallbacks
from flambeau._dynamo.utils import counters

UNSUPPORTED_DTYPE = "a dtype or device the code generator does not take"
COMPLEX_NODES = ["_to_copy", "abs", "mul.Tensor"]         # the nodes of complex_fn that touch complex64
EXPECTED = [f"{op}: {UNSUPPORTED_DTYPE}" for op in COMPLEX_NODES]


@pytest.fixture(autouse=True)
def _fresh():
    counters.clear()
    fl._dynamo.reset()
    yield
    fl._dynamo.reset()


def complex_fn(T, x, y):
    return (x.to(T.complex64) * y).abs() + y.sin()


def _inputs():
    x, y = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    return (fl.tensor(x), fl.tensor(y)), (torch.tensor(x), torch.tensor(y))


def test_counter_records_the_unsupported_node_with_its_reason():
    (x, y), (tx, ty) = _inputs()
    out = fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
    np.testing.assert_allclose(out.numpy(), complex_fn(torch, tx, ty).numpy(), rtol=1e-6, atol=1e-6)
    fallbacks = counters["inductor_fallbacks"]
    assert sorted(fallbacks) == EXPECTED and set(fallbacks.values()) == {1}, dict(fallbacks)
    assert not any(k.startswith("sin") for k in fallbacks), dict(fallbacks)     # the float part compiled
    assert counters["frames"]["total"] == counters["frames"]["ok"] == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_a_fully_compiled_graph_records_nothing():
    (x, y), _ = _inputs()
    fl.compile(lambda a, b: (a * b).sin() + b)(x, y)
    assert not counters["inductor_fallbacks"]
    assert counters["frames"]["ok"] == 1


def test_whole_graph_fallback_is_recorded():
    from flambeau._inductor import compile_fx
    from flambeau.fx.experimental.proxy_tensor import make_fx
    x = fl.randn(3)
    gm = make_fx(lambda a, n: a * n, tracing_mode="real")(x, 2)
    compiled = compile_fx(gm, [x, 2])
    assert compiled.artifact is None
    assert [k for k in counters["inductor_fallbacks"] if k.startswith("whole graph: ")], dict(counters)


def test_graph_breaks_and_recompiles_are_counted():
    def f(x):
        x = x + 1
        fl._dynamo.graph_break()
        return x * 2
    cf = fl.compile(f, backend="eager")
    cf(fl.randn(3))
    assert sum(counters["graph_break"].values()) == 1
    cf(fl.randn(3, dtype=fl.float64))
    assert counters["recompiles"]["f"] == 1


def test_fallbacks_are_logged(monkeypatch):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    logging.getLogger("flambeau.fallbacks").addHandler(handler)
    try:
        (x, y), _ = _inputs()
        monkeypatch.setenv("FLAMBEAU_LOGS", "")
        fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
        assert not records
        fl._dynamo.reset()
        for kind in ("fallbacks", "perf_hints"):
            monkeypatch.setenv("FLAMBEAU_LOGS", kind)
            fl._dynamo.reset()
            fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
            assert any(m.startswith("mul.Tensor runs eagerly") and UNSUPPORTED_DTYPE in m for m in records), records
            records.clear()
    finally:
        logging.getLogger("flambeau.fallbacks").removeHandler(handler)


def test_explain_lists_fallbacks():
    (x, y), _ = _inputs()
    out = fl._dynamo.explain(lambda a, b: complex_fn(fl, a, b))(x, y)
    assert out.fallbacks == EXPECTED
    text = str(out)
    assert "Fallback Count: 3" in text and f"  mul.Tensor: {UNSUPPORTED_DTYPE}" in text
    clean = fl._dynamo.explain(lambda a, b: (a * b).sin())(x, y)
    assert clean.fallbacks == [] and "Fallback Count: 0" in str(clean)


def test_no_unexpected_fallbacks_helper():
    (x, y), _ = _inputs()
    with pytest.raises(AssertionError, match="mul.Tensor"):
        with no_unexpected_fallbacks():
            fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
    fl._dynamo.reset()
    with pytest.raises(AssertionError, match="abs"):
        with no_unexpected_fallbacks({"mul.Tensor": "complex", "_to_copy": "complex"}):
            fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
    fl._dynamo.reset()
    with no_unexpected_fallbacks({op: "complex" for op in COMPLEX_NODES}) as seen:
        fl.compile(lambda a, b: complex_fn(fl, a, b))(x, y)
    assert sorted(seen) == EXPECTED


def test_compile_counter_backend():
    cnt = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fl.compile(lambda a: a.sin() + 1, backend=cnt)(fl.zeros(2))
    assert out.tolist() == [1.0, 1.0]
    assert cnt.frame_count == 1 and cnt.op_count == 2
