"""Matrix-product paths that per-sample gradients (`vmap(grad(...))` of a linear layer) run through,
against PyTorch: the gradient of a transposed operand (`x @ w.T`) is computed transposed, so it comes
out in the operand's own layout (PyTorch's mm_mat2_backward; a 3-D by 2-D product folds into one
product, no batch sum), and a batch of products with an inner size of 1 (the per-example outer
products of a linear weight gradient) is a broadcast multiply with PyTorch's bmm signs of zero."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._backends import cpu_kernels


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("transposed", [True, False])
def test_gradient_of_a_transposed_operand_has_its_layout(lead, transposed):
    rng = np.random.default_rng(len(lead))
    x = rng.standard_normal(lead + (4, 6))
    w = rng.standard_normal((5, 6) if transposed else (6, 5))
    g = rng.standard_normal(lead + (4, 5))
    grads = []
    for m in (fl, torch):
        xt, wt = m.tensor(x, requires_grad=True), m.tensor(w, requires_grad=True)
        (xt @ (wt.T if transposed else wt)).backward(m.tensor(g))
        grads.append((xt.grad, wt.grad))
    (gx, gw), (tx, tw) = grads
    np.testing.assert_allclose(gw.numpy(), tw.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx.numpy(), tx.numpy(), rtol=1e-12, atol=1e-12)
    assert gw.stride() == tw.stride() == ((6, 1) if transposed else (5, 1))


def _outer_operands(m, case, dtype):
    """(a, b) tensors of library `m` for a product over an inner size of 1; the strided cases are views."""
    specials = np.array([-1.0, -0.0, 0.0, 2.0, np.inf, np.nan, 1e-30, -3.5], dtype)
    rng = np.random.default_rng(1)
    a = m.tensor(rng.choice(specials, (4, 7, 1)))
    b = m.tensor(rng.choice(specials, (4, 1, 37)))      # 37: a vector body and a remainder
    if case == "a_strided":                 # a's column read with a stride of 2 elements
        a = m.tensor(rng.choice(specials, (4, 14, 1)))[:, ::2]
    elif case == "b_strided":               # b's row read with a stride of 3 elements
        b = m.tensor(rng.choice(specials, (4, 1, 111)))[:, :, ::3]
    elif case == "broadcast":               # a 4-d batch of a, one b shared by it
        a, b = m.tensor(rng.choice(specials, (2, 3, 7, 1))), m.tensor(rng.choice(specials, (1, 1, 37)))
    elif case == "broadcast_mixed":         # b broadcast over the first batch dim only: NumPy's product
        a, b = m.tensor(rng.choice(specials, (2, 3, 7, 1))), m.tensor(rng.choice(specials, (3, 1, 37)))
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["contiguous", "a_strided", "b_strided", "broadcast", "broadcast_mixed"])
def test_batched_outer_products_match_torch_bmm_bit_for_bit(case, dtype, monkeypatch):
    """Values and signs of zero as PyTorch's bmm/matmul; float32 runs `flm_batched_outer_f32` where the
    batch dims of each operand walk with one stride."""
    calls = []
    if cpu_kernels.available():
        real = cpu_kernels._state["batched_outer"]
        monkeypatch.setitem(cpu_kernels._state, "batched_outer", lambda *a: calls.append(a) or real(*a))
    got = fl.matmul(*_outer_operands(fl, case, dtype)).numpy()
    want = torch.matmul(*_outer_operands(torch, case, dtype)).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert len(calls) == (dtype == np.float32 and cpu_kernels.available() and case != "broadcast_mixed")


def test_batched_outer_products_take_the_broadcast_multiply(monkeypatch):
    """An inner size of 1 never reaches a GEMM (ours or NumPy's)."""
    def no_gemm(*args, **kwargs):
        raise AssertionError("a GEMM ran")
    monkeypatch.setattr(cpu_kernels.np, "matmul", no_gemm)
    monkeypatch.setitem(cpu_kernels._state, "fn", None)
    a, b = np.ones((64, 10, 1), np.float32), np.full((64, 1, 1936), 2.0, np.float32)
    np.testing.assert_array_equal(cpu_kernels.matmul(a, b), np.full((64, 10, 1936), 2.0, np.float32))
