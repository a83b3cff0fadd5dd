"""Backward computes only the gradients some input needs (PyTorch's `output_mask` of
derivatives.yaml, `flambeau.autograd.graph.OUTPUT_MASK`): a convolution, linear layer or matrix product
whose input does not require grad (a network's data input) runs no product for that input's gradient.

Each case runs under every combination of which inputs require grad, in flambeau and PyTorch: the
gradients agree, and the products dispatched during backward are one per needed input or weight gradient, as many as
PyTorch's (its `convolution_backward` output_mask, its mm/bmm calls).
"""
import itertools

import numpy as np
import pytest
import torch

import flambeau
from tests.conftest import op_names_mode

_PRODUCTS = {"mm", "bmm", "matmul", "convolution", "_convolution_weight_grad", "linear", "mv", "dot"}


class _TorchProducts(torch.utils._python_dispatch.TorchDispatchMode):
    """PyTorch's backward products: mm/bmm/mv/dot calls, and per convolution_backward the gradients its
    output_mask asks for among input and weight."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "convolution_backward":
            self.count += sum(bool(m) for m in args[-1][:2])
        elif name in ("mm", "bmm", "mv", "dot", "addmm"):
            self.count += 1
        return func(*args, **(kwargs or {}))


_CASES = {
    "conv2d_bias": (((2, 3, 8, 8), (4, 3, 3, 3), (4,)),
                    lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, stride=2, padding=1)),
    "conv1d": (((2, 3, 9), (4, 3, 3)), lambda m, x, w: m.nn.functional.conv1d(x, w, padding=1)),
    "conv_transpose2d": (((2, 3, 5, 5), (3, 4, 3, 3), (4,)),
                         lambda m, x, w, b: m.nn.functional.conv_transpose2d(x, w, b, stride=2, output_padding=1)),
    "linear_2d": (((5, 3), (4, 3), (4,)), lambda m, x, w, b: m.nn.functional.linear(x, w, b)),
    "linear_3d": (((2, 5, 3), (4, 3), (4,)), lambda m, x, w, b: m.nn.functional.linear(x, w, b)),
    "mm": (((5, 3), (3, 4)), lambda m, a, b: a.mm(b)),
    "bmm": (((2, 5, 3), (2, 3, 4)), lambda m, a, b: a.bmm(b)),
    "matmul_nd": (((2, 5, 3), (3, 4)), lambda m, a, b: a @ b),
    "matmul_vec_mat": (((3,), (3, 4)), lambda m, a, b: a @ b),
    "matmul_mat_vec": (((5, 3), (3,)), lambda m, a, b: a @ b),
}


def _cases():
    for name, (shapes, _) in sorted(_CASES.items()):
        for need in itertools.product((False, True), repeat=len(shapes)):
            if any(need):
                yield pytest.param(name, need, id=f"{name}-{''.join('g' if n else '-' for n in need)}")


@pytest.mark.parametrize("name,need", list(_cases()))
def test_backward_runs_only_the_needed_products_as_pytorch(name, need):
    shapes, fn = _CASES[name]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float64) for s in shapes]
    fa = [flambeau.tensor(a, requires_grad=n) for a, n in zip(arrays, need)]
    ta = [torch.tensor(a, requires_grad=n) for a, n in zip(arrays, need)]
    fo, to = fn(flambeau, *fa), fn(torch, *ta)
    g = rng.standard_normal(tuple(to.shape))
    with op_names_mode() as mode:
        fo.backward(flambeau.tensor(g))
    with _TorchProducts() as tmode:
        to.backward(torch.tensor(g))
    ours = sum(n in _PRODUCTS for n in mode.names)
    assert ours == sum(need[:2]), mode.names          # one product per needed input or weight gradient
    if "vec" not in name:                            # PyTorch's outer products there are mul, not a product
        assert ours == tmode.count, (mode.names, tmode.count)
    for f, t in zip(fa, ta):
        if t.grad is None:
            assert f.grad is None
        else:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_first_layer_gets_no_input_gradient_but_its_weights_do():
    """A small CNN on a data input: the first convolution's transposed convolution is not run, the
    weights' gradients equal PyTorch's."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 8, 8))
    mods = {}
    for m in (flambeau, torch):
        m.manual_seed(0)
        net = m.nn.Sequential(m.nn.Conv2d(3, 4, 3, padding=1), m.nn.ReLU(), m.nn.Conv2d(4, 2, 3)).double()
        mods[m.__name__] = net
    mods["flambeau"].load_state_dict({k: flambeau.tensor(v.detach().numpy())
                                     for k, v in mods["torch"].state_dict().items()})
    loss = mods["flambeau"](flambeau.tensor(x)).sum()
    with op_names_mode() as mode:
        loss.backward()
    mods["torch"](torch.tensor(x)).sum().backward()
    assert mode.names.count("convolution") == 1, mode.names      # the second layer's input gradient only
    assert mode.names.count("_convolution_weight_grad") == 2, mode.names
    for (k, p), tp in zip(mods["flambeau"].named_parameters(), mods["torch"].parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("which", ["input", "weight"])
@pytest.mark.parametrize("api", ["forward_ad", "func.jvp"])
def test_forward_mode_uses_the_mask_of_the_tangents(which, api):
    """Dual numbers (jvp by double vjp in `autograd.forward_ad`) ask only for the gradients paired with a
    tangent; func.jvp goes through the backward engine's mask."""
    rng = np.random.default_rng(2)
    x, w, b, t = (rng.standard_normal(s) for s in ((5, 3), (4, 3), (4,), (5, 3) if which == "input" else (4, 3)))

    def run(m):
        X, W, B, T = (m.tensor(a) for a in (x, w, b, t))
        f = (lambda v: m.nn.functional.linear(v, W, B)) if which == "input" else \
            (lambda v: m.nn.functional.linear(X, v, B))
        primal = X if which == "input" else W
        if api == "func.jvp":
            return m.func.jvp(f, (primal,), (T,))
        fwAD = m.autograd.forward_ad
        with fwAD.dual_level():
            out = fwAD.unpack_dual(f(fwAD.make_dual(primal, T)))
            return out.primal, out.tangent
    fo, ft = run(flambeau)
    to, tt = run(torch)
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ft.detach().numpy(), tt.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("need", [(True, False), (False, True), (True, True)], ids=["self", "other", "both"])
def test_division_computes_the_divisors_gradient_only_when_needed(need):
    """`a / b`'s backward: one division for a's gradient; the divisor's gradient (neg, mul, div) only
    when b requires grad (a per-example mean's count under vmap(grad) does not). Gradients vs PyTorch."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3)), rng.uniform(1, 2, (4, 3))
    fa, fb = (flambeau.tensor(v, requires_grad=n) for v, n in zip((a, b), need))
    ta, tb = (torch.tensor(v, requires_grad=n) for v, n in zip((a, b), need))
    loss = (fa / fb).sum()
    with op_names_mode() as mode:
        loss.backward()
    (ta / tb).sum().backward()
    assert mode.names.count("div") == 1 + need[1] and mode.names.count("neg") == need[1], mode.names
    assert mode.names.count("mul") == need[1], mode.names
    for f, t in zip((fa, fb), (ta, tb)):
        if t.grad is None:
            assert f.grad is None
        else:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-12)


class _TorchMuls(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ == "mul"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("need", [(True, False), (False, True), (True, True)], ids=["g-", "-g", "gg"])
@pytest.mark.parametrize("shapes", [((5, 3), (5, 3)), ((5, 3), (3,))], ids=["same", "broadcast"])
def test_a_product_runs_one_multiplication_per_needed_gradient_as_pytorch(shapes, need):
    """`x * mask`, `x * scale`: mul's backward multiplies only for the operands that require grad."""
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in shapes]
    fa = [flambeau.tensor(a, requires_grad=n) for a, n in zip(arrays, need)]
    ta = [torch.tensor(a, requires_grad=n) for a, n in zip(arrays, need)]
    g = rng.standard_normal((5, 3))
    fo, to = fa[0] * fa[1], ta[0] * ta[1]
    with op_names_mode() as mode:
        fo.backward(flambeau.tensor(g))
    with _TorchMuls() as tmode:
        to.backward(torch.tensor(g))
    assert mode.names.count("mul") == sum(need) == tmode.count, (mode.names, tmode.count)
    for f, t in zip(fa, ta):
        if t.grad is None:
            assert f.grad is None
        else:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)
