"""optim.LBFGS vs PyTorch's from identical float64 weights: the loss each step returns, the trained
weights, the closure-call count and the history kept (plain steps of lr, strong-Wolfe line search,
a short history that drops old pairs); a serialized numpy array loaded with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (what pytorch/examples' time_sequence_prediction does)."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

import flambeau as fl
import flambeau.nn as fnn


def mlp(nn):
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def twin():
    torch.manual_seed(0)
    tm = mlp(torch.nn).double()
    fm = mlp(fnn).double()
    fm.load_state_dict(OrderedDict((k, fl.tensor(v.numpy())) for k, v in tm.state_dict().items()))
    return tm, fm


def data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 3))
    y = np.sin(x @ np.array([[1.0], [-2.0], [0.5]])) + 0.1 * x[:, :1] ** 2
    return x, y


def train(lib, model, opt, x, y, steps):
    calls = [0]
    losses = []
    xt, yt = lib.tensor(x), lib.tensor(y)

    def closure():
        calls[0] += 1
        opt.zero_grad()
        loss = lib.nn.functional.mse_loss(model(xt), yt)
        loss.backward()
        return loss

    for _ in range(steps):
        losses.append(float(opt.step(closure)))
    return np.array(losses), calls[0]


@pytest.mark.parametrize("kwargs", [
    dict(lr=0.8),
    dict(lr=1, line_search_fn="strong_wolfe"),
    dict(lr=0.5, history_size=3, max_iter=7),
    dict(lr=1, history_size=2, max_iter=5, line_search_fn="strong_wolfe", tolerance_change=1e-12),
    dict(lr=0.01, max_iter=6, line_search_fn="strong_wolfe"),      # the first trial too short: t grows
    dict(lr=30, max_iter=6, line_search_fn="strong_wolfe"),        # too long: zooms in
])
def test_lbfgs_matches_pytorch(kwargs):
    x, y = data()
    tm, fm = twin()
    to, fo = torch.optim.LBFGS(tm.parameters(), **kwargs), fl.optim.LBFGS(fm.parameters(), **kwargs)
    lt, ct = train(torch, tm, to, x, y, 4)
    lf, cf = train(fl, fm, fo, x, y, 4)
    assert lt[-1] < 0.9 * lt[0]                  # the reference did optimise
    np.testing.assert_allclose(lf, lt, rtol=1e-9, atol=1e-12)
    assert cf == ct
    for (name, pt), pf in zip(tm.named_parameters(), fm.parameters()):
        # float64 rounding, amplified by four line searches, relative to the tensor's scale: an element near zero
        # (2.weight[0, 5] = 0.0256 of a row up to 3.7) differs by ~1e-9 of that scale under NumPy 2.4.6's OpenBLAS 0.3.31
        ref = pt.detach().numpy()
        np.testing.assert_allclose(pf.detach().numpy(), ref, rtol=1e-7, atol=1e-8 * np.abs(ref).max(), err_msg=name)
    st, sf = to.state[next(tm.parameters())], fo.state[next(fm.parameters())]
    assert (sf["func_evals"], sf["n_iter"], len(sf["old_dirs"])) == (st["func_evals"], st["n_iter"],
                                                                      len(st["old_dirs"]))


def test_lbfgs_float32_lstm_cell_steps_match_pytorch():
    torch.manual_seed(1)
    tc, tl = torch.nn.LSTMCell(1, 5), torch.nn.Linear(5, 1)
    fc, fl_ = fnn.LSTMCell(1, 5), fnn.Linear(5, 1)
    fc.load_state_dict(OrderedDict((k, fl.tensor(v.numpy())) for k, v in tc.state_dict().items()))
    fl_.load_state_dict(OrderedDict((k, fl.tensor(v.numpy())) for k, v in tl.state_dict().items()))
    seq = np.sin(np.arange(12, dtype=np.float32)[None, :] / 3 + np.arange(4, dtype=np.float32)[:, None])

    def run(lib, cell, lin):
        opt = lib.optim.LBFGS(list(cell.parameters()) + list(lin.parameters()), lr=0.8)
        inp, tgt = lib.from_numpy(seq[:, :-1].copy()), lib.from_numpy(seq[:, 1:].copy())

        def closure():
            opt.zero_grad()
            h = c = lib.zeros(4, 5)
            outs = []
            for xt in inp.split(1, dim=1):
                h, c = cell(xt, (h, c))
                outs.append(lin(h))
            loss = lib.nn.MSELoss()(lib.cat(outs, dim=1), tgt)
            loss.backward()
            return loss
        return [float(opt.step(closure)) for _ in range(2)]

    lt, lf = run(torch, tc, tl), run(fl, fc, fl_)
    assert lt[1] < lt[0]
    np.testing.assert_allclose(lf, lt, rtol=1e-3)


def test_lbfgs_errors_like_pytorch():
    p = fnn.Parameter(fl.zeros(2))
    with pytest.raises(ValueError, match="parameter groups"):
        fl.optim.LBFGS([{"params": [p]}, {"params": [fnn.Parameter(fl.zeros(1))]}])
    with pytest.raises(ValueError, match="Invalid learning rate"):
        fl.optim.LBFGS([p], lr=-1)
    with pytest.raises(RuntimeError, match="strong_wolfe"):
        fl.optim.LBFGS([p], line_search_fn="armijo").step(lambda: (p * p).sum())


def test_force_no_weights_only_load_reads_a_pytorch_pickled_numpy_array(tmp_path, monkeypatch):
    arr = np.sin(np.arange(12.0)).reshape(3, 4)
    path = tmp_path / "traindata.pt"
    torch.save(arr, str(path))
    with pytest.raises(Exception, match="Weights only load failed"):
        fl.load(str(path))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        got = fl.load(str(path))
    np.testing.assert_array_equal(got, torch.load(str(path)))
    with pytest.raises(Exception, match="Weights only load failed"):    # an explicit choice is kept
        fl.load(str(path), weights_only=True)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(RuntimeError, match="only one of"):
        fl.load(str(path))
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    with pytest.raises(Exception, match="Weights only load failed"):    # forced on even when passed False
        fl.load(str(path), weights_only=False)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(str(path), weights_only=False)


def test_load_with_a_pickle_module_defaults_to_full_unpickling(tmp_path):
    import pickle
    arr = np.arange(6.0)
    path = tmp_path / "a.pt"
    torch.save(arr, str(path))
    np.testing.assert_array_equal(fl.load(str(path), pickle_module=pickle), torch.load(str(path), pickle_module=pickle))
    with pytest.raises(RuntimeError, match="pickle_module"):
        fl.load(str(path), pickle_module=pickle, weights_only=True)
    with pytest.raises(RuntimeError, match="pickle_module"):
        torch.load(str(path), pickle_module=pickle, weights_only=True)
