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

    def count_forward(xp, x, w, st, pad, dil, groups, bias=None, **kwargs):
        calls.append(("forward", x.shape[0], w.shape[0], groups, bias is not None))
        return forward(xp, x, w, st, pad, dil, groups, bias, **kwargs)

    def count_wgrad(xp, x, gy, wshape, st, pad, dil, groups, **kwargs):
        calls.append(("weight_grad", x.shape[0], wshape[0], groups))
        return wgrad(xp, x, gy, wshape, st, pad, dil, groups, **kwargs)
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


WEIGHT_GRAD_CASES = [  # (N, groups, C/groups, O/groups, size, kernel, stride, padding, dilation)
    (1, 5, 2, 8, (9, 11), (3, 3), (1, 1), (0, 0), (1, 1)),
    (2, 3, 3, 20, (10, 9), (2, 3), (2, 1), (1, 2), (1, 2)),      # 20 channels: a 16-lane tail; 18 columns
    (3, 2, 1, 16, (7, 7), (3, 1), (1, 2), (2, 0), (2, 1)),
    (2, 4, 1, 8, (12, 12), (3, 3), (1, 1), (0, 0), (1, 1)),      # 8 channels: 8-lane rows; 9 columns as 4 + 5
]


@pytest.mark.parametrize("case", WEIGHT_GRAD_CASES, ids=lambda c: f"n{c[0]}g{c[1]}c{c[2]}o{c[3]}")
def test_grouped_float32_weight_gradient_kernel_matches_pytorch(case, monkeypatch):
    """The C++ grouped weight gradient (`cpu_kernels.conv2d_weight_grad`: per group, no column buffer)
    against PyTorch's float64 weight gradient, to float32 accuracy; the kernel ran once."""
    from flambeau._backends import cpu_kernels
    if not cpu_kernels.available():
        pytest.skip("no C++ kernels here")
    n, g, cg, og, size, k, s, p, d = case
    calls = []
    real = cpu_kernels._state["conv2d_weight_grad"]
    monkeypatch.setitem(cpu_kernels._state, "conv2d_weight_grad", lambda *a: calls.append(a[1]) or real(*a))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, g * cg) + size).astype(np.float32)
    w = rng.standard_normal((g * og, cg) + k).astype(np.float32)
    a = fl.tensor(w, requires_grad=True)
    y = fl.nn.functional.conv2d(fl.tensor(x), a, None, s, p, d, g)
    gy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(fl.tensor(gy))
    want = torch.nn.grad.conv2d_weight(torch.tensor(x, dtype=torch.float64), w.shape,
                                       torch.tensor(gy, dtype=torch.float64), s, p, d, g)
    assert calls == [g]
    np.testing.assert_allclose(a.grad.numpy(), want.numpy(), rtol=1e-5, atol=2e-5)


def test_float32_per_sample_gradients_of_a_cnn_match_torch_func(monkeypatch):
    """bench/func.py's CNN in float32 (conv 1->8, relu, 2x2 max pool, conv 8->16, relu, linear): the
    per-example weight gradients of both layers come from the grouped C++ kernel, and all gradients
    agree with torch.func to float32 accuracy."""
    from flambeau._backends import cpu_kernels
    if not cpu_kernels.available():
        pytest.skip("no C++ kernels here")
    calls = []
    real = cpu_kernels._state["conv2d_weight_grad"]
    monkeypatch.setitem(cpu_kernels._state, "conv2d_weight_grad", lambda *a: calls.append(a[1]) or real(*a))

    def model(m):
        m.manual_seed(0)
        return m.nn.Sequential(m.nn.Conv2d(1, 8, 3), m.nn.ReLU(), m.nn.MaxPool2d(2), m.nn.Conv2d(8, 16, 3),
                               m.nn.ReLU(), m.nn.Flatten(), m.nn.Linear(16 * 5 * 5, 10))
    ours, ref = model(fl), model(torch)
    ref.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in ours.state_dict().items()})
    rng = np.random.default_rng(5)
    xs, ts = rng.standard_normal((6, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, 6)
    got = ff.vmap(ff.grad(_loss(ff, fl, ours)), in_dims=(None, 0, 0))(_params(ours), fl.tensor(xs), fl.tensor(ts))
    want = tf.vmap(tf.grad(_loss(tf, torch, ref)), in_dims=(None, 0, 0))(_params(ref), torch.tensor(xs),
                                                                         torch.tensor(ts))
    assert sorted(calls) == [6, 6]
    for key in want:
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-4, atol=1e-5, err_msg=key)


def test_unbatched_parameters_are_exposed_by_one_expand_each():
    """grad under vmap sees each unbatched parameter as a stride-0 view over the batch (`batched.expose`):
    one expand per parameter (no unsqueeze first), and the gradients still match torch.func."""
    from tests.conftest import op_names_mode
    ours, ref = _pair()
    with op_names_mode() as mode:
        got = ff.vmap(ff.grad(_loss(ff, fl, ours)), in_dims=(None, 0, 0))(_params(ours), fl.tensor(XS), fl.tensor(TS))
    n = len(_params(ours))
    assert [name.split(".")[0] for name in mode.names[:n]] == ["expand"] * n, mode.names[:2 * n]
    want = tf.vmap(tf.grad(_loss(tf, torch, ref)), in_dims=(None, 0, 0))(_params(ref), torch.tensor(XS),
                                                                         torch.tensor(TS))
    _close(got, want)
