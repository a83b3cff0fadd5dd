"""flambeau.fx vs torch.fx: graph construction and codegen, symbolic_trace, Interpreter/Transformer,
dead-code elimination, make_fx (real/fake/symbolic) including traced autograd, fake tensors."""
import copy
import operator

import numpy as np
import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

import flambeau as fl
import flambeau.nn as fnn
import flambeau.nn.functional as FF
from flambeau.fx import (Graph, GraphModule, Interpreter, Transformer, TraceError, symbolic_trace,
                         map_arg)
from flambeau.fx.experimental.proxy_tensor import make_fx
from flambeau.fx.passes.shape_prop import ShapeProp
from flambeau._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from flambeau._ops._registry import Op


def N(x):
    return x.detach().numpy() if isinstance(x, (torch.Tensor, fl.Tensor)) else np.asarray(x)


def close(a, b, rtol=1.3e-6, atol=1e-5):
    np.testing.assert_allclose(N(a), N(b), rtol=rtol, atol=atol)


def mlp_class(ns, nn, F):
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.fc2 = nn.Linear(8, 3)
            self.scale = nn.Parameter(ns.ones(3))

        def forward(self, x):
            h = F.relu(self.fc1(x))
            y = self.fc2(h) * self.scale
            return ns.add(y.sum(dim=-1), 1) + x.shape[0]
    return MLP


def calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def ops_seq(gm):
    return [n.op for n in gm.graph.nodes]


# ---- Graph construction, codegen -----------------------------------------------------------------
def test_graph_construction_and_codegen_round_trip():
    g = Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    a = g.call_function(operator.add, (x, y))
    m = g.call_method("relu", (a,))
    s = g.call_function(fl.sum, (m,), {"dim": 0})
    g.output((s, a))
    g.lint()
    gm = GraphModule({}, g)
    assert "add = x + y" in gm.code
    assert "relu = add.relu()" in gm.code
    assert "flambeau.sum(relu, dim=0)" in gm.code or "flambeau.ops.aten.sum" in gm.code
    assert "return (sum_1, add)" in gm.code
    xv, yv = fl.randn(3, 2), fl.randn(3, 2)
    r = gm(xv, yv)
    close(r[0], (xv + yv).relu().sum(dim=0))
    close(r[1], xv + yv)
    # same structure in torch.fx
    tg = torch.fx.Graph()
    tx, ty = tg.placeholder("x"), tg.placeholder("y")
    ta = tg.call_function(operator.add, (tx, ty))
    tm = tg.call_method("relu", (ta,))
    tg.output((tg.call_function(torch.sum, (tm,), {"dim": 0}), ta))
    tgm = torch.fx.GraphModule({}, tg)
    assert "add = x + y" in tgm.code
    assert [n.name for n in tgm.graph.nodes] == [n.name for n in gm.graph.nodes]
    assert str(g).splitlines()[1].strip() == str(tg).splitlines()[1].strip()


def test_node_api_and_rewrites():
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.mul, (x, 2))
    b = g.call_function(operator.add, (a, x))
    g.output(b)
    assert list(x.users) == [a, b]
    assert b.all_input_nodes == [a, x]
    with g.inserting_before(b):
        c = g.call_function(operator.sub, (a, 1))
        d = g.call_function(operator.neg, (c,))
    assert [n.name for n in g.nodes] == ["x", "mul", "sub", "neg", "add", "output"]
    b.replace_input_with(a, d)
    assert b.args == (d, x) and b not in a.users
    with g.inserting_after(x):
        e = g.call_function(operator.abs, (x,))
        f = g.call_function(operator.pos, (e,))
    assert [n.name for n in g.nodes][:4] == ["x", "abs_1", "pos", "mul"]
    assert f.prev is e and e.next is f
    with pytest.raises(RuntimeError, match="still had 1 users"):
        g.erase_node(e)
    changed = a.replace_all_uses_with(x)
    assert changed == [c] and not a.users
    g.erase_node(a)
    g.lint()
    assert "%neg" in d.format_node() and "call_function[target=operator.neg]" in d.format_node()
    assert g.find_nodes(op="call_function", target=operator.sub) == [c]
    gm = GraphModule({}, g)
    close(gm(fl.tensor([1.0, -2.0])), -(fl.tensor([1.0, -2.0]) - 1) + fl.tensor([1.0, -2.0]))


def test_lint_catches_use_before_def():
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.neg, (x,))
    g.output(a)
    b = g.call_function(operator.abs, (x,))   # inserted after output
    a.args = (b,)
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        g.lint()


def test_dead_code_elimination_matches_torch():
    def build(G):
        g = G()
        x = g.placeholder("x")
        g.call_function(operator.mul, (x, 3))              # dead
        k = g.call_function(operator.add, (x, 1))
        g.call_function(operator.neg, (k,))                 # dead, its input stays used
        g.output(k)
        return g
    g, tg = build(Graph), build(torch.fx.Graph)
    assert g.eliminate_dead_code() and tg.eliminate_dead_code()
    assert [n.name for n in g.nodes] == [n.name for n in tg.nodes] == ["x", "add", "output"]
    assert not g.eliminate_dead_code()
    # in-place ops survive
    g2 = Graph()
    x = g2.placeholder("x")
    g2.call_function(fl.ops.aten.add_.Tensor, (x, 1))
    g2.output(x)
    g2.eliminate_dead_code()
    assert len(g2.find_nodes(op="call_function")) == 1


# ---- symbolic_trace --------------------------------------------------------------------------------
def test_symbolic_trace_mlp_matches_torch_fx():
    fm = mlp_class(fl, fnn, FF)()
    tm = mlp_class(torch, torch.nn, torch.nn.functional)()
    gm, tgm = symbolic_trace(fm), torch.fx.symbolic_trace(tm)
    assert ops_seq(gm) == ops_seq(tgm)
    assert [n.target for n in gm.graph.nodes if n.op in ("call_module", "call_method", "get_attr")] == \
        [n.target for n in tgm.graph.nodes if n.op in ("call_module", "call_method", "get_attr")]
    assert len(calls(gm)) == len(calls(tgm))
    assert [n.name for n in gm.graph.nodes] == [n.name for n in tgm.graph.nodes]
    x = fl.randn(5, 4)
    close(gm(x), fm(x))
    assert "fc1 = self.fc1(x)" in gm.code and "getattr_1 = x.shape" in gm.code


def test_symbolic_trace_nested_modules_params_buffers_and_unpacking():
    class Net(fnn.Module):
        def __init__(self):
            super().__init__()
            self.seq = fnn.Sequential(fnn.Linear(4, 4), fnn.ReLU())
            self.w = fnn.Parameter(fl.randn(4, 2))
            self.register_buffer("b", fl.ones(2))

        def forward(self, x):
            h = self.seq(x)
            h = h.view(h.size(0), -1) @ self.w
            a, b = fl.split(h, 1, dim=1)
            return FF.softmax(a + self.b, dim=-1), fl.flatten(b, 1)
    m = Net()
    gm = symbolic_trace(m)
    targets = [n.target for n in gm.graph.nodes if n.op in ("call_module", "get_attr")]
    assert targets == ["seq.0", "seq.1", "w", "b"]
    x = fl.randn(3, 4)
    for p, q in zip(gm(x), m(x)):
        close(p, q)
    assert gm.get_parameter("w") is m.w
    gm2 = copy.deepcopy(gm)
    assert gm2.code == gm.code and gm2.get_parameter("w") is not m.w
    gm2.graph.output_node().args = (gm2.graph.output_node().args[0][0],)
    gm2.recompile()
    close(gm2(x), m(x)[0])
    assert isinstance(gm(x), tuple)              # the original's forward is untouched


def test_symbolic_trace_function_and_control_flow_error():
    def f(x, y=2.0):
        return fl.relu(x) * y - x.sum()
    gm = symbolic_trace(f)
    x = fl.randn(4)
    close(gm(x), f(x))
    close(gm(x, 3.0), f(x, 3.0))

    def bad(x):
        if x.sum() > 0:
            return x
        return -x
    with pytest.raises(TraceError, match="control flow"):
        symbolic_trace(bad)


def test_symbolic_trace_constant_tensor_becomes_attr():
    c = fl.tensor([1.0, 2.0])

    def f(x):
        return x + c
    gm = symbolic_trace(f)
    assert [n.target for n in gm.graph.find_nodes(op="get_attr")] == ["_tensor_constant0"]
    close(gm(fl.ones(2)), fl.tensor([2.0, 3.0]))


# ---- Interpreter / Transformer ---------------------------------------------------------------------
def test_interpreter_equals_direct_run():
    m = mlp_class(fl, fnn, FF)()
    gm = symbolic_trace(m)
    x = fl.randn(6, 4)
    close(Interpreter(gm).run(x), gm(x))

    seen = []

    class Counting(Interpreter):
        def run_node(self, n):
            seen.append(n.op)
            return super().run_node(n)
    Counting(gm).run(x)
    assert seen == ops_seq(gm)


def test_transformer_replaces_add_by_sub():
    def f(x, y):
        return fl.add(x, y) + y
    gm = symbolic_trace(f)

    class AddToSub(Transformer):
        def call_function(self, target, args, kwargs):
            if target is operator.add:
                target = operator.sub
            elif target is fl.add:
                target = fl.sub
            return super().call_function(target, args, kwargs)
    new = AddToSub(gm).transform()
    x, y = fl.randn(3), fl.randn(3)
    close(new(x, y), fl.sub(x, y) - y)
    assert "operator.add" not in str(new.graph) and "x - " not in new.code or "sub" in new.code
    tgm = torch.fx.symbolic_trace(lambda x, y: torch.add(x, y) + y)
    assert ops_seq(new) == ops_seq(tgm)


# ---- make_fx --------------------------------------------------------------------------------------
def _mlp_fn():
    fl.manual_seed(0)
    w1, b1, w2 = fl.randn(8, 4, requires_grad=True), fl.randn(8), fl.randn(3, 8, requires_grad=True)

    def fwd(x, w1, w2):
        h = FF.relu(FF.linear(x, w1, b1))
        return FF.log_softmax(h @ w2.t(), dim=-1).sum() / x.shape[0]
    return fwd, w1, w2


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_make_fx_forward_meta_matches_real(mode):
    fwd, w1, w2 = _mlp_fn()
    x = fl.randn(5, 4)
    gm = make_fx(fwd, tracing_mode=mode)(x, w1, w2)
    cs = calls(gm)
    assert cs and all(isinstance(n.target, Op) for n in cs)
    assert "flambeau.ops.aten." in gm.code
    close(gm(x, w1, w2), fwd(x, w1, w2))
    real = {}

    class Record(Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            real[n] = r
            return r
    Record(gm).run(x, w1, w2)
    for n in gm.graph.nodes:
        if isinstance(real.get(n), fl.Tensor) and n.op != "output":
            v = n.meta["val"]
            assert isinstance(v, FakeTensor) and v.is_meta is False and v.device == real[n].device
            assert tuple(v.shape) == tuple(real[n].shape) and v.dtype == real[n].dtype, n.name


def test_make_fx_op_names_match_torch():
    def f(ns):
        return lambda x, y: (x * y + x).sin().sum()
    gm = make_fx(f(fl))(fl.randn(3), fl.randn(3))
    tgm = torch_make_fx(f(torch))(torch.randn(3), torch.randn(3))
    mine = [n.target._schema.name for n in calls(gm)]
    theirs = [n.target._schema.name.split("::")[1] for n in calls(tgm)]
    assert mine == theirs == ["mul", "add", "sin", "sum"]
    assert [n.op for n in gm.graph.nodes] == [n.op for n in tgm.graph.nodes]


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_forward_backward_equals_eager_grads(mode):
    fwd, w1, w2 = _mlp_fn()

    def train_step(x, w1, w2):
        loss = fwd(x, w1, w2)
        g1, g2 = fl.autograd.grad(loss, (w1, w2))
        return loss, g1, g2
    x = fl.randn(5, 4)
    gm = make_fx(train_step, tracing_mode=mode)(x, w1, w2)
    names = {n.target._schema.name for n in calls(gm) if isinstance(n.target, Op)}
    assert {"relu_backward", "linear", "relu"} <= names or {"relu", "threshold_backward"} <= names
    loss, g1, g2 = train_step(x, w1, w2)
    r = gm(x, w1, w2)
    close(r[0], loss)
    close(r[1], g1)
    close(r[2], g2)
    # compare with PyTorch's eager gradients too
    tw1, tw2 = (torch.tensor(N(w)).requires_grad_() for w in (w1, w2))
    tl = torch.nn.functional.log_softmax(torch.relu(torch.nn.functional.linear(
        torch.tensor(N(x)), tw1, torch.tensor(N(fwd.__closure__[0].cell_contents)))) @ tw2.t(), dim=-1).sum() / 5
    tg1, tg2 = torch.autograd.grad(tl, (tw1, tw2))
    close(r[1], tg1, rtol=1e-5)
    close(r[2], tg2, rtol=1e-5)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    close(gm(x, w1, w2)[2], g2)
    if mode == "symbolic":                       # the joint graph also serves another batch size
        x7 = fl.randn(7, 4)
        env = gm.meta["shape_env"]
        assert env.evaluate_guards(env.bindings_from_shapes([x7.shape, w1.shape, w2.shape]))
        for p, q in zip(gm(x7, w1, w2), train_step(x7, w1, w2)):
            close(p, q)


def test_make_fx_constants_scalars_inplace_multi_output():
    def f(x, k):
        v, i = x.max(dim=1)
        y = x.clone()
        y.add_(k)
        return v + fl.tensor([1.0, 2.0, 3.0]) + fl.zeros(3, device=x.device), i, y
    x = fl.randn(3, 4)
    for mode in ("real", "fake"):
        gm = make_fx(f, tracing_mode=mode)(x, 2)
        assert [n.target for n in gm.graph.find_nodes(op="get_attr")] == ["_tensor_constant0"]
        assert "_tensor_constant0" in dict(gm.named_buffers())
        assert any(n.target is operator.getitem for n in gm.graph.nodes)
        assert gm.graph.find_nodes(op="call_function", target=fl.ops.aten.add_.Tensor)
        for p, q in zip(gm(x, 2), f(x, 2)):
            close(p, q)


def test_make_fx_decomposition_table():
    def my_sin(x):
        return fl.ops.aten.cos.default(x - 1.5707963267948966)
    gm = make_fx(lambda x: x.sin() * 2, {fl.ops.aten.sin.default: my_sin})(fl.randn(4))
    names = [n.target._schema.name for n in calls(gm)]
    assert "sin" not in names and "cos" in names
    x = fl.randn(4)
    close(gm(x), x.sin() * 2, atol=1e-6)


# ---- symbolic shapes ----------------------------------------------------------------------------
def test_symbolic_make_fx_one_graph_two_batch_sizes():
    w = fl.randn(4, 6)

    def f(x, y):
        c = ((x + y) * 2) @ w
        return c.sum(dim=1), fl.cat([c.view(-1), c.view(-1)]), x.view(x.shape[0], -1).mul(x.shape[0])
    x, y = fl.randn(8, 4), fl.randn(8, 4)
    gm = make_fx(f, tracing_mode="symbolic")(x, y)
    env = gm.meta["shape_env"]
    s0 = gm.graph.find_nodes(op="placeholder")[0].meta["val"].shape[0]
    assert str(s0) == "s0"
    cat = next(n for n in gm.graph.nodes if n.target is fl.ops.aten.cat.default)
    assert str(cat.meta["val"].shape[0]) == "12*s0"
    assert not any(str(g) in ("Eq(s0, 8)", "Eq(8, s0)") for g in env.guards)   # the batch stayed symbolic
    assert "sym_size" in gm.code
    for B in (8, 5):
        xb, yb = fl.randn(B, 4), fl.randn(B, 4)
        assert env.evaluate_guards(env.bindings_from_shapes([xb.shape, yb.shape]))
        for p, q in zip(gm(xb, yb), f(xb, yb)):
            assert p.shape == q.shape
            close(p, q)
    assert not env.evaluate_guards({"s0": 1, "s1": 4})      # size 1 was guarded away (0/1 specialisation)


def test_symint_arithmetic_and_guards():
    from flambeau.fx.experimental.symbolic_shapes import ShapeEnv, SymInt
    env = ShapeEnv()
    s = env.create_symbol(6)
    assert isinstance(s, SymInt) and env.create_symbol(1) == 1
    assert (s * 4) // 4 == s and not env.guards                 # decided by algebra, no guard
    assert str(s * 2 + 3) == "2*s0 + 3" and (s - s) == 0 and type(s - s) is int
    assert s > 2 and len(env.guards) == 1
    assert int(s) == 6 and any(str(g) == "Eq(s0, 6)" for g in env.guards)
    with pytest.raises(TypeError):
        hash(s)


# ---- fake tensors, shape prop, ops namespace --------------------------------------------------------
def test_fake_tensor_mode():
    with FakeTensorMode(allow_non_fake_inputs=True) as fm:
        a = fm.from_tensor(fl.randn(2, 3))
        b = (a * 2).sum(dim=0)
        assert isinstance(b, FakeTensor) and b.shape == (3,) and b.device == fl.device("cpu")
        z = fl.zeros(4, 5)
        assert isinstance(z, FakeTensor) and z._device.type == "meta" and z.device.type == "cpu"
        c = fl.ones(2, 3) + a                            # real input converted on the fly
        assert isinstance(c, FakeTensor)
        assert "FakeTensor(..., size=(3,))" == repr(b)
    r1, r2 = fl.ones(2), fl.ones(2)
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="FakeTensor"):
            r1 + r2


def test_shape_prop():
    m = mlp_class(fl, fnn, FF)()
    gm = symbolic_trace(m)
    x = fl.randn(7, 4)
    ShapeProp(gm).propagate(x)
    fc2 = next(n for n in gm.graph.nodes if n.target == "fc2")
    assert fc2.meta["tensor_meta"].shape == (7, 3) and fc2.meta["tensor_meta"].dtype == fl.float32
    ShapeProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(fl.randn(9, 4))
    assert tuple(fc2.meta["val"].shape) == (9, 3)


def test_ops_aten_namespace_and_print_readable():
    assert fl.ops.aten.add.Tensor is fl._ops.OPS["add.Tensor"]
    assert fl.ops.aten.relu.default is fl._ops.OPS["relu"]
    close(fl.ops.aten.add(fl.ones(2), fl.ones(2)), [2.0, 2.0])
    with pytest.raises(AttributeError):
        fl.ops.aten.not_an_op_name
    gm = make_fx(lambda x: x.relu() + 1)(fl.randn(2, 3))
    out = gm.print_readable(print_output=False)
    assert out.startswith("class GraphModule(flambeau.nn.Module):")
    assert 'relu: "f32[2, 3]" = flambeau.ops.aten.relu.default(arg0_1)' in out
    mapped = map_arg((gm.graph.output_node().args[0], 3), lambda n: n.name)
    assert mapped == ("add", 3)


def _hand_built_graph(lib):
    """pytorch/examples' fx/proxy_based_graph_creation: Proxies around a fresh graph's placeholders."""
    graph = lib.fx.Graph()
    tracer = lib.fx.proxy.GraphAppendingTracer(graph)
    x, y = (lib.fx.Proxy(graph.placeholder(n), tracer) for n in ("x", "y"))
    b = lib.tanh(lib.cat([x, y]))
    c = lib.neg(b)
    lib.add(b, c)                                 # recorded, unused: dead code in the module
    graph.output(c.node)
    return lib.fx.GraphModule(lib.nn.Module(), graph)


def test_proxies_made_by_hand_record_calls_as_pytorch():
    gt, gf = _hand_built_graph(torch), _hand_built_graph(fl)
    ops = lambda g: [n.op for n in g.graph.nodes]      # noqa: E731
    assert ops(gf) == ops(gt) == ["placeholder", "placeholder"] + ["call_function"] * 4 + ["output"]
    a, b = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(N(gf(fl.tensor(a), fl.tensor(b))), N(gt(torch.tensor(a), torch.tensor(b))),
                               rtol=1e-6)
    from flambeau._ops import _registry
    assert _registry._fx_hook is None             # the Proxies are gone: so is the hook (fast paths back on)
    g = fl.fx.Graph()
    p = fl.fx.Proxy(g.placeholder("x"))
    assert _registry._fx_hook is not None         # installed while one lives
    del p
    assert _registry._fx_hook is None


def _inline_relu(lib, M):
    """pytorch/examples' fx/inline_function: a traced module's call_module node replaced by the module
    called on Proxies of its arguments (no tracer given: the node's graph's)."""
    m = lib.fx.symbolic_trace(M())
    for node in list(m.graph.nodes):
        if (node.op, node.target) == ("call_module", "relu"):
            with m.graph.inserting_before(node):
                args = lib.fx.node.map_arg(node.args, lambda n: lib.fx.Proxy(n))
                out = m.relu(*args)
                node.replace_all_uses_with(out.node)
                m.graph.erase_node(node)
    m.recompile()
    return m


def test_a_module_called_on_proxies_is_inlined_as_in_pytorch():
    def make(nn):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.relu = nn.ReLU()

            def forward(self, x):
                return self.relu(x) - 1.0
        return M
    mt, mf = _inline_relu(torch, make(torch.nn)), _inline_relu(fl, make(fnn))
    assert [n.op for n in mf.graph.nodes] == [n.op for n in mt.graph.nodes]
    assert "call_module" not in [n.op for n in mf.graph.nodes]
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    np.testing.assert_array_equal(N(mf(fl.tensor(x))), N(mt(torch.tensor(x))))


def _rewrite(lib):
    """pytorch/examples' fx/subgraph_rewriter_basic_use, plus a third use of neg(w1) the pattern must not
    swallow (its value is used outside), and a pattern occurrence with other literals (no match)."""
    class M(lib.nn.Module):
        def forward(self, x, w1, w2):
            m1 = lib.cat([lib.neg(w1), w2]).sum()
            m2 = lib.cat([lib.neg(w1), w2]).sum()
            v3 = lib.neg(w2)
            m3 = lib.cat([v3, w1]).sum() + v3.sum()           # neg used outside: not a match
            m4 = lib.cat([lib.neg(x), w1], 0).sum()          # dim given: other arguments, not a match
            return x + lib.max(m1) + lib.max(m2) + m3 + m4

    def pattern(a1, a2):
        return lib.cat([lib.neg(a1), a2]).sum()

    def replacement(w1, w2):
        return lib.stack([w1, w2])

    gm = lib.fx.symbolic_trace(M())
    matches = lib.fx.replace_pattern(gm, pattern, replacement)
    return gm, matches


def test_replace_pattern_matches_torch_fx():
    gt, mt = _rewrite(torch)
    gf, mf = _rewrite(fl)
    assert len(mf) == len(mt) == 2
    assert [n.name for n in mf[0].nodes_map.values()] == [n.name for n in mt[0].nodes_map.values()]
    shape = lambda g: [(n.op, getattr(n.target, "__name__", n.target)) for n in g.graph.nodes]  # noqa: E731
    assert shape(gf) == shape(gt)
    a, b, c = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(N(gf(*map(fl.tensor, (a, b, c)))), N(gt(*map(torch.tensor, (a, b, c)))), rtol=1e-5)


def test_replace_pattern_refuses_mismatched_inputs():
    gm = symbolic_trace(lambda x: fl.neg(x) + 1)
    with pytest.raises(ValueError, match="the pattern takes 1 inputs and the replacement 2"):
        fl.fx.replace_pattern(gm, lambda a: fl.neg(a), lambda a, b: a + b)
