"""Compile under autocast vs PyTorch's torch.compile, the same code run by both (`lib`).

Autocast entered outside a compiled function: one compile, guarded on the autocast state (no
recompile while it is unchanged; leaving it or changing its dtype recompiles once). Entered inside
(`autocast`, `amp.autocast`, `cpu.amp.autocast`/`cuda.amp.autocast`, an `@autocast` decorated
function): one graph, no break, the casts in the AOT graph, output dtypes as in eager. Backward
under autocast, compiled. A counting backend counts compiles (`frame_count`) and runs of compiled
graphs (`runs`): a call that does not run a graph ran eagerly.
"""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from tests.test_dynamo import lib  # noqa: F401

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BACKENDS = ["graph", "aot_eager"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # deprecated cpu.amp/cuda.amp spellings
        yield


def _need(lib, device):
    if device == "cuda" and not lib.cuda.is_available():
        pytest.skip(f"{lib.__name__} has no CUDA here")


def _low(lib, device):
    return lib.bfloat16 if device == "cpu" else lib.float16


def counter(lib, backend: str = "graph"):
    """`lib._dynamo.testing.CompileCounter` that also counts runs of the graphs it compiled and
    hands each graph to `backend` ("graph": run as captured; "aot_eager": AOT autograd)."""
    registry = importlib.import_module(lib.__name__ + "._dynamo.backends.registry")
    testing = importlib.import_module(lib.__name__ + "._dynamo.testing")
    inner = None if backend == "graph" else registry.lookup_backend(backend)

    class Runs(testing.CompileCounter):
        def __init__(self):
            super().__init__()
            self.runs = 0

        def __call__(self, gm, example_inputs):
            fn = super().__call__(gm, example_inputs)
            if inner is not None:
                fn = inner(gm, example_inputs)

            def run(*args):
                self.runs += 1
                return fn(*args)
            return run
    return Runs()


def _mlp(lib, device):
    lib.manual_seed(0)
    nn = lib.nn
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)


def _close(lib, a, b, tol=3e-2):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(a.detach().float().cpu().numpy(), b.detach().float().cpu().numpy(), rtol=tol, atol=tol)


# ---- autocast entered outside the compiled function --------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_outer_autocast_compiles_once(lib, device, backend):
    _need(lib, device)
    m = _mlp(lib, device)
    cnt = counter(lib, backend)
    cf = lib.compile(m, backend=cnt)
    x = lib.randn(4, 8, device=device)
    with lib.autocast(device, dtype=_low(lib, device)):
        ref = m(x)
        outs = [cf(x) for _ in range(6)]
    assert ref.dtype == _low(lib, device)
    for o in outs:
        _close(lib, o, ref)
    assert cnt.frame_count == 1
    assert cnt.runs == 6                        # every call ran the compiled graph, none ran eagerly


@pytest.mark.parametrize("device", DEVICES)
def test_leaving_or_changing_autocast_recompiles_once(lib, device):
    _need(lib, device)
    low = _low(lib, device)
    other = lib.float16 if low is lib.bfloat16 else lib.bfloat16
    cnt = counter(lib)

    def f(x, w):
        return (x @ w).relu() + 1

    cf = lib.compile(f, backend=cnt)
    x, w = lib.randn(4, 4, device=device), lib.randn(4, 4, device=device)
    seen = []
    for region, n in ((low, 3), (None, 2), (low, 2), (other, 2), (None, 1)):
        for _ in range(n):
            if region is None:
                out = cf(x, w)
            else:
                with lib.autocast(device, dtype=region):
                    out = cf(x, w)
            seen.append((out.dtype, cnt.frame_count))
        assert out.dtype == (lib.float32 if region is None else region)
    # bf16: 1 compile; off: one recompile; back to bf16: the first entry again; fp16: one more
    assert [c for _, c in seen] == [1, 1, 1, 2, 2, 2, 2, 3, 3, 3]
    assert cnt.runs == 10


# ---- autocast entered inside the compiled function ---------------------------------------------------
def _region(lib, device, spelling):
    low = _low(lib, device)
    if spelling == "autocast":
        return lib.autocast(device, dtype=low)
    if spelling == "amp.autocast":
        return lib.amp.autocast(device, dtype=low)
    return getattr(lib, device).amp.autocast(dtype=low)          # cpu.amp.autocast / cuda.amp.autocast


SPELLINGS = ["autocast", "amp.autocast", "device.amp.autocast", "decorated callee", "decorated top"]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("device", DEVICES)
def test_autocast_inside_is_one_graph(lib, device, spelling):
    _need(lib, device)
    cnt = counter(lib)
    if spelling.startswith("decorated"):
        @lib.autocast(device, dtype=_low(lib, device))
        def inner(x, w):
            return x @ w, (x @ w).sum()

        f = inner if spelling == "decorated top" else (lambda x, w: tuple(t + 1 for t in inner(x, w)))
    else:
        def f(x, w):
            with _region(lib, device, spelling):
                y = x @ w
                s = y.sum()
            return y + 1, s, (x @ w)

    cf = lib.compile(f, backend=cnt, fullgraph=True)             # fullgraph: no graph break allowed
    x, w = lib.randn(4, 4, device=device), lib.randn(4, 4, device=device)
    ref = f(x, w)
    for _ in range(3):
        out = cf(x, w)
        assert [t.dtype for t in out] == [t.dtype for t in ref]
        for a, b in zip(out, ref):
            _close(lib, a, b)
    assert ref[0].dtype == _low(lib, device)
    assert not lib.is_autocast_enabled(device)
    assert cnt.frame_count == 1 and cnt.runs == 3


def _aot_forward_graphs(lib, fn, args, outer=None):
    """The AOT forward/inference graphs of `fn` compiled (dynamo -> AOT autograd) and called once."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    aot = importlib.import_module(lib.__name__ + "._functorch.aot_autograd").aot_module_simplified

    def backend(gm, example_inputs):
        return aot(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    cf = lib.compile(fn, backend=backend, fullgraph=True)
    if outer is None:
        out = cf(*args)
    else:
        with lib.autocast("cpu", dtype=outer):
            out = cf(*args)
    return graphs, out


def _casts_to(gm, dtype) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and any(k in str(n.target) for k in ("_to_copy", "convert_element_type"))
               and getattr(n.meta.get("val"), "dtype", None) == dtype)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_casts_are_in_the_aot_graph(lib, where):
    def inside(x, w):
        with lib.autocast("cpu", dtype=lib.bfloat16):
            return x @ w

    def outside(x, w):
        return x @ w

    x, w = lib.randn(4, 4), lib.randn(4, 4)
    graphs, out = _aot_forward_graphs(lib, inside if where == "inside" else outside, (x, w),
                                      outer=None if where == "inside" else lib.bfloat16)
    assert out.dtype == lib.bfloat16
    assert len(graphs) == 1 and _casts_to(graphs[0], lib.bfloat16) == 2        # x and w, both to bf16


def test_autocast_disabled_inside_an_outer_region(lib):
    """The AOT graph holds the casts it was traced with; run again under the outer region, its ops
    must not be cast a second time (the inner `enabled=False` matmul stays float32)."""
    cnt = counter(lib, "aot_eager")

    def f(x, w):
        with lib.autocast("cpu", enabled=False):
            a = x @ w
        return a, x @ w

    cf = lib.compile(f, backend=cnt, fullgraph=True)
    x, w = lib.randn(4, 4), lib.randn(4, 4)
    with lib.autocast("cpu", dtype=lib.bfloat16):
        for _ in range(2):
            a, b = cf(x, w)
            assert (a.dtype, b.dtype) == (lib.float32, lib.bfloat16)
    _close(lib, a, x @ w, 1e-5)
    assert cnt.frame_count == 1 and cnt.runs == 2


# ---- backward ----------------------------------------------------------------------------------------
def _train_step(lib, m, x, y, where, device):
    low = _low(lib, device)

    def loss_fn(x, y):
        if where == "inside":
            with lib.autocast(device, dtype=low):
                out = m(x)
        else:
            out = m(x)
        return lib.nn.functional.cross_entropy(out.float(), y), out

    return loss_fn


@pytest.mark.parametrize("where", ["inside", "outside"])
@pytest.mark.parametrize("device", DEVICES)
def test_backward_under_autocast_compiled(lib, device, where):
    _need(lib, device)
    low = _low(lib, device)
    x = lib.randn(6, 8, device=device)
    y = lib.tensor([0, 1, 2, 3, 0, 1], device=device)
    results = []
    cnt = counter(lib, "aot_eager")
    for compiled in (False, True):
        m = _mlp(lib, device)
        fn = _train_step(lib, m, x, y, where, device)
        run = lib.compile(fn, backend=cnt) if compiled else fn
        for _ in range(3):
            m.zero_grad()
            with lib.autocast(device, dtype=low, enabled=where == "outside"):
                loss, out = run(x, y)
            loss.backward()
        results.append((loss, out, [p.grad for p in m.parameters()]))
    (l0, o0, g0), (l1, o1, g1) = results
    assert o0.dtype == o1.dtype == low
    _close(lib, l1, l0)
    for a, b in zip(g1, g0):
        assert a.dtype == lib.float32
        _close(lib, a, b)
    assert cnt.frame_count == 1 and cnt.runs == 3


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_training_under_autocast(device):
    """flambeau's inductor: compiled forward and backward under an outer autocast region, once."""
    import flambeau as fl
    _need(fl, device)
    fl._dynamo.reset()
    fl._dynamo.utils.counters.clear()
    x = fl.randn(6, 8, device=device)
    y = fl.tensor([0, 1, 2, 3, 0, 1], device=device)
    results = []
    for compiled in (False, True):
        m = _mlp(fl, device)
        fn = _train_step(fl, m, x, y, "outside", device)
        run = fl.compile(fn) if compiled else fn
        for _ in range(3):
            m.zero_grad()
            with fl.autocast(device, dtype=_low(fl, device)):
                loss, out = run(x, y)
            loss.backward()
        results.append((loss, out, [p.grad for p in m.parameters()]))
    (l0, o0, g0), (l1, o1, g1) = results
    assert o1.dtype == o0.dtype == _low(fl, device)
    _close(fl, l1, l0)
    for a, b in zip(g1, g0):
        _close(fl, a, b)
    c = fl._dynamo.utils.counters
    assert c["frames"]["ok"] == 1 and not c["recompiles"]
    assert not [k for k in c["inductor_fallbacks"] if k.startswith("whole frame")]


def test_aot_function_cache_keys_on_autocast():
    """flambeau's aot_function traces again when the autocast state differs from its first trace."""
    import flambeau as fl
    from flambeau._functorch.aot_autograd import aot_function

    f = aot_function(lambda x, w: x @ w, fw_compiler=lambda gm, ex: gm.forward)
    x, w = fl.randn(3, 3), fl.randn(3, 3)
    assert f(x, w).dtype is fl.float32
    with fl.autocast("cpu", dtype=fl.bfloat16):
        assert f(x, w).dtype is fl.bfloat16
    assert f(x, w).dtype is fl.float32


def test_cache_size_limit_counts_frames_run_eagerly():
    """A frame past config.cache_size_limit runs eagerly and is counted as a "whole frame" fallback."""
    import flambeau as fl
    fl._dynamo.reset()
    fl._dynamo.utils.counters.clear()
    old = fl._dynamo.config.cache_size_limit
    fl._dynamo.config.cache_size_limit = 1
    try:
        cf = fl.compile(lambda x: x + 1, backend=counter(fl))
        cf(fl.randn(2))
        cf(fl.randn(3))
        cf(fl.randn(4))
    finally:
        fl._dynamo.config.cache_size_limit = old
    eager = {k: v for k, v in fl._dynamo.utils.counters["inductor_fallbacks"].items() if k.startswith("whole frame")}
    assert sum(eager.values()) == 2 and all("cache_size_limit" in k for k in eager)
