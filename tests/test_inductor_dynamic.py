"""flambeau._inductor with symbolic sizes: one compiled graph (C++ kernels taking the sizes as
`int64_t` arguments) serves every size, without recompiling and without running eagerly.

Each case is a function written against a module `T` (flambeau or torch); the compiled flambeau
result is compared with PyTorch on the same inputs. `compiled_graphs` records the CompiledGraphs
the inductor backend makes, so tests can check that the generated code (not the eager fallback)
ran: the graph has size symbols, its source takes them, and `counters["dynamic_eager_calls"]`
(calls whose inputs didn't fit and ran eagerly) does not move.
"""
import sys

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau import _cpp_builder as cpp_builder
from flambeau._inductor import compile_fx, config
from tests.opdb import all_opinfos, as_numpy, check_compiled_or_expected_failure, flat_tensors, materialize
from flambeau.fx.experimental.proxy_tensor import make_fx
from tests.conftest import spy_compile_fx

cfx = sys.modules["flambeau._inductor.compile_fx"]


@pytest.fixture(autouse=True)
def _fresh():
    fl.compiler.reset()
    yield
    fl.compiler.reset()


@pytest.fixture
def compiled_graphs(monkeypatch):
    return spy_compile_fx(monkeypatch, [])


class InductorCounter:
    """The inductor backend, counting the graphs dynamo hands it."""

    def __init__(self):
        self.frame_count = 0
        self.backend = fl.compiler.lookup_backend("inductor")

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        return self.backend(gm, example_inputs)


def to_torch(x):
    if isinstance(x, fl.Tensor):
        return torch.from_numpy(np.array(x.detach().numpy(), copy=True))
    if isinstance(x, (list, tuple)):
        return type(x)(to_torch(v) for v in x)
    return x


def assert_same(got, ref, rtol=1e-5, atol=1e-5):
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    ref = list(ref) if isinstance(ref, (list, tuple)) else [ref]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        torch.testing.assert_close(to_torch(g), r, rtol=rtol, atol=atol)


def assert_generated(graphs):
    """Every graph compiled into kernels taking size arguments (no eager graph, no fallback op)."""
    assert graphs
    for c in graphs:
        assert c.eager_reason is None, c.eager_reason
        assert c.size_names, "the graph was specialised to its sizes"
        assert not c.fallback_ops, c.fallback_ops
        if c.kernel_count:
            first = c.size_names[0]
            assert f"int64_t {first}" in c.source if c.artifact.backend == "cpp" else f", {first}" in c.source


def run_sizes(fn, arg_shapes, dynamic=True, rtol=1e-5, atol=1e-5):
    """Compile `fn` once, call it for each list of input shapes, compare with PyTorch."""
    cnt = InductorCounter()
    cf = fl.compile(lambda *a: fn(fl, *a), backend=cnt, dynamic=dynamic)
    eager_before = cfx.counters["dynamic_eager_calls"]
    for shapes in arg_shapes:
        args = [fl.randn(*s) for s in shapes]
        assert_same(cf(*args), fn(torch, *[to_torch(a) for a in args]), rtol, atol)
    assert cfx.counters["dynamic_eager_calls"] == eager_before
    return cnt


# ---- the kinds of graph ---------------------------------------------------------------------------
def test_pointwise_broadcast(compiled_graphs):
    fn = lambda T, x, y, z: (x * y + z.exp()).relu() - x.sigmoid() / 3     # noqa: E731
    cnt = run_sizes(fn, [[(8, 5), (5,), (8, 1)], [(12, 7), (7,), (12, 1)],
                         [(600, 500), (500,), (600, 1)]])       # big enough to run in parallel
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)
    src = compiled_graphs[0].source
    if compiled_graphs[0].artifact.backend == "cpp":
        assert "if(parallel: " in src                           # the parallel decision is made at run time
        assert "int64_t s0, int64_t s1" in src


def test_reductions_over_static_and_symbolic_dims(compiled_graphs):
    fn = lambda T, x: [x.sum(1) + x.mean(1) * x.amax(1), x.sum(0), x.mean(), x.amin(-1, keepdim=True)]  # noqa: E731
    cnt = run_sizes(fn, [[(8, 5)], [(12, 7)], [(33, 3)]])
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)


def test_softmax(compiled_graphs):
    fn = lambda T, x: x.softmax(-1) + x.log_softmax(0)      # noqa: E731
    cnt = run_sizes(fn, [[(8, 5)], [(12, 7)], [(700, 400)]])
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)


def test_layer_norm_gelu(compiled_graphs):
    F = lambda T: T.nn.functional       # noqa: E731
    fn = lambda T, x, w, b: F(T).gelu(F(T).layer_norm(x, (x.shape[-1],), w, b), approximate="tanh")  # noqa: E731
    cnt = run_sizes(fn, [[(8, 5), (5,), (5,)], [(12, 7), (7,), (7,)], [(3, 16), (16,), (16,)]], rtol=1e-4)
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)


def test_views(compiled_graphs):
    def fn(T, x):
        flat = x.reshape(-1, x.shape[-1]).t()[1:3] * 2               # reshape, transpose, static slice
        back = flat.reshape(2, x.shape[0], x.shape[1]).permute(1, 0, 2).transpose(1, 2)
        return back + x[:, :2, :3].sum() + x[:, :1].expand(-1, x.shape[1], -1)[..., 1:3]
    cnt = run_sizes(fn, [[(8, 6, 5)], [(12, 10, 7)], [(5, 8, 3)]])
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)


def test_floor_division_sizes(compiled_graphs):
    # reshape(n, 2, -1) of a dynamic dim: the inferred size floor(s1/2) is a derived symbol
    fn = lambda T, x: x.reshape(x.shape[0], 2, -1).transpose(1, 2) * 2 + x[:, :4].sum()   # noqa: E731
    cnt = run_sizes(fn, [[(8, 6)], [(12, 10)], [(5, 8)]])
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)
    derived = compiled_graphs[0].size_names[-1]           # d + a hash of floor(s1/2)
    assert derived.startswith("d") and derived in compiled_graphs[0].source


def test_extern_matmuls(compiled_graphs):
    fn = lambda T, x, w, b: T.addmm(b, x, w).relu() @ w.t() + T.bmm(x.unsqueeze(0), w.unsqueeze(0)).sum()  # noqa: E731
    cnt = run_sizes(fn, [[(8, 6), (6, 6), (6,)], [(12, 10), (10, 10), (10,)]], rtol=1e-4, atol=1e-4)
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)


def test_mlp_forward_with_dynamic_batch(compiled_graphs):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 3))
    m = fl.nn.Sequential(fl.nn.Linear(6, 32), fl.nn.GELU(), fl.nn.LayerNorm(32), fl.nn.Linear(32, 3))
    m.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    cnt = InductorCounter()
    cm = fl.compile(m, backend=cnt)
    eager_before = cfx.counters["dynamic_eager_calls"]
    with fl.no_grad():
        for b in (8, 12, 16, 20):
            x = fl.randn(b, 6)
            if b == 8:
                fl._dynamo.mark_dynamic(x, 0)
            assert_same(cm(x), ref(to_torch(x)), rtol=1e-4, atol=1e-5)
    assert cnt.frame_count == 1
    assert cfx.counters["dynamic_eager_calls"] == eager_before
    assert_generated(compiled_graphs)
    assert compiled_graphs[0].size_names == ["s0"]        # only the batch: the weights' dims stay static
    if compiled_graphs[0].artifact.backend == "cpp":
        assert "x0 < s0" in compiled_graphs[0].source and "< 32" in compiled_graphs[0].source


def test_training_step_with_dynamic_batch(compiled_graphs):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    m = fl.nn.Sequential(fl.nn.Linear(6, 16), fl.nn.LayerNorm(16), fl.nn.Tanh(), fl.nn.Linear(16, 4))
    m.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    opt, ropt = fl.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)

    def loss_fn(T, model, x, y):
        return T.nn.functional.cross_entropy(model(x), y)
    cnt = InductorCounter()
    step = fl.compile(lambda x, y: loss_fn(fl, m, x, y), backend=cnt, dynamic=True)
    eager_before = cfx.counters["dynamic_eager_calls"]
    for b in (8, 12, 5):
        x, y = fl.randn(b, 6), fl.randint(0, 4, (b,))
        loss = step(x, y)
        loss.backward()
        rloss = loss_fn(torch, ref, to_torch(x), to_torch(y))
        rloss.backward()
        assert_same(loss, rloss, rtol=1e-5, atol=1e-6)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(to_torch(p.grad), q.grad, rtol=1e-4, atol=1e-6)
        opt.step(), ropt.step()
        opt.zero_grad(), ropt.zero_grad()
    assert cnt.frame_count == 1
    assert cfx.counters["dynamic_eager_calls"] == eager_before
    assert len(compiled_graphs) == 2                  # forward and backward, each compiled once
    assert_generated(compiled_graphs)
    # x's feature dim, matched with the weight's by the matrix product, is pinned by a guard: static
    assert [c.size_names for c in compiled_graphs] == [["s0"], ["s0"]]


# ---- recompiles, specialisation, fallbacks ------------------------------------------------------------
def test_automatic_dynamic_compiles_twice_then_never(compiled_graphs):
    fn = lambda T, x: (x * 2).softmax(-1).sum(0) + x[1:].amax(0)     # noqa: E731
    cnt = InductorCounter()
    cf = fl.compile(lambda x: fn(fl, x), backend=cnt)
    eager_before = cfx.counters["dynamic_eager_calls"]
    for i, b in enumerate((8, 12, 16, 20)):
        if i == 2:
            cpp_compiles = cpp_builder.counters["compiles"] + cpp_builder.counters["disk_hits"]
        x = fl.randn(b, 5)
        assert_same(cf(x), fn(torch, to_torch(x)))
    assert cnt.frame_count == 2                       # static sizes, then symbolic ones
    assert cpp_builder.counters["compiles"] + cpp_builder.counters["disk_hits"] == cpp_compiles
    assert len(compiled_graphs) == 2 and not compiled_graphs[0].size_names
    assert_generated(compiled_graphs[1:])
    assert cfx.counters["dynamic_eager_calls"] == eager_before


def test_sizes_zero_and_one_stay_specialised(compiled_graphs):
    fn = lambda T, x: (x * 2).softmax(-1).sum(0)        # noqa: E731
    cnt = InductorCounter()
    cf = fl.compile(lambda x: fn(fl, x), backend=cnt, dynamic=True)
    for b in (8, 1, 12, 1, 0, 9):
        x = fl.randn(b, 5)
        assert_same(cf(x), fn(torch, to_torch(x)))
    assert cnt.frame_count == 3                       # symbolic batch, batch 1, batch 0
    assert all(c.eager_reason is None for c in compiled_graphs)


def test_wrapper_checks_inputs_and_runs_eagerly_when_they_dont_fit():
    x = fl.randn(4, 4)
    gm = make_fx(lambda x: (x * 3).sum(1), tracing_mode="symbolic")(x)   # duck sizing: one symbol
    c = compile_fx(gm, [x])
    assert c.size_names == ["s0"]
    assert_generated([c])
    before = cfx.counters["dynamic_eager_calls"]
    for xx in (fl.randn(7, 7), fl.randn(3, 3)):                          # fits: generated code
        np.testing.assert_allclose(c(xx).numpy(), (xx * 3).sum(1).numpy(), rtol=1e-5)
    assert cfx.counters["dynamic_eager_calls"] == before
    for xx in (fl.randn(5, 6), fl.randn(1, 1), fl.randn(6, 5).t()):      # doesn't: eager, still right
        np.testing.assert_allclose(c(xx).numpy(), (xx * 3).sum(1).numpy(), rtol=1e-5)
    assert cfx.counters["dynamic_eager_calls"] == before + 3


def test_numpy_backend(compiled_graphs, monkeypatch):
    monkeypatch.setattr(config, "backend", "numpy")
    fn = lambda T, x, y: (x * y).softmax(-1).sum(0) + x.t()[:, 1:].amax(1)    # noqa: E731
    run_sizes(fn, [[(8, 5), (5,)], [(12, 7), (7,)]])
    assert all(c.size_names and c.eager_reason is None for c in compiled_graphs)
    assert "def kernel0(" in compiled_graphs[0].source and "s0, s1):" in compiled_graphs[0].source


def test_tracer_guards_are_checked_for_each_new_size():
    x = fl.randn(4, 6)
    gm = make_fx(lambda x: x[:, :3] * 2, tracing_mode="symbolic")(x)      # guards s1 >= 3 (the clamp)
    c = compile_fx(gm, [x])
    assert c.size_names and c.eager_reason is None
    before = cfx.counters["dynamic_eager_calls"]
    for xx in (fl.randn(5, 3), fl.randn(9, 17)):
        np.testing.assert_allclose(c(xx).numpy(), (xx[:, :3] * 2).numpy())
    assert cfx.counters["dynamic_eager_calls"] == before
    xx = fl.randn(5, 2)                                                    # violates the guard: eager
    np.testing.assert_allclose(c(xx).numpy(), (xx[:, :3] * 2).numpy())
    assert cfx.counters["dynamic_eager_calls"] == before + 1


def attention_block(T, d=16, heads=2):
    F = T.nn.functional

    class Block(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = T.nn.LayerNorm(d)
            self.qkv, self.proj = T.nn.Linear(d, 3 * d), T.nn.Linear(d, d)

        def forward(self, x):
            B, L, C = x.shape
            q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
            q, k, v = (z.view(B, L, heads, C // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.proj(y.transpose(1, 2).reshape(B, L, C))
    return Block()


def test_attention_block_training_with_dynamic_batch(compiled_graphs):
    torch.manual_seed(0)
    ref = attention_block(torch)
    m = attention_block(fl)
    m.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    cnt = InductorCounter()
    step = fl.compile(lambda x: m(x).square().mean(), backend=cnt, dynamic=True)
    eager_before = cfx.counters["dynamic_eager_calls"]

    def check(b, t):
        x = fl.randn(b, t, 16)
        loss = step(x)
        loss.backward()
        rloss = ref(to_torch(x)).square().mean()
        rloss.backward()
        assert_same(loss, rloss, rtol=1e-5, atol=1e-6)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(to_torch(p.grad), q.grad, rtol=1e-4, atol=1e-6)
            p.grad = None
        ref.zero_grad()
    for b in (4, 6, 3, 9):
        check(b, 8)
    # saved activations (transposed views in the trace, contiguous at run time) keep the backward
    # on the generated code
    assert cfx.counters["dynamic_eager_calls"] == eager_before
    assert cnt.frame_count == 1
    assert_generated(compiled_graphs)
    # another sequence length: served by the same graphs, or, if tracing specialised the length
    # (an op whose meta takes int(size)), recompiled, since AOT autograd traces in dynamo's
    # ShapeEnv and the specialisation is a dynamo guard; never a graph made for the old length
    check(3, 5)
    assert cnt.frame_count <= 2
    assert cfx.counters["dynamic_eager_calls"] == eager_before


# ---- the size algebra ---------------------------------------------------------------------------------
def test_size_expressions_and_index_simplification():
    from flambeau._inductor.index import Index, Sym
    from flambeau._inductor.sizevars import SizeExpr, Unsupported, exact_div, known_lt, known_nonneg
    s0, s1 = SizeExpr.symbol("s0"), SizeExpr.symbol("s1")
    assert s0 * s1 - s1 * s0 == 0 and isinstance(s0 - s0, int)
    assert str(2 * s0 * s1 + 3) == "(2*s0*s1 + 3)" and str(s0 - 1) == "(s0 - 1)"
    assert eval(str(2 * s0 * s1 - s0 + 3), {"s0": 5, "s1": 7}) == (2 * s0 * s1 - s0 + 3).evaluate({"s0": 5, "s1": 7})
    assert s0 >= 2 and s0 * s1 > s1 and not (s0 < 2)          # sizes are >= 2
    with pytest.raises(Unsupported):
        s0 < s1                                                 # noqa: B015  (depends on the sizes)
    with pytest.raises(Unsupported):
        int(s0)
    assert known_nonneg(s0 * s1 - 2 * s1) and not known_nonneg(s0 - s1) and known_lt(s1 - 1, s1)
    assert exact_div(6 * s0 * s1, 3 * s1) == 2 * s0 and exact_div(s0 + 1, s0) is None
    i, j = Sym("i", s0), Sym("j", s1)
    flat = Index.of(i) * s1 + Index.of(j)                       # a row-major flattening ...
    assert (flat // s1).key() == Index.of(i).key()              # ... splits back exactly
    assert (flat % s1).key() == Index.of(j).key()
    assert ((flat // s1) * s1 + flat % s1).key() == flat.key()
    k = Sym("k", s0 * s1)
    assert "//" in repr(Index.of(k) // s1)                      # not provable: stays a division


def test_graph_returning_sizes_across_a_graph_break(compiled_graphs):
    import math

    def attn(T, x, wqkv, mask):
        B, L, C = x.shape
        q, k, v = (z.view(B, L, 2, C // 2).transpose(1, 2) for z in (x @ wqkv).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))     # graph break: sizes are outputs
        att = att.masked_fill(mask[:L, :L] == 0, float("-inf")).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(B, L, C)
    wqkv, mask = fl.randn(8, 24) * 0.3, fl.tril(fl.ones(16, 16))
    cf = fl.compile(lambda x: attn(fl, x, wqkv, mask), dynamic=True)
    for b, t in ((3, 5), (4, 5), (3, 9)):
        x = fl.randn(b, t, 8)
        assert_same(cf(x), attn(torch, to_torch(x), to_torch(wqkv), to_torch(mask)), rtol=1e-4)
    assert all(c.eager_reason is None for c in compiled_graphs)
    # the graph before the break (it returns B, L, C to the code after it) compiled once for every
    # size; the code after the break gets them as Python ints, so its graphs are per size
    first = compiled_graphs[0]
    assert first.size_names == ["s0", "s1"]
    assert [c.size_names for c in compiled_graphs].count(["s0", "s1"]) == 1


def test_size_expressions_print_as_safe_operands():
    # a divisor s0*s1 printed without parentheses divided by s0 then multiplied by s1
    fn = lambda T, x, y: T.matmul(x, y) + 1          # noqa: E731  (4-d @ 3-d: reshapes by products of sizes)
    run_sizes(fn, [[(2, 1, 2, 3), (3, 3, 2)], [(3, 1, 3, 4), (4, 4, 3)]], rtol=1e-4, atol=1e-4)


def test_floor_of_a_sum_in_a_derived_size():
    # x[:, ::2] has ceil(s1 / 2) = floor(s1/2 + 1/2) columns: printed as (1 + s1) // 2, an int
    fn = lambda T, x: x[:, ::2] * 2 + x[:, ::2].sum(0)     # noqa: E731
    run_sizes(fn, [[(4, 5)], [(6, 9)], [(3, 4)]])


def test_views_of_inputs_as_outputs_follow_the_sizes():
    # an output that is a view of an input is regenerated from the input after the compiled graph
    # runs; its view arguments are symbolic (reshape to s0*s1, a slice to s0 - 1, conv's and
    # unfold's floor((s - k) / 2) sizes), so they are evaluated at each call's sizes: one compile
    # serves every size, and nothing runs eagerly
    from flambeau._dynamo.utils import counters
    fn = lambda T, x, w: (x.reshape(-1), x.flatten(1), x[1:], x.transpose(0, 1),       # noqa: E731
                          T.nn.functional.conv2d(x, w, stride=2, padding=1), x.unfold(2, 3, 2))
    counters.clear()
    cf = fl.compile(lambda x, w: fn(fl, x, w), dynamic=True)
    w = fl.randn(3, 2, 3, 3)
    for shape in [(5, 2, 7, 6), (6, 2, 9, 11), (4, 2, 10, 8)]:        # no size equal to another (duck sizing)
        x = fl.randn(*shape)
        got = cf(x, w)
        assert_same(got, fn(torch, to_torch(x), to_torch(w)), rtol=1e-4, atol=1e-4)
        assert all(g._base is x or g._base is x._base for g in got[:4] if g._base is not None)
    assert counters["frames"]["total"] == 1, dict(counters)
    assert not counters["inductor_fallbacks"], dict(counters)


def test_flip_and_batch_norm_statistics_compile_for_every_size():
    # flip's reversed index is an arange starting at a symbolic size - 1; batch_norm's running
    # variance is corrected by n / (n - 1) for a symbolic element count n
    from flambeau._dynamo.utils import counters

    def fn(T, x, rm, rv):
        y = T.nn.functional.batch_norm(x, rm, rv, training=True)
        return y.flip((0, 2)), x.rot90(1, (1, 2)), rm, rv
    counters.clear()
    cf = fl.compile(lambda *a: fn(fl, *a), dynamic=True)
    for shape in [(5, 3, 7), (6, 3, 9), (4, 3, 11)]:
        x = fl.randn(*shape)
        args = [x, fl.zeros(3), fl.ones(3)]
        targs = [to_torch(a) for a in args]
        assert_same(cf(*args), fn(torch, *targs), rtol=1e-4, atol=1e-5)
    assert counters["frames"]["total"] == 1, dict(counters)
    assert not counters["inductor_fallbacks"], dict(counters)


def test_roll_by_a_constant_compiles_for_every_size(compiled_graphs):
    # roll(x, 3, -1) slices from n - (3 mod n) = n - 3 + n*floor(3/n): a start with a derived symbol,
    # >= 0 for every n by floor's bounds (3 - n + 1 <= n*floor(3/n)); fuzzer seed 1102 ran the slice eagerly
    from flambeau._dynamo.utils import counters
    from flambeau._inductor.sizevars import SizeExpr, _floor_div, known_nonneg
    n = SizeExpr.symbol("s0")
    assert known_nonneg(n - 3 + n * _floor_div(3, n)) and not known_nonneg(n - 5 + n * _floor_div(3, n))
    assert known_nonneg(7 - n * _floor_div(7, n)) and not known_nonneg(6 - n * _floor_div(7, n))
    fn = lambda T, x: (x.roll(3, -1) * 2, x.roll(-5, 0) + 1)        # noqa: E731
    counters.clear()
    run_sizes(fn, [[(5, 7)], [(6, 2)], [(9, 4)]])
    assert not counters["inductor_fallbacks"], dict(counters)
    assert_generated(compiled_graphs)


def test_loops_over_sizes_not_provably_positive():
    # conv1d's output length is s2 + 1 - s4 (input length, kernel size): not provably >= 1, so a
    # loop over it must not be bounded by 0 (that once simplified (r % L) to r: the kernels read and
    # wrote past the end of their buffers)
    fn = lambda T, x, w, b: 0 + (T.nn.functional.conv1d(x, w, b).float() * 1).sum()      # noqa: E731
    cf = fl.compile(lambda *a: fn(fl, *a), dynamic=True)
    for shapes in [((2, 4, 9), (6, 4, 3), (6,)), ((3, 5, 11), (7, 5, 3), (7,)), ((2, 4, 9), (6, 4, 4), (6,))]:
        args = [fl.randn(*s, requires_grad=True) for s in shapes]
        targs = [to_torch(a).requires_grad_() for a in args]
        loss, ref = cf(*args), fn(torch, *targs)
        assert_same(loss, ref, rtol=1e-4, atol=1e-4)
        assert_same(fl.autograd.grad(loss, args), torch.autograd.grad(ref, targs), rtol=1e-4, atol=1e-4)


# ---- every operator of the op database, compiled with dynamic=True --------------------------------------
OPINFOS = all_opinfos()


@pytest.mark.parametrize("info", OPINFOS, ids=[i.name for i in OPINFOS])
def test_opdb_inductor_dynamic(info):
    """One compiled function per operator, called on its samples (several shapes, so the dynamic
    graph is reused across sizes): the results equal eager flambeau's, and nothing unexpected runs
    eagerly."""
    check_compiled_or_expected_failure(fl, info, "inductor", 4, dynamic=True, compile_per_sample=False)


GRAD_OPS = ["conv1d", "conv2d", "conv_transpose1d", "group_norm", "layer_norm", "pixel_shuffle", "matmul",
            "softmax", "max_pool2d", "avg_pool2d", "embedding", "cross_entropy", "interpolate", "unfold"]


@pytest.mark.parametrize("info", [i for i in OPINFOS if i.name in GRAD_OPS], ids=lambda i: i.name)
def test_opdb_gradients_inductor_dynamic(info):
    """Forward and backward graphs (sizes flow between them) of ops whose backward re-indexes
    memory in size-dependent ways: gradients equal eager flambeau's."""
    import warnings
    fn = info.resolve(fl)

    def loss(*a, **k):
        outs = flat_tensors(fl, fn(*a, **k))
        return sum((o.float() * (j + 1)).sum() for j, o in enumerate(outs) if o.dtype.is_floating_point)
    compiled = fl.compile(loss, backend="inductor", dynamic=True)
    for i, s in enumerate(info.samples("float32")[:3]):
        args, kwargs, leaves = materialize(fl, s, "float32", 100 + i, True)
        try:
            ref = loss(*args, **kwargs)
            rgrads = fl.autograd.grad(ref, leaves, allow_unused=True)
        except Exception:
            continue                       # not a differentiable sample
        args, kwargs, leaves = materialize(fl, s, "float32", 100 + i, True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = compiled(*args, **kwargs)
            grads = fl.autograd.grad(res, leaves, allow_unused=True)
        np.testing.assert_allclose(as_numpy(res), as_numpy(ref), rtol=1e-4, atol=1e-4, err_msg=f"sample {i}")
        for a, b in zip(rgrads, grads):
            assert (a is None) == (b is None), f"sample {i}"
            if a is not None:
                np.testing.assert_allclose(as_numpy(b), as_numpy(a), rtol=1e-3, atol=1e-4, err_msg=f"sample {i}")
