"""flambeau.func transforms inside flambeau.compile: grad, grad_and_value, vmap, jacrev, jacfwd,
hessian (composed), jvp, vjp (and its vjp_fn), linearize (and its jvp_fn), of module-level
functions and of functions made in the frame that close over tensors, are captured as graph nodes
with no graph break, and backends trace through them (AOT autograd's graphs hold the transform's
operations); values and gradients against torch.func and flambeau eager. Per-sample gradients of a
small CNN (vmap(grad(loss)) over functional_call) compile as one graph. A transform whose body
cannot run on fake tensors is a graph break logged (FLAMBEAU_LOGS=graph_breaks) with its reason."""
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


def vjp_twice(T, w, xs):
    out, vjp_fn = T.func.vjp(wavy_pair, w, xs[0])
    return out, vjp_fn((out[0] * 0 + 1, out[1].cos()))


def vjp_aux(T, w, xs):
    out, vjp_fn, aux = T.func.vjp(with_aux, w, has_aux=True)
    return out, aux, vjp_fn(out * 3)


def linearized(T, w, xs):
    out, jvp_fn = T.func.linearize(torch_free_tanh, w)
    return out, jvp_fn(xs[0]), jvp_fn(xs[1])


def closure_grad(T, w, xs):
    scale = xs[0] * 2
    return T.func.grad(lambda v: (v * scale).sin().sum())(w) + 1


def closure_vmap_jacrev(T, w, xs):
    return T.func.vmap(T.func.jacrev(lambda r: (r * w).tanh()), in_dims=0)(xs)


def wavy_pair(w, x):
    return (w * x).sin(), w.sum() * x


def _programs(T):
    f = T.func
    return {
        "jvp": lambda w, xs, ys: f.jvp(wavy_pair, (w, xs[0]), (xs[1], xs[2])),
        "jvp_grad": lambda w, xs, ys: f.jvp(f.grad(wavy), (w,), (xs[0],)),
        "vjp": lambda w, xs, ys: vjp_twice(T, w, xs),
        "vjp_aux": lambda w, xs, ys: vjp_aux(T, w, xs),
        "linearize": lambda w, xs, ys: linearized(T, w, xs),
        "closure_grad": lambda w, xs, ys: closure_grad(T, w, xs),
        "closure_vmap_jacrev": lambda w, xs, ys: closure_vmap_jacrev(T, w, xs),
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


def test_gradients_flow_to_a_tensor_the_transformed_function_closes_over():
    """grad(lambda v: (v * s).sin().sum()) closes over s: s is an operand of the node, so the outer
    backward reaches it (torch.func treats it as a captured constant of the inner grad, too)."""
    def fn(T, x, s):
        return (T.func.grad(lambda v: (v * s).sin().sum())(x) ** 2).sum()

    for backend in ("aot_eager", "inductor"):
        flambeau._dynamo.reset()
        counters.clear()
        cnt = CompileCounter() if backend == "aot_eager" else None
        x, s = flambeau.tensor(W, requires_grad=True), flambeau.tensor(XS[0], requires_grad=True)
        xt, st = torch.tensor(W, requires_grad=True), torch.tensor(XS[0], requires_grad=True)
        flambeau.compile(lambda a, b: fn(flambeau, a, b), backend=backend, fullgraph=True)(x, s).backward()
        fn(torch, xt, st).backward()
        np.testing.assert_allclose(s.grad.numpy(), st.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
        assert not counters["graph_break"], dict(counters["graph_break"])


def _cnn(T, weights):
    model = T.nn.Sequential(T.nn.Conv2d(1, 4, 3), T.nn.ReLU(), T.nn.MaxPool2d(2), T.nn.Flatten(),
                            T.nn.Linear(4 * 3 * 3, 5))
    model.load_state_dict({k: T.tensor(v) for k, v in weights.items()})
    return model


def per_sample_grads(T, model, params, x, t):
    def loss(p, xi, ti):
        out = T.func.functional_call(model, p, (xi.unsqueeze(0),))
        return T.nn.functional.cross_entropy(out, ti.unsqueeze(0))
    return T.func.vmap(T.func.grad(loss), in_dims=(None, 0, 0))(params, x, t)


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
def test_per_sample_gradients_of_a_cnn_compile_as_one_graph(backend):
    """vmap(grad(loss)) over functional_call of a CNN the loss closes over, parameters as a dict:
    one frame, no break, a dict of per-sample gradients equal to torch.func's and to eager's."""
    xs = _RNG.standard_normal((6, 1, 8, 8)).astype(np.float32)
    ts = _RNG.integers(0, 5, 6)
    weights = {k: _RNG.standard_normal(s).astype(np.float32) * 0.3 for k, s in
               (("0.weight", (4, 1, 3, 3)), ("0.bias", (4,)), ("4.weight", (5, 36)), ("4.bias", (5,)))}
    results = {}
    for T in (flambeau, torch):
        model = _cnn(T, weights)
        params = {k: v.detach() for k, v in model.named_parameters()}
        x, t = T.tensor(xs), T.tensor(ts)
        results[T.__name__] = per_sample_grads(T, model, params, x, t)
        if T is flambeau:
            flambeau._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            fn = flambeau.compile(lambda p, a, b: per_sample_grads(flambeau, model, p, a, b),
                                  backend=cnt if backend == "counter" else backend)
            compiled = fn(params, x, t)
            assert not counters["graph_break"], dict(counters["graph_break"])
            if backend == "counter":
                assert cnt.frame_count == 1
    assert sorted(compiled) == sorted(results["torch"])
    for k, want in results["torch"].items():
        assert tuple(compiled[k].shape) == (6,) + tuple(want.shape[1:])
        np.testing.assert_allclose(compiled[k].numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(compiled[k].numpy(), results["flambeau"][k].numpy(), rtol=1e-5, atol=1e-7)


def data_dependent(v):
    return v.sin().sum() * (2.0 if v.sum().item() > 0 else 3.0)


def test_transform_whose_body_cannot_be_traced_breaks_with_a_logged_reason(monkeypatch, capsys):
    def fn(x):
        return flambeau.func.grad(data_dependent)(x * 2) + 1

    monkeypatch.setattr(flambeau._logging, "_overrides", {})     # no set_logs() of an earlier test in effect
    monkeypatch.setenv("FLAMBEAU_LOGS", "graph_breaks")
    flambeau._dynamo.reset()
    counters.clear()
    got = flambeau.compile(fn, backend="eager")(flambeau.tensor(W))
    err = capsys.readouterr().err
    monkeypatch.setenv("FLAMBEAU_LOGS", "")
    flambeau._dynamo.reset()
    want = torch.func.grad(data_dependent)(torch.tensor(W) * 2) + 1
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    assert counters["graph_break"], "expected a graph break"
    assert "while tracing" in err and "item" in err, err


LIN_W = _RNG.standard_normal((2, 3)).astype(np.float32)
LIN_B = _RNG.standard_normal(2).astype(np.float32)
STATE = {}           # per system: the module and the scale tensor the transformed functions read as globals


def scaled_by_globals(T, x):
    model, scale = STATE[T.__name__]
    return T.func.vmap(lambda r: model(r) * scale)(x).pow(2).sum()


def scaled_by_global_names(x):
    return flambeau.func.vmap(lambda r: GLOBAL_MODEL(r) * GLOBAL_SCALE)(x).pow(2).sum()


def _linear(T):
    m = T.nn.Linear(3, 2)
    m.load_state_dict({"weight": T.tensor(LIN_W), "bias": T.tensor(LIN_B)})
    return m


GLOBAL_MODEL = _linear(flambeau)
GLOBAL_SCALE = flambeau.tensor([1.5, -2.0], requires_grad=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_modules_and_tensors_a_transformed_function_reads_get_gradients(backend):
    """A function closing over a module and a tensor (through the frame's locals) or reading them as
    globals: their parameters and values are node operands (not constants baked into the AOT
    graph), so the module's and the tensor's gradients match eager and torch.func; rebinding the
    global tensor recompiles (its read is guarded) rather than reusing the old value."""
    want = {}
    for T in (torch, flambeau):
        STATE[T.__name__] = (_linear(T), T.tensor([1.5, -2.0], requires_grad=True))
        scaled_by_globals(T, T.tensor(XS)).backward()
        model, scale = STATE[T.__name__]
        want[T.__name__] = [model.weight.grad.numpy(), model.bias.grad.numpy(), scale.grad.numpy()]
        model.zero_grad()
        scale.grad = None
    np.testing.assert_allclose(want["flambeau"][0], want["torch"][0], rtol=1e-5)
    flambeau._dynamo.reset()
    counters.clear()
    model, scale = STATE["flambeau"]
    flambeau.compile(lambda x: scaled_by_globals(flambeau, x), backend=backend, fullgraph=True)(
        flambeau.tensor(XS)).backward()
    for got, w in zip([model.weight.grad, model.bias.grad, scale.grad], want["torch"]):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-5, atol=1e-6)

    global GLOBAL_SCALE
    flambeau._dynamo.reset()
    fn = flambeau.compile(scaled_by_global_names, backend=backend, fullgraph=True)
    GLOBAL_MODEL.zero_grad()
    GLOBAL_SCALE.grad = None
    fn(flambeau.tensor(XS)).backward()
    np.testing.assert_allclose(GLOBAL_MODEL.weight.grad.numpy(), want["torch"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(GLOBAL_SCALE.grad.numpy(), want["torch"][2], rtol=1e-5, atol=1e-6)
    saved, GLOBAL_SCALE = GLOBAL_SCALE, flambeau.tensor([3.0, 0.5])
    try:
        np.testing.assert_allclose(fn(flambeau.tensor(XS)).item(), scaled_by_global_names(flambeau.tensor(XS)).item(),
                                   rtol=1e-5)
    finally:
        GLOBAL_SCALE = saved
    assert not counters["graph_break"], dict(counters["graph_break"])


def _linear_pair():
    ours, ref = _linear(flambeau), _linear(torch)
    return {"flambeau": ours, "torch": ref}


def call_with_given_weight(T, model, w, x):
    """functional_call at the compiled function's own level, the weight given, the bias the module's."""
    return T.func.functional_call(model, {"weight": w}, (x,)).sin().sum()


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
def test_functional_call_at_the_frames_level_is_one_graph_with_gradients(backend):
    """Gradients reach the given tensor and the module's own parameter it did not replace."""
    models, grads = _linear_pair(), {}
    for T in (torch, flambeau):
        model = models[T.__name__]
        w = T.tensor(LIN_W * 2, requires_grad=True)
        fn = lambda a, b: call_with_given_weight(T, model, a, b)
        if T is flambeau:
            flambeau._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            fn = flambeau.compile(fn, backend=cnt if backend == "counter" else backend)
        out = fn(w, T.tensor(XS))
        out.backward()
        grads[T.__name__] = [out.detach().numpy(), w.grad.numpy(), model.bias.grad.numpy()]
        assert model.weight.grad is None
    for g, w in zip(grads["flambeau"], grads["torch"]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not counters["graph_break"], dict(counters["graph_break"])
    if backend == "counter":
        assert cnt.frame_count == 1


def ensemble(T, base, params, buffers, x):
    """PyTorch's model-ensembling recipe: vmap a functional call of one model over stacked states."""
    return T.func.vmap(lambda p, b, xb: T.func.functional_call(base, (p, b), (xb,)), in_dims=(0, 0, None))(
        params, buffers, x)


def _ensemble_models(T):
    T.manual_seed(0)
    models = [_linear(T) for _ in range(3)]
    for i, m in enumerate(models):
        m.weight.data.mul_(i + 1.0)
    return models


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
def test_vmap_of_functional_call_over_stacked_states_is_one_graph(backend):
    results = {}
    for T in (torch, flambeau):
        models = _ensemble_models(T)
        params, buffers = T.func.stack_module_state(models)
        fn = lambda p, b, x: ensemble(T, models[0], p, b, x)
        if T is flambeau:
            flambeau._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            fn = flambeau.compile(fn, backend=cnt if backend == "counter" else backend)
        out = fn(params, buffers, T.tensor(XS))
        out.sum().backward()
        results[T.__name__] = (out.detach().numpy(), params["weight"].grad.numpy(), params["bias"].grad.numpy())
    for g, w in zip(results["flambeau"], results["torch"]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not counters["graph_break"], dict(counters["graph_break"])
    if backend == "counter":
        assert cnt.frame_count == 1


def test_stack_module_state_in_a_compiled_function_breaks_with_its_reason():
    """Its outputs are new leaves that require grad: it runs eagerly, the rest compiles, gradients
    reach the stacked leaves as in torch.func."""
    results = {}
    for T in (torch, flambeau):
        models = _ensemble_models(T)

        def fn(x):
            params, buffers = T.func.stack_module_state(models)
            return ensemble(T, models[0], params, buffers, x), params
        if T is flambeau:
            flambeau._dynamo.reset()
            counters.clear()
            fn = flambeau.compile(fn, backend="aot_eager")
        out, params = fn(T.tensor(XS))
        out.sum().backward()
        results[T.__name__] = (out.detach().numpy(), params["weight"].grad.numpy(), params["weight"].is_leaf)
    for g, w in zip(results["flambeau"][:2], results["torch"][:2]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert results["flambeau"][2] and results["torch"][2]
    assert any("stack_module_state" in r for r in counters["graph_break"]), dict(counters["graph_break"])


def returns_linear_functions(T, w):
    out, vjp_fn = T.func.vjp(wavy_pair, w, w * 2)
    tangent_out, jvp_fn = T.func.linearize(torch_free_tanh, w)
    return out, vjp_fn, jvp_fn


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
def test_vjp_fn_and_jvp_fn_returned_from_a_compiled_function(backend):
    """The frame compiles (one graph, no break); the returned functions match torch.func's."""
    results = {}
    for T in (torch, flambeau):
        fn = lambda w: returns_linear_functions(T, w)
        if T is flambeau:
            flambeau._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            fn = flambeau.compile(fn, backend=cnt if backend == "counter" else backend)
        out, vjp_fn, jvp_fn = fn(T.tensor(W))
        results[T.__name__] = _flat((out, vjp_fn((T.tensor(XS[0]), T.tensor(XS[1]))), jvp_fn(T.tensor(XS[2]))))
    assert len(results["flambeau"]) == len(results["torch"])
    for g, w in zip(results["flambeau"], results["torch"]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    if backend == "counter":
        assert cnt.frame_count == 1
