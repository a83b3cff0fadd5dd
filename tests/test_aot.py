"""flambeau._functorch: functionalization and AOT autograd (joint graph, partitioners, runtime),
checked against eager flambeau and against PyTorch."""
import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._decomp import core_aten_decompositions
from flambeau._functorch import (FunctionalTensorMode, aot_function, aot_module, aot_module_simplified,
                                 default_partition, functionalize, min_cut_rematerialization_partition)
from flambeau.fx.experimental.proxy_tensor import make_fx
from flambeau._functorch.partitioners import _nbytes


def N(t):
    return t.detach().numpy() if isinstance(t, fl.Tensor) else t.detach().numpy()


def close(a, b, rtol=1.3e-6, atol=1e-5):
    np.testing.assert_allclose(N(a), N(b), rtol=rtol, atol=atol)


def calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and hasattr(n.target, "_schema")]


def nop(gm, example_inputs):
    return gm


# ---- functionalization ------------------------------------------------------------------------------
def mutating(m):
    def f(x, y):
        v = x[0]
        v.add_(y)                         # through a select view
        w = x.view(-1)
        z = w * 2                         # sees the update
        x[:, 1:3].mul_(3)                 # through a slice view
        t = x.t()
        t[0].sub_(1)                      # through a transpose then select
        y.add_(1)                         # input mutated directly
        return z, w + 1, x.sum(0)
    return f


def test_functionalize_matches_eager_and_torch():
    x, y = np.random.default_rng(0).standard_normal((3, 4)), np.arange(4.0)
    fx, fy = fl.tensor(x), fl.tensor(y)
    tx, ty = torch.tensor(x), torch.tensor(y)
    ref = mutating(torch)(tx, ty)
    out = functionalize(mutating(fl))(fx, fy)
    for a, b in zip(out, ref):
        close(a, b)
    close(fx, tx)
    close(fy, ty)


def test_functionalized_graph_has_no_mutation_but_final_copies():
    x, y = fl.randn(3, 4), fl.randn(4)
    gm = make_fx(functionalize(mutating(fl)), tracing_mode="fake")(x.clone(), y.clone())
    names = [n.target.name for n in calls(gm)]
    inplace = [n for n in calls(gm) if n.target.is_inplace]
    assert [n.target.name for n in inplace] == ["copy_", "copy_"]
    assert all(n.args[0].op == "placeholder" for n in inplace)
    # the copies come last: nothing after them but the output
    last = list(gm.graph.nodes)[-3:-1]
    assert all(n.target.name == "copy_" for n in last)
    assert "select_scatter" in names and "slice_scatter" in names
    x1, y1, x2, y2 = x.clone(), y.clone(), x.clone(), y.clone()
    for a, b in zip(mutating(fl)(x1, y1), gm(x2, y2)):
        close(a, b)
    close(x1, x2)
    close(y1, y2)


def test_functionalize_batchnorm_running_stats():
    bn = fl.nn.BatchNorm1d(3)
    x = fl.randn(5, 3)
    ref_bn = fl.nn.BatchNorm1d(3)
    ref = ref_bn(x)

    def f(x, rm, rv, nb):
        nb.add_(1)
        return fl.nn.functional.batch_norm(x, rm, rv, bn.weight, bn.bias, True, 0.1, 1e-5)
    gm = make_fx(functionalize(f), tracing_mode="fake")(x, bn.running_mean, bn.running_var, bn.num_batches_tracked)
    assert not any(n.target.is_inplace and n.target.name != "copy_" for n in calls(gm))
    assert sum(n.target.name == "copy_" for n in calls(gm)) == 3
    out = gm(x, bn.running_mean, bn.running_var, bn.num_batches_tracked)
    close(out, ref)
    close(bn.running_mean, ref_bn.running_mean)
    close(bn.running_var, ref_bn.running_var)
    assert int(bn.num_batches_tracked) == 1


def test_functional_mode_out_and_stale_views():
    x = fl.zeros(4)
    with FunctionalTensorMode():
        v = x[1:3]
        x.add_(1)                          # v is stale until used
        s = v * 1
        fl.add(x, 1, out=x)
    close(s, fl.ones(2))
    close(x, fl.full((4,), 2.0))


def test_functionalize_leaf_error_like_eager():
    w = fl.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        functionalize(lambda w: w.add_(1))(w)


# ---- AOT autograd ------------------------------------------------------------------------------------
def mlp_fn(x, w1, b1, w2):
    h = fl.nn.functional.gelu(x @ w1 + b1)
    return fl.nn.functional.log_softmax(h @ w2, -1).sum(), h


def _params(seed=0, rg=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 3))
    ws = [rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal((5, 2))]
    return fl.tensor(x), [fl.tensor(w, requires_grad=rg) for w in ws], torch.tensor(x), \
        [torch.tensor(w, requires_grad=rg) for w in ws]


@pytest.mark.parametrize("partition", [default_partition, min_cut_rematerialization_partition])
@pytest.mark.parametrize("decomp", [False, True])
def test_aot_function_grads_match_eager_and_torch(partition, decomp):
    x, ws, tx, tws = _params()
    seen = []

    def fw(gm, ex):
        seen.append(("fw", gm))
        return gm

    def bw(gm, ex):
        seen.append(("bw", gm))
        return gm
    cf = aot_function(mlp_fn, fw, bw, partition_fn=partition,
                      decompositions=core_aten_decompositions() if decomp else None)
    loss, h = cf(x, *ws)
    (loss + h.sum()).backward()
    tl = torch.log_softmax(torch.nn.functional.gelu(tx @ tws[0] + tws[1]) @ tws[2], -1).sum()
    th = torch.nn.functional.gelu(tx @ tws[0] + tws[1])
    (tl + th.sum()).backward()
    close(loss, tl)
    for w, tw in zip(ws, tws):
        close(w.grad, tw.grad, rtol=1e-5)
    assert [k for k, _ in seen] == ["fw", "bw"]
    if decomp:
        from flambeau._decomp import is_core
        assert all(is_core(n.target) for _, g in seen for n in calls(g))


def test_min_cut_saves_fewer_bytes_than_default():
    def chain(x, w):
        y = x @ w
        return (y.sin() * 2 + 1).tanh().relu().sum()
    x, w = fl.randn(16, 8), fl.randn(8, 32, requires_grad=True)
    saved = {}

    def spy(name):
        def fw(gm, ex):
            out = gm.graph.output_node().args[0]
            saved[name] = sum(_nbytes(n) for n in out[1:])
            return gm
        return fw
    for name, p in (("default", default_partition), ("mincut", min_cut_rematerialization_partition)):
        cf = aot_function(chain, spy(name), nop, partition_fn=p, decompositions=core_aten_decompositions())
        l = cf(x, w)
        g, = fl.autograd.grad(l, w)
        close(g, fl.autograd.grad(chain(x, w), w)[0])
    assert saved["mincut"] < saved["default"]


def test_inference_graph_when_nothing_requires_grad():
    x, ws, _, _ = _params(rg=False)
    compiled = []
    cf = aot_function(mlp_fn, lambda g, e: compiled.append("fw") or g, lambda g, e: compiled.append("bw") or g)
    loss, h = cf(x, *ws)
    close(loss, mlp_fn(x, *ws)[0])
    assert compiled == ["fw"] and not loss.requires_grad
    with fl.no_grad():
        x2, ws2, _, _ = _params()
        cf(x2, *ws2)
    assert compiled == ["fw", "fw"]           # no_grad: a second, inference graph


def test_aot_mutation_copied_back_and_alias_outputs():
    def f(x, buf):
        buf.mul_(0.5).add_(x.detach().sum())
        return x * 2, x.view(-1), x
    x = fl.randn(2, 3, requires_grad=True)
    buf, ref_buf = fl.ones(3), fl.ones(3)
    cf = aot_function(f, nop, nop)
    a, v, same = cf(x, buf)
    ra, rv, _ = f(x, ref_buf)
    close(buf, ref_buf)
    close(a, ra)
    assert same is x
    assert v._base is x and tuple(v.shape) == (6,)
    (a.sum() + v.sum()).backward()
    close(x.grad, fl.full((2, 3), 3.0))


def test_aot_module_batchnorm_training_and_params():
    fl.manual_seed(0)
    m = fl.nn.Sequential(fl.nn.Linear(3, 4), fl.nn.BatchNorm1d(4), fl.nn.ReLU())
    ref = fl.nn.Sequential(fl.nn.Linear(3, 4), fl.nn.BatchNorm1d(4), fl.nn.ReLU())
    ref.load_state_dict(m.state_dict())
    am = aot_module(m, nop, nop, decompositions=core_aten_decompositions())
    for _ in range(2):
        x = fl.randn(6, 3)
        am(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
    for k, v in ref.state_dict().items():
        close(m.state_dict()[k], v)
    for p, q in zip(m.parameters(), ref.parameters()):
        close(p.grad, q.grad, rtol=1e-5)


def test_aot_module_simplified_lifts_graph_parameters():
    lin = fl.nn.Linear(3, 2)
    gm = fl.fx.symbolic_trace(lin)
    x = fl.randn(4, 3)
    call = aot_module_simplified(gm, [x], nop, nop)
    out, = call(x)
    out.sum().backward()
    close(out, lin(x))
    close(lin.bias.grad, fl.full((2,), 4.0))


def test_aot_logs_print_graphs(monkeypatch, capsys):
    monkeypatch.setenv("FLAMBEAU_LOGS", "aot")
    x, ws, _, _ = _params()
    aot_function(mlp_fn, nop, nop)(x, *ws)
    out = capsys.readouterr().err            # through logging: the `flambeau` logger's stderr handler
    assert "AOT joint graph" in out and "AOT forward graph" in out and "AOT backward graph" in out
    assert "tangents_1" in out and "primals_1" in out


def test_symbolic_aot_graph_serves_other_sizes():
    cf = aot_function(lambda x, w: (x @ w).relu().sum(), nop, nop, dynamic=True)
    w = fl.randn(3, 2, requires_grad=True)
    for b in (4, 7):
        x = fl.randn(b, 3)
        g, = fl.autograd.grad(cf(x, w), w)
        close(g, fl.autograd.grad((x @ w).relu().sum(), w)[0])


# ---- absent tangents: an output that receives no gradient contributes nothing ------------------------
def _log_and_softmax(m):
    def f(x):
        a = m.log10(x)                        # NaN where x < 0
        return a, m.softmax(a, 0)            # the softmax is NaN throughout; its backward must never run
    return f


def _log_break_softmax(m):
    def f(x):
        a = m.log10(x)
        s = m.softmax(a, 0)
        m._dynamo.graph_break()               # the softmax leaves the first graph and only `>` reads it
        return a, s > 0
    return f


def _chunks(m):
    def f(x):
        a, b = m.log10(x).chunk(2)            # the backward joins a gradient with b's absent one (cat)
        return a * 3, m.softmax(b, 0)
    return f


def _columns(m):
    def f(x):
        a, b = m.log10(x).reshape(-1, 2).unbind(1)   # the zero joined in is (floor(s0/2), 1): a symbolic size
        return a * 3, m.softmax(b, 0)
    return f


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("program", [_log_and_softmax, _log_break_softmax, _chunks, _columns])
def test_absent_tangent_contributes_nothing_as_pytorch_eager(program, dynamic):
    """Only the first output reaches the loss: the compiled backward is specialised on the second's
    tangent being absent (no zero tangent that 0 * NaN turns into NaN gradients), as eager runs no
    backward for it. Was NaN throughout (PyTorch's own torch.compile gives NaN here too)."""
    vals = [-1.0, 2.0, 3.0, 0.5, -0.25, 4.0]
    x, tx = fl.tensor(vals, requires_grad=True), torch.tensor(vals, requires_grad=True)
    a = fl.compile(program(fl), dynamic=dynamic)(x)[0]
    ta = program(torch)(tx)[0]
    (a * fl.arange(a.shape[0])).sum().backward()
    (ta * torch.arange(ta.shape[0])).sum().backward()
    close(x.grad, tx.grad)


@pytest.mark.parametrize("dynamic", [False, True])
def test_input_reached_only_through_an_absent_tangent_gets_no_grad(dynamic):
    """`y` feeds only the output the loss ignores: its grad stays None, as in eager (was zeros)."""
    def f(m, x, y):
        return x * 2, m.exp(y) * x
    x, y = fl.randn(4, requires_grad=True), fl.randn(4, requires_grad=True)
    tx, ty = torch.tensor(N(x), requires_grad=True), torch.tensor(N(y), requires_grad=True)
    fl.compile(lambda x, y: f(fl, x, y), dynamic=dynamic)(x, y)[0].sum().backward()
    f(torch, tx, ty)[0].sum().backward()
    assert y.grad is None and ty.grad is None
    close(x.grad, tx.grad)


def test_saved_values_the_backward_returns_are_marked_for_the_forward():
    """partitioners._returned: the positions of saved values that a backward graph returns as gradients,
    themselves or through views (what the inductor keeps out of its saved-activation arena); a value only
    read by the backward's arithmetic is not one."""
    from flambeau._functorch.partitioners import _returned

    def bw(a, b, c):
        return a.view(-1).unsqueeze(0), b * 2, c
    gm = make_fx(bw)(fl.randn(2, 3), fl.randn(3), fl.randn(4))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outs = list(gm.graph.output_node().args[0])
    assert _returned(placeholders, outs) == {0, 2}
    assert _returned(placeholders[1:], outs) == {1}          # (c, now at position 1)


# ---- common subexpression elimination of the joint graph ----------------------------------------------
def _cross_entropy_bf16(m):
    def f(x, w, y):
        with m.autocast("cpu", dtype=m.bfloat16):
            logits = x @ w.t()
        return m.nn.functional.cross_entropy(logits, y)
    return f


@pytest.mark.parametrize("cse", [True, False])
def test_cross_entropy_backward_reuses_the_forward_statistics(monkeypatch, cse):
    """Cross-entropy's backward recomputes the softmax of the logits; with the joint graph's CSE
    (`torch._functorch.config.cse`, on by default as in PyTorch) the duplicate cast, row maximum and sum
    merge with the forward's, and the min-cut partitioner saves the (rows, 1) statistics: the backward
    graph reads the logits once and computes no reduction over them. Gradients equal PyTorch's."""
    from flambeau._functorch import config
    monkeypatch.setattr(config, "cse", cse)
    rng = np.random.default_rng(0)
    x, w, y = rng.standard_normal((64, 16)), rng.standard_normal((300, 16)), rng.integers(0, 300, 64)
    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm
        return compiler
    fx, fw = fl.tensor(x, dtype=fl.float32, requires_grad=True), fl.tensor(w, dtype=fl.float32, requires_grad=True)
    out = aot_function(_cross_entropy_bf16(fl), keep("fw"), keep("bw"), partition_fn=min_cut_rematerialization_partition,
                       decompositions=core_aten_decompositions())(fx, fw, fl.tensor(y))
    out.backward()
    tx, tw = torch.tensor(x, dtype=torch.float32, requires_grad=True), torch.tensor(w, dtype=torch.float32,
                                                                                      requires_grad=True)
    ref = _cross_entropy_bf16(torch)(tx, tw, torch.tensor(y))
    ref.backward()
    close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
    close(fx.grad, tx.grad, rtol=2e-2, atol=2e-3)
    close(fw.grad, tw.grad, rtol=2e-2, atol=2e-3)
    bw_reductions = [n for n in calls(graphs["bw"]) if n.target._schema.name in ("amax", "sum", "logsumexp")
                     and n.args[0].meta["val"].shape == (64, 300)]
    fw_saved = [n.meta["val"].shape for n in graphs["fw"].graph.output_node().args[0][1:]]
    if cse:
        assert bw_reductions == []
        assert (64, 1) in fw_saved
    else:                                       # the pass is what removes them: without it they are there
        assert len(bw_reductions) == 2


def test_cse_never_merges_random_calls_or_signed_zeros():
    """Two dropouts of the same input stay two draws (PyTorch's rand_ops are excluded the same way), and
    `x + 0.0` / `x + -0.0` stay two calls (-0.0 + 0.0 is 0.0, -0.0 + -0.0 is -0.0); two equal casts merge."""
    from flambeau._functorch.compile_utils import fx_graph_cse

    def f(x):
        a = fl.nn.functional.dropout(x, 0.5) + fl.nn.functional.dropout(x, 0.5)
        return a, x + 0.0, x + -0.0, x.to(fl.float64) * x.to(fl.float64)
    gm = make_fx(f)(fl.randn(8))
    before = [n.target._schema.name for n in calls(gm)]
    after = [n.target._schema.name for n in calls(fx_graph_cse(gm))]
    random = [n for n in before if n in ("native_dropout", "bernoulli", "rand", "rand_like", "dropout")]
    assert random and [n for n in after if n in random] == random
    assert after.count("_to_copy") == 1 and before.count("_to_copy") == 2
    assert after.count("add") == before.count("add") >= 3
    x = fl.tensor([-0.0, 1.0])
    _, z1, z2, _ = gm(x)
    assert np.signbit(z1.numpy()[0]) == np.signbit(np.float32(-0.0) + np.float32(0.0))
    assert np.signbit(z2.numpy()[0]) == np.signbit(np.float32(-0.0) + np.float32(-0.0))
