"""ctc_loss / nn.CTCLoss against PyTorch: values and gradients, target layouts, reductions, edge cases."""
import numpy as np
import pytest
import torch

import flambeau


def _run(m, x, tg, il, tl, cat, **kw):
    lp = m.tensor(x, requires_grad=True)
    t = m.tensor(tg)
    if cat:
        t = m.cat([t[i, :tl[i]] for i in range(len(tl))])
    loss = m.nn.functional.ctc_loss(m.nn.functional.log_softmax(lp, 2), t, m.tensor(il), m.tensor(tl), **kw)
    g, = m.autograd.grad(loss.sum(), lp)
    return loss.detach().numpy(), g.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("cat", [False, True])
def test_ctc_loss_matches_pytorch(reduction, cat):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 3, 5))
    tg = rng.integers(1, 5, size=(3, 5))
    tg[2, 1] = tg[2, 0]                          # a repeated label needs a blank between
    il, tl = [12, 9, 10], [3, 0, 5]
    ours = _run(flambeau, x, tg, il, tl, cat, reduction=reduction)
    ref = _run(torch, x, tg, il, tl, cat, reduction=reduction)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-9)
    np.testing.assert_allclose(ours[1], ref[1], rtol=1e-7, atol=1e-9)


def test_impossible_alignment_and_zero_infinity():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 1, 4))
    for kw in (dict(reduction="none"), dict(zero_infinity=True)):
        ours = _run(flambeau, x, [[1, 2, 3]], [2], [3], False, **kw)
        ref = _run(torch, x, [[1, 2, 3]], [2], [3], False, **kw)
        np.testing.assert_array_equal(ours[0], ref[0])


def test_ctc_module_and_errors():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 2, 4)).astype(np.float32)
    args = ([[1, 2], [3, 3]], [6, 5], [2, 2])
    ours = flambeau.nn.CTCLoss()(flambeau.tensor(x).log_softmax(2), *(flambeau.tensor(a) for a in args))
    ref = torch.nn.CTCLoss()(torch.tensor(x).log_softmax(2), *(torch.tensor(a) for a in args))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    with pytest.raises(RuntimeError):
        flambeau.nn.functional.ctc_loss(flambeau.tensor(x), flambeau.tensor([[1, 2]] * 2), [7, 5], [2, 2])
