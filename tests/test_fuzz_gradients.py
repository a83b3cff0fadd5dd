"""Gradient regressions found by the compile fuzzer (tests/fuzz), each against PyTorch, eager and
compiled: masked activation backwards select (an inf/NaN gradient outside the mask gives 0), a NaN
input passes the gradient as ATen's formula does, softsign/tanhshrink differentiate as the
compositions they are in PyTorch, acosh's real gradient formula, and the partitioner never
recomputes a value the backward compares for equality (amax/amin)."""
import contextlib
import math

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._decomp import core_aten_decompositions
from flambeau._functorch import aot_function, min_cut_rematerialization_partition
from tests.fuzz.check import NAN_GRADIENT_BY_LAYOUT, _by_their_formulas
from tests.test_fuzz import _strict  # noqa: F401  (autouse: capture errors raise, caches reset)

inf, nan = math.inf, math.nan
MASKED = {
    "relu": lambda m, x: m.nn.functional.relu(x),
    "relu6": lambda m, x: m.nn.functional.relu6(x),
    "hardtanh": lambda m, x: m.nn.functional.hardtanh(x, -0.5, 2.0),
    "hardsigmoid": lambda m, x: m.nn.functional.hardsigmoid(x),
    "hardswish": lambda m, x: m.nn.functional.hardswish(x),
    "softshrink": lambda m, x: m.nn.functional.softshrink(x, 1.0),
    "hardshrink": lambda m, x: m.nn.functional.hardshrink(x, 1.0),
    "threshold": lambda m, x: m.nn.functional.threshold(x, 0.5, 2.0),
}
POINTS = [-inf, -7.0, -3.0, -1.0, -0.5, 0.0, 0.3, 0.5, 1.0, 2.0, 3.0, 6.0, 7.0, inf]




def _grad(m, fn, x, g, compiled=False):
    x = m.tensor(x, requires_grad=True)
    run = fl.compile(lambda t: fn(m, t)) if compiled else (lambda t: fn(m, t))
    out = run(x)
    return m.autograd.grad(out, x, m.tensor(g))[0].detach().numpy()


def _same(res, ref):
    """Equal values and NaN positions (the sign of a zero gradient is not PyTorch's semantics)."""
    assert np.array_equal(np.isnan(res), np.isnan(ref)), (res, ref)
    np.testing.assert_allclose(np.nan_to_num(res), np.nan_to_num(ref), rtol=1e-6, atol=0)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(MASKED))
@pytest.mark.parametrize("incoming", [inf, nan, -inf])
def test_masked_activation_gradients_select_as_pytorch(name, incoming, compiled):
    """Seeds 1134 and 1729: relu6's backward multiplied the incoming gradient by its mask, so an inf
    gradient (reciprocal of relu6's zeros) outside the mask became 0 * inf = NaN; ATen selects 0."""
    x = np.array(POINTS, np.float32)
    g = np.full(x.shape, incoming, np.float32)
    ref = _grad(torch, MASKED[name], x, g)
    _same(_grad(fl, MASKED[name], x, g, compiled), ref)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(MASKED))
def test_nan_input_passes_the_gradient_as_atens_formula(name, compiled):
    """Seed 1836: hardshrink's gradient at a NaN input is the incoming gradient in ATen's formula
    (its CUDA kernel and CPU scalar loop, which PyTorch runs on these 3 elements); hardsigmoid's is 0."""
    x = np.array([nan, 0.3, 5.0], np.float32)
    g = np.array([1.5, 2.0, 3.0], np.float32)
    _same(_grad(fl, MASKED[name], x, g, compiled), _grad(torch, MASKED[name], x, g))


@pytest.mark.parametrize("name", NAN_GRADIENT_BY_LAYOUT)
def test_fuzzer_reference_follows_the_formula_in_vector_blocks(name):
    """The fuzzer's PyTorch reference (`_by_their_formulas`) gives, on 64 contiguous elements (PyTorch's
    CPU vector blocks), the gradient at a NaN that PyTorch's own scalar loop gives on 1 element."""
    fn = lambda x: getattr(torch.nn.functional, name)(x)  # noqa: E731 -- looked up inside the context
    x1 = torch.full((1,), nan, requires_grad=True)
    one, = torch.autograd.grad(fn(x1), x1, torch.full((1,), 2.0))
    with _by_their_formulas(torch):
        x = torch.full((64,), nan, requires_grad=True)
        many, = torch.autograd.grad(fn(x), x, torch.full((64,), 2.0))
        xm = torch.full((64,), nan, requires_grad=True)
        method, = torch.autograd.grad(xm.hardshrink(), xm, torch.full((64,), 2.0))
    assert many.tolist() == [one.item()] * 64 and method.tolist() == [2.0] * 64


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", ["softsign", "tanhshrink"])
def test_softsign_and_tanhshrink_differentiate_as_their_compositions(name, compiled):
    """Seed 1709: PyTorch's softsign is x / (|x| + 1), so an inf gradient gives inf through the quotient
    and -inf through |x|: NaN. flambeau's fused softsign_backward gave inf."""
    fn = lambda m, t: getattr(m.nn.functional, name)(t)  # noqa: E731
    x = np.array([2.6094, -1.5, 0.0, -0.0, 40.0, -inf, inf], np.float64)
    for incoming in (inf, -inf, 1.25):
        g = np.full(x.shape, incoming)
        _same(_grad(fl, fn, x, g, compiled), _grad(torch, fn, x, g))


@pytest.mark.parametrize("compiled", [False, True])
def test_acosh_gradient_outside_its_domain_as_pytorch(compiled):
    """Seed 1583: acosh's gradient is 1 / sqrt(x*x - 1) for real x (PyTorch's formula), finite below -1
    where sqrt(x - 1) * sqrt(x + 1) is NaN."""
    x = np.array([-2.0736, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 3.0, inf, -inf], np.float64)
    g = np.full(x.shape, 0.75)
    _same(_grad(fl, lambda m, t: m.acosh(t), x, g, compiled), _grad(torch, lambda m, t: m.acosh(t), x, g))


def test_partitioner_saves_a_value_compared_for_equality():
    """amax's gradient goes to the elements equal to the saved result: the min-cut partitioner must save
    sin(x), not recompute it in the backward (a kernel may round sin differently: no element equal)."""
    saved = []

    def fw(gm, ex):
        saved.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.output_node().args[0][1:])
        return gm
    f = aot_function(lambda x: x.sin().amax(0), fw, lambda gm, ex: gm,
                     partition_fn=min_cut_rematerialization_partition, decompositions=core_aten_decompositions())
    x = fl.randn(5, 3, requires_grad=True)
    f(x).sum().backward()
    assert any("sin" in s for s in saved), saved


SEED_1964 = [2.9614, -1.319, -1.5645, -2.8479, -0.5816, -0.2974, 1.1468, 0.2145, -2.1293, -2.5617, -2.9401,
             -2.6445, 2.9745, 2.4461, -2.0897, -1.0052, -2.9435, -1.2421, -0.03, 0.0271, -2.4719, 0.5856, -0.0782,
             1.7077, 0.4415, -2.8967, -1.2416, 0.6477, 2.6554, 1.672, 1.3399, 0.4091, 2.4524, 2.7444, 2.4319,
             -1.6189, -2.2659, -0.0945, -1.589, 0.8548]


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_amin_gradient_of_a_transcendental_chain(dynamic):
    """Seed 1964: the backward recomputed sinc(erfc(x)) in another kernel (a scalar sinf against the
    forward's vector one), no element equalled the saved amin, and its gradient was 0/0 = NaN."""
    def f(m, x):
        return x.erfc().sinc().amin(-3)
    data = np.array(SEED_1964, np.float32).reshape(1, 5, 4, 2)
    cot = np.arange(8, dtype=np.float32).reshape(1, 4, 2) - 3.5
    tx = torch.tensor(data, requires_grad=True)
    ref, = torch.autograd.grad(f(torch, tx), tx, torch.tensor(cot))
    x = fl.tensor(data, requires_grad=True)
    res, = fl.autograd.grad(fl.compile(lambda t: f(fl, t), dynamic=dynamic)(x), x, fl.tensor(cot))
    np.testing.assert_allclose(res.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


POW_THEN_INPLACE = {
    "square": lambda m, x, e: m.square(x),
    "pow_scalar": lambda m, x, e: x ** 2.0,
}


@pytest.mark.parametrize("name", sorted(POW_THEN_INPLACE))
def test_pow_keeps_its_result_only_for_the_exponent_gradient(name):
    """Fuzzer seed 2876: a power's output changed in place before backward. PyTorch saves the result
    only in the overload with a tensor exponent; a power of a number leaves it free to change."""
    grads = []
    for m in (torch, fl):
        x = m.tensor([0.5, -1.5, 2.0, 3.0], dtype=m.float64, requires_grad=True)
        y = POW_THEN_INPLACE[name](m, x, m.full((4,), 2.0, dtype=m.float64))
        y.mul_(3.0)
        y.sum().backward()
        grads.append(x.grad.detach().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


@pytest.mark.parametrize("exponent_grad", [True, False])
def test_pow_of_a_tensor_exponent_refuses_a_changed_result_as_pytorch(exponent_grad):
    for m in (torch, fl):
        x = m.tensor([0.5, 1.5], dtype=m.float64, requires_grad=True)
        e = m.tensor([2.0, 3.0], dtype=m.float64, requires_grad=exponent_grad)
        y = x ** e
        y.mul_(3.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@pytest.mark.parametrize("mode", ["eager", "inductor", "dynamic"])
@pytest.mark.parametrize("name", ["max", "min"])
def test_inplace_write_to_max_values_after_it_as_pytorch(mode, name):
    """Seed 2312: max(dim)/min(dim) save their indices only (PyTorch's), so add_ on the values
    afterwards is no error (was 'modified by an inplace operation'); forward-mode too."""
    def f(m, x):
        v = getattr(x, name)(0, keepdim=True)[0]
        w = (v + 2) * 3
        v.transpose(0, 1)[0].add_(1)
        return w, v
    vals = [[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]]
    x, tx = fl.tensor(vals, requires_grad=True), torch.tensor(vals, requires_grad=True)
    run = (lambda x: f(fl, x)) if mode == "eager" else fl.compile(lambda x: f(fl, x), dynamic=mode == "dynamic")
    out, ref = run(x), f(torch, tx)
    g, = fl.autograd.grad(out[0].sum() + out[1].sum(), x)
    tg, = torch.autograd.grad(ref[0].sum() + ref[1].sum(), tx)
    np.testing.assert_array_equal(g.numpy(), tg.numpy())
    if mode == "eager":
        import flambeau.autograd.forward_ad as fwad
        with fwad.dual_level():
            d = fwad.make_dual(fl.tensor(vals), fl.ones(2, 3))
            t = fwad.unpack_dual(getattr(d, name)(0)[0]).tangent
        np.testing.assert_array_equal(t.numpy(), np.ones(3, np.float32))


@pytest.mark.parametrize("name", NAN_GRADIENT_BY_LAYOUT)
def test_fuzzer_reference_keeps_pytorchs_saved_input(name):
    """Seed 1447: the fuzzer's PyTorch reference (`_by_their_formulas`) calls the function on the input
    itself when it holds no NaN, so an in-place write to that input before backward raises as in
    PyTorch (and in flambeau); it passed a copy, and a program that PyTorch rejects was kept."""
    def run(m, wrapped):
        x = m.tensor([-1.5, -0.2, 0.3, 2.0], requires_grad=True)
        v = x * 1
        with (_by_their_formulas(torch) if wrapped else contextlib.nullcontext()):
            y = getattr(m.nn.functional, name)(v)
        v.mul_(2)
        try:
            y.sum().backward()
        except RuntimeError as e:
            return "modified by an inplace operation" in str(e)
        return False
    assert run(torch, True) == run(torch, False) == run(fl, False)
