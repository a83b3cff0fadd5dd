"""Dynamically quantized GRU and recurrent cells vs PyTorch's (`quantize_dynamic` default spec): the
same int8 weights, outputs and states equal to `quantized_gru` / `quantized_*_cell_dynamic` to float
rounding of the gates, while the int8 effect vs the float module is ~1e-3."""
import warnings

import numpy as np
import pytest
import torch

import flambeau

warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
warnings.filterwarnings("ignore", category=DeprecationWarning)

ATOL = 2e-6          # float rounding of the gates; one int8 step of a hidden state is ~1e-2


def _copy_weights(ours, ref):
    ours.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})


def _assert_quantized_match(got, want, floats):
    for g, w, f in zip(got, want, floats):
        np.testing.assert_allclose(g, w, rtol=0, atol=ATOL)
        assert np.abs(g - f).max() > 1e-4          # quantized: not the float module


GRU_CASES = {  # input size, hidden, layers, bidirectional, batch_first, (T, B), initial state
    "one_layer": (10, 16, 1, False, False, (6, 3), False),
    "two_layers_bidirectional_batch_first": (8, 12, 2, True, True, (7, 2), False),
    "initial_state": (6, 20, 1, False, False, (12, 4), True),
}


@pytest.mark.parametrize("case", list(GRU_CASES))
def test_quantize_dynamic_gru_matches_pytorch(case):
    """The default spec swaps nn.GRU as PyTorch's does; output and final state equal its `quantized_gru`."""
    size, hidden, layers, bi, bf, (T, B), with_state = GRU_CASES[case]
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.GRU(size, hidden, layers, bidirectional=bi, batch_first=bf)).eval()
    ours = flambeau.nn.Sequential(flambeau.nn.GRU(size, hidden, layers, bidirectional=bi, batch_first=bf)).eval()
    _copy_weights(ours, ref)
    qr, qo = torch.ao.quantization.quantize_dynamic(ref), flambeau.ao.quantization.quantize_dynamic(ours)
    assert type(qo[0]) is flambeau.ao.nn.quantized.dynamic.GRU
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, size) if bf else (T, B, size)).astype(np.float32)
    h0 = rng.standard_normal((layers * (2 if bi else 1), B, hidden)).astype(np.float32)
    args_r = (torch.tensor(x),) + ((torch.tensor(h0),) if with_state else ())
    args_o = (flambeau.tensor(x),) + ((flambeau.tensor(h0),) if with_state else ())
    with torch.no_grad():
        want = [t.numpy() for t in qr[0](*args_r)]
    got = [t.detach().numpy() for t in qo[0](*args_o)]
    _assert_quantized_match(got, want, [t.detach().numpy() for t in ours[0](*args_o)])


CELLS = ["RNNCell", "RNNCell-relu", "LSTMCell", "GRUCell"]


def _cell(m, name, size, hidden):
    cls, _, nonlinearity = name.partition("-")
    return getattr(m.nn, cls)(size, hidden, **({"nonlinearity": nonlinearity} if nonlinearity else {}))


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("with_state", [False, True])
def test_quantize_dynamic_cells_match_pytorch(name, with_state):
    """Three steps of each cell, the state fed back: equal to PyTorch's dynamic cells at every step."""
    torch.manual_seed(1)
    ref = torch.nn.Sequential(_cell(torch, name, 12, 24))
    ours = flambeau.nn.Sequential(_cell(flambeau, name, 12, 24))
    _copy_weights(ours, ref)
    qr, qo = torch.ao.quantization.quantize_dynamic(ref), flambeau.ao.quantization.quantize_dynamic(ours)
    assert type(qo[0]).__name__ == name.partition("-")[0] and type(qo[0]).__module__.startswith(
        "flambeau.ao.nn.quantized.dynamic")
    np.testing.assert_array_equal(qo[0].get_weight()["weight_hh"].int_repr().numpy(),
                                  qr[0].get_weight()["weight_hh"].int_repr().numpy())
    rng = np.random.default_rng(6)
    xs = [(rng.standard_normal((4, 12)) * s).astype(np.float32) for s in (1.0, 3.0, 0.2)]
    n_states = 2 if name == "LSTMCell" else 1
    state = [rng.standard_normal((4, 24)).astype(np.float32) for _ in range(n_states)] if with_state else None
    s_r = s_o = s_f = None
    if state is not None:
        pack = (lambda m: tuple(m.tensor(s) for s in state)) if n_states == 2 else (lambda m: m.tensor(state[0]))
        s_r, s_o, s_f = pack(torch), pack(flambeau), pack(flambeau)
    for x in xs:
        with torch.no_grad():
            s_r = qr[0](torch.tensor(x), s_r)
        s_o, s_f = qo[0](flambeau.tensor(x), s_o), ours[0](flambeau.tensor(x), s_f)
        as_list = (lambda s, conv: [conv(t) for t in s]) if n_states == 2 else (lambda s, conv: [conv(s)])
        _assert_quantized_match(as_list(s_o, lambda t: t.detach().numpy()), as_list(s_r, lambda t: t.numpy()),
                                as_list(s_f, lambda t: t.detach().numpy()))


def test_dynamic_cells_refuse_what_pytorchs_refuse():
    cell = flambeau.ao.quantization.quantize_dynamic(flambeau.nn.Sequential(flambeau.nn.GRUCell(4, 6)))[0]
    with pytest.raises(RuntimeError, match="input has inconsistent input_size: got 5, expected 4"):
        cell(flambeau.zeros(2, 5))
    with pytest.raises(RuntimeError, match=r"Input batch size 2 doesn't match hidden batch size 3"):
        cell(flambeau.zeros(2, 4), flambeau.zeros(3, 6))
    with pytest.raises(RuntimeError, match="hidden has inconsistent hidden_size: got 5, expected 6"):
        cell(flambeau.zeros(2, 4), flambeau.zeros(2, 5))
    with pytest.raises(IndexError):
        cell(flambeau.zeros(4))


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_quantize_dynamic_packed_sequences_match_pytorch(name):
    """Unsorted packed sequences through 2 bidirectional layers: each step quantizes the hidden state of
    the running sequences only, as ATen's PackedLayer (the whole padded batch's range differs by ~1e-3)."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(getattr(torch.nn, name)(6, 10, 2, bidirectional=True))
    ours = flambeau.nn.Sequential(getattr(flambeau.nn, name)(6, 10, 2, bidirectional=True))
    _copy_weights(ours, ref)
    qr, qo = torch.ao.quantization.quantize_dynamic(ref), flambeau.ao.quantization.quantize_dynamic(ours)
    x = (np.random.default_rng(0).standard_normal((7, 3, 6)) * 2).astype(np.float32)
    lens = [5, 7, 2]
    with torch.no_grad():
        out_r, state_r = qr[0](torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), lens, enforce_sorted=False))
    po = flambeau.nn.utils.rnn.pack_padded_sequence(flambeau.tensor(x), lens, enforce_sorted=False)
    out_o, state_o = qo[0](po)
    _, state_f = ours[0](po)
    first = (lambda s: s[0]) if name == "LSTM" else (lambda s: s)
    np.testing.assert_allclose(out_o.data.detach().numpy(), out_r.data.numpy(), rtol=0, atol=ATOL)
    _assert_quantized_match([first(state_o).detach().numpy()], [first(state_r).numpy()],
                            [first(state_f).detach().numpy()])


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_dynamic_cells_print_as_pytorch(kind):
    kwargs = {"nonlinearity": "relu"} if kind == "RNNCell" else {}
    mods = [m.nn.Sequential(getattr(m.nn, kind)(4, 3, **kwargs)) for m in (flambeau, torch)]
    ours = flambeau.ao.quantization.quantize_dynamic(mods[0], dtype=flambeau.qint8)[0]
    theirs = torch.ao.quantization.quantize_dynamic(mods[1], dtype=torch.qint8)[0]
    assert type(ours).__module__.startswith("flambeau.ao.nn.quantized.dynamic"), type(ours)
    assert ours.extra_repr() == theirs.extra_repr()


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell", "LSTM", "GRU"])
def test_quantize_dynamic_refuses_bias_free_recurrent_modules_as_pytorch(kind):
    """PyTorch's dynamic recurrent layers and cells have no bias-free form: quantize_dynamic of one
    raises AssertionError("mod.bias must be True"), ours the same (was: converted)."""
    errors = []
    for m in (torch, flambeau):
        with pytest.raises(AssertionError, match="mod.bias must be True") as info:
            m.ao.quantization.quantize_dynamic(m.nn.Sequential(getattr(m.nn, kind)(4, 3, bias=False)))
        errors.append(info.type)
    assert errors[0] is errors[1]
    assert kind in str(info.value)                 # ours names the module
