"""FSDP2 on a 2-D mesh, 4 MPI ranks, float64 (tests/dist_workers/fsdp_2d.py): HSDP (replicate over mesh
dim 0, shard over dim 1) trains as one PyTorch process on the 4 ranks' concatenated batch, FSDP x TP
(tensor parallel inside each dp slice, FSDP across them) as one process on the 2 slices' batch; losses and
final weights to 1e-10; the same worker on PyTorch's FSDP2 (torchrun, gloo) gives the same losses and
layouts (colwise TP pieces sharded over dp as PyTorch's `_StridedShard`), and each rank's piece is the same block
of the global tensor (`compute_local_shape_and_global_offset`, what distributed checkpoints read)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.dist_helpers import RUN_TIMEOUT_S, WORKERS, launch
from tests.dist_workers.tp_models import STEPS, build_model, fsdp_batch

WORLD = 4
Model = build_model(torch)
# parameter layout | gradient layout on the 2x2 mesh
LAYOUTS = {
    "hsdp": {"head.weight": "(Replicate(), Shard(dim=0))|(Replicate(), Shard(dim=0))",
             "blocks.0.q.weight": "(Replicate(), Shard(dim=0))|(Replicate(), Shard(dim=0))",
             "blocks.0.o.weight": "(Replicate(), Shard(dim=0))|(Replicate(), Shard(dim=0))",
             "blocks.0.q.bias": "(Replicate(), Shard(dim=0))|(Replicate(), Shard(dim=0))"},
    "fsdp_tp": {"head.weight": "(Shard(dim=0),)|(Shard(dim=0),)",
                "blocks.0.q.weight": "(_StridedShard(dim=0, sf=2), Shard(dim=0))|(_StridedShard(dim=0, sf=2), "
                                     "Shard(dim=0))",
                "blocks.0.o.weight": "(Shard(dim=0), Shard(dim=1))|(Shard(dim=0), Shard(dim=1))",
                "blocks.0.q.bias": "(_StridedShard(dim=0, sf=2), Shard(dim=0))|(_StridedShard(dim=0, sf=2), "
                                   "Shard(dim=0))"},
}


LAYOUTS["fsdp_tp_mp"] = LAYOUTS["fsdp_tp"]
# each block's rowwise bias a Partial TP parameter: (Shard(0), Partial()) as PyTorch shards it
LAYOUTS["fsdp_tp_partial"] = dict(LAYOUTS["fsdp_tp"], **{"blocks.0.o.bias": "(Shard(dim=0), Partial(sum))|"
                                                                          "(Shard(dim=0), Partial(sum))"})
MP_RTOL = 1e-5              # float32 compute against the float64 one-process reference


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2d")
    rc, so, se = launch("fsdp_2d.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return _Ranks([dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)], out)


class _Ranks(list):
    """Every rank's saved results, and `path`: the first rank's file (the launch's output folder beside it)."""

    def __init__(self, items: list, out) -> None:
        super().__init__(items)
        self.path = os.path.join(out, "rank0.npz")


def _reference(tag, res, data_parallel):
    model = Model().double()
    prefix = f"{tag}/init/"
    model.load_state_dict({k[len(prefix):]: torch.from_numpy(v) for k, v in res.items() if k.startswith(prefix)})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = fsdp_batch(torch, step, data_parallel)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.named_parameters()}


@pytest.mark.parametrize("tag,data_parallel", [("hsdp", WORLD), ("fsdp_tp", 2), ("fsdp_tp_mp", 2),
                                               ("fsdp_tp_partial", 2)])
def test_2d_training_equals_one_process_on_the_whole_batch(ranks, tag, data_parallel):
    """Mixed precision (fsdp_tp_mp): float64 shards and gradients, the forward in float32, within MP_RTOL."""
    losses, final = _reference(tag, ranks[0], data_parallel)
    rtol = MP_RTOL if tag.endswith("_mp") else 1e-10
    for r, res in enumerate(ranks):
        assert bool(res[f"{tag}/sharded"])
        assert str(res[f"{tag}/compute_dtype"]) == ("float32" if tag.endswith("_mp") else "float64")
        for name in LAYOUTS[tag]:
            assert str(res[f"{tag}/dtypes/{name}"]) == "torch.float64|torch.float64", name
        np.testing.assert_allclose(res[f"{tag}/losses"], losses, rtol=rtol, atol=rtol * 1e-2)
        for k, v in final.items():
            if k.endswith("k.bias"):
                continue            # its exact gradient is 0 (softmax's shift invariance): AdamW normalises the
                # rounding noise into lr-sized steps, so its value is whichever summation order ran (float64 too)
            np.testing.assert_allclose(res[f"{tag}/final/{k}"], v, rtol=rtol * 10, atol=rtol * 1e-1,
                                       err_msg=f"rank {r} {k}")


@pytest.mark.parametrize("tag", ["hsdp", "fsdp_tp", "fsdp_tp_mp", "fsdp_tp_partial"])
def test_2d_parameter_and_gradient_layouts(ranks, tag):
    for res in ranks:
        for name, want in LAYOUTS[tag].items():
            assert str(res[f"{tag}/layout/{name}"]) == want, name


@pytest.fixture(scope="module")
def pytorch_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2d_pytorch")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           os.path.join(WORKERS, "fsdp_2d.py"), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def test_fsdp_tp_checkpoint_holds_the_whole_parameters(ranks, tmp_path_factory):
    """The DCP checkpoint the 4 FSDP x TP ranks wrote (strided colwise pieces among them), made one `.pt` file
    by dcp_to_torch_save and read by torch.load, holds every parameter whole: equal to the ranks' full_tensor()."""
    from flambeau.distributed.checkpoint.format_utils import dcp_to_torch_save
    folder = os.path.join(os.path.dirname(ranks.path), "dcp_fsdp_tp")
    whole = tmp_path_factory.mktemp("dcp_whole") / "model.pt"
    dcp_to_torch_save(folder, whole)
    state = torch.load(whole, weights_only=True)
    finals = {k[len("fsdp_tp/final/"):]: v for k, v in ranks[0].items() if k.startswith("fsdp_tp/final/")}
    assert sorted(state) == sorted(finals)
    for k, v in finals.items():
        np.testing.assert_array_equal(state[k].numpy(), v, err_msg=k)


def test_strided_layout_cuts_and_joins_as_pytorch(ranks, pytorch_ranks):
    """distribute_tensor to (_StridedShard(0, sf=2), Shard(0)) of 12 rows: each rank's piece as PyTorch's
    (tp cuts 6 | 6, dp cuts each again: rank (dp 1, tp 0) holds rows 3-5), full_tensor the whole again."""
    whole = np.arange(36.0).reshape(12, 3)
    np.testing.assert_array_equal(ranks[2]["strided/local"], whole[3:6])        # rank 2: dp 1, tp 0
    for ours, theirs in zip(ranks, pytorch_ranks):
        np.testing.assert_array_equal(ours["strided/local"], theirs["strided/local"])
        np.testing.assert_array_equal(ours["strided/full"], whole)


@pytest.mark.parametrize("tag", ["hsdp", "fsdp_tp", "fsdp_tp_mp"])
def test_2d_agrees_with_pytorch_fsdp2(ranks, pytorch_ranks, tag):
    rtol = 1e-5 if tag.endswith("_mp") else 1e-10      # float32 sums in another order
    for ours, theirs in zip(ranks, pytorch_ranks):
        np.testing.assert_allclose(ours[f"{tag}/losses"], theirs[f"{tag}/losses"], rtol=rtol)
        assert str(ours[f"{tag}/compute_dtype"]) == str(theirs[f"{tag}/compute_dtype"])
        for name in LAYOUTS[tag]:
            assert str(ours[f"{tag}/layout/{name}"]) == str(theirs[f"{tag}/layout/{name}"]), name
            np.testing.assert_array_equal(ours[f"{tag}/block/{name}"], theirs[f"{tag}/block/{name}"], err_msg=name)
            np.testing.assert_allclose(ours[f"{tag}/local/{name}"], theirs[f"{tag}/local/{name}"], rtol=rtol,
                                       atol=rtol * 1e-2, err_msg=name)
            assert str(ours[f"{tag}/ops/{name}"]) == str(theirs[f"{tag}/ops/{name}"]), name
            for what in ("ops_local", "ops_sum"):
                np.testing.assert_allclose(ours[f"{tag}/{what}/{name}"], theirs[f"{tag}/{what}/{name}"], rtol=rtol,
                                           atol=rtol * 1e-2, err_msg=f"{what} {name}")


def test_partial_tp_parameter_is_sharded_as_pytorch(ranks, pytorch_ranks):
    """A Partial TP bias under FSDP: the same layout and first loss as PyTorch's FSDP2 (whose backward then
    refuses the Partial gradient; ours trains as one process: test_2d_training_equals_one_process_on_the_whole_batch)."""
    name, tag = "blocks.0.o.bias", "fsdp_tp_partial"
    for ours, theirs in zip(ranks, pytorch_ranks):
        assert str(ours[f"{tag}/layout/{name}"]).split("|")[0] == str(theirs[f"{tag}/layout/{name}"]).split("|")[0]
        np.testing.assert_allclose(ours[f"{tag}/losses"][:1], theirs[f"{tag}/losses"], rtol=1e-10)
