"""FSDP2 on a model made on the meta device, the flow of PyTorch's FSDP2 example (pytorch/examples
distributed/FSDP2): `fully_shard` per block and at the root, `to_empty(device="cpu")`, `reset_parameters()` of
every module that has one (float64 by default dtype), two AdamW steps on this rank's rows; then the trained weights and optimizer state
into fresh meta-device models two ways: (a) `distribute_tensor` pieces loaded with `load_state_dict(assign=True)`
(the example's default), (b) `set_model_state_dict` / `set_optimizer_state_dict` with full_state_dict and
broadcast_from_rank0, rank 1 passing empty dicts (`--dcp-api`). Whole tensors, losses and what the loaded
models compute to <out>/rank<R>.npz. A PyTorch script run on flambeau."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_models import B, build_model, fsdp_batch  # noqa: E402
from training import step_and_mean_loss  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
Model = build_model(torch)
# float64: AdamW divides by the gradient's size, and k's bias has none (softmax ignores a key shift): in float32
# its rounding noise decides the update and no two programs agree
torch.set_default_dtype(torch.float64)
FULL = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
res = {}


def meta_model(default_mesh=False):
    with torch.device("meta"):
        model = Model()
    kw = {} if default_mesh else {"mesh": mesh}     # the default: the accelerator's mesh (here cpu), not meta
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return model


def whole(model) -> dict:
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def data(step):
    x, y = fsdp_batch(torch, step, world)
    return x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]


def record(tag, tensors):
    for k, v in tensors.items():
        res[f"{tag}/{k}"] = v.numpy()


torch.manual_seed(0)
model = meta_model()
res["meta"] = np.array(all(p.device.type == "meta" for p in model.parameters()))
model.to_empty(device="cpu")
res["moved"] = np.array(all(isinstance(p, DTensor) and p.to_local().device.type == "cpu" for p in model.parameters()))
for m in model.modules():
    if hasattr(m, "reset_parameters"):
        m.reset_parameters()
record("init", whole(model))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
losses = []
for step in range(2):
    x, y = data(step)
    losses.append(step_and_mean_loss(((model(x) - y) ** 2).mean(), opt, dist))
res["losses"] = np.array(losses)
saved = whole(model)
record("trained", saved)
saved_optim = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
x, y = data(2)
with torch.no_grad():
    res["next_out"] = model(x).numpy()

# (a) the example's default: distribute_tensor pieces, assigned into the meta model
m2 = meta_model()
meta_sd = m2.state_dict()
m2.load_state_dict({k: torch.nn.Parameter(distribute_tensor(v, meta_sd[k].device_mesh, meta_sd[k].placements))
                    for k, v in saved.items()}, strict=False, assign=True)
record("assign", whole(m2))
with torch.no_grad():
    res["assign_out"] = m2(x).numpy()

# (a') the same into a model sharded over fully_shard's default mesh, as the example does
m4 = meta_model(default_mesh=True)
res["default_mesh_type"] = np.array(m4.blocks[0].q.weight.device_mesh.device_type)
meta_sd = m4.state_dict()
m4.load_state_dict({k: torch.nn.Parameter(distribute_tensor(v, meta_sd[k].device_mesh, meta_sd[k].placements))
                    for k, v in saved.items()}, strict=False, assign=True)
with torch.no_grad():
    res["default_mesh_out"] = m4(x).numpy()

# (b) --dcp-api: rank 0's full state dicts broadcast, rank 1's dicts empty
m3 = meta_model()
set_model_state_dict(m3, saved if rank == 0 else {}, options=FULL)
record("broadcast", whole(m3))
opt3 = torch.optim.AdamW(m3.parameters(), lr=0.01)
set_optimizer_state_dict(m3, opt3, saved_optim if rank == 0 else {}, options=FULL)
for mm, oo, tag in ((model, opt, "continued"), (m3, opt3, "resumed")):
    res[f"{tag}_loss"] = np.array(step_and_mean_loss(((mm(x) - y) ** 2).mean(), oo, dist))
    record(tag, whole(mm))
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
