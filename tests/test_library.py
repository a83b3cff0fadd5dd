"""flambeau.library (custom operators) against torch.library: schemas inferred from type hints and
their errors, eager results and gradients, fake functions, mutation, the low-level Library API,
opcheck, and compilation (one node in the captured graph, the registered backward in AOT autograd,
dynamic shapes driven by the fake function)."""

import itertools
import typing

import numpy as np
import pytest
import torch

import flambeau
import flambeau.library as FL
from flambeau._dynamo.testing import CompileCounter

_ids = itertools.count()


def _ns() -> str:
    return f"fltest{next(_ids)}"


def both(fn_builder):
    """(flambeau result, torch result) of `fn_builder(lib_module, torch_like, namespace)`."""
    return fn_builder(flambeau, _ns()), fn_builder(torch, _ns())


def _err(fn):
    try:
        fn()
    except Exception as e:           # the error a call raises, to compare type and text with PyTorch's
        return type(e), str(e)
    return None


# ---- schema inference ------------------------------------------------------------------------------

def _signatures(T):
    """Functions annotated with the library `T` (flambeau or torch), and their mutates_args."""
    def f1(x: T.Tensor, n: int, *, scale: float = 1.0) -> T.Tensor: ...
    def f2(xs: typing.List[T.Tensor], y: typing.Optional[T.Tensor], flag: bool = False) -> typing.Tuple[T.Tensor, T.Tensor]: ...
    def f3(x: T.Tensor, out: T.Tensor, s: str = "a") -> None: ...
    def f4(x: T.Tensor, dims: typing.Sequence[int], d: typing.Optional[T.dtype] = None) -> typing.List[T.Tensor]: ...
    def f5(x: T.Tensor, k: typing.Union[int, float, bool] = 2) -> float: ...
    return [(f1, ()), (f2, ()), (f3, ("out",)), (f4, ()), (f5, ()), (f3, "unknown")]


def test_infer_schema_matches_pytorch():
    for (ours, mut), (ref, _) in zip(_signatures(flambeau), _signatures(torch)):
        assert FL.infer_schema(ours, mutates_args=mut, op_name="op") == \
            torch.library.infer_schema(ref, mutates_args=mut, op_name="op")


def _bad_signatures(T):
    def no_hint(x): ...
    def tuple_arg(x: typing.Tuple[T.Tensor, T.Tensor]) -> T.Tensor: ...
    def varargs(*xs: T.Tensor) -> T.Tensor: ...
    def no_return(x: T.Tensor): ...
    def bad_return(x: T.Tensor) -> dict: ...
    def bad_type(x: dict) -> T.Tensor: ...
    def mut_int(x: int) -> None: ...
    return [(no_hint, ()), (tuple_arg, ()), (varargs, ()), (no_return, ()), (bad_return, ()), (bad_type, ()),
            (mut_int, ("x",)), (no_return, ("y",)), (no_return, "everything")]


def test_infer_schema_errors_match_pytorch():
    for (ours, mut), (ref, _) in zip(_bad_signatures(flambeau), _bad_signatures(torch)):
        e_ours = _err(lambda: FL.infer_schema(ours, mutates_args=mut))
        e_ref = _err(lambda: torch.library.infer_schema(ref, mutates_args=mut))
        assert e_ours is not None and e_ours[0] is e_ref[0], (ours.__name__, e_ours, e_ref)
        # same sentence up to the type names (flambeau.Tensor vs torch.Tensor)
        assert e_ours[1].split(" Got func")[0].split("The valid types")[0].replace(
            "flambeau._tensor.", "torch.").replace("flambeau", "torch") == \
            e_ref[1].split(" Got func")[0].split("The valid types")[0], (e_ours, e_ref)


def test_custom_op_requires_mutates_args_and_a_namespace():
    for lib, T in ((FL, flambeau), (torch.library, torch)):
        def f(x: T.Tensor) -> T.Tensor:
            return x
        with pytest.raises(TypeError, match="mutates_args"):
            lib.custom_op("ns::f", f)
        with pytest.raises(ValueError):
            lib.custom_op("no_namespace", f, mutates_args=())


# ---- eager -------------------------------------------------------------------------------------------

def _scaled_sin(T, ns, with_autograd=True, backward_scale=1.0):
    """ns::scaled_sin(x, k) = sin(x) * k with a fake function and (optionally) a registered backward,
    deliberately `backward_scale` times the true one (so a test sees which backward ran)."""
    @T.library.custom_op(f"{ns}::scaled_sin", mutates_args=())
    def scaled_sin(x: T.Tensor, k: float) -> T.Tensor:
        return T.from_numpy(np.sin(x.detach().numpy()) * k)   # opaque to tracing: a NumPy kernel

    @scaled_sin.register_fake
    def _fake(x, k):
        return T.empty_like(x)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.k = inputs[1]

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() * ctx.k * backward_scale, None
    if with_autograd:
        scaled_sin.register_autograd(backward, setup_context=setup_context)
    return scaled_sin


X = np.array([[0.5, -1.0, 2.0], [0.1, 0.2, -3.0]])


def test_eager_result_gradient_and_packet_as_pytorch():
    def run(T, ns):
        op = _scaled_sin(T, ns)
        x = T.tensor(X, requires_grad=True)
        packet = getattr(getattr(T.ops, ns), "scaled_sin")
        y = packet(x, 3.0)
        y.sum().backward()
        return (y.detach().numpy(), x.grad.numpy(), repr(packet), repr(packet.default).replace(ns, "NS"),
                str(op._opoverload._schema).replace(ns, "NS"), repr(op).replace(ns, "NS"), packet.default is op._opoverload)
    ours, ref = both(run)
    np.testing.assert_allclose(ours[0], ref[0])
    np.testing.assert_allclose(ours[1], ref[1])
    assert ours[2].replace(ns_marker(ours[2]), "NS") == ref[2].replace(ns_marker(ref[2]), "NS")
    assert ours[3:] == ref[3:]


def ns_marker(text: str) -> str:
    return text.split("'")[1].split(".")[0]


def test_missing_fake_missing_autograd_and_aliasing_errors_as_pytorch():
    def run(T, ns):
        @T.library.custom_op(f"{ns}::plain", mutates_args=())
        def plain(x: T.Tensor) -> T.Tensor:
            return x.clone()

        @T.library.custom_op(f"{ns}::alias", mutates_args=())
        def alias(x: T.Tensor) -> T.Tensor:
            return x
        x = T.ones(2, requires_grad=True)
        no_fake = _err(lambda: plain(T.ones(2, device="meta")))
        y = plain(x)
        no_backward = _err(lambda: y.sum().backward())
        aliased = _err(lambda: alias(T.ones(2)))
        return [(e[0], e[1].replace(ns, "NS").split("(with implementation")[0]) for e in (no_fake, no_backward, aliased)]
    ours, ref = both(run)
    assert ours == ref


def test_kernel_per_device_and_meta():
    ns = _ns()
    op = _scaled_sin(flambeau, ns)
    op.register_kernel("cpu", lambda x, k: x * 0 + k)
    assert op(flambeau.zeros(2), 5.0).tolist() == [5.0, 5.0]
    m = op(flambeau.empty(4, 3, device="meta"), 1.0)
    assert m.device.type == "meta" and tuple(m.shape) == (4, 3)


def test_mutating_op_as_pytorch():
    def run(T, ns):
        @T.library.custom_op(f"{ns}::add_into", mutates_args=("out",))
        def add_into(x: T.Tensor, out: T.Tensor) -> None:
            out.add_(x)
        out = T.zeros(2, 3)
        v = _version(out)
        add_into(T.tensor(X), out)
        return out.numpy(), str(add_into._opoverload._schema).replace(ns, "NS"), _version(out) > v
    ours, ref = both(run)
    np.testing.assert_allclose(ours[0], ref[0])
    assert ours[1:] == ref[1:]


def _version(t) -> int:
    return t._version[0] if isinstance(t._version, list) else t._version


def test_register_autograd_refuses_a_mutating_op_as_pytorch():
    def run(T, ns):
        @T.library.custom_op(f"{ns}::add_into", mutates_args=("out",))
        def add_into(x: T.Tensor, out: T.Tensor) -> None:
            out.add_(x)
        e = _err(lambda: add_into.register_autograd(lambda ctx, g: g))
        return e[0], e[1].replace(ns, "NS").split(" with schema")[0]
    ours, ref = both(run)
    assert ours == ref


# ---- low-level API --------------------------------------------------------------------------------------

def test_library_define_impl_and_aliases_as_pytorch():
    def run(T, ns):
        L = T.library
        lib = L.Library(ns, "DEF")
        name = lib.define("triple(Tensor x) -> Tensor")
        lib.impl("triple", lambda x: x * 3, "CPU")
        lib.impl("triple", lambda x: T.empty_like(x), "Meta")
        errs = [_err(lambda: L.Library(ns, "DEF"))[0], _err(lambda: L.Library(ns, "BAD"))]
        impl_lib = L.Library(ns, "IMPL")
        errs.append(_err(lambda: impl_lib.define("other(Tensor x) -> Tensor"))[1].split("(Error")[0].strip())
        L.define(f"{ns}2::scale", "(Tensor x, int n) -> Tensor")
        L.impl(f"{ns}2::scale", "cpu", lambda x, n: x * n)
        with pytest.warns(FutureWarning):
            L.impl_abstract(f"{ns}2::scale", lambda x, n: T.empty_like(x))
        frag = L.Library(ns, "FRAGMENT")
        frag.define("neg2(Tensor x) -> Tensor")
        frag.impl("neg2", lambda x: -2 * x, "CompositeExplicitAutograd")
        nsop = getattr(T.ops, ns)
        return (name, nsop.triple(T.tensor(X)).numpy(), tuple(nsop.triple(T.ones(2, 2, device="meta")).shape),
                getattr(T.ops, ns + "2").scale(T.tensor(X), 4).numpy(), nsop.neg2(T.tensor(X)).numpy(),
                tuple(getattr(T.ops, ns + "2").scale(T.ones(5, device="meta"), 2).shape), errs)
    ours, ref = both(run)
    assert ours[0] == ref[0] and ours[2] == ref[2] and ours[5] == ref[5]
    for a, b in zip(ours[1:5:], ref[1:5]):
        if isinstance(a, np.ndarray):
            np.testing.assert_allclose(a, b)
    assert ours[6] == ref[6]


# ---- opcheck --------------------------------------------------------------------------------------------

def _opcheck_cases(T, ns):
    good = _scaled_sin(T, ns)

    @T.library.custom_op(f"{ns}::bad_fake", mutates_args=())
    def bad_fake(x: T.Tensor) -> T.Tensor:
        return x * 2
    bad_fake.register_fake(lambda x: x.new_empty(x.shape[0]))
    bad_fake.register_autograd(lambda ctx, g: g * 2)

    @T.library.custom_op(f"{ns}::sneaky", mutates_args=())
    def sneaky(x: T.Tensor) -> T.Tensor:
        x.add_(1)                       # mutates an input its schema does not mark
        return x * 2
    sneaky.register_fake(lambda x: T.empty_like(x))

    lib = T.library.Library(ns, "FRAGMENT")       # a kernel but no autograd registration
    lib.define("no_grad_formula(Tensor x) -> Tensor")
    lib.impl("no_grad_formula", lambda x: x * 2, "CPU")
    lib.impl("no_grad_formula", lambda x: T.empty_like(x), "Meta")
    no_grad_formula = getattr(T.ops, ns).no_grad_formula.default
    x = T.tensor(X, requires_grad=True)
    results = {
        "good": T.library.opcheck(good, (x, 2.0)),
        "bad_fake": T.library.opcheck(bad_fake, (x,), raise_exception=False),
        "sneaky": T.library.opcheck(sneaky, (T.tensor(X),), test_utils="test_schema", raise_exception=False),
        "no_grad_formula": T.library.opcheck(no_grad_formula, (x,), test_utils="test_autograd_registration",
                                             raise_exception=False)}
    return {k: {t: r if r == "SUCCESS" else "FAIL" for t, r in v.items()} for k, v in results.items()}


def test_opcheck_as_pytorch():
    ours, ref = both(_opcheck_cases)
    assert ours["good"] == ref["good"] == {t: "SUCCESS" for t in FL.opcheck_tests.DEFAULT_TEST_UTILS}
    assert ours["bad_fake"]["test_faketensor"] == ref["bad_fake"]["test_faketensor"] == "FAIL"
    assert ours["sneaky"] == ref["sneaky"] == {"test_schema": "FAIL"}
    assert ours["no_grad_formula"] == ref["no_grad_formula"] == {"test_autograd_registration": "FAIL"}
    ns = _ns()
    _opcheck_cases(flambeau, ns)
    with pytest.raises(FL.OpCheckError, match="test_faketensor failed"):
        FL.opcheck(getattr(flambeau.ops, ns).bad_fake, (flambeau.tensor(X, requires_grad=True),))
    with pytest.raises(ValueError, match="rtol/atol"):
        FL.opcheck(getattr(flambeau.ops, ns).scaled_sin, (flambeau.tensor(X), 1.0), rtol=1e-3)


# ---- compilation --------------------------------------------------------------------------------------

class GraphCounter(CompileCounter):
    """A counting backend that keeps each captured graph."""

    def __init__(self):
        super().__init__()
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return super().__call__(gm, example_inputs)


def _calls(gm, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def test_custom_op_is_one_node_in_the_captured_graph():
    ns = _ns()
    op = _scaled_sin(flambeau, ns)
    spellings = [lambda x: op(x, 2.0).exp(), lambda x: getattr(flambeau.ops, ns).scaled_sin(x, 2.0).exp(),
                 lambda x: getattr(flambeau.ops, ns).scaled_sin.default(x, 2.0).exp()]
    for fn in spellings:
        cnt = GraphCounter()
        x = flambeau.tensor(X)
        out = flambeau.compile(fn, backend=cnt, fullgraph=True)(x)
        np.testing.assert_allclose(out.numpy(), np.exp(np.sin(X) * 2.0))
        assert cnt.frame_count == 1 and cnt.op_count == 2
        assert _calls(cnt.graphs[0], op._opoverload) == 1
    ref = torch.library.custom_op(f"{_ns()}::s", lambda x: x.sin(), mutates_args=(),
                                  schema="(Tensor x) -> Tensor")
    ref.register_fake(lambda x: torch.empty_like(x))
    rcnt = torch._dynamo.testing.CompileCounter()
    torch.compile(lambda x: ref(x).exp(), backend=rcnt, fullgraph=True)(torch.tensor(X))
    assert rcnt.frame_count == 1 and rcnt.op_count == 2       # the same count on PyTorch


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_training_uses_the_registered_backward(backend):
    """The registered backward is 3x the true derivative: compiled gradients follow it, as PyTorch's."""
    def run(T, ns):
        op = _scaled_sin(T, ns, backward_scale=3.0)
        x = T.tensor(X, requires_grad=True)
        y = T.compile(lambda x: (op(x * 2, 1.5) ** 2).sum(), backend="aot_eager" if T is torch else backend)(x)
        y.backward()
        return y.detach().numpy(), x.grad.numpy()
    ours, ref = both(run)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
    np.testing.assert_allclose(ours[1], ref[1], rtol=1e-6)
    x = X * 2
    np.testing.assert_allclose(ours[1], 2 * np.sin(x) * 1.5 * np.cos(x) * 1.5 * 3.0 * 2, rtol=1e-6)


def test_fake_function_drives_dynamic_shapes():
    """An op whose output has half the input's columns: one dynamic compile serves every size."""
    ns = _ns()

    @FL.custom_op(f"{ns}::left_half", mutates_args=())
    def left_half(x: flambeau.Tensor) -> flambeau.Tensor:
        return flambeau.from_numpy(x.numpy()[:, : x.shape[1] // 2].copy())

    @left_half.register_fake
    def _fake(x):
        return x.new_empty(x.shape[0], x.shape[1] // 2)
    cnt = GraphCounter()
    f = flambeau.compile(lambda x: left_half(x) + 1, backend=cnt, dynamic=True)
    g = flambeau.compile(lambda x: left_half(x) * 2, backend="inductor", dynamic=True)
    for rows, cols in [(2, 6), (3, 10), (5, 4)]:
        a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
        np.testing.assert_allclose(f(flambeau.tensor(a)).numpy(), a[:, : cols // 2] + 1)
        np.testing.assert_allclose(g(flambeau.tensor(a)).numpy(), a[:, : cols // 2] * 2)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_mutating_op_compiles_and_writes_its_argument(backend):
    ns = _ns()

    @FL.custom_op(f"{ns}::add_into", mutates_args=("out",))
    def add_into(x: flambeau.Tensor, out: flambeau.Tensor) -> None:
        out.add_(x)

    def step(x, buf):
        add_into(x * 2, buf)
        return buf * 3
    buf = flambeau.zeros(2, 3)
    out = flambeau.compile(step, backend=backend)(flambeau.tensor(X, dtype=flambeau.float32), buf)
    np.testing.assert_allclose(buf.numpy(), X * 2, rtol=1e-6)
    np.testing.assert_allclose(out.numpy(), X * 6, rtol=1e-6)
