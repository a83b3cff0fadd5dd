"""compile + autograd.Function: dynamo traces the user's forward and backward into one
`autograd_function_apply` node (two subgraphs), AOT autograd compiles both; checked against eager
and against torch.compile on the same Functions (values, gradients, graph and op counts), with a
Function whose backward cannot be traced falling back with its reason."""
import logging

import numpy as np
import pytest
import torch
import torch._dynamo.testing  # the reference CompileCounter (not loaded by `import torch`)

import flambeau
from flambeau._counters import counters, FALLBACKS
from flambeau._dynamo.testing import CompileCounter
from flambeau._functorch.aot_autograd import aot_module_simplified
from tests.conftest import keep_log


def _functions(T):
    """The same Functions written against T (flambeau or torch)."""
    class ScaledSin(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.save_for_backward(x)
            ctx.k = k
            return x.sin() * k

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() * ctx.k, None

    class ExpOnce(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)            # an output saved for backward
            return y

        @staticmethod
        @T.autograd.function.once_differentiable
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * y

    class SplitSign(T.autograd.Function):
        """Two outputs: the second is marked non-differentiable; gradients are not materialised."""
        @staticmethod
        def forward(ctx, x, w):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x, w)
            sign = (x > 0).to(x.dtype)
            ctx.mark_non_differentiable(sign)
            return x * w, sign

        @staticmethod
        def backward(ctx, g, g_sign):
            x, w = ctx.saved_tensors
            if g is None:
                return None, None
            gx = g * w if ctx.needs_input_grad[0] else None
            gw = (g * x).sum(0) if ctx.needs_input_grad[1] else None
            return gx, gw

    class SetupStyle(T.autograd.Function):
        """forward without ctx, plus setup_context."""
        @staticmethod
        def forward(x, p):
            return x ** p

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, p = inputs
            ctx.save_for_backward(x)
            ctx.p = p

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * ctx.p * x ** (ctx.p - 1), None
    return ScaledSin, ExpOnce, SplitSign, SetupStyle


def _programs(T):
    ScaledSin, ExpOnce, SplitSign, SetupStyle = _functions(T)
    return {
        "scaled_sin": lambda x, w: (ScaledSin.apply(x * 2, 3.0).exp() * w).sum(),
        "once": lambda x, w: (ExpOnce.apply(x.tanh()) * w).sum(),
        "split_sign": lambda x, w: (lambda y, s: (y * y).sum() + s.sum())(*SplitSign.apply(x, w)),
        "setup_context": lambda x, w: SetupStyle.apply(x.abs() + 1, 3.0).mean() * w.sum(),
    }


X = np.array([[0.5, -1.0, 2.0], [0.3, 0.2, -3.0]], dtype=np.float32)
W = np.array([1.5, -0.5, 2.0], dtype=np.float32)


class Recording:
    """A backend through AOT autograd that keeps the dynamo graph and the compiled forward/backward graphs."""

    def __init__(self):
        self.frame_count, self.op_count, self.dynamo, self.fw, self.bw = 0, 0, [], [], []

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        self.dynamo.append(gm)

        def keep(into):
            def compiler(g, _inputs):
                into.append(g)
                return g.forward
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep(self.fw), bw_compiler=keep(self.bw))


def _run(T, name, compile_with=None):
    fn = _programs(T)[name]
    if compile_with is not None:
        fn = T.compile(fn, backend=compile_with)
    x, w = T.tensor(X, requires_grad=True), T.tensor(W, requires_grad=True)
    out = fn(x, w)
    out.backward()
    return out.detach().numpy(), x.grad.numpy(), w.grad.numpy()


def _targets(gm) -> list:
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name", ["scaled_sin", "once", "split_sign", "setup_context"])
def test_compiled_gradients_match_eager_and_pytorch(name):
    flambeau._dynamo.reset()
    eager = _run(flambeau, name)
    ref = _run(torch, name, compile_with="aot_eager")
    for backend in ("eager", "aot_eager", "inductor"):
        got = _run(flambeau, name, compile_with=backend)
        for a, b, c in zip(got, eager, ref):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["scaled_sin", "once", "split_sign", "setup_context"])
def test_one_graph_with_forward_and_backward_traced(name):
    flambeau._dynamo.reset()
    before = sum(counters[FALLBACKS].values())
    rec = Recording()
    _run(flambeau, name, compile_with=rec)
    assert rec.frame_count == 1
    gm = rec.dynamo[0]
    assert _targets(gm).count("autograd_function_apply") == 1
    assert "bwd_body_0" in dict(gm.named_children()) and "fwd_body_0" in dict(gm.named_children())
    assert len(rec.fw) == 1 and len(rec.bw) == 1                 # AOT autograd compiled both
    assert sum(counters[FALLBACKS].values()) == before
    ref = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    _run(torch, name, compile_with=ref)
    assert (rec.frame_count, rec.op_count) == (ref.frame_count, ref.op_count)


def test_user_backward_is_in_the_compiled_backward_graph():
    """ScaledSin's backward computes cos: it is in the dynamo graph's bwd_body_0 and in the backward
    graph AOT autograd compiled; its forward's sin is in the compiled forward graph."""
    flambeau._dynamo.reset()
    rec = Recording()
    _run(flambeau, "scaled_sin", compile_with=rec)
    assert "cos" in _targets(dict(rec.dynamo[0].named_children())["bwd_body_0"])
    assert "sin" in _targets(rec.fw[0]) and "cos" in _targets(rec.bw[0])
    assert "apply" not in " ".join(_targets(rec.fw[0]) + _targets(rec.bw[0]))


def test_dynamic_shapes_compile_once():
    flambeau._dynamo.reset()
    rec = Recording()
    fn = flambeau.compile(_programs(flambeau)["scaled_sin"], backend=rec, dynamic=True)
    for n in (3, 5, 8):
        x = flambeau.randn(n, requires_grad=True)
        fn(x, flambeau.ones(n)).backward()
        np.testing.assert_allclose(x.grad.numpy(), (np.exp(np.sin(2 * x.detach().numpy()) * 3) * np.cos(
            2 * x.detach().numpy()) * 6), rtol=1e-5)
    assert rec.frame_count == 1


def _untraceable(T):
    class HostBackward(T.autograd.Function):
        """A backward that leaves the tensor world (NumPy on the gradient): not traceable."""
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return T.tensor(np.asarray(g.numpy()) * 2) * x
    return lambda x, w: HostBackward.apply(x).sum() * w.sum()


def test_untraceable_backward_falls_back_with_a_logged_reason(monkeypatch):
    flambeau._dynamo.reset()
    records, handler = keep_log("flambeau.fallbacks")
    monkeypatch.setenv("FLAMBEAU_LOGS", "fallbacks")
    try:
        before = counters[FALLBACKS].copy()
        cnt = CompileCounter()
        fn = flambeau.compile(_untraceable(flambeau), backend=cnt)
        x, w = flambeau.tensor(X, requires_grad=True), flambeau.tensor(W, requires_grad=True)
        fn(x, w).backward()
    finally:
        logging.getLogger("flambeau.fallbacks").removeHandler(handler)
    new = [k for k in counters[FALLBACKS] if counters[FALLBACKS][k] > before.get(k, 0)]
    assert len(new) == 1 and new[0].startswith("HostBackward.apply: autograd.Function not traced") and "backward" in new[0]
    assert any(m.startswith("HostBackward.apply runs eagerly") for m in records), records
    assert cnt.frame_count == 1                    # still one graph, the Function an opaque call in it
    tx, tw = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    _untraceable(torch)(tx, tw).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


def test_non_differentiable_output_and_needs_input_grad_as_pytorch():
    def run(T, compiled):
        _, _, SplitSign, _ = _functions(T)
        fn = lambda x, w: SplitSign.apply(x, w)       # noqa: E731
        if compiled:
            fn = T.compile(fn, backend="aot_eager")
        x, w = T.tensor(X, requires_grad=True), T.tensor(W)      # w needs no gradient
        y, s = fn(x, w)
        y.sum().backward()
        return s.requires_grad, y.requires_grad, x.grad.numpy(), w.grad
    ours, ref = run(flambeau, True), run(torch, True)
    assert ours[:2] == ref[:2] == (False, True)
    np.testing.assert_allclose(ours[2], ref[2])
    assert ours[3] is None and ref[3] is None


def _gradient_probes(T):
    class NoMaterialize(T.autograd.Function):
        """set_materialize_grads(False): a backward that tells an absent gradient (None) from a zero one."""
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            (x,) = ctx.saved_tensors
            r = T.zeros_like(x)
            r = r + (1000.0 if g2 is None else g2 * 3)
            r = r + (5000.0 if g1 is None else g1 * 2)
            return r

    class NeedsGrad(T.autograd.Function):
        """A backward that computes only the gradients `ctx.needs_input_grad` asks for, and says which."""
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            both = ctx.needs_input_grad[0] and ctx.needs_input_grad[1]     # shows in the values
            gx = g * w + (100.0 if both else 7.0) if ctx.needs_input_grad[0] else None
            gw = g * x + (200.0 if both else 9.0) if ctx.needs_input_grad[1] else None
            return gx, gw

    class Once(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.exp()

        @staticmethod
        @T.autograd.function.once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.exp()
    return NoMaterialize, NeedsGrad, Once


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("used", ["first", "second", "both"])
def test_absent_gradients_reach_the_backward_as_none_without_materialize(backend, used):
    """Eager semantics of set_materialize_grads(False): an output that gets no gradient gives the
    backward None, not zeros (torch.compile itself passes zeros here, so the reference is PyTorch eager)."""
    def run(T, compile_with=None):
        NoMaterialize, _, _ = _gradient_probes(T)

        def fn(x):
            a, b = NoMaterialize.apply(x)
            return {"first": a.sum(), "second": (b * b).sum(), "both": a.sum() + b.sum()}[used]
        if compile_with is not None:
            fn = T.compile(fn, backend=compile_with)
        x = T.tensor(X, requires_grad=True)
        fn(x).backward()
        return x.grad.numpy()
    flambeau._dynamo.reset()
    np.testing.assert_allclose(run(flambeau, backend), run(torch), rtol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_needs_input_grad_under_compile_as_pytorch(backend, needs):
    def run(T, compile_with):
        _, NeedsGrad, _ = _gradient_probes(T)
        fn = T.compile(lambda x, w: NeedsGrad.apply(x, w).sum(), backend=compile_with)
        x, w = T.tensor(X, requires_grad=needs[0]), T.tensor(W, requires_grad=needs[1])
        fn(x, w).backward()
        return [None if t.grad is None else t.grad.numpy() for t in (x, w)]
    flambeau._dynamo.reset()
    torch._dynamo.reset()
    got, want = run(flambeau, backend), run(torch, "aot_eager" if backend != "eager" else "eager")
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if r is not None:
            np.testing.assert_allclose(g, r, rtol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_once_differentiable_under_compile_as_pytorch(backend):
    """First-order gradients as PyTorch; a second differentiation through the once_differentiable
    backward raises RuntimeError in both (the backward ran without grad mode). Through AOT autograd
    the first gradient does not require grad in flambeau (PyTorch: it does, and its backward raises
    "does not currently support double backward"), so requires_grad is compared on the eager backend."""
    def run(T, compile_with):
        _, _, Once = _gradient_probes(T)
        fn = T.compile(lambda x: Once.apply(x * 1.5).sum(), backend=compile_with)
        x = T.tensor(X, requires_grad=True)
        (g,) = T.autograd.grad(fn(x), x, create_graph=True)
        with pytest.raises(RuntimeError):
            g.sum().backward()
        return g.detach().numpy(), g.requires_grad
    flambeau._dynamo.reset()
    torch._dynamo.reset()
    got, want = run(flambeau, backend), run(torch, backend)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    if backend == "eager":
        assert got[1] == want[1]
