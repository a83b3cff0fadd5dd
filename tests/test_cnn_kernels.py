"""The CNN kernels' fast NumPy paths against PyTorch bit for bit: max pooling's indices where windows
tie or hold NaN (the strided running-max path, every window inside the plane, and the gathered path
with padding both follow ATen's CPU loop), and relu's select (`_helpers.zero_where`, a bitwise mask)
on -0.0, NaN and inf values and gradients."""
import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._backends import cpu_kernels

CASES = [  # (shape, kernel_size, stride, padding, dilation, ceil_mode)
    ((2, 3, 8, 8), 2, None, 0, 1, False),
    ((2, 3, 9, 11), 3, 2, 0, 1, False),
    ((2, 3, 9, 11), (2, 3), (1, 2), 0, (2, 1), True),
    ((2, 3, 9, 11), 3, 2, 1, 1, False),
    ((2, 3, 7, 70), 2, 2, 0, 1, False),               # rows of 35 outputs: two 16-lane chunks and a tail
    ((2, 3, 9, 50), 3, (2, 3), 0, (1, 2), False),       # column stride 3 (gathered lanes), dilation 2
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + f"_k{c[1]}_p{c[3]}")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8"])
def test_max_pool2d_ties_and_nans_pick_atens_index(case, dtype, monkeypatch):
    """uint8: the quantized graphs' int8 max pool (its C++ kernel, 16 stride-2 outputs per vector); with
    padding the lowest value (0) is also a common real value, so many windows take the remapping path."""
    shape, k, s, p, d, ceil = case
    calls = []
    kernel = ("max_pool2d", np.dtype(dtype))
    if dtype in ("float32", "uint8") and cpu_kernels.available():
        cpu_kernels._load()
        real = cpu_kernels._state[kernel]
        monkeypatch.setitem(cpu_kernels._state, kernel, lambda *a: calls.append(a[8]) or real(*a))
    rng = np.random.default_rng(0)
    x = rng.integers(0 if dtype == "uint8" else -2, 2, shape).astype(dtype)          # many ties
    if dtype not in ("int64", "uint8"):
        x[rng.random(shape) < 0.15] = np.nan
        x[rng.random(shape) < 0.05] = -np.inf
    got = fl.nn.functional.max_pool2d(fl.tensor(x), k, s, p, d, ceil, True)
    want = torch.nn.functional.max_pool2d(torch.tensor(x), k, s, p, d, ceil, True)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    if dtype in ("float32", "uint8") and cpu_kernels.available():
        assert calls == [(s or k) if isinstance(s or k, int) else (s or k)[1]]   # the C++ kernel ran, column stride


GRAD_CASES = CASES + [  # disjoint windows (stride >= extent: the indexed-assignment backward) and overlapping ones
    ((2, 3, 9, 11), 2, 3, 1, 1, True),
    ((2, 3, 9, 11), 2, 2, 0, 2, False),
    ((2, 3, 9, 11), (2, 1), (3, 1), 0, (2, 1), False),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"_k{c[1]}_s{c[2]}_p{c[3]}_d{c[4]}")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_pool2d_gradient_goes_to_the_chosen_index_bit_for_bit(case, dtype):
    shape, k, s, p, d, ceil = case
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 2, shape).astype(dtype)          # ties, NaN and -inf: the forward's index gets the gradient
    x[rng.random(shape) < 0.15] = np.nan
    x[rng.random(shape) < 0.05] = -np.inf
    a, b = fl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = fl.nn.functional.max_pool2d(a, k, s, p, d, ceil)
    g = (np.round(rng.standard_normal(tuple(out.shape)) * 8) / 8).astype(dtype)   # overlapping sums exact in any order
    g.reshape(-1)[::4] = -0.0                              # -0.0 + 0 = +0.0 where ATen accumulates
    g.reshape(-1)[1::7] = np.nan
    out.backward(fl.tensor(g))
    torch.nn.functional.max_pool2d(b, k, s, p, d, ceil).backward(torch.tensor(g))
    np.testing.assert_array_equal(a.grad.numpy().view(f"u{x.itemsize}"), b.grad.numpy().view(f"u{x.itemsize}"))


def test_max_pool3d_and_1d_strided_windows_as_pytorch():
    rng = np.random.default_rng(1)
    x = rng.integers(-2, 2, (1, 2, 5, 6, 7)).astype(np.float32)
    for fn, arr, args in (("max_pool3d", x, (2, None, 0, 1, True)), ("max_pool1d", x[0, 0], (2, 1, 0, 2, False))):
        got = getattr(fl.nn.functional, fn)(fl.tensor(arr), *args, return_indices=True)
        want = getattr(torch.nn.functional, fn)(torch.tensor(arr), *args, return_indices=True)
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())


SPECIALS = [-1.0, -0.0, 0.0, np.nan, -np.nan, 2.0, np.inf, -np.inf, 1e-45, -1e-45]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int64"])
def test_relu_and_its_gradient_bit_for_bit_as_pytorch(dtype, monkeypatch):
    """Values, gradients and signs of zero (also of a -0.0 gradient) as PyTorch's; float32/float64 run the
    one-pass C++ select forward and backward (`cpu_kernels.zero_where_negative`)."""
    calls = []
    key = ("zero_where_negative", np.dtype(dtype))
    if cpu_kernels.available() and key in cpu_kernels._state:
        real = cpu_kernels._state[key]
        monkeypatch.setitem(cpu_kernels._state, key, lambda *a: calls.append(a[4]) or real(*a))
    rng = np.random.default_rng(2)
    x = np.concatenate([np.array(SPECIALS if dtype.startswith("float") else [-3, 0, 5, 1]), rng.standard_normal(64) * 9])
    x = x.astype(dtype).reshape(-1, 2)
    g = np.where(np.arange(x.size) % 3 == 0, np.inf, np.arange(x.size) - 7.0).reshape(x.shape).astype(dtype) \
        if dtype.startswith("float") else None
    if g is not None:
        g[::5, 1] = -0.0
    got, want = fl.relu(fl.tensor(x)).numpy(), torch.relu(torch.tensor(x)).numpy()
    np.testing.assert_array_equal(got.view(f"u{x.itemsize}"), want.view(f"u{x.itemsize}"))    # sign of zeros too
    if g is not None:
        a, b = fl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        fl.relu(a).backward(fl.tensor(g))
        torch.relu(b).backward(torch.tensor(g))
        np.testing.assert_array_equal(a.grad.numpy().view(f"u{x.itemsize}"), b.grad.numpy().view(f"u{x.itemsize}"))
    if dtype in ("float32", "float64") and cpu_kernels.available():
        assert calls == [0, 0, 1]       # relu of x, relu of the leaf, the backward's inclusive select


def test_max_pool2d_backward_of_overlapping_windows_adds_in_float32_as_aten():
    """Overlapping windows (3x3, stride 1): an input position gets several gradients, added in float32
    in ATen's order (the C++ scatter-add), so arbitrary float32 gradients match PyTorch bit for bit."""
    rng = np.random.default_rng(5)
    x = rng.integers(-1, 2, (3, 4, 12, 12)).astype(np.float32)        # ties: a position wins many windows
    a, b = fl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = fl.nn.functional.max_pool2d(a, 3, 1)
    g = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    out.backward(fl.tensor(g))
    torch.nn.functional.max_pool2d(b, 3, 1).backward(torch.tensor(g))
    np.testing.assert_array_equal(a.grad.numpy().view(np.uint32), b.grad.numpy().view(np.uint32))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_padded_max_pool_picks_atens_index_where_a_window_holds_only_the_lowest_value(nd):
    """Padding (and ceil_mode, dilation): the planes are padded with -inf (an integer's minimum) and
    pooled inside; a window starting in the padding whose elements are all -inf (or all the minimum)
    takes ATen's first position inside the plane (start moved on by whole dilations). 60 random
    geometries per rank vs PyTorch, values and indices (was: 49 of 580 such cases off)."""
    rng = np.random.default_rng(nd)
    checked = 0
    for _ in range(60):
        S = tuple(int(v) for v in rng.integers(3, 9, nd))
        ks, dl, st = (tuple(int(v) for v in rng.integers(lo, hi, nd)) for lo, hi in ((1, 4), (1, 3), (1, 4)))
        pd = tuple(int(rng.integers(0, k // 2 + 1)) for k in ks)
        ceil = bool(rng.integers(0, 2))
        x = rng.standard_normal((2, 3) + S).astype(np.float32)
        x[rng.random(x.shape) < 0.6] = -np.inf
        for arr in (x, np.where(np.isinf(x), np.iinfo(np.int64).min, 1).astype(np.int64)):
            try:
                want = getattr(torch.nn.functional, f"max_pool{nd}d")(torch.tensor(arr), ks, st, pd, dl, ceil, True)
            except RuntimeError:
                continue            # a geometry PyTorch refuses
            got = getattr(fl.nn.functional, f"max_pool{nd}d")(fl.tensor(arr), ks, st, pd, dl, ceil, True)
            np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
            np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
            checked += 1
    assert checked > 60


DIRECT_CONV_CASES = [  # (N, C, H, W, O, kernel, stride, padding, dilation, bias)
    (3, 1, 28, 28, 8, (3, 3), 1, 0, 1, True),
    (2, 8, 13, 13, 16, (3, 3), 1, 0, 1, True),
    (2, 16, 11, 11, 8, (3, 3), 1, 2, 1, False),            # an input gradient's padded adjoint
    (2, 3, 9, 40, 12, (3, 5), (2, 1), (1, 2), (2, 2), True),  # 36 columns: two chunks and a tail; row stride 2
    (1, 2, 5, 6, 3, (2, 2), 1, (1, 3), 1, False),            # padding wider than the kernel reach
]


@pytest.mark.parametrize("case", DIRECT_CONV_CASES, ids=lambda c: f"n{c[0]}c{c[1]}o{c[4]}w{c[3]}")
def test_conv2d_with_few_output_channels_runs_direct_as_pytorch(case, monkeypatch):
    """float32 convolutions with <= 16 output channels and column stride 1 run `flm_conv2d_direct` (no
    column panels) and match PyTorch's float64 result to float32 accuracy."""
    if not cpu_kernels.available():
        pytest.skip("no C++ kernels here")
    n, c, h, w, o, k, s, p, d, with_bias = case
    calls = []
    real = cpu_kernels._state["conv2d_direct"]
    monkeypatch.setitem(cpu_kernels._state, "conv2d_direct", lambda *a: calls.append(a[4]) or real(*a))
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c) + k).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if with_bias else None
    got = fl.nn.functional.conv2d(fl.tensor(x), fl.tensor(wt), None if b is None else fl.tensor(b), s, p, d)
    want = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64),
                                      None if b is None else torch.tensor(b, dtype=torch.float64), s, p, d)
    assert calls == [o]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
