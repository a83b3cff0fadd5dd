"""Tensor parallelism (parallelize_module with ColwiseParallel / RowwiseParallel / SequenceParallel) on 2
and 3 MPI ranks, float64: an MLP, a transformer block and the block with sequence parallelism train to
the same losses and weights as one PyTorch process on the whole model (tests/dist_workers/tp.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.dist_helpers import launch
from tests.dist_workers.tp_models import STEPS, batch, build

MLP, Block = build(torch)
CASES = {"mlp": (MLP, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
         "block": (Block, lambda ps: torch.optim.Adam(ps, lr=0.01)),
         "sp": (Block, lambda ps: torch.optim.Adam(ps, lr=0.01))}
COLWISE = "(Shard(dim=0),)|(Shard(dim=0),)"
ROWWISE_W = "(Shard(dim=1),)|(Shard(dim=1),)"


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"tp{world}")
    rc, so, se = launch("tp.py", world, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(world)]


def _reference(tag, res):
    cls, make_opt = CASES[tag]
    model = cls().double()
    prefix = f"{tag}/init/"
    model.load_state_dict({k[len(prefix):]: torch.from_numpy(v) for k, v in res.items() if k.startswith(prefix)})
    opt = make_opt(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(torch, step)
        out = model(x)
        loss = ((out - y) * (out - y)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.named_parameters()}


@pytest.mark.parametrize("tag", list(CASES))
def test_tensor_parallel_training_equals_one_process(ranks, tag):
    losses, final = _reference(tag, ranks[0])
    for r, res in enumerate(ranks):
        np.testing.assert_allclose(res[f"{tag}/losses"], losses, rtol=1e-10, atol=1e-12)
        for k, v in final.items():
            np.testing.assert_allclose(res[f"{tag}/final/{k}"], v, rtol=1e-9, atol=1e-11, err_msg=f"rank {r} {k}")


def test_parameter_and_gradient_layouts(ranks):
    for res in ranks:
        assert str(res["mlp/layout/fc1.weight"]) == COLWISE
        assert str(res["mlp/layout/fc1.bias"]) == COLWISE
        assert str(res["mlp/layout/fc2.weight"]) == ROWWISE_W
        assert str(res["mlp/layout/fc2.bias"]) == "(Replicate(),)|(Replicate(),)"
        assert str(res["sp/layout/ln1.weight"]) == "(Replicate(),)|(Replicate(),)"
        assert str(res["block/layout/q.weight"]) == COLWISE
