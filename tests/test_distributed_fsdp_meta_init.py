"""FSDP2 over a model made on the meta device (the flow of PyTorch's FSDP2 example, pytorch/examples
distributed/FSDP2), 2 ranks (tests/dist_workers/fsdp_meta_init.py): `to_empty` moves every shard off meta,
`reset_parameters` draws what the one-process model draws, training from there equals PyTorch on the whole
batch, and a checkpoint of the trained model loads back into fresh meta models both ways the example does
(`distribute_tensor` + `load_state_dict(assign=True)`; `set_*_state_dict` with broadcast_from_rank0)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.dist_helpers import launch
from tests.dist_workers.tp_models import B, build_model, fsdp_batch

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_meta")
    rc, so, se = launch("fsdp_meta_init.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def _names():
    return list(build_model(torch)().state_dict())


def test_to_empty_moves_every_shard_off_the_meta_device(ranks):
    for res in ranks:
        assert bool(res["meta"]) and bool(res["moved"])


def test_reset_parameters_on_shards_draws_what_one_process_draws(ranks):
    """Every rank keeps its piece of the values the whole tensor gets: the sharded model starts as the same
    seed's one-process model (flambeau's, built on the cpu: the same draws in the same order)."""
    import flambeau
    flambeau.manual_seed(0)
    flambeau.set_default_dtype(flambeau.float64)
    try:
        ref = build_model(flambeau)()
    finally:
        flambeau.set_default_dtype(flambeau.float32)
    for res in ranks:
        for k, v in ref.state_dict().items():
            np.testing.assert_array_equal(res[f"init/{k}"], v.numpy(), err_msg=k)


def test_training_from_the_meta_init_equals_pytorch_on_the_whole_batch(ranks):
    res = ranks[0]
    model = build_model(torch)().double()
    model.load_state_dict({k: torch.from_numpy(res[f"init/{k}"]) for k in _names()})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(2):
        x, y = fsdp_batch(torch, step, WORLD)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for r in ranks:
        np.testing.assert_allclose(r["losses"], losses, rtol=1e-10)
        for k, v in model.state_dict().items():
            np.testing.assert_allclose(r[f"trained/{k}"], v.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def test_assigned_distribute_tensor_pieces_restore_the_trained_model(ranks):
    for r, res in enumerate(ranks):
        for k in _names():
            np.testing.assert_array_equal(res[f"assign/{k}"], res[f"trained/{k}"], err_msg=k)
        np.testing.assert_array_equal(res["assign_out"], res["next_out"])
        assert str(res["default_mesh_type"]) == "cpu"        # fully_shard's default mesh: not the meta device
        np.testing.assert_array_equal(res["default_mesh_out"], res["next_out"])
        assert res["next_out"].shape[0] == B


def test_broadcast_from_rank0_restores_model_and_optimizer(ranks):
    """Rank 1 passed empty dicts: what it loaded came from rank 0. A step after the load equals the trained
    model's own next step (weights and loss), so the optimizer state came back too."""
    for res in ranks:
        for k in _names():
            np.testing.assert_array_equal(res[f"broadcast/{k}"], res[f"trained/{k}"], err_msg=k)
            np.testing.assert_array_equal(res[f"resumed/{k}"], res[f"continued/{k}"], err_msg=k)
            assert not np.array_equal(res[f"continued/{k}"], res[f"trained/{k}"]) or k.startswith("blocks.0.ln")
        assert float(res["resumed_loss"]) == float(res["continued_loss"])


def _world_of_one():
    import flambeau.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_like_factories_of_a_dtensor_honour_device():
    """`empty_like(dtensor, device=...)` (what `Module.to_empty` calls) puts the local piece on that device;
    the device used to be dropped, leaving a meta model's shards on meta."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.device_mesh import init_device_mesh
    _world_of_one()
    try:
        mesh = init_device_mesh("cpu", (1,))
        with flambeau.device("meta"):
            lin = flambeau.nn.Linear(3, 4)
        from flambeau.distributed.fsdp import fully_shard
        fully_shard(lin, mesh=mesh)
        assert lin.weight.to_local().device.type == "meta"
        for fn in (flambeau.empty_like, flambeau.zeros_like, flambeau.ones_like):
            out = fn(lin.weight, device="cpu")
            assert out.to_local().device.type == "cpu" and tuple(out.shape) == (4, 3), fn.__name__
        assert float(flambeau.full_like(lin.weight, 2.0, device="cpu").to_local().sum()) == 24.0
    finally:
        dist.destroy_process_group()


def test_options_and_layouts_that_cannot_load_raise():
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from flambeau.distributed.device_mesh import init_device_mesh
    from flambeau.distributed.fsdp import fully_shard
    from flambeau.distributed.tensor import Partial, Replicate, distribute_tensor
    _world_of_one()
    try:
        mesh = init_device_mesh("cpu", (1,))
        lin = fully_shard(flambeau.nn.Linear(3, 4), mesh=mesh)
        with pytest.raises(ValueError, match="full_state_dict must be True when broadcast_from_rank0 is True"):
            set_model_state_dict(lin, {}, options=StateDictOptions(broadcast_from_rank0=True))
        wrong = flambeau.nn.Parameter(distribute_tensor(flambeau.zeros(4, 3), mesh, [Replicate()]))
        with pytest.raises(RuntimeError, match="parameter 'weight', which FSDP manages as a DTensor"):
            lin.load_state_dict({"weight": wrong}, strict=False, assign=True)
        partial = flambeau.distributed.tensor.DTensor.from_local(flambeau.zeros(2), mesh, [Partial()])
        with pytest.raises(RuntimeError, match="cannot initialise a DTensor with placements"):
            flambeau.nn.init.normal_(partial)
    finally:
        dist.destroy_process_group()


def test_distribute_tensor_moves_the_whole_tensor_to_the_meshs_device_type():
    """PyTorch's distribute_tensor puts a tensor of another device type on the mesh's (the FSDP2 example loads its
    checkpoint with map_location="cpu", then distributes it over a cuda mesh: the broadcast found no cpu engine
    in an NCCL group); a meta tensor is not broadcast (it holds no values)."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.device_mesh import init_device_mesh
    from flambeau.distributed.tensor import Shard, distribute_tensor
    _world_of_one()
    try:
        moved = distribute_tensor(flambeau.ones(4, 2), init_device_mesh("meta", (1,)), [Shard(0)])
        assert moved.to_local().device.type == "meta" and tuple(moved.shape) == (4, 2)
        kept = distribute_tensor(flambeau.ones(4, 2, device="meta"), init_device_mesh("cpu", (1,)), [Shard(0)])
        assert kept.to_local().device.type == "meta"
        plain = distribute_tensor(flambeau.arange(8.0).reshape(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
        assert plain.to_local().tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    finally:
        dist.destroy_process_group()
