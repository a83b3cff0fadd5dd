"""compile + NumPy (PyTorch 2.1's torch.compile of NumPy code): functions written with `numpy` on
ndarrays, and mixed flambeau/NumPy code, are captured into one graph (`fullgraph=True`, a counting
backend sees the np.* calls as nodes) and give NumPy's own results and dtypes, returned as
numpy.ndarrays; checked against NumPy itself, and against torch.compile on the same functions.
`np.random` and NumPy functions flambeau._numpy lacks break the graph with their reason."""
import numpy as np
import pytest
import torch
import torch._numpy

import flambeau
import flambeau._numpy as tnp
from flambeau._counters import counters
from flambeau._dynamo.testing import CompileCounter
from flambeau._numpy import _wrappers


def _rng():
    return np.random.default_rng(0)


def _f32(*shape):
    return _rng().standard_normal(shape).astype(np.float32)


def _f64(*shape):
    return _rng().standard_normal(shape)


def _i32(*shape):
    return _rng().integers(-5, 6, shape).astype(np.int32)


# ---- the NumPy programs (module-level functions: NumPy is read as the global `np`) -----------------------
def mlp_step(x, w1, w2):
    h = np.maximum(x @ w1, 0.0)
    out = h @ w2
    return np.exp(out - out.max(axis=1, keepdims=True)).sum(axis=-1)


def promotion(a, b):
    return a + b, a * 2.0, a / b, a // 3, np.sqrt(a), (a > b).sum()


def reductions(a):
    return (np.sum(a), a.mean(axis=0), np.std(a, axis=1, ddof=1), a.var(), np.argmax(a, axis=1), a.min(),
            np.prod(a[:2], axis=(0, 1)), np.cumsum(a, axis=0), np.all(a > -10), np.any(a > 10, axis=0))


def int_reductions(a):
    return a.sum(), np.mean(a), a.prod(axis=0), np.cumsum(a), a.max(axis=1)


def creation(a):
    z = np.zeros((2, 3)) + np.ones(3) * np.arange(3) + np.eye(2, 3) + np.full((2, 3), 7)
    return z, np.linspace(0.0, 1.0, 5), np.arange(0.5, 3.0, 0.5), np.zeros_like(a), np.ones_like(a, dtype=np.int8)


def shapes(a):
    b = a.reshape(4, 3).T
    c = np.concatenate([a, a], axis=1)
    return (b, c, np.stack([a, a]).shape, np.transpose(a[None], (2, 0, 1)), a.ravel(), np.expand_dims(a, 0),
            np.squeeze(a[:, :1]), np.swapaxes(a, 0, 1), np.flip(a, 1), np.roll(a, 1, axis=0), np.tile(a, (1, 2)),
            np.where(a > 0, a, -1.0), np.clip(a, -0.5, 0.5), np.triu(a[:3, :3]), np.vstack([a, a]),
            np.broadcast_to(a[:1], (3, 4)))


def indexing(a, idx):
    b = a.copy()
    b[0] = 1.0
    b[:, 1] += 2.0
    b[idx] *= -1.0
    return b, a[1:, ::2], a[idx], a[..., None].shape, a[[0, 2], 1:]


def products(a, b):
    return (np.dot(a, b.T), np.einsum("ij,kj->ik", a, b), np.outer(a[0], b[0]), np.linalg.norm(a),
            np.linalg.norm(a, axis=1), np.tensordot(a, b, axes=([1], [1])), np.linalg.inv(a[:, :3] @ a[:, :3].T +
                                                                                      3 * np.eye(3)))


def inplace(a, b):
    a += 1.0
    a *= b
    np.add(a, b, out=a)
    return a


def attributes(a):
    return a.shape, a.ndim, a.size, a.dtype, a.itemsize, a.T.shape, len(a), isinstance(a, np.ndarray)


def ufunc_kwargs(a, b):
    out = np.empty_like(a)
    np.multiply(a, b, out=out)
    return out, np.add(a, b, dtype=np.float32), np.hypot(a, b), np.arctan2(a, b), np.logaddexp(a, b)


def scalars_and_weak_types(a):
    return a + 1, a * 2.5, 1 - a, 2 ** a, np.float32(2) * a, a.astype(np.int64) + 1


def mixed(t):
    x = t.numpy()
    y = np.tanh(x) * 2
    return flambeau.from_numpy(y) + t


def mixed_torch(t):
    x = t.numpy()
    y = np.tanh(x) * 2
    return torch.from_numpy(y) + t


CASES = {
    "mlp_step": (mlp_step, lambda: (_f32(4, 5), _f32(5, 6), _f32(6, 3))),
    "promotion_f32_i32": (promotion, lambda: (_f32(3, 4), _i32(3, 4) + 10)),
    "promotion_i32_f64": (promotion, lambda: (_i32(3, 4), _f64(3, 4))),
    "reductions_f32": (reductions, lambda: (_f32(3, 4),)),
    "reductions_f64": (reductions, lambda: (_f64(3, 4),)),
    "int_reductions": (int_reductions, lambda: (_i32(3, 4),)),
    "creation": (creation, lambda: (_f32(2, 3),)),
    "shapes": (shapes, lambda: (_f32(3, 4),)),
    "indexing": (indexing, lambda: (_f64(3, 4), np.array([2, 0]))),
    "products": (products, lambda: (_f64(3, 4), _f64(5, 4))),
    "inplace": (inplace, lambda: (_f64(3, 4), _f64(3, 4))),
    "attributes": (attributes, lambda: (_f32(3, 4),)),
    "ufunc_kwargs": (ufunc_kwargs, lambda: (_f64(3, 4), _f64(3, 4) + 1)),
    "scalars_and_weak_types": (scalars_and_weak_types, lambda: (_f32(3, 4),)),
}


def _assert_same(got, want, path="result"):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}[{i}]")
        return
    if isinstance(want, (np.ndarray, np.generic)):
        assert isinstance(got, np.ndarray), f"{path}: {type(got).__name__} returned, NumPy gives an array"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype}, NumPy gives {want.dtype}"
        assert got.shape == np.shape(want), (path, got.shape, np.shape(want))
        np.testing.assert_allclose(got, want, rtol=2e-6 if want.dtype != np.float16 else 1e-3, atol=1e-6,
                                   err_msg=path)
        return
    assert got == want and type(got) is type(want), (path, got, want)


def _copies(args):
    return tuple(a.copy() for a in args)


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_function_compiles_to_one_graph_and_matches_numpy(name, backend):
    fn, make = CASES[name]
    args = make()
    want = fn(*_copies(args))
    flambeau._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()
    compiled = flambeau.compile(fn, backend=cnt if backend == "counter" else backend, fullgraph=True)
    got_args = _copies(args)
    got = compiled(*got_args)
    _assert_same(got, want)
    if name == "inplace":                       # the caller's array was written
        _assert_same(got_args[0], want)
    assert not counters["graph_break"], dict(counters["graph_break"])
    if backend == "counter":
        assert cnt.frame_count == 1
        assert cnt.op_count > 0
    again = compiled(*_copies(args))            # the cached entry
    _assert_same(again, want)


def test_numpy_calls_are_graph_nodes_not_eager_calls():
    """Every NumPy call, method and operator of the function is a node of the one graph (a flambeau._numpy
    wrapper), so nothing of it runs as NumPy code: a call left to run eagerly (graph break, skipped
    frame, a constant folded at trace time) leaves its node out and fails here."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    flambeau._dynamo.reset()
    a, w1, w2 = CASES["mlp_step"][1]()
    compiled = flambeau.compile(mlp_step, backend=backend)
    _assert_same(compiled(a, w1, w2), mlp_step(a, w1, w2))
    assert len(graphs) == 1
    seen = []
    for n in graphs[0].graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if isinstance(t, _wrappers.numpy_function):
            seen.append(t.qualname)
        elif isinstance(t, _wrappers.numpy_method):
            seen.append("." + t.name)
        elif t is _wrappers.numpy_binary_operator:
            seen.append(n.args[0].__name__)
    assert sorted(seen) == sorted(["matmul", "maximum", "matmul", ".max", "sub", "exp", ".sum"]), seen


def test_trace_numpy_off_breaks_the_graph(monkeypatch):
    monkeypatch.setattr(flambeau._dynamo.config, "trace_numpy", False)
    flambeau._dynamo.reset()
    with pytest.raises(flambeau._dynamo.exc.Unsupported):
        flambeau.compile(mlp_step, backend="eager", fullgraph=True)(*CASES["mlp_step"][1]())


def _noise(a):
    return a + np.random.rand(*a.shape)


def _unsupported(a):
    return np.fft.fft(a).real + 1


@pytest.mark.parametrize("fn, reason", [(_noise, "np.random.rand"), (_unsupported, "numpy.fft.fft")])
def test_random_and_unsupported_functions_break_the_graph_with_a_reason(fn, reason, caplog):
    flambeau._dynamo.reset()
    counters.clear()
    a = _f64(3, 4)
    np.random.seed(1)
    want = fn(a)
    np.random.seed(1)
    got = flambeau.compile(fn, backend="eager")(a)
    np.testing.assert_allclose(got, want)
    assert any(reason in k for k in counters["graph_break"]), dict(counters["graph_break"])
    with pytest.raises(flambeau._dynamo.exc.Unsupported, match=reason.replace(".", r"\.")):
        flambeau._dynamo.reset()
        flambeau.compile(fn, backend="eager", fullgraph=True)(a)


def test_mixed_flambeau_and_numpy_code_is_one_graph_with_gradients():
    flambeau._dynamo.reset()
    cnt = CompileCounter()
    x = _f32(3, 4)
    t = flambeau.tensor(x)
    got = flambeau.compile(mixed, backend=cnt, fullgraph=True)(t)
    want = torch.compile(mixed_torch, backend="eager", fullgraph=True)(torch.tensor(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    assert isinstance(got, flambeau.Tensor) and cnt.frame_count == 1


# not int_reductions: torch.compile gives np.cumsum of int32 as int32, NumPy (and flambeau) int64;
# not reductions: torch.compile refuses np.prod(axis=tuple)
@pytest.mark.parametrize("name", ["mlp_step", "promotion_f32_i32", "shapes", "creation",
                                  "products", "scalars_and_weak_types"])
def test_matches_torch_compile_of_the_same_numpy_code(name):
    fn, make = CASES[name]
    args = make()
    flambeau._dynamo.reset()
    torch._dynamo.reset()
    got = flambeau.compile(fn, backend="eager", fullgraph=True)(*_copies(args))
    want = torch.compile(fn, backend="eager", fullgraph=True)(*_copies(args))
    _assert_same(got, want)


def test_dynamic_sizes_compile_once():
    flambeau._dynamo.reset()
    cnt = CompileCounter()
    compiled = flambeau.compile(mlp_step, backend=cnt, dynamic=True, fullgraph=True)
    for n in (4, 7, 9):
        a, w1, w2 = _f32(n, 5), _f32(5, 6), _f32(6, 3)
        _assert_same(compiled(a, w1, w2), mlp_step(a, w1, w2))
    assert cnt.frame_count == 1


def test_new_dtype_recompiles_with_numpy_promotion():
    flambeau._dynamo.reset()
    cnt = CompileCounter()
    compiled = flambeau.compile(promotion, backend=cnt, fullgraph=True)
    for args in (CASES["promotion_f32_i32"][1](), CASES["promotion_i32_f64"][1]()):
        _assert_same(compiled(*_copies(args)), promotion(*_copies(args)))
    assert cnt.frame_count == 2


def test_graph_break_keeps_arrays_alive_across_the_break():
    def fn(a):
        b = np.cos(a) * 2
        flambeau._dynamo.graph_break()
        return b + np.sin(a)

    flambeau._dynamo.reset()
    cnt = CompileCounter()
    a = _f64(3)
    _assert_same(flambeau.compile(fn, backend=cnt)(a), fn(a))
    assert cnt.frame_count == 2


def test_flambeau_numpy_module_eager_matches_numpy():
    a, b = _f32(3, 4), _i32(3, 4)
    ta, tb = tnp.asarray(a), tnp.asarray(b)
    pairs = [(ta + tb, a + b), (tnp.mean(tb, axis=0), np.mean(b, axis=0)), (ta @ ta.T, a @ a.T),
             (tnp.sin(tb.astype(np.int8)), np.sin(b.astype(np.int8))), (ta.sum(1, keepdims=True), a.sum(1, keepdims=True)),
             (tnp.ones(3), np.ones(3)), (tnp.arange(4) / 2, np.arange(4) / 2), (-tb, -b), (abs(tb), abs(b))]
    for got, want in pairs:
        assert isinstance(got, tnp.ndarray)
        _assert_same(np.asarray(got), want)
    with pytest.raises(TypeError, match="same_kind"):
        x = tnp.zeros(3, dtype=np.int64)
        x += 1.5


@pytest.mark.parametrize("api", [tnp, torch._numpy], ids=["flambeau", "torch"])
def test_array_of_a_numpy_array_is_a_copy(api):
    """np.array(a) copies (copy=True), np.array(a, copy=False) and np.asarray(a) share a's memory: writes
    through each reach `a` as in NumPy (flambeau's array() shared the memory)."""
    a = np.zeros(3)
    api.array(a)[0] = 5.0
    api.array(a, copy=False)[1] = 7.0
    api.asarray(a)[2] = 9.0
    want = np.zeros(3)
    np.array(want)[0] = 5.0
    np.array(want, copy=False)[1] = 7.0
    np.asarray(want)[2] = 9.0
    np.testing.assert_array_equal(a, want)


def test_graph_logs_name_the_numpy_calls(monkeypatch, capsys):
    monkeypatch.setenv("FLAMBEAU_LOGS", "graph")
    flambeau._dynamo.reset()
    flambeau.compile(mlp_step, backend="eager", fullgraph=True)(*CASES["mlp_step"][1]())
    err = capsys.readouterr().err
    monkeypatch.setenv("FLAMBEAU_LOGS", "")
    flambeau._dynamo.reset()
    assert "wrapped_maximum" in err and "wrapped_exp" in err


def test_wrap_numpy_compiles_numpy_code_for_tensors_with_gradients():
    """torch.compiler.wrap_numpy's example: NumPy code as a Tensor -> Tensor function, gradients through it."""
    def body(a):
        return np.sum(a * a)

    def run(T):
        fn = T.compile(T.compiler.wrap_numpy(body), backend="aot_eager", fullgraph=True)
        x = T.arange(6, dtype=T.float32, requires_grad=True)
        out = fn(x)
        out.backward()
        return out.detach().numpy(), x.grad.numpy(), type(out).__module__.split(".")[0]
    flambeau._dynamo.reset()
    torch._dynamo.reset()
    got, want = run(flambeau), run(torch)
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1])
    assert got[2] == "flambeau" and want[2] == "torch"
