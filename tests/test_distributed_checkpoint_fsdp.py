"""Distributed checkpoints of FSDP2 training (tests/dist_workers/dcp_fsdp.py): saved at world 4 with
fully_shard (Shard(0) DTensor parameters and optimizer state, one layer sharded unevenly), resumed at
world 2 with fully_shard and at world 1 on a plain model (here, in process) and in PyTorch: the losses
after loading must be the ones the world-4 run went on to have.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import flambeau
import flambeau.distributed.checkpoint as dcp
from flambeau.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from tests.dist_helpers import launch
from tests.dist_workers.dcp_fsdp import LR, STEPS_AFTER, STEPS_BEFORE, batch, build, train

pytest.importorskip("flambeau.distributed.fsdp")


@pytest.fixture(scope="module")
def saved4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp_save4")
    rc, so, se = launch("dcp_fsdp.py", 4, "save", str(folder), str(folder))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return folder, np.load(folder / "reference.npy")


def test_fsdp_checkpoint_is_sharded_over_four_ranks(saved4):
    folder, _ = saved4
    entries = json.loads((folder / "ckpt" / "metadata.json").read_text())["state_dict_metadata"]
    chunks = entries["model.0.weight"]["chunks"]             # 6 rows over 4 ranks: 2, 2, 2, 0
    assert [c["offsets"][0] for c in chunks] == [0, 2, 4] and [c["sizes"][0] for c in chunks] == [2, 2, 2]
    assert len({c["file"] for c in entries["optim.state.2.weight.exp_avg"]["chunks"]}) == 3


def test_fsdp_saved_at_world_4_resumes_at_world_2(saved4, tmp_path):
    folder, reference = saved4
    rc, so, se = launch("dcp_fsdp.py", 2, "load", str(folder), str(tmp_path))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    np.testing.assert_allclose(np.load(tmp_path / "loaded2.npy"), reference, rtol=1e-12, atol=0)


def test_fsdp_saved_at_world_4_resumes_at_world_1(saved4):
    folder, reference = saved4
    flambeau.manual_seed(1)
    model = build(flambeau.nn).double()
    opt = flambeau.optim.AdamW(model.parameters(), lr=10 * LR)
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=folder / "ckpt")
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    assert opt.param_groups[0]["lr"] == LR
    names = sd["optim"]["param_groups"][0]["params"]
    weights = {k: v.numpy().copy() for k, v in sd["model"].items()}          # before training moves them
    states = [{k: np.array(v.numpy()) for k, v in sd["optim"]["state"][name].items()} for name in names]
    losses = train(flambeau, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    np.testing.assert_allclose(losses, reference, rtol=1e-12, atol=0)

    theirs = build(torch.nn).double()                       # PyTorch resumes from the same tensors
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    t_opt = torch.optim.AdamW(theirs.parameters(), lr=LR)
    t_opt.load_state_dict({"state": {i: {k: torch.from_numpy(v) for k, v in st.items()} for i, st in enumerate(states)},
                           "param_groups": [dict(t_opt.param_groups[0], params=list(range(len(names))))]})
    np.testing.assert_allclose(train(torch, theirs, t_opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER)),
                               reference, rtol=1e-9)
