"""vmap of convolutions whose weight is shared by the batch (`flambeau._functorch.conv_batching`):
per-sample gradients (first and second order) against torch.func in float64, and the forward is ONE
ordinary convolution over the folded batch, not a batch-many-group convolution."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.func as tf

import flambeau as fl
import flambeau.func as ff
from flambeau._ops import nn_conv

BATCH = 5
RNG = np.random.default_rng(7)
XS = RNG.standard_normal((BATCH, 2, 9, 9))
TS = RNG.integers(0, 3, BATCH)


def _model(m):
    m.manual_seed(0)
    return m.nn.Sequential(m.nn.Conv2d(2, 4, 3, padding=1, stride=2), m.nn.Tanh(),
                           m.nn.Conv2d(4, 6, 3, groups=2, dilation=1), m.nn.Tanh(), m.nn.Flatten(),
                           m.nn.Linear(6 * 3 * 3, 3)).double()


def _pair():
    ours, ref = _model(fl), _model(torch)
    ref.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in ours.state_dict().items()})
    return ours, ref


def _loss(F, m, model):
    def loss(p, x, t):
        return m.nn.functional.cross_entropy(F.functional_call(model, p, (x.unsqueeze(0),)), t.unsqueeze(0))
    return loss


def _params(model):
    return {k: v.detach() for k, v in model.named_parameters()}


def _close(a, b):
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(a[k].detach().numpy(), b[k].detach().numpy(), rtol=1e-9, atol=1e-11, err_msg=k)


@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_per_sample_gradients_with_shared_conv_weights_match_torch_func(argnums):
    ours, ref = _pair()
    got = ff.vmap(ff.grad(_loss(ff, fl, ours), argnums=argnums), in_dims=(None, 0, 0))(
        _params(ours), fl.tensor(XS), fl.tensor(TS))
    want = tf.vmap(tf.grad(_loss(tf, torch, ref), argnums=argnums), in_dims=(None, 0, 0))(
        _params(ref), torch.tensor(XS), torch.tensor(TS))
    if argnums == 0:
        got, want = (got,), (want,)
    _close(got[0], want[0])
    if len(got) > 1:
        np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=1e-9, atol=1e-11)


def test_per_sample_second_derivatives_through_shared_conv_weights_match_torch_func():
    """grad of an input-gradient norm: the input gradient's dependence on the weight stays per example."""
    ours, ref = _pair()

    def outer(F, m, model):
        inner = F.grad(_loss(F, m, model), argnums=1)
        return F.vmap(F.grad(lambda p, x, t: inner(p, x, t).pow(2).sum()), in_dims=(None, 0, 0))
    got = outer(ff, fl, ours)(_params(ours), fl.tensor(XS), fl.tensor(TS))
    want = outer(tf, torch, ref)(_params(ref), torch.tensor(XS), torch.tensor(TS))
    _close(got, want)


def test_forward_with_shared_weights_is_one_ungrouped_convolution(monkeypatch):
    """Each layer's forward under vmap(grad) with unbatched parameters: one kernel call, groups as
    declared, the vmap batch folded into N, the bias added by the kernel (weight gradients: one
    grouped call per layer)."""
    calls = []
    forward, wgrad = nn_conv.conv_forward_arrays, nn_conv.conv_weight_grad_arrays

    def count_forward(xp, x, w, st, pad, dil, groups, bias=None):
        calls.append(("forward", x.shape[0], w.shape[0], groups, bias is not None))
        return forward(xp, x, w, st, pad, dil, groups, bias)

    def count_wgrad(xp, x, gy, wshape, st, pad, dil, groups):
        calls.append(("weight_grad", x.shape[0], wshape[0], groups))
        return wgrad(xp, x, gy, wshape, st, pad, dil, groups)
    monkeypatch.setattr(nn_conv, "conv_forward_arrays", count_forward)
    monkeypatch.setattr(nn_conv, "conv_weight_grad_arrays", count_wgrad)
    ours, _ = _pair()
    ff.vmap(ff.grad(_loss(ff, fl, ours)), in_dims=(None, 0, 0))(_params(ours), fl.tensor(XS), fl.tensor(TS))
    assert [c for c in calls if c[0] == "forward"] == [("forward", BATCH, 4, 1, True), ("forward", BATCH, 6, 2, True)]
    assert sorted(c for c in calls if c[0] == "weight_grad") == [("weight_grad", 1, BATCH * 4, BATCH),
                                                                 ("weight_grad", 1, BATCH * 6, 2 * BATCH)]


def test_shared_weight_with_a_batched_bias_matches_torch_func():
    """A weight shared by the batch (grad's expand) with a per-example bias: the bias is added after
    the one convolution, and both gradients stay per example."""
    rng = np.random.default_rng(3)
    w, b, x = rng.standard_normal((4, 2, 3, 3)), rng.standard_normal((BATCH, 4)), rng.standard_normal((BATCH, 2, 7, 7))

    def run(F, m):
        def loss(w, b, x):
            return m.nn.functional.conv2d(x.unsqueeze(0), w, b, padding=1).tanh().sum()
        return F.vmap(F.grad(loss, argnums=(0, 1)), in_dims=(None, 0, 0))(m.tensor(w), m.tensor(b), m.tensor(x))
    for got, want in zip(run(ff, fl), run(tf, torch)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-11)


def test_per_example_weight_gradients_a_few_groups_at_a_time_match_torch_func(monkeypatch):
    """The grouped weight gradient of one item (the examples are its groups) taken in chunks of
    groups (`nn_conv._weight_grad_by_groups`, forced here by tiny block sizes: 2 groups a chunk)."""
    calls = []
    by_groups = nn_conv._weight_grad_by_groups

    def counted(*args):
        calls.append(args[-1])
        return by_groups(*args)
    monkeypatch.setattr(nn_conv, "_BLOCK_BYTES", 1)
    monkeypatch.setattr(nn_conv, "_GROUP_BLOCK_BYTES", 2 * 4 * 9 * 25 * 8)
    monkeypatch.setattr(nn_conv, "_weight_grad_by_groups", counted)
    test_per_sample_gradients_with_shared_conv_weights_match_torch_func(0)
    assert calls and all(c < BATCH for c in calls), calls
