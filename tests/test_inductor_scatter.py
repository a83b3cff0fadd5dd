"""flambeau._inductor's writing ops: scatter, scatter_add, index_put (real loops in the generated
code), the `*_scatter` ops, the linspace/logspace/tril_indices/triu_indices factories and the
mutation `copy_`, compiled and compared with PyTorch, with static and symbolic sizes, on the C++
and the NumPy backends.

Every test also checks that the op was compiled: nothing ran eagerly inside the compiled code
(`flambeau._dynamo.utils.counters["inductor_fallbacks"]` did not move, the graph has no eager
fallback kernel) and, where the op is a loop, that the loop is in the generated source.
"""
import collections
import sys

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau import _cpp_builder as cpp_builder
from flambeau._decomp import DecompositionMode
from flambeau._dynamo.testing import unexpected_fallbacks
from flambeau._dynamo.utils import counters
from flambeau._inductor import compile_fx, config
from flambeau.fx.experimental.proxy_tensor import make_fx
from tests.conftest import spy_compile_fx

cfx = sys.modules["flambeau._inductor.compile_fx"]


@pytest.fixture(autouse=True)
def _fresh(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(cpp_builder, "cache_dir", str(tmp_path_factory.getbasetemp() / "inductor_cache"))
    fl.compiler.reset()
    yield
    fl.compiler.reset()


@pytest.fixture(params=["cpp", "numpy"])
def backend(request, monkeypatch):
    monkeypatch.setattr(config, "backend", request.param)
    return request.param


@pytest.fixture
def graphs(monkeypatch):
    """The CompiledGraphs the inductor backend makes (through flambeau.compile)."""
    return spy_compile_fx(monkeypatch, Compiled())


class Compiled(list):
    """CompiledGraphs, and the fallback counter when the test began."""

    def __init__(self):
        super().__init__()
        self.before = collections.Counter(counters["inductor_fallbacks"])

    def fallbacks(self) -> list:
        return unexpected_fallbacks(counters["inductor_fallbacks"] - self.before)


def assert_compiled(made, loop=None, dynamic=False):
    """Each graph ran as generated code with no eager fallback; `loop`: some kernel stores with
    that C++ statement form (`+=` for an accumulating scatter, `] = ` otherwise)."""
    assert made, "nothing was compiled"
    assert not made.fallbacks(), made.fallbacks()
    for c in made:
        assert c.artifact is not None, c.eager_reason
        assert not c.fallback_ops, c.fallback_ops
        if dynamic:
            assert c.size_names, "the graph was specialised to its sizes"
    if loop is not None:
        src = "\n".join(c.source for c in made)
        assert any(k.scatter is not None for c in made for k in c.artifact.kernels), src
        if made[0].artifact.backend == "cpp":
            assert loop in src, src


def to_torch(x):
    if isinstance(x, fl.Tensor):
        return torch.from_numpy(np.array(x.detach().numpy(), copy=True))
    if isinstance(x, (list, tuple)):
        return type(x)(to_torch(v) for v in x)
    return x


def from_torch(x):
    return fl.tensor(x.numpy()) if x.dim() else fl.tensor(x.item(), dtype=getattr(fl, str(x.dtype)[6:]))


def check(fn, *args, dynamic=False, rtol=None, atol=None, equal_nan=False):
    """flambeau.compile(fn) on flambeau tensors vs fn on torch tensors (same values)."""
    got = fl.compile(lambda *a: fn(fl, *a), backend="inductor", dynamic=dynamic)(*args)
    want = fn(torch, *[to_torch(a) for a in args])
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple)) else [want]):
        assert g.dtype.name == str(w.dtype)[6:], (g.dtype, w.dtype)
        torch.testing.assert_close(to_torch(g), w, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return got


def ints(*shape, high, low=0, seed=0):
    return fl.tensor(np.random.default_rng(seed).integers(low, high, size=shape))


def randn(*shape, dtype=fl.float32, seed=0):
    return fl.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype.np))


# ---- scatter / scatter_add -----------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_scatter_add_sums_duplicates(backend, graphs, dynamic):
    x, src = randn(5, 6), randn(7, 6, seed=1)
    index = ints(7, 6, high=5)                          # 7 rows into 5: duplicates in every column
    check(lambda T, x, i, s: T.scatter_add(x, 0, i, s), x, index, src, dynamic=dynamic)
    xi, si = ints(4, 9, high=100), ints(4, 9, high=100, seed=2)
    check(lambda T, x, i, s: x.scatter_add(1, i, s) * 2, xi, ints(4, 9, high=3), si, dynamic=dynamic)
    assert_compiled(graphs, "+=", dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
def test_scatter_src_non_contiguous_and_smaller_index(backend, graphs, dynamic):
    x = randn(6, 5).t()                                   # (5, 6), transposed
    src = randn(8, 6, seed=1)[::2]                        # (4, 6), strided; larger than the index
    index = fl.tensor(np.stack([np.random.default_rng(k).permutation(5)[:3] for k in range(4)], 1))   # (3, 4)
    check(lambda T, x, i, s: T.scatter(x + 1, 0, i, s).exp(), x, index, src, dynamic=dynamic)
    assert_compiled(graphs, "] = ", dynamic)


@pytest.mark.parametrize("bad", [5, -1])
def test_scatter_out_of_range_index_raises(backend, graphs, bad):
    f = fl.compile(lambda x, i, s: x.scatter_add(0, i, s), backend="inductor")
    x, s = fl.zeros(5, 2), fl.ones(3, 2)
    assert f(x, fl.tensor([[0, 1], [4, 4], [2, 0]]), s).sum().item() == 6
    with pytest.raises(RuntimeError):
        torch.zeros(5, 2).scatter_add(0, torch.tensor([[0, 1], [bad, 4], [2, 0]]), torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="out of bounds"):
        f(x, fl.tensor([[0, 1], [bad, 4], [2, 0]]), s)
    assert_compiled(graphs, "+=")


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(backend, graphs, reduce, include_self):
    """Duplicates combine, untouched elements keep x, include_self=False starts each target from
    the reduction's identity; float32, int64 (mean: floor division) and int8, against PyTorch."""
    index = fl.tensor([[0, 4, 4, 1], [4, 0, 0, 0], [1, 1, 4, 0]])       # rows 2, 3 are never written
    f = lambda T, x, i, s: T.scatter_reduce(x, 0, i, s, reduce, include_self=include_self)   # noqa: E731
    check(f, randn(5, 4), index, randn(3, 4, seed=1))
    check(f, ints(5, 4, low=-9, high=10), index, ints(3, 4, low=-9, high=10, seed=1))
    check(lambda T, x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self) + 1,
          ints(5, 4, low=-4, high=5).to(fl.int8), fl.tensor([[0, 3, 3], [3, 0, 0], [1, 1, 3], [0, 0, 0]]),
          ints(4, 3, low=-4, high=5, seed=2).to(fl.int8))
    assert_compiled(graphs, {"sum": "+=", "mean": "+=", "prod": "*=", "amax": "fl_max(", "amin": "fl_min("}[reduce])


@pytest.mark.parametrize("dynamic", [False, True])
def test_scatter_reduce_bool_nan_and_dynamic(backend, graphs, dynamic):
    x, s = randn(4, 6), randn(4, 3, seed=1)
    s[1, 2] = float("nan")                                  # amax/amin propagate NaN, as PyTorch
    index = ints(4, 3, high=6, seed=3)
    for reduce in ("amax", "amin", "mean"):
        check(lambda T, x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=False), x, index, s,
              dynamic=dynamic, equal_nan=True)
    xb, sb = ints(4, 6, high=2).to(fl.bool), ints(4, 3, high=2, seed=4).to(fl.bool)
    for reduce in ("sum", "prod", "amax", "amin"):
        check(lambda T, x, i, s: x.scatter_reduce(1, i, s, reduce), xb, index, sb, dynamic=dynamic)
    assert_compiled(graphs, dynamic=dynamic)


# ---- index_put ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_index_put_accumulate_duplicates_and_negative_indices(backend, graphs, dynamic):
    x, v = randn(6, 4), randn(8, 4, seed=1)
    idx = fl.tensor([0, 5, -1, 2, 0, -6, 3, 0])        # duplicates of 0 and 5 (-1), -6 is 0
    check(lambda T, x, i, v: x.index_put((i,), v, accumulate=True), x, idx, v, dynamic=dynamic)
    xi, vi = ints(6, 4, high=50), ints(8, 4, high=50, seed=1)
    check(lambda T, x, i, v: x.index_put((i,), v, accumulate=True), xi, idx, vi, dynamic=dynamic)
    assert_compiled(graphs, "+=", dynamic)


def _setitem(key):
    def fn(T, x, *iv):
        y = x * 1
        y[key(*iv[:-1])] = iv[-1]
        return y
    return fn


@pytest.mark.parametrize("dynamic", [False, True])
def test_index_put_store_broadcast_values_and_index_layouts(backend, graphs, dynamic):
    x = randn(4, 5, 6)
    i, j = fl.tensor([3, 0, -2]), fl.tensor([[1], [-1]])          # broadcast to (2, 3)
    check(_setitem(lambda i: (slice(None), i)), x, i, randn(6, seed=1), dynamic=dynamic)     # x[:, i] = v
    check(lambda T, x, i, j, v: x.index_put((j, i), v), x, i, j, randn(3, 6, seed=2), dynamic=dynamic)
    check(_setitem(lambda i, j: (j, slice(None), i)), x, i, j, randn(5, 1, seed=3).t(), dynamic=dynamic)
    check(lambda T, x, i, v: x.index_put((i,), v, accumulate=True), x.transpose(0, 2), fl.tensor([0, 0, 5]),
          randn(5, 1, seed=4), dynamic=dynamic)
    assert_compiled(graphs, "] = ", dynamic)


def test_index_put_out_of_range_index_raises(backend, graphs):
    f = fl.compile(lambda x, i, v: x.index_put((i,), v, accumulate=True), backend="inductor")
    x, v = fl.zeros(5, 2), fl.ones(3, 2)
    assert f(x, fl.tensor([0, 4, -5]), v).sum().item() == 6
    for bad in (5, -6):
        with pytest.raises(IndexError):
            torch.zeros(5, 2).index_put((torch.tensor([0, bad, 1]),), torch.ones(3, 2), accumulate=True)
        with pytest.raises(IndexError):
            f(x, fl.tensor([0, bad, 1]), v)
    assert_compiled(graphs, "+=")


def test_parallel_scatter_loop_sums_exactly(graphs, monkeypatch):
    """Large enough to run in parallel: only the dims that can't collide are split among threads,
    so every duplicate still adds exactly once (integers: exact)."""
    monkeypatch.setattr(config, "backend", "cpp")
    monkeypatch.setattr(config, "parallel_threshold", 16)
    x, v = ints(50, 300, high=10), ints(2000, 300, high=1000, seed=1)
    idx = ints(2000, high=50, seed=2)
    check(lambda T, x, i, v: x.index_put((i,), v, accumulate=True), x, idx, v)
    check(lambda T, x, i, s: x.scatter_add(0, i, s), x, ints(2000, 300, high=50, seed=3), v)
    assert_compiled(graphs, "+=")
    assert "#pragma omp parallel for" in "\n".join(c.source for c in graphs)


def test_embedding_backward_compiles_to_an_accumulating_loop(graphs):
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 4)
    emb = fl.nn.Embedding(10, 4)
    emb.weight.data = fl.tensor(ref.weight.detach().numpy())
    idx = [[1, 3, 3, 9], [0, 1, 1, 1]]                   # repeated rows: their gradients add up

    def step(m, T, i):
        out = m(i)
        (out * out).sum().backward()
        return m.weight.grad
    got = fl.compile(lambda i: step(emb, fl, i), backend="inductor")(fl.tensor(idx))
    want = step(ref, torch, torch.tensor(idx))
    torch.testing.assert_close(to_torch(got), want)
    assert_compiled(graphs, "+=")


# ---- the *_scatter ops: pointwise selects (diagonal, slice, select), a strided store (as_strided) ----
@pytest.mark.parametrize("dynamic", [False, True])
def test_view_scatter_ops(backend, graphs, dynamic):
    x = randn(5, 6, 4)
    check(lambda T, x, s: T.diagonal_scatter(x, s, 1, 0, 1), x, randn(4, 5, seed=1), dynamic=dynamic)
    check(lambda T, x, s: T.diagonal_scatter(x, s, -2, 2, 0), x, randn(6, 2, seed=2), dynamic=dynamic)
    check(lambda T, x, s: T.slice_scatter(x, s, 1, 1, 6, 2), x, randn(5, 3, 4, seed=3), dynamic=dynamic)
    check(lambda T, x, s: T.select_scatter(x, s, 2, -1), x, randn(5, 6, seed=4), dynamic=dynamic)
    assert_compiled(graphs, dynamic=dynamic)


def test_as_strided_scatter(backend, graphs):
    x = randn(5, 6)
    check(lambda T, x, s: T.as_strided_scatter(x * 2, s, (3, 2), (7, 2), 1), x, randn(3, 2, seed=1))
    check(lambda T, x, s: T.as_strided_scatter(x, s.t(), (2, 4), (1, 6), 3), x, randn(4, 2, seed=2))
    assert_compiled(graphs, "] = ")


# ---- factories --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_linspace_logspace(backend, graphs, dynamic):
    x = randn(3, 11)                                     # (a symbolic dim under dynamic=True)
    check(lambda T, x: T.linspace(-1.5, 3.25, 11) + x, x, dynamic=dynamic)
    check(lambda T, x: T.linspace(-10, 33, 7, dtype=T.int64) * x, ints(3, 7, high=9), dynamic=dynamic)
    check(lambda T, x: T.logspace(-1.5, 3.25, 11, base=2.0, dtype=T.float64) - x, x.double(), dynamic=dynamic,
          rtol=1e-12, atol=0)
    check(lambda T, x: T.logspace(0, 2, 5, dtype=T.float32) + x, randn(3, 5), dynamic=dynamic)
    assert_compiled(graphs, dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
def test_triangle_indices(backend, graphs, dynamic):
    for row, col, off in [(4, 5, 0), (4, 5, 2), (5, 3, -2), (3, 7, -1), (6, 6, 10), (6, 6, -10), (1, 1, 0),
                          (7, 4, -5), (40, 33, 3)]:
        check(lambda T, x: T.tril_indices(row, col, off)[:, :, None] + x, ints(3, high=2), dynamic=dynamic)
        check(lambda T, x: T.triu_indices(row, col, off, dtype=T.int32)[:, :, None] + x,
              ints(3, high=2).int(), dynamic=dynamic)
    assert_compiled(graphs, dynamic=dynamic)


# ---- copy_: mutations in a traced graph --------------------------------------------------------------
def trace(fn, args):
    def f(*a):
        with DecompositionMode():
            return fn(fl, *a)
    return make_fx(f, tracing_mode="fake")(*args)


def _copy_cases():
    def add_(T, x, y):
        return x.add_(y).mul_(2)                            # copy_ into an input, twice, returns it

    def setitem(T, x, v):
        y = x.clone()
        row = y[1]                                            # a view taken before the writes
        y[1] = v
        y[:, ::2] = 0.5
        y[2:, 1] += 1
        return y, row * 2

    def setitem_input(T, x, v):
        x[:, 1:3] = v                                         # a write into a view of an input
        return x.sum(0)

    def index_put_(T, x, i, v):
        y = x.clone()
        y[i] = v
        return y
    yield add_, lambda: [randn(3, 4), randn(4, seed=1)]
    yield setitem, lambda: [randn(4, 5), randn(5, seed=1)]
    yield setitem_input, lambda: [randn(4, 5), randn(4, 2, seed=1)]
    yield index_put_, lambda: [randn(4, 5), fl.tensor([2, 0]), randn(5, seed=1)]


@pytest.mark.parametrize("case", list(_copy_cases()), ids=lambda c: c[0].__name__)
def test_copy_into_inputs_and_views(backend, case):
    fn, make = case
    before = collections.Counter(counters["inductor_fallbacks"])
    gm = trace(fn, make())
    assert any(getattr(n.target, "name", None) == "copy_" for n in gm.graph.nodes)
    c = compile_fx(gm, make())
    assert c.artifact is not None, c.eager_reason
    assert not c.fallback_ops, c.fallback_ops
    got_args, want_args = make(), [to_torch(a) for a in make()]
    got = c(*got_args)
    want = fn(torch, *want_args)
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(to_torch(g), w)
    for g, w in zip(got_args, want_args):                  # the inputs were written like torch's
        torch.testing.assert_close(to_torch(g), w)
    assert not unexpected_fallbacks(counters["inductor_fallbacks"] - before)
    if fn.__name__ == "add_":
        assert got[0] is got_args[0] if isinstance(got, (list, tuple)) else got is got_args[0]
