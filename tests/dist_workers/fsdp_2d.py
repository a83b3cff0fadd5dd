"""FSDP2 on a 2-D mesh of 4 ranks (float64): HSDP (`fully_shard(mesh=(2, 2))`: replicate over mesh dim 0,
shard over dim 1; data parallel over all 4 ranks) and FSDP x TP (blocks tensor-parallel over mesh["tp"], then
`fully_shard` over mesh["dp"]; data parallel over the 2 dp slices, the tp pair sees the same rows). Losses,
final weights and gradient layouts to <out>/rank<R>.npz. A PyTorch script run on flambeau."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_models import B, STEPS, build_model, fsdp_batch  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
Model = build_model(torch)
BLOCK_PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
              "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
res = {}


PARTIAL_SHARES = (0.25, 0.75)      # the tp ranks' pieces of a Partial bias: unequal, adding up to the bias


def train(tag, data_parallel, slice_index, mp=None, partial=False):
    """partial: each block's rowwise `o` bias becomes a Partial TP parameter (tp rank t holds PARTIAL_SHARES[t]
    of it). PyTorch 2.13 shards it as ours does but its backward refuses to make the gradient Partial
    ("redistributing to Partial is for internal use only"): on PyTorch only the layout and the first loss."""
    model = Model().double()
    g = np.random.default_rng(5)            # the same weights on flambeau and PyTorch (their RNGs differ)
    with torch.no_grad():
        for v in model.state_dict().values():
            v.copy_(torch.from_numpy(0.3 * g.standard_normal(tuple(v.shape))))
    for k, v in model.state_dict().items():
        res[f"{tag}/init/{k}"] = v.numpy().copy()
    if tag == "hsdp":
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        policy = {} if mp is None else {"mp_policy": mp}
        for b in model.blocks:
            parallelize_module(b, mesh["tp"], BLOCK_PLAN)
            if partial:
                share = PARTIAL_SHARES[mesh["tp"].get_local_rank()]
                b.o.bias = torch.nn.Parameter(DTensor.from_local(b.o.bias.to_local() * share, mesh["tp"], [Partial()]))
            fully_shard(b, mesh=mesh["dp"], **policy)
        fully_shard(model, mesh=mesh["dp"], **policy)
    res[f"{tag}/sharded"] = np.array(all(isinstance(p, DTensor) for p in model.parameters()))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = fsdp_batch(torch, step, data_parallel)
        x, y = x[slice_index * B:(slice_index + 1) * B], y[slice_index * B:(slice_index + 1) * B]
        out = model(x)
        res[f"{tag}/compute_dtype"] = np.array(str(out.dtype).split(".")[-1])
        loss = ((out - y) ** 2).mean()
        if partial and torch.__name__ == "torch":
            total = loss.detach().clone()
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
            res[f"{tag}/losses"] = np.array([total.item()])
            res[f"{tag}/layout/blocks.0.o.bias"] = np.array(f"{model.get_parameter('blocks.0.o.bias').placements}|")
            return
        opt.zero_grad()
        loss.backward()
        for name in ("head.weight", "blocks.0.q.weight", "blocks.0.o.weight", "blocks.0.q.bias") + \
                (("blocks.0.o.bias",) if partial else ()):
            p = model.get_parameter(name)
            res[f"{tag}/layout/{name}"] = np.array(f"{p.placements}|{p.grad.placements}")
            res[f"{tag}/dtypes/{name}"] = np.array(f"{p.dtype}|{p.grad.dtype}".replace("flambeau.", "torch."))
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            res[f"{tag}/block/{name}"] = np.array([list(shape), list(offset)])
            res[f"{tag}/local/{name}"] = p.to_local().detach().numpy().copy()
            with torch.no_grad():                # DTensor ops on the layout: elementwise keeps it, sum gathers
                e = p * 2 + p.grad
                res[f"{tag}/ops/{name}"] = np.array(f"{e.placements}")
                res[f"{tag}/ops_local/{name}"] = e.to_local().numpy().copy()
                res[f"{tag}/ops_sum/{name}"] = p.sum().full_tensor().numpy().copy()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    res[f"{tag}/losses"] = np.array(losses)
    for k, p in model.named_parameters():
        res[f"{tag}/final/{k}"] = p.full_tensor().detach().numpy()
    if tag == "fsdp_tp":                 # every rank writes its pieces (strided ones too) of one checkpoint
        import torch.distributed.checkpoint as dcp
        dcp.save(model.state_dict(), checkpoint_id=os.path.join(out_dir, "dcp_fsdp_tp"))


# a strided layout made from a whole tensor (12 rows cut by tp, each piece by dp: PyTorch needs even cuts), and back
whole = torch.arange(12 * 3, dtype=torch.float64).reshape(12, 3)
strided = distribute_tensor(whole, mesh, (_StridedShard(0, split_factor=2), Shard(0)))
res["strided/local"] = strided.to_local().numpy().copy()
res["strided/full"] = strided.full_tensor().numpy().copy()
train("hsdp", world, rank)
train("fsdp_tp", 2, mesh.get_coordinate()[0])
# FSDP x TP in mixed precision: float64 shards, gathered and computed in float32, gradients reduced in float32
train("fsdp_tp_mp", 2, mesh.get_coordinate()[0], MixedPrecisionPolicy(torch.float32, torch.float32))
train("fsdp_tp_partial", 2, mesh.get_coordinate()[0], partial=True)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
