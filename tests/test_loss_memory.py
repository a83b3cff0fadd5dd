"""Peak memory of cross_entropy / nll_loss forward + backward on cpu, measured with tracemalloc (NumPy
reports its allocations to it): class-index targets must not build an N x C one-hot or coefficient
matrix, so the peak stays near the one N x C array each direction needs. Values are checked against
PyTorch in float64 at the same size (PyTorch's own float32 gradient is off by ~2e-6 here)."""
import tracemalloc

import numpy as np
import pytest
import torch

import flambeau as fl
import flambeau.nn.functional as F

ROWS, CLASSES = 2048, 8192
# forward and backward each need one N x C array (measured peak: 1.0x the logits); a dense one-hot in
# either direction (bool mask times a float factor: 1.25x more) crosses this
PEAK_LIMIT_IN_LOGITS = 2.0

GRAD_ATOL = 2e-7

CASES = {
    "cross_entropy": dict(fn="cross_entropy", kw={}),
    "cross_entropy_weight_smoothing_ignore": dict(fn="cross_entropy", kw=dict(label_smoothing=0.1,
                                                                               ignore_index=5), weight=True),
    "cross_entropy_kdim_sum": dict(fn="cross_entropy", kw=dict(reduction="sum", label_smoothing=0.2), kdim=True),
    "nll_loss": dict(fn="nll_loss", kw={}, weight=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_class_target_loss_peak_memory_is_about_one_logits(case):
    spec = CASES[case]
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((ROWS, CLASSES), dtype=np.float32)
    t_np = rng.integers(0, CLASSES, ROWS)
    t_np[::7] = 5
    if spec.get("kdim"):
        x_np = np.ascontiguousarray(x_np.reshape(8, ROWS // 8, CLASSES).transpose(0, 2, 1))
        t_np = t_np.reshape(8, ROWS // 8)
    w_np = rng.uniform(0.5, 1.5, CLASSES).astype(np.float32) if spec.get("weight") else None
    x = fl.tensor(x_np, requires_grad=True)
    t, w = fl.tensor(t_np), None if w_np is None else fl.tensor(w_np)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        loss = getattr(F, spec["fn"])(x, t, weight=w, **spec["kw"])
        loss.backward()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT_IN_LOGITS * x_np.nbytes, f"{case}: peak {peak / x_np.nbytes:.2f}x the logits"

    xt = torch.tensor(x_np, dtype=torch.float64, requires_grad=True)
    wt = None if w_np is None else torch.tensor(w_np, dtype=torch.float64)
    ref = getattr(torch.nn.functional, spec["fn"])(xt, torch.tensor(t_np), weight=wt, **spec["kw"])
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=0, atol=GRAD_ATOL)
