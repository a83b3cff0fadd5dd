"""Observers and eager dynamic quantization vs PyTorch: the same statistics, scales and zero points
on the same data; `quantize_dynamic` models' weights and outputs."""
import warnings

import numpy as np
import pytest
import torch

import flambeau

warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")


def _batches(shape=(8, 16), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * s + o).astype(np.float32)
            for s, o in [(1, 0), (2, 0.5), (0.5, -1), (3, 0), (0.1, 4)]]


OBSERVERS = [
    ("MinMaxObserver", {}),
    ("MinMaxObserver", {"dtype": "qint8", "qscheme": "per_tensor_symmetric"}),
    ("MinMaxObserver", {"dtype": "quint8", "qscheme": "per_tensor_symmetric"}),
    ("MinMaxObserver", {"quant_min": 0, "quant_max": 127}),
    ("MinMaxObserver", {"dtype": "qint8", "reduce_range": True}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 0.1}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1, "dtype": "qint8", "qscheme": "per_channel_symmetric"}),
    ("PerChannelMinMaxObserver", {"ch_axis": 0}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1, "qscheme": "per_channel_affine_float_qparams"}),
    ("MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1, "averaging_constant": 0.2}),
    ("HistogramObserver", {}),
    ("HistogramObserver", {"dtype": "qint8", "qscheme": "per_tensor_symmetric", "bins": 256}),
    ("HistogramObserver", {"quant_min": 0, "quant_max": 127, "eps": 2 ** -12}),
]


def _make(module, name, kwargs):
    kw = {k: getattr(module, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    return getattr(module.ao.quantization, name)(**kw)


@pytest.mark.parametrize("name,kwargs", OBSERVERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OBSERVERS)])
def test_observer_statistics_and_qparams_match_pytorch(name, kwargs):
    ours, ref = _make(flambeau, name, kwargs), _make(torch, name, kwargs)
    for x in _batches():
        out = ours(flambeau.tensor(x))
        ref(torch.tensor(x))
        np.testing.assert_array_equal(out.numpy(), x)               # observers pass their input on
    for buf in ("min_val", "max_val", "histogram"):
        if hasattr(ref, buf):
            np.testing.assert_array_equal(getattr(ours, buf).numpy(), getattr(ref, buf).numpy(), err_msg=buf)
    s, z = ours.calculate_qparams()
    rs, rz = ref.calculate_qparams()
    assert str(s.dtype) == str(rs.dtype) and str(z.dtype) == str(rz.dtype)
    np.testing.assert_array_equal(s.numpy(), rs.numpy())
    np.testing.assert_array_equal(z.numpy(), rz.numpy())


def test_histogram_observer_growing_range_and_infinities():
    """New data beyond the range re-bins the old histogram (upsampled) as PyTorch's does."""
    ours, ref = flambeau.ao.quantization.HistogramObserver(bins=64), torch.ao.quantization.HistogramObserver(bins=64)
    rng = np.random.default_rng(7)
    for scale in (0.5, 1.0, 4.0, 2.0, 16.0):
        x = (rng.standard_normal(500) * scale).astype(np.float32)
        ours(flambeau.tensor(x))
        ref(torch.tensor(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours(flambeau.tensor([1.0, float("inf")]))
        ref(torch.tensor([1.0, float("inf")]))
    np.testing.assert_array_equal(ours.histogram.numpy(), ref.histogram.numpy())
    for a, b in zip(ours.calculate_qparams(), ref.calculate_qparams()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("weight", [False, True], ids=["activation", "per_channel_weight"])
def test_fused_moving_average_fake_quantize_qparams_and_values_match_pytorch(weight):
    """FusedMovingAvgObsFakeQuantize fake-quantizes with the qparams of PyTorch's fused op (FBGEMM's
    ChooseQuantizationParams, sparsity preserved for the symmetric weights: scale = max(-min/128, max/127)
    per channel, not the observer's max(-min, max)/127.5), over 4 steps of a moving range: channels of both
    signs, all positive, all negative, tiny (FBGEMM's smallest scale); scales, zero points and outputs
    bit for bit. The observer's own qparams (what convert uses) stay the observer's."""
    rng = np.random.default_rng(0)
    made = []
    for lib in (torch, flambeau):
        if weight:
            made.append(lib.ao.quantization.FusedMovingAvgObsFakeQuantize(
                observer=lib.ao.quantization.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                dtype=lib.int8, qscheme=lib.per_channel_symmetric, ch_axis=0, eps=2 ** -12))
        else:
            made.append(lib.ao.quantization.FusedMovingAvgObsFakeQuantize(quant_min=0, quant_max=255,
                                                                          dtype=lib.quint8, eps=2 ** -12))
    theirs, ours = made
    for _ in range(4):
        if weight:
            x = (rng.standard_normal((6, 3, 2, 2)) * rng.uniform(1e-6, 2, (6, 1, 1, 1))).astype(np.float32)
            x[4], x[3] = np.abs(x[4]) + 0.1, -np.abs(x[3])
        else:
            x = (rng.standard_normal(50) * 3 + rng.uniform(-2, 2)).astype(np.float32)
        want, got = theirs(torch.tensor(x)).numpy(), ours(flambeau.tensor(x)).numpy()
        np.testing.assert_array_equal(ours.scale.numpy(), theirs.scale.numpy())
        np.testing.assert_array_equal(ours.zero_point.numpy(), theirs.zero_point.numpy())
        np.testing.assert_array_equal(got, want)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_observer_errors_and_defaults():
    with pytest.raises(NotImplementedError):
        flambeau.ao.quantization.MinMaxObserver(qscheme=flambeau.per_channel_affine)
    with pytest.raises(NotImplementedError):
        flambeau.ao.quantization.PerChannelMinMaxObserver(qscheme=flambeau.per_tensor_affine)
    with pytest.warns(UserWarning, match="must run observer"):
        s, z = flambeau.ao.quantization.MinMaxObserver().calculate_qparams()
    assert s.tolist() == [1.0] and z.tolist() == [0]


def _mlp(m, seed=0):
    m.manual_seed(seed)
    return m.nn.Sequential(m.nn.Linear(32, 64), m.nn.ReLU(), m.nn.Linear(64, 64), m.nn.Sequential(
        m.nn.ReLU(), m.nn.Linear(64, 10, bias=False)))


def _pair():
    ref = _mlp(torch)
    ours = _mlp(flambeau)
    ours.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    return ours, ref


@pytest.mark.parametrize("scale", [2.0, 1e-3, 100.0])
def test_quantize_dynamic_linear_matches_pytorch(scale):
    ours, ref = _pair()
    qo = flambeau.ao.quantization.quantize_dynamic(ours, {flambeau.nn.Linear}, dtype=flambeau.qint8)
    qr = torch.ao.quantization.quantize_dynamic(ref, {torch.nn.Linear}, dtype=torch.qint8)
    assert isinstance(ours[0], flambeau.nn.Linear)                     # not in place: the float model is kept
    for a, b in ((qo[0], qr[0]), (qo[2], qr[2]), (qo[3][1], qr[3][1])):
        assert type(a).__name__ == "Linear" and a.weight().is_quantized
        np.testing.assert_array_equal(a.weight().int_repr().numpy(), b.weight().int_repr().numpy())
        assert a.weight().q_scale() == b.weight().q_scale()
    x = (np.random.default_rng(3).standard_normal((16, 32)) * scale).astype(np.float32)
    got, want = qo(flambeau.tensor(x)).numpy(), qr(torch.tensor(x)).detach().numpy()
    # PyTorch's own tolerance for dynamic linear is a quantization step; we match its arithmetic
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * max(1.0, float(np.abs(want).max())))
    assert np.abs(got - qo.__class__.__call__(ours, flambeau.tensor(x)).detach().numpy()).max() > 0


def test_quantize_dynamic_by_name_and_3d_input():
    ours, ref = _pair()
    qo = flambeau.ao.quantization.quantize_dynamic(ours, {"2"})
    qr = torch.ao.quantization.quantize_dynamic(ref, {"2"})
    assert isinstance(qo[0], flambeau.nn.Linear) and not isinstance(qo[2], flambeau.nn.Linear)
    x = np.random.default_rng(4).standard_normal((3, 5, 32)).astype(np.float32)
    np.testing.assert_allclose(qo(flambeau.tensor(x)).detach().numpy(), qr(torch.tensor(x)).detach().numpy(),
                               rtol=0, atol=1e-6)


class _RNNModel:
    """An embedding-free language-model body: LSTM then a Linear decoder, built from either library."""

    @staticmethod
    def build(m, input_size, hidden, layers, bidirectional, batch_first):
        class Model(m.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = m.nn.LSTM(input_size, hidden, layers, bidirectional=bidirectional, batch_first=batch_first)
                self.dec = m.nn.Linear(hidden * (2 if bidirectional else 1), 5)

            def forward(self, x, hx=None):
                out, (h, c) = self.rnn(x, hx)
                return self.dec(out), h, c
        return Model().eval()


LSTM_CASES = {  # input size, hidden, layers, bidirectional, batch_first, (T, B), initial state
    "one_layer": (10, 16, 1, False, False, (6, 3), False),
    "two_layers_bidirectional_batch_first": (8, 12, 2, True, True, (7, 2), False),
    "initial_state": (6, 20, 1, False, False, (12, 4), True),
}


@pytest.mark.parametrize("case", list(LSTM_CASES))
def test_quantize_dynamic_lstm_matches_pytorch(case):
    """The default `quantize_dynamic` (no qconfig_spec) swaps nn.LSTM and nn.Linear as PyTorch's does; the
    dynamically quantized LSTM's outputs and final states equal PyTorch's `quantized_lstm` to float
    rounding of the gates (the int8 effect itself, vs the float model, is ~1e-3)."""
    size, hidden, layers, bi, bf, (T, B), with_state = LSTM_CASES[case]
    torch.manual_seed(0)
    ref = _RNNModel.build(torch, size, hidden, layers, bi, bf)
    ours = _RNNModel.build(flambeau, size, hidden, layers, bi, bf)
    ours.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    qr = torch.ao.quantization.quantize_dynamic(ref)
    qo = flambeau.ao.quantization.quantize_dynamic(ours)
    assert type(qo.rnn).__module__.startswith("flambeau.ao.nn.quantized.dynamic") and type(qo.dec).__name__ == "Linear"
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, size) if bf else (T, B, size)).astype(np.float32)
    state = [rng.standard_normal((layers * (2 if bi else 1), B, hidden)).astype(np.float32) for _ in range(2)]
    args_r = (torch.tensor(x), tuple(torch.tensor(s) for s in state) if with_state else None)
    args_o = (flambeau.tensor(x), tuple(flambeau.tensor(s) for s in state) if with_state else None)
    with torch.no_grad():
        want = [t.numpy() for t in qr(*args_r)]
    got = [t.detach().numpy() for t in qo(*args_o)]
    floats = [t.detach().numpy() for t in ours(*args_o)]
    for g, w, f in zip(got, want, floats):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6)
        assert np.abs(g - f).max() > 1e-4          # quantized: not the float model
