"""flambeau.func transforms inside flambeau.compile: grad, grad_and_value, vmap, jacrev, jacfwd and
hessian (composed) are captured as one graph node each, with no graph break, and backends trace
through them (AOT autograd's graphs hold the transform's operations); values and gradients against
torch.func. A transform of a function with free variables runs eagerly, logged (FLAMBEAU_LOGS=graph_breaks) with its reason."""
import numpy as np
import pytest
import torch

import flambeau
from flambeau._counters import counters, FALLBACKS
from flambeau._dynamo.testing import CompileCounter
from flambeau._functorch.aot_autograd import aot_module_simplified

_RNG = np.random.default_rng(0)
W = _RNG.standard_normal(3).astype(np.float32)
XS = _RNG.standard_normal((5, 3)).astype(np.float32)
YS = _RNG.standard_normal(5).astype(np.float32)


def wavy(x):
    return (x.sin() * x).sum()


def mse(w, xb, yb):
    return ((xb @ w - yb) ** 2).mean()


def with_aux(x):
    return (x ** 2).sum(), x.cos()


def _programs(T):
    f = T.func
    return {
        "grad": lambda w, xs, ys: f.grad(wavy)(w) * 2,
        "grad_argnums": lambda w, xs, ys: f.grad(mse, argnums=(0, 2))(w, xs, ys),
        "grad_and_value_aux": lambda w, xs, ys: f.grad_and_value(with_aux, has_aux=True)(w),
        "vmap_lambda": lambda w, xs, ys: f.vmap(lambda r: r.cos().sum())(xs) + 1,
        "per_sample_grads": lambda w, xs, ys: f.vmap(f.grad(mse), in_dims=(None, 0, 0))(w, xs, ys),
        "jacrev": lambda w, xs, ys: f.jacrev(torch_free_tanh)(w),
        "jacfwd": lambda w, xs, ys: f.jacfwd(torch_free_tanh)(w),
        "hessian": lambda w, xs, ys: f.hessian(wavy)(w),
    }


def torch_free_tanh(w):
    return (w * 3).tanh() * w


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [y for e in x for y in _flat(e)]
    return [x.detach().numpy()]


def _run(T, name, backend=None):
    fn = _programs(T)[name]
    if backend is not None:
        fn = T.compile(fn, backend=backend)
    return _flat(fn(*(T.tensor(a) for a in (W, XS, YS))))


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(_programs(torch)))
def test_transform_is_one_graph_and_matches_torch_func(name, backend):
    flambeau._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()
    got = _run(flambeau, name, cnt if backend == "counter" else backend)
    want = _run(torch, name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters[FALLBACKS], dict(counters[FALLBACKS])
    if backend == "counter":
        assert cnt.frame_count == 1


def test_aot_graphs_hold_the_transforms_operations_and_gradients_flow():
    """grad(wavy) inside a compiled loss: the compiled forward graph computes wavy's derivative
    (cos appears, no opaque call of the transform), and the outer gradient matches torch.func."""
    fw, bw = [], []

    def backend(gm, example_inputs):
        def keep(into):
            def compiler(g, _inputs):
                into.append(g)
                return g.forward
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep(fw), bw_compiler=keep(bw))

    def outer(T, x):
        return T.func.grad(wavy)(x).pow(2).sum()

    flambeau._dynamo.reset()
    x, xt = flambeau.tensor(W, requires_grad=True), torch.tensor(W, requires_grad=True)
    flambeau.compile(lambda a: outer(flambeau, a), backend=backend, fullgraph=True)(x).backward()
    outer(torch, xt).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5)
    names = [getattr(n.target, "__name__", str(n.target)) for n in fw[0].graph.nodes if n.op == "call_function"]
    assert "cos" in names and "wavy" not in names, names
    assert len(bw) == 1


def test_transform_of_a_closure_runs_eagerly_with_a_logged_reason(monkeypatch, capsys):
    scale = flambeau.tensor(2.0)

    def fn(x):
        return flambeau.func.grad(lambda v: (v * scale).sin().sum())(x) + 1

    monkeypatch.setenv("FLAMBEAU_LOGS", "graph_breaks")
    flambeau._dynamo.reset()
    counters.clear()
    x = flambeau.tensor(W)
    got = flambeau.compile(fn, backend="eager")(x)
    err = capsys.readouterr().err
    monkeypatch.setenv("FLAMBEAU_LOGS", "")
    flambeau._dynamo.reset()
    want = torch.func.grad(lambda v: (v * 2.0).sin().sum())(torch.tensor(W)) + 1
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    # the lambda's closure cannot be rebuilt after a break, so the whole frame runs eagerly, logged with the reason
    assert "Skipping frame fn" in err and "flambeau.func.grad of" in err and "free variables" in err, err
