"""Double backward (gradients of gradients) of convolution, pooling, interpolation, normalisation and
activation ops, against PyTorch in float64: for y = f(inputs), the first gradient
g = d<y, v>/d inputs is taken with create_graph=True, then d<g, u>/d (inputs, v) is compared. Each op's
backward is itself differentiated, so a derivative formula that is not written in differentiable
flambeau ops (or that is wrong) fails here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau

RNG = np.random.default_rng(11)


def _arr(*shape, positive=False):
    a = RNG.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


CASES = {
    "conv1d": (lambda m, x, w, b: m.nn.functional.conv1d(x, w, b, padding=1), [(2, 3, 7), (4, 3, 3), (4,)]),
    "conv2d": (lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, stride=2, padding=1), [(2, 3, 6, 5), (4, 3, 3, 3), (4,)]),
    "conv2d_groups": (lambda m, x, w: m.nn.functional.conv2d(x, w, groups=2, dilation=(1, 2)), [(1, 4, 6, 7), (6, 2, 2, 2)]),
    "conv3d": (lambda m, x, w: m.nn.functional.conv3d(x, w, padding=1), [(1, 2, 4, 4, 3), (3, 2, 2, 2, 2)]),
    "conv_transpose2d": (lambda m, x, w, b: m.nn.functional.conv_transpose2d(x, w, b, stride=2, padding=1),
                         [(2, 3, 4, 4), (3, 2, 3, 3), (2,)]),
    "max_pool2d": (lambda m, x: m.nn.functional.max_pool2d(x, 2, stride=1, padding=1), [(2, 3, 5, 5)]),
    "max_pool1d": (lambda m, x: m.nn.functional.max_pool1d(x, 3, stride=2), [(2, 3, 9)]),
    "avg_pool2d": (lambda m, x: m.nn.functional.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                   [(2, 3, 6, 5)]),
    "adaptive_avg_pool2d": (lambda m, x: m.nn.functional.adaptive_avg_pool2d(x, (3, 2)), [(2, 3, 7, 5)]),
    "adaptive_max_pool2d": (lambda m, x: m.nn.functional.adaptive_max_pool2d(x, (3, 2)), [(2, 3, 7, 5)]),
    "interpolate_nearest": (lambda m, x: m.nn.functional.interpolate(x, scale_factor=2, mode="nearest"), [(2, 3, 4, 3)]),
    "interpolate_bilinear": (lambda m, x: m.nn.functional.interpolate(x, size=(7, 5), mode="bilinear",
                                                                      align_corners=False), [(2, 3, 4, 3)]),
    "interpolate_bicubic": (lambda m, x: m.nn.functional.interpolate(x, size=(6, 6), mode="bicubic",
                                                                     align_corners=True), [(1, 2, 4, 3)]),
    "interpolate_linear": (lambda m, x: m.nn.functional.interpolate(x, scale_factor=1.5, mode="linear"), [(2, 3, 6)]),
    "layer_norm": (lambda m, x, w, b: m.nn.functional.layer_norm(x, (5,), w, b), [(3, 4, 5), (5,), (5,)]),
    "batch_norm_train": (lambda m, x, w, b: m.nn.functional.batch_norm(x, None, None, w, b, training=True),
                         [(4, 3, 5), (3,), (3,)]),
    "group_norm": (lambda m, x, w, b: m.nn.functional.group_norm(x, 2, w, b), [(2, 4, 3, 3), (4,), (4,)]),
    "instance_norm": (lambda m, x: m.nn.functional.instance_norm(x), [(2, 3, 6)]),
    "rms_norm": (lambda m, x, w: m.nn.functional.rms_norm(x, (4,), w), [(3, 4), (4,)]),
    "softmax": (lambda m, x: m.softmax(x, -1), [(3, 5)]),
    "log_softmax": (lambda m, x: m.log_softmax(x, 1), [(3, 5)]),
    "gelu": (lambda m, x: m.nn.functional.gelu(x), [(4, 5)]),
    "gelu_tanh": (lambda m, x: m.nn.functional.gelu(x, approximate="tanh"), [(4, 5)]),
    "silu": (lambda m, x: m.nn.functional.silu(x), [(4, 5)]),
    "elu": (lambda m, x: m.nn.functional.elu(x, 0.7), [(4, 5)]),
    "softplus": (lambda m, x: m.nn.functional.softplus(x, beta=2.0), [(4, 5)]),
    "leaky_relu": (lambda m, x: m.nn.functional.leaky_relu(x, 0.1), [(4, 5)]),
    "tanh": (lambda m, x: m.tanh(x), [(4, 5)]),
    "sigmoid": (lambda m, x: m.sigmoid(x), [(4, 5)]),
    "mish": (lambda m, x: m.nn.functional.mish(x), [(4, 5)]),
    "hardswish": (lambda m, x: m.nn.functional.hardswish(x), [(4, 5)]),
    "cross_entropy": (lambda m, x: m.nn.functional.cross_entropy(x, m.tensor([0, 2, 1]), label_smoothing=0.1),
                      [(3, 4)]),
    "mse_loss": (lambda m, x, y: m.nn.functional.mse_loss(x, y), [(3, 4), (3, 4)]),
    "smooth_l1_loss": (lambda m, x, y: m.nn.functional.smooth_l1_loss(x, y, beta=0.5), [(3, 4), (3, 4)]),
}


def _double_backward(mod, fn, arrays, v_arr, u_arrs):
    xs = [mod.tensor(a, dtype=mod.float64, requires_grad=True) for a in arrays]
    y = fn(mod, *xs)
    v = mod.tensor(v_arr, dtype=mod.float64, requires_grad=True)
    gs = mod.autograd.grad(y, xs, v, create_graph=True, allow_unused=True)
    s = sum((g * mod.tensor(u, dtype=mod.float64)).sum() for g, u in zip(gs, u_arrs) if g is not None)
    second = mod.autograd.grad(s, xs + [v], allow_unused=True)
    first = [None if g is None else g.detach().numpy() for g in gs]
    return first, [None if g is None else g.detach().numpy() for g in second]


@pytest.mark.parametrize("name", list(CASES))
def test_double_backward_matches_pytorch(name):
    fn, shapes = CASES[name]
    arrays = [_arr(*s) for s in shapes]
    if name.startswith("max_pool") or name.startswith("adaptive_max"):
        arrays[0] = arrays[0] + np.arange(arrays[0].size).reshape(arrays[0].shape) * 1e-3  # no ties
    with torch.no_grad():
        out_shape = tuple(fn(torch, *[torch.tensor(a) for a in arrays]).shape)
    v_arr = _arr(*out_shape)
    u_arrs = [_arr(*s) for s in shapes]
    f_first, f_second = _double_backward(flambeau, fn, arrays, v_arr, u_arrs)
    t_first, t_second = _double_backward(torch, fn, arrays, v_arr, u_arrs)
    for k, (a, b) in enumerate(zip(f_first, t_first)):
        assert (a is None) == (b is None) or (a if a is not None else b).any() == 0, f"first grad {k}"
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9, err_msg=f"{name}: first grad {k}")
    checked = 0
    for k, (a, b) in enumerate(zip(f_second, t_second)):
        if b is None or not np.any(b):
            assert a is None or not np.any(a), f"{name}: second grad {k} nonzero, torch's is zero"
            continue
        assert a is not None, f"{name}: second grad {k} is None, torch has one"
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9, err_msg=f"{name}: second grad {k}")
        checked += 1
    assert checked, f"{name}: no second-order gradient to compare"
