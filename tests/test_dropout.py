"""Dropout checked statistically and by its mask: the kept fraction, the 1/(1-p) scaling, E[out], that
backward uses the forward's mask, and PyTorch's structure (whole channels for dropout1d/2d/3d, the
alpha variants keeping mean and variance). The op database can only compare shapes of random ops;
these tests fail when dropout is replaced by the identity, by a fresh mask in backward, or by a wrong
scale.

Bounds are 6 standard deviations of a binomial/mean estimate (a false failure about once in 10^9 runs)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import flambeau
import flambeau.nn as nn
import flambeau.nn.functional as F
from flambeau._ops import attention as A

SIGMAS = 6.0
N = 200_000


def _binomial_bound(n: int, p: float) -> float:
    return SIGMAS * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keeps_one_minus_p_and_scales(p):
    flambeau.manual_seed(0)
    x = flambeau.ones(N)
    out = F.dropout(x, p, training=True).numpy()
    kept = out != 0
    assert abs(kept.mean() - (1 - p)) < _binomial_bound(N, p)
    np.testing.assert_allclose(out[kept], 1 / (1 - p), rtol=1e-6)
    # E[out] = x: the mean of N outputs of a unit input is 1 within its standard error.
    sd = math.sqrt(p / (1 - p) / N)
    assert abs(out.mean() - 1.0) < SIGMAS * sd


def test_dropout_of_random_input_is_unbiased():
    flambeau.manual_seed(1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(N).astype(np.float32) + 2.0
    p = 0.3
    outs = np.stack([F.dropout(flambeau.tensor(x), p, training=True).numpy() for _ in range(4)])
    kept = outs != 0
    np.testing.assert_allclose(outs[kept], np.broadcast_to(x, outs.shape)[kept] / (1 - p), rtol=1e-6)
    est = outs.mean()
    sd = math.sqrt(np.mean(x ** 2) * p / (1 - p) / outs.size)
    assert abs(est - x.mean()) < SIGMAS * sd


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_backward_uses_the_forward_mask(inplace):
    flambeau.manual_seed(2)
    p = 0.4
    x = flambeau.randn(1000, requires_grad=True)
    c = flambeau.randn(1000)
    y = x * 1.0
    out = F.dropout(y, p, training=True, inplace=inplace)
    (out * c).sum().backward()
    mask = (out.detach() != 0).numpy()
    expected = np.where(mask, c.numpy() / (1 - p), 0.0)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)
    assert 0.45 < mask.mean() < 0.75


def test_dropout_edge_probabilities_and_eval():
    x = flambeau.randn(64)
    np.testing.assert_array_equal(F.dropout(x, 0.0, training=True).numpy(), x.numpy())
    np.testing.assert_array_equal(F.dropout(x, 1.0, training=True).numpy(), np.zeros(64, np.float32))
    np.testing.assert_array_equal(F.dropout(x, 0.5, training=False).numpy(), x.numpy())
    m = nn.Dropout(0.5)
    m.eval()
    np.testing.assert_array_equal(m(x).numpy(), x.numpy())
    m.train()
    flambeau.manual_seed(3)
    y = m(flambeau.ones(N)).numpy()
    assert abs((y != 0).mean() - 0.5) < _binomial_bound(N, 0.5)


@pytest.mark.parametrize("fn,shape,feature_dims", [
    ("dropout1d", (50, 40, 7), 2), ("dropout2d", (50, 40, 3, 4), 2), ("dropout3d", (30, 40, 2, 3, 2), 2),
    ("dropout2d", (400, 5, 6), 1)])
def test_feature_dropout_zeroes_whole_channels(fn, shape, feature_dims):
    flambeau.manual_seed(4)
    p = 0.3
    out = getattr(F, fn)(flambeau.ones(*shape), p, training=True).numpy()
    per_channel = out.reshape(math.prod(shape[:feature_dims]), -1)
    # each channel is all dropped or all kept and scaled
    dropped = (per_channel == 0).all(axis=1)
    kept = np.isclose(per_channel, 1 / (1 - p)).all(axis=1)
    assert np.all(dropped | kept)
    n = per_channel.shape[0]
    assert abs(dropped.mean() - p) < _binomial_bound(n, p)


@pytest.mark.parametrize("fn", ["alpha_dropout", "feature_alpha_dropout"])
def test_alpha_dropout_affine_map_and_moments(fn):
    """Alpha dropout sets dropped units to SELU's negative saturation alpha' and applies a*x + b with
    a = ((1-p)(1 + p alpha'^2))^-1/2, b = -a alpha' p, keeping a standard normal's mean 0, variance 1."""
    flambeau.manual_seed(5)
    p = 0.2
    shape = (4000, 50, 1) if fn == "feature_alpha_dropout" else (N,)
    xn = flambeau.randn(*shape)
    x = xn.numpy().astype(np.float64)
    out = getattr(F, fn)(xn, p, training=True).numpy().astype(np.float64)
    alpha_p = -1.0507009873554805 * 1.6732632423543772
    a = ((1 - p) * (1 + p * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * p
    kept = np.isclose(out, a * x + b, rtol=1e-5, atol=1e-6)
    dropped = np.isclose(out, a * alpha_p + b, rtol=1e-5, atol=1e-6)
    assert np.all(kept | dropped)
    assert abs(dropped.mean() - p) < _binomial_bound(out.size if fn == "alpha_dropout" else shape[0] * shape[1], p)
    assert abs(out.mean()) < 0.02
    assert abs(out.var() - 1.0) < 0.03


@pytest.mark.parametrize("path", [A.SDPBackend.MATH, A.SDPBackend.EFFICIENT_ATTENTION])
def test_sdpa_dropout_mask_scale_and_expectation(path, monkeypatch):
    """With value = identity, the output is the dropped, rescaled attention matrix itself: its zeros
    are the mask. Kept fraction 1-p, kept entries = probs/(1-p), E[out] over seeds = no-dropout output,
    and the gradient of value uses exactly the forward's mask."""
    monkeypatch.setattr(A, "BLOCK", [8, 16])
    rng = np.random.default_rng(6)
    L, p = 32, 0.25
    q = flambeau.tensor(rng.standard_normal((2, 3, L, 8)).astype(np.float32))
    k = flambeau.tensor(rng.standard_normal((2, 3, L, 8)).astype(np.float32))
    eye = np.broadcast_to(np.eye(L, dtype=np.float32), (2, 3, L, L)).copy()
    with A.sdpa_kernel(path):
        probs = F.scaled_dot_product_attention(q, k, flambeau.tensor(eye)).numpy()
        total = np.zeros_like(probs)
        draws = 40
        for seed in range(draws):
            flambeau.manual_seed(100 + seed)
            v = flambeau.tensor(eye, requires_grad=True)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
            c = flambeau.tensor(rng.standard_normal((2, 3, L, L)).astype(np.float32))
            (out * c).sum().backward()
            o = out.detach().numpy()
            kept = o != 0
            assert abs(kept.mean() - (1 - p)) < _binomial_bound(kept.size, p)
            np.testing.assert_allclose(o[kept], probs[kept] / (1 - p), rtol=1e-4, atol=1e-7)
            # d/dv sum(c * (P Z / (1-p)) v) = (P Z / (1-p))^T c = o^T c
            np.testing.assert_allclose(v.grad.numpy(), np.swapaxes(o, -1, -2) @ c.numpy(), rtol=1e-4, atol=1e-5)
            total += o
    mean = total / draws
    sd = np.sqrt(probs ** 2 * p / (1 - p) / draws)
    assert np.all(np.abs(mean - probs) <= SIGMAS * sd + 1e-6)
