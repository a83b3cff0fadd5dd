"""DeviceMesh on 4 ranks as a (2, 2) mesh ("dp", "tp"): groups, slicing, local shapes, and 2-D DTensor
layouts; results to <out>/rank<R>.npz (a PyTorch script run on flambeau by the launcher)."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
res = {"coordinate": np.array(mesh.get_coordinate()),
       "tp_ranks": np.array(dist.get_process_group_ranks(mesh["tp"].get_group())),
       "dp_ranks": np.array(dist.get_process_group_ranks(mesh.get_group("dp"))),
       "local_ranks": np.array([mesh.get_local_rank("dp"), mesh.get_local_rank("tp"), mesh["tp"].get_local_rank()]),
       "sizes": np.array([mesh.size(), mesh.size(0), mesh["dp"].size()])}
t = torch.ones(1) * rank
dist.all_reduce(t, group=mesh["tp"].get_group())
res["tp_sum"] = t.numpy()
layouts = {"S0S0": [Shard(0), Shard(0)], "S0S1": [Shard(0), Shard(1)], "RS0": [Replicate(), Shard(0)],
           "S1R": [Shard(1), Replicate()]}
full = torch.from_numpy(np.arange(35, dtype=np.float64).reshape(5, 7))
for name, pl in layouts.items():
    shape, offset = compute_local_shape_and_global_offset((5, 7), mesh, pl)
    res[f"{name}/shape"], res[f"{name}/offset"] = np.array(shape), np.array(offset)
    d = distribute_tensor(full, mesh, pl)
    res[f"{name}/local"] = d.to_local().numpy().copy()
    for other, pl2 in layouts.items():
        res[f"{name}/{other}/local"] = d.redistribute(mesh, pl2).to_local().numpy().copy()
    res[f"{name}/full"] = d.full_tensor().numpy()
a = distribute_tensor(full, mesh, [Shard(0), Replicate()])
b = distribute_tensor(full.t().contiguous(), mesh, [Replicate(), Shard(1)])
c = a @ b
res["mm/placements"] = np.array(",".join(map(str, c.placements)))
res["mm/full"] = c.full_tensor().numpy()
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
