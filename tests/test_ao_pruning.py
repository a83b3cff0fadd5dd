"""flambeau.ao.pruning's WeightNormSparsifier against torch.ao.pruning's on the same weights: masks
(2:4 and block sparsity levels), the parametrized forward and the gradient of `original`, and
squash_mask folding the mask into a plain parameter (the PyTorch semi-structured tutorial's flow)."""
import numpy as np
import pytest
import torch
from torch.ao.pruning import WeightNormSparsifier as TorchSparsifier

import flambeau
from flambeau.ao.pruning import WeightNormSparsifier
from flambeau.sparse import to_sparse_semi_structured


def _models(seed=0):
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    w2 = rng.standard_normal((8, 32)).astype(np.float32)
    fm = flambeau.nn.Sequential(flambeau.nn.Linear(64, 32), flambeau.nn.ReLU(), flambeau.nn.Linear(32, 8, bias=False))
    tm = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
    with flambeau.no_grad(), torch.no_grad():
        for m, lib in ((fm, flambeau), (tm, torch)):
            m[0].weight.copy_(lib.tensor(w1))
            m[0].bias.copy_(lib.tensor(b1))
            m[2].weight.copy_(lib.tensor(w2))
    return fm, tm


@pytest.mark.parametrize("kw", [dict(sparsity_level=1.0, sparse_block_shape=(1, 4), zeros_per_block=2),
                                dict(sparsity_level=0.5, sparse_block_shape=(1, 4), zeros_per_block=2),
                                dict(sparsity_level=0.3, sparse_block_shape=(2, 3)),
                                dict(sparsity_level=0.6, sparse_block_shape=(1, 4), zeros_per_block=3, norm=1)])
def test_weight_norm_sparsifier_matches_pytorch(kw):
    fm, tm = _models()
    config = [{"tensor_fqn": "0.weight"}, {"tensor_fqn": "2.weight"}]
    fs, ts = WeightNormSparsifier(**kw), TorchSparsifier(**kw)
    fs.prepare(fm, config)
    ts.prepare(tm, config)
    fs.step()
    ts.step()
    for i in (0, 2):
        np.testing.assert_array_equal(fm[i].parametrizations.weight[0].mask.numpy(),
                                      tm[i].parametrizations.weight[0].mask.numpy())
    assert sorted(n for n, _ in fm.named_parameters()) == sorted(n for n, _ in tm.named_parameters())
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    fo, to = fm(flambeau.tensor(x)), tm(torch.tensor(x))
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-5)
    fo.sum().backward()
    to.sum().backward()
    np.testing.assert_allclose(fm[0].parametrizations.weight.original.grad.numpy(),
                               tm[0].parametrizations.weight.original.grad.numpy(), rtol=1e-5, atol=1e-5)
    fs.squash_mask()
    ts.squash_mask()
    assert type(fm[0]) is flambeau.nn.Linear and not hasattr(fm[0], "parametrizations")
    np.testing.assert_array_equal(fm[0].weight.detach().numpy(), tm[0].weight.detach().numpy())
    assert sorted(n for n, _ in fm.named_parameters()) == sorted(n for n, _ in tm.named_parameters())


def test_pruned_weight_converts_to_semi_structured():
    fm, _ = _models(seed=2)
    sp = WeightNormSparsifier(sparsity_level=1.0, sparse_block_shape=(1, 4), zeros_per_block=2)
    sp.prepare(fm, [{"tensor_fqn": "0.weight"}])
    sp.step()
    sp.squash_mask()
    fm = fm.half()
    x = flambeau.randn(16, 64).half()
    dense = fm[0](x)
    fm[0].weight = flambeau.nn.Parameter(to_sparse_semi_structured(fm[0].weight.detach()))
    assert flambeau.equal(fm[0](x), dense)
