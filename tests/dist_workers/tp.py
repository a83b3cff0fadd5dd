"""Tensor parallel training (float64) on a 1-D mesh of every rank: an MLP (colwise fc1, rowwise fc2),
a transformer block (q/k/v colwise, o rowwise, MLP) and the same block with sequence parallelism
(LayerNorms SequenceParallel, activations sharded on the sequence); losses, gradients' layouts and
final weights to <out>/rank<R>.npz. A PyTorch script run on flambeau by the launcher."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_models import STEPS, batch, build  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
MLP, Block = build(torch)
torch.set_default_dtype(torch.float64)
res = {}


def train(tag, model, plan, opt_cls, seq_parallel=False):
    for k, v in model.state_dict().items():
        res[f"{tag}/init/{k}"] = v.numpy().copy()
    parallelize_module(model, mesh, plan)
    opt = opt_cls(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(torch, step)
        if seq_parallel:
            x = x.chunk(world, 1)[rank]
        out = model(x)
        if seq_parallel:
            out = DTensor.from_local(out, mesh, [Shard(1)]).full_tensor()
        loss = ((out - y) * (out - y)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    res[f"{tag}/losses"] = np.array(losses)
    for k, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        res[f"{tag}/final/{k}"] = full.detach().numpy().copy()
        if isinstance(p, DTensor):
            res[f"{tag}/layout/{k}"] = np.array(f"{p.placements}|{p.grad.placements}")


torch.manual_seed(0)
train("mlp", MLP(), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()},
      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
block_plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
              "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
torch.manual_seed(1)
train("block", Block(), block_plan, lambda ps: torch.optim.Adam(ps, lr=0.01))
sp_plan = {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
           "q": ColwiseParallel(input_layouts=Shard(1)), "k": ColwiseParallel(input_layouts=Shard(1)),
           "v": ColwiseParallel(input_layouts=Shard(1)), "o": RowwiseParallel(output_layouts=Shard(1)),
           "mlp.fc1": ColwiseParallel(input_layouts=Shard(1)), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))}
torch.manual_seed(2)
train("sp", Block(), sp_plan, lambda ps: torch.optim.Adam(ps, lr=0.01), seq_parallel=True)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
