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
from tests.conftest import keep_log

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
    records, handler = keep_log("flambeau.fallbacks")
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


# ---- compile(mode=..., options=...): accepted values act or say so; others raise like torch.compile ----
@pytest.mark.parametrize("kwargs", [dict(mode="foo"), dict(options={"nonexistent": 1}),
                                    dict(options={"debug": "yes"}), dict(mode="reduce-overhead", options={}),
                                    dict(mode="max-autotune", options={"fuse": True})])
def test_bad_mode_or_options_raise_like_torch(kwargs):
    f = lambda x: x + 1                                      # noqa: E731
    with pytest.raises(RuntimeError) as theirs:
        torch.compile(f, **kwargs)
    with pytest.raises(RuntimeError) as ours:
        fl.compile(f, **kwargs)
    first = lambda e: str(e.value).split(",")[0].split(" known")[0]      # noqa: E731
    if "mode" in kwargs and "options" not in kwargs:    # torch 2.13 also lists its "lite" mode
        assert str(ours.value).startswith("Unrecognized mode=foo, should be one of: ")
    else:
        assert first(ours) == first(theirs)


@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_every_torch_mode_is_accepted_and_a_mode_without_effect_says_so(mode):
    from flambeau._counters import FALLBACKS, counters
    before = dict(counters[FALLBACKS])
    f = fl.compile(lambda x: x.relu() * 2, mode=mode)
    assert f(fl.tensor([-1.0, 2.0])).tolist() == [0.0, 4.0]
    torch.compile(lambda x: x, mode=mode)             # accepted by torch too
    said = sorted(k for k, v in counters[FALLBACKS].items() if v != before.get(k, 0))
    expect = {None: [], "default": [], "reduce-overhead": ["CUDA graph: graphs on cpu are not CUDA graphs"],
              "max-autotune": ["CUDA graph: graphs on cpu are not CUDA graphs",
                               "block-size autotuning: the C++ kernels have no block sizes to tune"],
              "max-autotune-no-cudagraphs": ["block-size autotuning: the C++ kernels have no block sizes to tune"]}
    assert said == expect[mode], said


def test_options_act_or_raise():
    from flambeau._inductor import config as iconfig
    seen = []
    real = fl._inductor.compile_fx

    def spy(gm, ex, **kw):
        seen.append(iconfig.fuse)
        return real(gm, ex, **kw)
    import flambeau._inductor as ind
    old = ind.compile_fx
    ind.compile_fx = spy
    try:
        fl.compile(lambda x: x.sin() + 1, options={"fuse": False})(fl.randn(3))
    finally:
        ind.compile_fx = old
    assert seen == [False] and iconfig.fuse is True
    with pytest.raises(RuntimeError, match="takes no options"):
        fl.compile(lambda x: x, backend="eager", options={"fuse": False})


# ---- config.suppress_errors: False (PyTorch's default) raises with the graph and node named ----------
def _broken_sin_lowering(monkeypatch):
    """Make the lowering rule of `sin` fail the way a bug in a rule would (not ir.Unsupported)."""
    from flambeau._decomp._table import aten

    def broken(g, *args):
        raise ZeroDivisionError("a bug in the sin lowering")
    monkeypatch.setattr(aten.sin, "lowering", broken)


def test_backend_error_raises_naming_the_graph_and_node(monkeypatch):
    assert fl._dynamo.config.suppress_errors is False
    _broken_sin_lowering(monkeypatch)

    def my_function(x):
        return (x * 2).sin() + 1
    with pytest.raises(fl._dynamo.exc.BackendCompilerFailed) as e:
        fl.compile(my_function)(fl.randn(3))
    msg = str(e.value)
    assert msg.startswith("backend='inductor' raised:\nLoweringException: ZeroDivisionError: a bug in the sin lowering")
    assert "target: aten.sin" in msg and "my_function" in msg and "def forward" in msg, msg
    assert isinstance(e.value, RuntimeError)
    assert not counters["inductor_fallbacks"]


def test_suppress_errors_runs_eagerly_with_a_logged_warning(monkeypatch):
    _broken_sin_lowering(monkeypatch)
    monkeypatch.setattr(fl._dynamo.config, "suppress_errors", True)
    records, handler = keep_log("flambeau._dynamo")
    try:
        x = fl.randn(3)
        out = fl.compile(lambda a: (a * 2).sin() + 1)(x)
    finally:
        logging.getLogger("flambeau._dynamo").removeHandler(handler)
    np.testing.assert_allclose(out.numpy(), ((x * 2).sin() + 1).numpy())
    assert any("running it eagerly" in r and "ZeroDivisionError" in r for r in records), records
    assert [k for k in counters["inductor_fallbacks"] if k.startswith("whole frame: ")]


def test_graph_breaks_stay_graph_breaks():
    def f(x):
        y = x.sin()
        print("", end="")                 # a call capture does not trace: the graph breaks here
        return y + 1
    x = fl.randn(3)
    out = fl.compile(f)(x)
    # atol: sin(x) + 1 cancels near x = -pi/2, where one ulp of sin is a large relative error
    np.testing.assert_allclose(out.numpy(), (x.sin() + 1).numpy(), rtol=1e-6, atol=1e-6)
    assert sum(counters["graph_break"].values()) == 1 and not counters["inductor_fallbacks"]
