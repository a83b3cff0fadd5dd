"""flambeau.distributed.pipelining at world 2 and 4 (tests/dist_workers/pipeline.py) against PyTorch.

Every schedule (GPipe, 1F1B, interleaved 1F1B with two stages per rank, and stages made by hand) must give
the per-microbatch losses, the merged output and the gradients of the unsplit model run in PyTorch from the
same weights, microbatch by microbatch (`tensor_split` of the batch, gradients of the mean of the losses).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import flambeau
from flambeau.distributed.pipelining import SplitPoint, pipe_split, pipeline
from tests.dist_helpers import launch
from tests.dist_workers.pipeline import N_BLOCKS, N_MICROBATCHES, WIDTH, build, data, loss_fn

SCHEDULES = {2: ["gpipe", "1f1b", "interleaved", "manual"], 4: ["gpipe", "1f1b", "interleaved"]}
SEQ_NAMES = {0: "emb", **{i + 1: f"layers.{i}" for i in range(N_BLOCKS)}, N_BLOCKS + 1: "head"}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def run(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"pipe{world}")
    rc, so, se = launch("pipeline.py", world, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    results = {name: [dict(np.load(os.path.join(out, f"{name}_rank{r}.npz"))) for r in range(world)]
               for name in SCHEDULES[world]}
    return world, dict(np.load(os.path.join(out, "weights.npz"))), results


def _reference(weights: dict, sequential: bool):
    """PyTorch: per-microbatch losses, the whole output and the gradients of the mean loss."""
    model = build(torch.nn, torch)()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    if sequential:
        model = torch.nn.Sequential(model.emb, *model.layers, model.head)
    x, y = (torch.from_numpy(a) for a in data())
    losses, outputs = [], []
    for xm, ym in zip(torch.tensor_split(x, N_MICROBATCHES), torch.tensor_split(y, N_MICROBATCHES)):
        out = model(xm)
        loss = loss_fn(out, ym)
        (loss / N_MICROBATCHES).backward()
        losses.append(loss.item())
        outputs.append(out.detach())
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    if sequential:
        grads = {f"{SEQ_NAMES[int(k.split('.')[0])]}.{k.split('.', 1)[1]}": g for k, g in grads.items()}
    return np.array(losses), torch.cat(outputs).numpy(), grads


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "manual"])
def test_schedules_equal_the_unsplit_model(run, name):
    world, weights, results = run
    if name not in results:
        pytest.skip(f"{name} runs at world 2 only")
    losses, output, grads = _reference(weights, name == "manual")
    last = results[name][world - 1]
    np.testing.assert_allclose(last["losses"], losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last["output"], output, rtol=1e-5, atol=1e-6)
    got = {}
    for rank_result in results[name]:
        for k, v in rank_result.items():
            if k.startswith("grad/"):
                key = k[len("grad/"):]
                if name == "manual":
                    index, _, rest = key.partition(".")
                    key = f"{SEQ_NAMES[int(index)]}.{rest}"
                assert key not in got, f"two ranks hold a gradient of {key}"
                got[key] = v
    assert sorted(got) == sorted(grads)
    for k, g in grads.items():
        np.testing.assert_allclose(got[k], g, rtol=1e-4, atol=1e-6, err_msg=k)


def test_pipeline_cuts_where_asked_and_computes_the_same():
    model = build(flambeau.nn, flambeau)(pipe_split)
    x = flambeau.from_numpy(data()[0])
    pipe = pipeline(model, (x,), split_spec={"layers.3": SplitPoint.BEGINNING, "layers.5": SplitPoint.END})
    assert pipe.num_stages == 4                      # cut after block 0, before block 3, after block 5
    owners = [sorted({n.target.split(".")[0] + "." + n.target.split(".")[1] if n.target.startswith("layers")
                      else n.target.split(".")[0] for n in pipe.get_stage_module(i).graph.nodes
                      if n.op in ("call_module", "get_attr")}) for i in range(4)]
    assert owners[0] == ["emb", "layers.0"] and owners[1] == ["layers.1", "layers.2"]
    assert owners[2] == ["layers.3", "layers.4", "layers.5"] and owners[3] == ["head", "layers.6", "layers.7"]
    np.testing.assert_allclose(pipe(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="not a submodule"):
        pipeline(model, (x,), split_spec={"layers.99": SplitPoint.BEGINNING})


def _orders(world: int, n_local: int, n_microbatches: int, rank: int) -> tuple:
    """(ours, PyTorch's) interleaved 1F1B action order of one rank, as (kind, stage, microbatch)."""
    from types import SimpleNamespace

    from torch.distributed.pipelining import schedules as torch_schedules

    from flambeau.distributed.pipelining import ScheduleInterleaved1F1B
    theirs_self = SimpleNamespace(n_local_stages=n_local, microbatches_per_round=world, pp_group_size=world,
                                  _n_microbatches=n_microbatches)
    theirs = torch_schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(theirs_self, rank)
    theirs = [("F" if a.computation_type == torch_schedules._ComputationType.FORWARD else "B", a.stage_index,
               a.microbatch_index) for a in theirs if a is not None]
    ours_self = object.__new__(ScheduleInterleaved1F1B)
    ours_self._group_size, ours_self._rank = world, rank
    ours_self._n_microbatches, ours_self._n_local = n_microbatches, n_local
    return ours_self._actions(), theirs


@pytest.mark.parametrize("world,n_local,n_microbatches", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (2, 2, 8)])
def test_interleaved_order_is_pytorchs(world, n_local, n_microbatches):
    for rank in range(world):
        ours, theirs = _orders(world, n_local, n_microbatches, rank)
        assert ours == theirs, rank


def test_1f1b_keeps_at_most_the_stages_ahead_in_flight():
    from types import SimpleNamespace

    from flambeau.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    for stage_index in range(4):
        stage = SimpleNamespace(stage_index=stage_index, num_stages=4, group_size=4, group_rank=stage_index)
        for cls, bound in ((Schedule1F1B, 4 - stage_index), (ScheduleGPipe, 8)):
            actions = cls(stage, 8)._actions()
            alive, most = 0, 0
            for kind, _, _ in actions:
                alive += 1 if kind == "F" else -1
                most = max(most, alive)
            assert most == bound and sorted(actions) == sorted([(k, stage_index, m) for k in "FB" for m in range(8)])
