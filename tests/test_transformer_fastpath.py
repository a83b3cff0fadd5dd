"""The Transformer encoder's inference fast path (issue 11 item 4): in eval mode with a key padding mask
PyTorch runs the layers on a nested tensor of the tokens and pads the result with zeros. flambeau must give
PyTorch's numbers: equal tokens, zeros at padded positions, and the slow path's values whenever PyTorch
does not take the fast path (training, grad needed, mask not left aligned, a src mask too, fast path off)."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import flambeau as fl

D, H, FF, LAYERS = 32, 4, 64, 2
_ISOLATED = "FLAMBEAU_TEST_ISOLATED"


def _ran_in_a_fresh_process(request) -> bool:
    """Run this test alone in a new interpreter (True: it ran there and passed). PyTorch's choice of its fast
    path reads process-wide state (autocast, torch-function modes, ...) that other tests of a long run may leave
    set; the comparison needs PyTorch as a user starts it."""
    if os.environ.get(_ISOLATED) == "1":
        return False
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        f"{__file__}::{request.node.name}"], env={**os.environ, _ISOLATED: "1"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    return True


def _pair(norm=False, batch_first=True, **kw):
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, batch_first=batch_first, **kw)
    fl_ = fl.nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, batch_first=batch_first, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        te = torch.nn.TransformerEncoder(tl, LAYERS, norm=torch.nn.LayerNorm(D) if norm else None)
        fe = fl.nn.TransformerEncoder(fl_, LAYERS, norm=fl.nn.LayerNorm(D) if norm else None)
    with torch.no_grad():
        if norm:        # a bias, so that norm(0) is not 0: the zeros must come before the final norm
            te.norm.bias.uniform_(-1, 1)
    fe.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in te.state_dict().items()})
    return te, fe


def _batch(batch_first=True):
    x = np.random.default_rng(0).standard_normal((3, 7, D)).astype(np.float32)
    pad = np.zeros((3, 7), bool)
    pad[0, 5:] = True
    pad[1, 3:] = True
    return (x if batch_first else x.transpose(1, 0, 2).copy()), pad


def _run(te, fe, x, pad, grad=False, **kw):
    with torch.set_grad_enabled(grad):
        ref = te(torch.tensor(x), src_key_padding_mask=torch.tensor(pad), **kw)
    with fl.set_grad_enabled(grad):
        out = fe(fl.tensor(x), src_key_padding_mask=fl.tensor(pad), **kw)
    return ref.detach().numpy(), out.detach().numpy()


@pytest.mark.parametrize("norm", [False, True])
def test_eval_with_padding_gives_pytorchs_zeros_at_padded_positions(norm, request):
    if _ran_in_a_fresh_process(request):
        return
    te, fe = _pair(norm=norm)
    te.eval(), fe.eval()
    x, pad = _batch()
    ref, out = _run(te, fe, x, pad)
    assert not np.allclose(ref[0, 5:], _run(te.train(False), fe, x, pad, grad=True)[1][0, 5:])  # fast != slow there
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_float_padding_mask_takes_the_fast_path_too(request):
    if _ran_in_a_fresh_process(request):
        return
    te, fe = _pair()
    te.eval(), fe.eval()
    x, pad = _batch()
    fpad = np.where(pad, -np.inf, 0.0).astype(np.float32)
    ref, out = _run(te, fe, x, fpad)
    assert np.abs(ref[0, 5:]).max() == 0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["training", "grad", "not_left_aligned", "fastpath_off", "not_batch_first"])
def test_without_the_fast_path_padded_positions_keep_the_slow_values(case, request):
    if _ran_in_a_fresh_process(request):
        return
    te, fe = _pair(batch_first=case != "not_batch_first")
    te.eval(), fe.eval()
    if case == "training":      # dropout: compare with dropout off via p=0 modules
        for m in list(te.modules()) + list(fe.modules()):
            if isinstance(m, (torch.nn.Dropout, fl.nn.Dropout)):
                m.p = 0.0
            if isinstance(m, (torch.nn.MultiheadAttention, fl.nn.MultiheadAttention)):
                m.dropout = 0.0
        te.train(), fe.train()
    x, pad = _batch(batch_first=case != "not_batch_first")
    if case == "not_left_aligned":
        pad[2, 0] = True
    try:
        if case == "fastpath_off":
            torch.backends.mha.set_fastpath_enabled(False)
            fl.backends.mha.set_fastpath_enabled(False)
        ref, out = _run(te, fe, x, pad, grad=case in ("grad", "training"))
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
        fl.backends.mha.set_fastpath_enabled(True)
    padded = (pad if case != "not_batch_first" else pad.T)
    assert np.abs(ref[padded]).max() > 0.1          # PyTorch kept the computed values
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_construction_warns_as_pytorch_when_nested_tensors_cannot_be_used():
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        e = fl.nn.TransformerEncoder(fl.nn.TransformerEncoderLayer(8, 2, 16), 1)
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), 1)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs] != []
    assert e.use_nested_tensor is False
    assert fl.backends.mha.get_fastpath_enabled() is torch.backends.mha.get_fastpath_enabled() is True
