"""flambeau.func against torch.func: grad/vjp/jvp/jacobians/hessian in float64, vmap's arguments and
errors, compositions, per-sample gradients of a CNN, model ensembles, and use under compile."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.func as tf

import flambeau as fl
import flambeau.func as ff


def _t(mod, a):
    return mod.tensor(np.asarray(a, dtype=np.float64))


def close(a, b, rtol=1e-9, atol=1e-10):
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b)
        for x, y in zip(a, b):
            close(x, y, rtol, atol)
        return
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            close(a[k], b[k], rtol, atol)
        return
    assert tuple(a.shape) == tuple(b.shape), (tuple(a.shape), tuple(b.shape))
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)) + 0.5
Y = RNG.standard_normal((4,))

# representative functions: (m, *tensors) -> tensor
FUNCS = {
    "sin_mul": lambda m, x, y: (m.sin(x) * y).sum(),
    "softmax": lambda m, x, y: (m.softmax(x, -1) * y).sum(),
    "matmul": lambda m, x, y: (x @ y).pow(2).sum(),
    "norm_exp": lambda m, x, y: m.exp(x / (1 + x.norm())).mean() + (y * y).sum(),
    "tanh_logsumexp": lambda m, x, y: m.logsumexp(m.tanh(x) + y, -1).sum(),
    "layer_norm": lambda m, x, y: (m.nn.functional.layer_norm(x, (4,)) * y).sum(),
}
VEC = {   # vector-valued: for jacobians and jvp/vjp
    "sin_mul": lambda m, x, y: m.sin(x) * y,
    "matmul": lambda m, x, y: x @ y,
    "softmax": lambda m, x, y: m.softmax(x * y, -1),
    "cumsum": lambda m, x, y: m.cumsum(x, 1) * y,
}


@pytest.mark.parametrize("name", list(FUNCS))
def test_grad_and_value_match_torch_func(name):
    f = FUNCS[name]
    for argnums in (0, 1, (0, 1)):
        ours = ff.grad_and_value(lambda *a: f(fl, *a), argnums=argnums)(_t(fl, X), _t(fl, Y))
        ref = tf.grad_and_value(lambda *a: f(torch, *a), argnums=argnums)(_t(torch, X), _t(torch, Y))
        close(ours, ref)
    # results are detached unless a tensor outside the transform requires grad (then they stay differentiable)
    g, v = ff.grad_and_value(lambda *a: f(fl, *a))(_t(fl, X), _t(fl, Y))
    assert not g.requires_grad and not v.requires_grad
    y = _t(fl, Y).requires_grad_()
    g = ff.grad(lambda x: f(fl, x, y))(_t(fl, X))
    ry = _t(torch, Y).requires_grad_()
    rg = tf.grad(lambda x: f(torch, x, ry))(_t(torch, X))
    if rg.requires_grad:          # (flambeau also keeps g attached when f's graph merely reaches y: norm_exp)
        assert g.requires_grad
        close(fl.autograd.grad(g.sum(), y)[0], torch.autograd.grad(rg.sum(), ry)[0])


@pytest.mark.parametrize("name", list(VEC))
def test_vjp_jvp_jacrev_jacfwd_match_torch_func(name):
    f = VEC[name]
    ct = RNG.standard_normal(np.shape(f(np, X, Y))) if name != "softmax" else RNG.standard_normal((3, 4))
    tx, ty = RNG.standard_normal(X.shape), RNG.standard_normal(Y.shape)
    out, fn = ff.vjp(lambda *a: f(fl, *a), _t(fl, X), _t(fl, Y))
    rout, rfn = tf.vjp(lambda *a: f(torch, *a), _t(torch, X), _t(torch, Y))
    close(out, rout)
    close(fn(_t(fl, ct)), rfn(_t(torch, ct)))
    close(ff.jvp(lambda *a: f(fl, *a), (_t(fl, X), _t(fl, Y)), (_t(fl, tx), _t(fl, ty))),
          tf.jvp(lambda *a: f(torch, *a), (_t(torch, X), _t(torch, Y)), (_t(torch, tx), _t(torch, ty))))
    for argnums in (0, (0, 1)):
        close(ff.jacrev(lambda *a: f(fl, *a), argnums)(_t(fl, X), _t(fl, Y)),
              tf.jacrev(lambda *a: f(torch, *a), argnums)(_t(torch, X), _t(torch, Y)))
        close(ff.jacfwd(lambda *a: f(fl, *a), argnums)(_t(fl, X), _t(fl, Y)),
              tf.jacfwd(lambda *a: f(torch, *a), argnums)(_t(torch, X), _t(torch, Y)))
    close(ff.jacrev(lambda *a: f(fl, *a), chunk_size=5)(_t(fl, X), _t(fl, Y)),
          tf.jacrev(lambda *a: f(torch, *a), chunk_size=5)(_t(torch, X), _t(torch, Y)))
    close(ff.jacfwd(lambda *a: f(fl, *a), chunk_size=5)(_t(fl, X), _t(fl, Y)),
          tf.jacfwd(lambda *a: f(torch, *a))(_t(torch, X), _t(torch, Y)))


@pytest.mark.parametrize("name", list(FUNCS))
def test_hessian_matches_torch_func(name):
    f = FUNCS[name]
    close(ff.hessian(lambda *a: f(fl, *a))(_t(fl, X), _t(fl, Y)),
          tf.hessian(lambda *a: f(torch, *a))(_t(torch, X), _t(torch, Y)), rtol=1e-8, atol=1e-9)


def test_linearize_and_has_aux_and_pytrees():
    f = lambda m, x: m.sin(x) * x
    out, jfn = ff.linearize(lambda x: f(fl, x), _t(fl, X))
    rout, rjfn = tf.linearize(lambda x: f(torch, x), _t(torch, X))
    close(out, rout)
    for _ in range(2):                               # the retained graph serves several tangents
        t = RNG.standard_normal(X.shape)
        close(jfn(_t(fl, t)), rjfn(_t(torch, t)))
    g = lambda m, p: ((p["w"] * p["b"][0]).sum(), {"aux": p["w"] * 2})
    p = {"w": X, "b": [Y]}
    ours = ff.grad(lambda p: g(fl, p), has_aux=True)({"w": _t(fl, X), "b": [_t(fl, Y)]})
    ref = tf.grad(lambda p: g(torch, p), has_aux=True)({"w": _t(torch, X), "b": [_t(torch, Y)]})
    close(ours[0], ref[0])
    close(ours[1], ref[1])
    assert p
    o, fn, aux = ff.vjp(lambda x: (fl.sin(x), x.cos()), _t(fl, X), has_aux=True)
    ro, rfn, raux = tf.vjp(lambda x: (torch.sin(x), x.cos()), _t(torch, X), has_aux=True)
    close((o, aux, fn(fl.ones_like(o))), (ro, raux, rfn(torch.ones_like(ro))))


def test_compositions_match_torch_func():
    f = lambda m, x, y: (m.sin(x) * m.tanh(y)).sum()
    xs, ys = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 3))
    cases = [
        lambda F, m: F.vmap(F.grad(lambda x, y: f(m, x, y)))(_t(m, xs), _t(m, ys)),
        lambda F, m: F.grad(lambda x: F.vmap(lambda a, b: f(m, a, b))(x, _t(m, ys)).sum())(_t(m, xs)),
        lambda F, m: F.grad(F.grad(lambda x: f(m, x, x)))(_t(m, xs[0, 0])),
        lambda F, m: F.jacfwd(F.jacrev(lambda x: f(m, x, x)))(_t(m, xs[0])),
        lambda F, m: F.jacrev(F.jacrev(lambda x: f(m, x, x)))(_t(m, xs[0])),
        lambda F, m: F.vmap(F.jacrev(lambda x: m.sin(x) * x.sum()))(_t(m, xs)),
        lambda F, m: F.vmap(F.hessian(lambda x: f(m, x, x)))(_t(m, xs)),
        lambda F, m: F.vmap(F.vmap(lambda a, b: a * b + m.sin(a)), in_dims=(0, None))(_t(m, xs), _t(m, ys[0])),
        lambda F, m: F.vmap(F.grad(lambda x, y: f(m, x, y)), in_dims=(None, 0))(_t(m, xs[0]), _t(m, ys)),
        lambda F, m: F.grad(lambda x: F.grad(lambda y: (x * y).sum() * x.sum())(x).pow(2).sum())(_t(m, xs[0])),
    ]
    for k, case in enumerate(cases):
        close(case(ff, fl), case(tf, torch), rtol=1e-8, atol=1e-9)


def test_vmap_in_dims_out_dims_nested_and_chunks():
    x, y = RNG.standard_normal((3, 5)), RNG.standard_normal((5, 3))
    fn = lambda m: (lambda d, s: (d["a"] * s[0], {"b": d["a"].sum(0)}))
    for F, m in ((ff, fl), (tf, torch)):
        pass
    ours = ff.vmap(fn(fl), in_dims=({"a": 1}, (0,)), out_dims=(1, {"b": 0}))({"a": _t(fl, x)}, (_t(fl, y),))
    ref = tf.vmap(fn(torch), in_dims=({"a": 1}, (0,)), out_dims=(1, {"b": 0}))({"a": _t(torch, x)}, (_t(torch, y),))
    close(ours, ref)
    for chunk in (1, 2, 5):
        close(ff.vmap(lambda a: a.sin() @ a, chunk_size=chunk)(_t(fl, np.ones((5, 2, 2)))),
              tf.vmap(lambda a: a.sin() @ a)(_t(torch, np.ones((5, 2, 2)))))
    close(ff.vmap(lambda a: _t(fl, Y))(_t(fl, x)), tf.vmap(lambda a: _t(torch, Y))(_t(torch, x)))
    close(ff.vmap(lambda a, k: a * k, in_dims=(0, None))(_t(fl, x), 3.0), _t(fl, x) * 3.0)


def _raises(fn_ours, fn_ref):
    with pytest.raises(Exception) as ref:
        fn_ref()
    with pytest.raises(type(ref.value)) as ours:
        fn_ours()
    return str(ours.value), str(ref.value)


def test_errors_as_pytorch():
    x = RNG.standard_normal((3, 4))
    for make in (
        lambda F, m: F.vmap(lambda a: a.item())(_t(m, x)),
        lambda F, m: F.vmap(lambda a: 1 if a.sum() > 0 else 0)(_t(m, x)),
        lambda F, m: F.vmap(lambda a: m.randn(4) + a)(_t(m, x)),
        lambda F, m: F.vmap(lambda a: a, in_dims=2)(_t(m, x)),
        lambda F, m: F.vmap(lambda a, b: a + b)(_t(m, x), _t(m, np.ones((4, 3)))),
        lambda F, m: F.vmap(lambda a: 1)(_t(m, x)),
        lambda F, m: F.vmap(lambda a: a, randomness="x")(_t(m, x)),
        lambda F, m: F.vmap(lambda a: a)(1),
        lambda F, m: F.grad(lambda a: a * 2)(_t(m, x)),
        lambda F, m: F.grad(lambda a: a.sum(), argnums=3)(_t(m, x)),
        lambda F, m: F.grad(lambda a: a.sum(), has_aux=True)(_t(m, x)),
        lambda F, m: F.jvp(lambda a: a, (_t(m, x),), (_t(m, np.ones(3)),)),
        lambda F, m: F.jacrev(lambda a: a, chunk_size=0),
    ):
        ours, ref = _raises(lambda: make(ff, fl), lambda: make(tf, torch))
        assert ours.split(":")[0] == ref.split(":")[0] or ours[:30] == ref[:30], (ours, ref)


def test_inplace_into_a_captured_tensor_errors_and_batched_inplace_works():
    y = fl.zeros(4)
    with pytest.raises(RuntimeError, match="vmapped over but `self` not being vmapped"):
        ff.vmap(lambda a: y.add_(a))(fl.ones(3, 4))
    xs = fl.tensor(X)
    out = ff.vmap(lambda a: a.clone().mul_(2).add_(fl.tensor(Y)))(xs)
    close(out, xs * 2 + fl.tensor(Y))
    z = fl.tensor(X).clone()
    ff.vmap(lambda a: a.mul_(3))(z)                      # writes through to the mapped input
    close(z, fl.tensor(X) * 3)


def test_randomness_flags():
    x = fl.zeros(4, 3)
    diff = ff.vmap(lambda a: a + fl.rand(3), randomness="different")(x)
    same = ff.vmap(lambda a: a + fl.rand(3), randomness="same")(x)
    assert not fl.allclose(diff[0], diff[1])
    assert fl.equal(same[0], same[1]) and fl.equal(same[0], same[3])
    like = ff.vmap(lambda a: fl.rand_like(a), randomness="same")(x)
    assert fl.equal(like[0], like[2])
    x = fl.ones(6, 40)
    drop = ff.vmap(lambda a: fl.nn.functional.dropout(a, 0.5), randomness="different")(x)
    assert drop.shape == (6, 40) and not fl.equal(drop[0], drop[1])
    kept = (drop != 0).double().mean().item()
    assert 0.3 < kept < 0.7 and set(drop.unique().tolist()) <= {0.0, 2.0}
    drop = ff.vmap(lambda a: fl.nn.functional.dropout(a, 0.5), randomness="same")(x)    # PyTorch allows it
    assert all(fl.equal(drop[0], drop[k]) for k in range(6)) and not fl.equal(drop[0], fl.ones(40) * 2)
    # PyTorch refuses 'same' for normal(batched mean); flambeau runs its decomposition: one draw shared
    with pytest.raises(RuntimeError, match="same randomness with a batched tensor input"):
        tf.vmap(lambda a: torch.normal(a, 1.0), randomness="same")(torch.ones(3, 4))
    means = fl.arange(3.0).unsqueeze(1).expand(3, 4)
    noise = ff.vmap(lambda a: fl.normal(a, 1.0), randomness="same")(means) - means
    assert fl.allclose(noise[0], noise[1]) and fl.allclose(noise[0], noise[2])


class _CNN:
    @staticmethod
    def build(m):
        m.manual_seed(0)
        return m.nn.Sequential(m.nn.Conv2d(1, 4, 3), m.nn.ReLU(), m.nn.MaxPool2d(2), m.nn.Flatten(),
                               m.nn.Linear(4 * 3 * 3, 10))


def _copy_weights(src, dst):
    dst.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in src.state_dict().items()})


def test_per_sample_gradients_of_a_cnn_match_torch_func():
    ours, ref = _CNN.build(fl), _CNN.build(torch)
    _copy_weights(ours, ref)
    xs = RNG.standard_normal((8, 1, 8, 8)).astype(np.float32)
    ts = RNG.integers(0, 10, 8)

    def per_sample(F, m, model):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, x, t):
            out = F.functional_call(model, p, (x.unsqueeze(0),))
            return m.nn.functional.cross_entropy(out, t.unsqueeze(0))
        return F.vmap(F.grad(loss), in_dims=(None, 0, 0))(params, m.tensor(xs), m.tensor(ts))
    g_ours, g_ref = per_sample(ff, fl, ours), per_sample(tf, torch, ref)
    close(g_ours, g_ref, rtol=1e-4, atol=1e-5)
    # and the loop over the samples agrees
    for i in (0, 5):
        ours.zero_grad()
        fl.nn.functional.cross_entropy(ours(fl.tensor(xs[i:i + 1])), fl.tensor(ts[i:i + 1])).backward()
        for k, p in ours.named_parameters():
            close(g_ours[k][i], p.grad, rtol=1e-4, atol=1e-5)


def test_vmap_allocates_from_the_cache_allocator_and_puts_numpy_policy_back(monkeypatch):
    """An outermost vmap call sets the caching allocator for its duration (its arrays come from it, so a
    second call reuses the first call's freed blocks: both still match torch.func); a nested vmap keeps
    it; afterwards, and with config.vmap_cache_allocator off, NumPy's own policy is back."""
    from flambeau._backends import cpu_allocator
    from flambeau._functorch import config
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:         # NumPy 1.x
        from numpy.core.multiarray import get_handler_name
    if cpu_allocator._load() is None:
        pytest.skip("no C++ compiler or NumPy without allocation handlers")
    seen = []

    def allocator(t):
        a = t.numpy()
        while a.base is not None:       # a view's memory belongs to its base
            a = a.base
        return get_handler_name(a)

    def inner(x):
        seen.append(("inner", get_handler_name()))
        return x.sin()

    def outer(x):
        seen.append(("outer", get_handler_name()))
        y = ff.vmap(inner)(x)
        seen.append(("after inner", get_handler_name()))
        return y * 2
    ff.vmap(outer)(fl.ones(2, 3, 4))
    assert seen == [("outer", "flambeau_cpu_cache"), ("inner", "flambeau_cpu_cache"),
                    ("after inner", "flambeau_cpu_cache")]
    assert get_handler_name() == "default_allocator"
    ours, ref = _CNN.build(fl), _CNN.build(torch)
    _copy_weights(ours, ref)
    xs = RNG.standard_normal((32, 1, 8, 8)).astype(np.float32)
    ts = RNG.integers(0, 10, 32)

    def per_sample(F, m, model):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, x, t):
            return m.nn.functional.cross_entropy(F.functional_call(model, p, (x.unsqueeze(0),)), t.unsqueeze(0))
        return F.vmap(F.grad(loss), in_dims=(None, 0, 0))(params, m.tensor(xs), m.tensor(ts))
    g_ref = per_sample(tf, torch, ref)
    for _ in range(2):
        g_ours = per_sample(ff, fl, ours)
        assert {allocator(g) for g in g_ours.values()} == {"flambeau_cpu_cache"}
        close(g_ours, g_ref, rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(config, "vmap_cache_allocator", False)
    g_ours = per_sample(ff, fl, ours)
    assert {allocator(g) for g in g_ours.values()} == {"default_allocator"}


def test_model_ensemble_with_stack_module_state_matches_torch():
    models = [_CNN.build(fl) for _ in range(3)]
    for k, mod in enumerate(models):
        for p in mod.parameters():
            p.data.mul_(1 + 0.1 * k)
    refs = [_CNN.build(torch) for _ in range(3)]
    for a, b in zip(models, refs):
        _copy_weights(a, b)
    xs = RNG.standard_normal((2, 1, 8, 8)).astype(np.float32)

    def run(F, m, ms):
        params, buffers = F.stack_module_state(ms)
        base = ms[0]
        return F.vmap(lambda p, b, x: F.functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))(
            params, buffers, m.tensor(xs))
    close(run(ff, fl, models), run(tf, torch, refs), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="at least one model"):
        ff.stack_module_state([])


def test_functional_call_keys_and_ties():
    lin = fl.nn.Linear(3, 2)
    w = fl.ones(2, 3)
    out = ff.functional_call(lin, {"weight": w}, (fl.ones(1, 3),))
    close(out, fl.ones(1, 3) @ w.T + lin.bias)
    assert lin.weight is not w and isinstance(lin.weight, fl.nn.Parameter)     # restored
    with pytest.raises(RuntimeError, match="Missing key"):
        ff.functional_call(lin, {"weight": w}, (fl.ones(1, 3),), strict=True)
    with pytest.raises(ValueError, match="multiple dictionaries"):
        ff.functional_call(lin, ({"weight": w}, {"weight": w}), (fl.ones(1, 3),))


def test_transforms_are_captured_under_compile_and_match_eager():
    """A transform of a function without free variables is one node of the compiled graph (no break;
    tests/test_compile_func.py has the cases vs torch.func)."""
    from flambeau._dynamo.testing import CompileCounter
    from flambeau._dynamo.utils import counters
    counters.clear()
    cnt = CompileCounter()

    def f(x):
        y = x.sin() + 1
        g = ff.vmap(ff.grad(lambda a: (a * a).sum()))(y)
        return g.cos() * 2

    x = fl.tensor(X)
    out = fl.compile(f, backend=cnt)(x)
    close(out, f(x))
    assert cnt.frame_count == 1
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("name,kw", [("sum", {}), ("mean", {"dim": 0, "keepdim": True}), ("amax", {"dim": -1}),
                                     ("argmax", {"dim": 0}), ("softmax", {"dim": 0}), ("logsumexp", {"dim": [0]}),
                                     ("max", {"dim": 0})])
def test_reductions_of_scalar_examples_run_their_rule_not_the_loop(name, kw):
    """vmap of a reduction whose examples are 0-d (a per-example loss's `.mean()`): the op's batching
    rule over a new one-element dimension, no loop fallback (its performance warning is an error
    here); values, shapes and a bad dim's IndexError as torch.func."""
    x = np.random.default_rng(3).standard_normal(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = ff.vmap(lambda v: getattr(fl, name)(v, **kw))(_t(fl, x))
    want = tf.vmap(lambda v: getattr(torch, name)(v, **kw))(_t(torch, x))
    if isinstance(want, tuple):
        assert type(got).__name__ == type(want).__name__
        got, want = got[0], want[0]
    close(got, want)
    with pytest.raises(IndexError, match="Dimension out of range"):
        ff.vmap(lambda v: getattr(fl, name)(v, 1))(_t(fl, x))


@pytest.mark.parametrize("per_example", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_vmap_of_cross_entropy_with_ignored_targets_matches_torch_func(per_example, reduction):
    """Per-example cross-entropy (a minibatch of `per_example` rows each, some targets ignored) and its
    gradient under vmap vs torch.func in float64; with one target an example the rule sums nothing."""
    from tests.conftest import op_names_mode
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, per_example, 4))
    t = rng.integers(0, 4, (5, per_example))
    if per_example > 1 or reduction != "mean":        # (an example with every target ignored: see below)
        t[1, 0] = t[3, -1] = -100
    if reduction != "mean":
        t[4] = -100

    def run(F, m):
        def f(xi, ti):
            return m.nn.functional.cross_entropy(xi, ti, reduction=reduction).sum()
        return F.vmap(F.grad_and_value(f))(m.tensor(x), m.tensor(t))
    with op_names_mode() as mode:
        got = run(ff, fl)
    want = run(tf, torch)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.detach().numpy(), rtol=1e-12, atol=1e-14, equal_nan=True)
    if per_example == 1 and reduction != "none":
        assert "sum" not in [n.split(".")[0] for n in mode.names[:mode.names.index("cross_entropy_loss") + 4]]


@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 2, 4), (3, 4)], ids=["one-target", "two-targets", "unbatched-2d"])
def test_mean_cross_entropy_of_an_all_ignored_example_has_zero_gradient_under_vmap(shape):
    """An example whose targets are all ignored: its mean loss is nan (0/0) and its gradient 0, as
    torch.func's (a plain division by the count gave a nan gradient)."""
    x = np.random.default_rng(9).standard_normal(shape)
    t = {1: np.array([[1], [-100], [2]]), 2: np.array([[1, 3], [-100, -100], [2, -100]])}[shape[1]] \
        if len(shape) == 3 else np.array([1, -100, 2])

    def run(F, m):
        return F.vmap(F.grad(lambda xi, ti: m.nn.functional.cross_entropy(xi, ti)))(m.tensor(x), m.tensor(t))
    np.testing.assert_allclose(run(ff, fl).numpy(), run(tf, torch).numpy(), rtol=1e-12, atol=1e-14)
