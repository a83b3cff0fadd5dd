"""flambeau.distributed.checkpoint.state_dict and format_utils, in one process, against PyTorch.

The name-keyed model and optimizer state dicts must equal PyTorch's (keys, param_groups, state shapes,
wrapper prefixes dropped); a run saved with dcp and resumed into a fresh model and optimizer must continue
with exactly the losses of the uninterrupted run; the single-file converters must round-trip.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint import state_dict as tsd

import flambeau
import flambeau.distributed.checkpoint as dcp
from flambeau.distributed.checkpoint import format_utils
from flambeau.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                        set_state_dict)


def _models(seed=0):
    flambeau.manual_seed(seed)
    ours = flambeau.nn.Sequential(flambeau.nn.Linear(4, 8), flambeau.nn.Tanh(), flambeau.nn.Linear(8, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    return ours, theirs


def _batch(step):
    g = np.random.default_rng(step)
    return g.standard_normal((6, 4)).astype(np.float32), g.standard_normal((6, 2)).astype(np.float32)


def _train(model, opt, steps, lib):
    losses = []
    for step in steps:
        x, y = (lib.from_numpy(a) for a in _batch(step))
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("wrap", ["plain", "compiled"])
@pytest.mark.filterwarnings("ignore")
def test_state_dicts_keyed_by_names_as_pytorch(wrap):
    ours, theirs = _models()
    if wrap == "compiled":
        ours, theirs = flambeau.compile(ours), torch.compile(theirs)
    o_opt = flambeau.optim.Adam(ours.parameters(), lr=0.01, weight_decay=0.1)
    t_opt = torch.optim.Adam(theirs.parameters(), lr=0.01, weight_decay=0.1)
    o_model, o_optim = get_state_dict(ours, o_opt)
    t_model, t_optim = tsd.get_state_dict(theirs, t_opt)
    assert list(o_model) == list(t_model)
    for k in t_model:
        np.testing.assert_array_equal(o_model[k].numpy(), t_model[k].numpy())
    assert o_optim["param_groups"] == t_optim["param_groups"]
    assert list(o_optim["state"]) == list(t_optim["state"])
    for name, st in t_optim["state"].items():
        assert {k: tuple(v.shape) for k, v in o_optim["state"][name].items()} == \
            {k: tuple(v.shape) for k, v in st.items()}
    frozen = get_model_state_dict(ours, options=StateDictOptions(ignore_frozen_params=True))
    assert list(frozen) == list(t_model)


def test_resumed_training_continues_with_the_same_losses(tmp_path):
    model, _ = _models(0)
    opt = flambeau.optim.Adam(model.parameters(), lr=0.05)
    _train(model, opt, range(3), flambeau)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "epoch": 3}, checkpoint_id=tmp_path / "ck")
    continued = _train(model, opt, range(3, 6), flambeau)

    fresh, _ = _models(1)
    fresh_opt = flambeau.optim.Adam(fresh.parameters(), lr=0.5)
    msd, osd = get_state_dict(fresh, fresh_opt)
    sd = {"model": msd, "optim": osd, "epoch": 0}
    dcp.load(sd, checkpoint_id=tmp_path / "ck")
    set_state_dict(fresh, fresh_opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    assert sd["epoch"] == 3 and fresh_opt.param_groups[0]["lr"] == 0.05
    assert _train(fresh, fresh_opt, range(3, 6), flambeau) == continued


def test_resumed_training_equals_pytorch(tmp_path):
    ours, theirs = _models(0)
    o_opt = flambeau.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    t_opt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    _train(ours, o_opt, range(2), flambeau)
    _train(theirs, t_opt, range(2), torch)
    msd, osd = get_state_dict(ours, o_opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp_path / "ck")
    fresh, _ = _models(5)
    fresh_opt = flambeau.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    msd, osd = get_state_dict(fresh, fresh_opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=tmp_path / "ck")
    set_state_dict(fresh, fresh_opt, model_state_dict=msd, optim_state_dict=osd)
    np.testing.assert_allclose(_train(fresh, fresh_opt, range(2, 5), flambeau),
                               _train(theirs, t_opt, range(2, 5), torch), rtol=1e-5)


def test_single_file_converters_round_trip(tmp_path):
    model, _ = _models(0)
    opt = flambeau.optim.Adam(model.parameters(), lr=0.05)
    _train(model, opt, range(2), flambeau)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "tag": "x"}, checkpoint_id=tmp_path / "ck")
    format_utils.dcp_to_torch_save(tmp_path / "ck", tmp_path / "one.pt")
    whole = flambeau.load(tmp_path / "one.pt")
    assert whole["tag"] == "x" and list(whole["model"]) == list(msd)
    for k, v in msd.items():
        np.testing.assert_array_equal(whole["model"][k].numpy(), v.numpy())
    np.testing.assert_array_equal(whole["optim"]["state"]["0.weight"]["exp_avg"].numpy(),
                                  osd["state"]["0.weight"]["exp_avg"].numpy())
    assert whole["optim"]["param_groups"][0]["params"] == osd["param_groups"][0]["params"]
    theirs = torch.load(tmp_path / "one.pt", weights_only=True)        # PyTorch's .pt zip, read by PyTorch
    assert theirs["tag"] == "x" and list(theirs["model"]) == list(msd)
    for k, v in msd.items():
        np.testing.assert_array_equal(theirs["model"][k].numpy(), v.numpy())
        assert theirs["model"][k].dtype == getattr(torch, str(v.dtype).split(".")[-1])
    np.testing.assert_array_equal(theirs["optim"]["state"]["0.weight"]["exp_avg"].numpy(),
                                  osd["state"]["0.weight"]["exp_avg"].numpy())
    assert theirs["optim"]["param_groups"][0]["lr"] == osd["param_groups"][0]["lr"]
    format_utils.torch_save_to_dcp(tmp_path / "one.pt", tmp_path / "back")
    target = {"model": {k: flambeau.zeros_like(v) for k, v in msd.items()}, "tag": ""}
    dcp.load(target, checkpoint_id=tmp_path / "back")
    assert target["tag"] == "x"
    for k, v in msd.items():
        np.testing.assert_array_equal(target["model"][k].numpy(), v.numpy())
