"""int8 average pooling (`aten._avg_pool2d_int8`, `flambeau/_ops/quantized_pool.py`) vs PyTorch's quantized
avg_pool2d / adaptive_avg_pool2d on quint8/qint8 tensors with equal input and output qparams (what PT2E's
shared observers give): int_repr bit for bit on channels-last tensors (PyTorch's vectorised channel
lanes) and contiguous ones with an even zero point; the C++ kernel and the NumPy path. The compiled
PT2E models are in tests/test_quantization_pt2e.py."""
import numpy as np
import pytest
import torch

import flambeau
from flambeau._backends import cpu_kernels
from flambeau._ops import quantized_pool as QP

CASES = [  # (N, C, H, W, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, zp, channels_last)
    (2, 32, 9, 9, 3, 2, 1, False, True, None, 128, True),
    (2, 32, 9, 9, 3, 2, 1, False, False, None, 3, True),
    (1, 16, 8, 8, 2, 2, 0, False, True, None, 7, True),
    (2, 48, 7, 7, 7, 1, 0, False, True, None, 0, True),
    (1, 16, 10, 9, (3, 2), (2, 1), (1, 0), True, False, None, 100, True),
    (1, 32, 6, 6, 2, None, 0, False, True, 3, 5, True),
    (2, 5, 7, 7, 3, 2, 1, False, True, None, 128, False),
]


@pytest.fixture(params=["cpp", "numpy"])
def path(request, monkeypatch):
    """The C++ kernel, or the NumPy path (the kernel declining)."""
    if request.param == "numpy":
        monkeypatch.setattr(cpu_kernels, "avg_pool2d_int8", lambda *a: False)
    elif not cpu_kernels.available():
        pytest.skip("no C++ kernels on this machine")
    return request.param


def _pair(x, zp, cl):
    """PyTorch's quantized tensor over the integers x (quint8 from uint8, qint8 from int8) and flambeau's x."""
    tq = torch._make_per_tensor_quantized_tensor(torch.tensor(x), 0.1, zp)
    fx = flambeau.tensor(x)
    if cl:
        tq, fx = tq.contiguous(memory_format=torch.channels_last), fx.contiguous(memory_format=flambeau.channels_last)
    return tq, fx


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("signed", [False, True])
def test_int8_avg_pool_equals_pytorchs_quantized_avg_pool2d(case, signed, path):
    N, C, H, W, ks, st, pd, ceil, cip, div, zp, cl = CASES[case]
    rng = np.random.default_rng(case)
    lo, hi = (-128, 127) if signed else (0, 255)
    zp = zp - 128 if signed else zp
    x = rng.integers(lo, hi + 1, (N, C, H, W)).astype(np.int8 if signed else np.uint8)
    tq, fx = _pair(x, zp, cl)
    want = torch.nn.functional.avg_pool2d(tq, ks, st, pd, ceil, cip, div)
    win = QP.avg_pool2d_windows(H, W, ks, st, pd, ceil, cip, div)
    got = flambeau.ops.aten._avg_pool2d_int8(fx, *win[0], *win[1], zp)
    assert got.dtype == (flambeau.int8 if signed else flambeau.uint8)
    assert tuple(got.shape) == tuple(want.shape) and got.stride() == want.stride()
    np.testing.assert_array_equal(got.numpy(), want.int_repr().numpy())


@pytest.mark.parametrize("out_size", [(1, 1), (3, 2), (4, 4)])
def test_int8_adaptive_avg_pool_equals_pytorchs(out_size, path):
    """adaptive=True: PyTorch's adaptive pool rounds acc * (1 / (1 / m)) + zp in one FMA (its quantize_val);
    7 -> 3 by 7 -> 2 has divisor 12 and a zero point of 131, so halves occur and the rounding is seen."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (2, 32, 7, 7)).astype(np.uint8)
    tq, fx = _pair(x, 131, True)
    want = torch.nn.functional.adaptive_avg_pool2d(tq, out_size)
    win = QP.adaptive_avg_pool2d_windows(7, 7, out_size)
    got = flambeau.ops.aten._avg_pool2d_int8(fx, *win[0], *win[1], 131, True)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.int_repr().numpy())


def test_remainder_channels_differ_from_pytorch_only_at_ties():
    """PyTorch rounds its channels past the last 16-lane vector as quantize_val (the zero point added before
    rounding) and the vector lanes as nearbyint(acc * m) + zp: with an odd zero point and an even divisor
    the two disagree on exact halves. This kernel rounds every channel as the lanes: one integer at most."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (2, 7, 8, 8)).astype(np.uint8)
    tq, fx = _pair(x, 9, True)
    want = torch.nn.functional.avg_pool2d(tq, 2).int_repr().numpy().astype(int)
    win = QP.avg_pool2d_windows(8, 8, 2, 2, 0)
    got = flambeau.ops.aten._avg_pool2d_int8(fx, *win[0], *win[1], 9).numpy().astype(int)
    diff = np.abs(got - want)
    assert diff.max() == 1
    acc = x.astype(int).reshape(2, 7, 4, 2, 4, 2).sum((3, 5)) - 4 * 9
    assert np.all(acc[diff.astype(bool)] % 4 == 2)          # exactly the halves


def test_taps_windows_recognise_average_pools_not_interpolations():
    x = flambeau.randn(1, 2, 9, 9)
    tables = {}
    import flambeau._ops.nn_pool as nn_pool
    orig = nn_pool._taps_gather

    def spy(inp, idx, w):
        tables["t"] = [t.numpy() for t in idx], [t.numpy() for t in w]
        return orig(inp, idx, w)
    try:
        nn_pool._taps_gather = spy
        flambeau.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        win = tuple(QP.taps_windows(i, w) for i, w in zip(*tables["t"]))
        assert win == tuple(tuple(list(v) for v in d) for d in QP.avg_pool2d_windows(9, 9, 3, 2, 1, False, False))
        flambeau.nn.functional.adaptive_avg_pool2d(x, (4, 3))
        win = tuple(QP.taps_windows(i, w) for i, w in zip(*tables["t"]))
        assert win == QP.adaptive_avg_pool2d_windows(9, 9, (4, 3))
        flambeau.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
        assert all(QP.taps_windows(i, w) is None for i, w in zip(*tables["t"]))
    finally:
        nn_pool._taps_gather = orig


def test_errors_name_the_op():
    win = QP.avg_pool2d_windows(4, 4, 2)
    with pytest.raises(RuntimeError, match="_avg_pool2d_int8: expected a 4-D uint8 or int8 input"):
        flambeau.ops.aten._avg_pool2d_int8(flambeau.randn(1, 2, 4, 4), *win[0], *win[1], 0)
    with pytest.raises(RuntimeError, match="does not fit a dim of size 3"):
        flambeau.ops.aten._avg_pool2d_int8(flambeau.zeros(1, 2, 3, 4, dtype=flambeau.uint8), *win[0], *win[1], 0)
