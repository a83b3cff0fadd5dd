"""DTensor on a 1-D mesh of every rank: each case of dtensor_cases.py and every redistribution between
placements; whole results (full_tensor) and gradients saved to <out>/rank<R>.npz. Written as a PyTorch
script: the launcher runs it on flambeau, torchrun on PyTorch's own DTensor (the layouts are compared);
errors are saved per case so one broken rule fails one test."""
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dtensor_cases import CASES, PLACEMENTS, REDIST_SHAPE, inputs  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
res = {"mesh_shape": np.array(mesh.shape), "local_rank": np.array(mesh.get_local_rank())}


def placement(s):
    return Replicate() if s == "R" else Partial() if s == "P" else Shard(int(s[1:]))


def names(pl):
    return ",".join(str(p) for p in pl)


for name, (fn, specs, differentiable, ints) in CASES.items():
    try:
        arrays = inputs(name, specs, ints)
        xs = []
        for i, (a, (shape, p)) in enumerate(zip(arrays, specs)):
            x = torch.from_numpy(a) if p == "plain" else distribute_tensor(torch.from_numpy(a), mesh, [placement(p)])
            if differentiable and i not in ints:
                x.requires_grad_(True)
            xs.append(x)
        out = fn(torch, *xs)
        res[f"{name}/out"] = out.full_tensor().detach().numpy()
        res[f"{name}/placements"] = np.array(names(out.placements))
        if differentiable:
            (out * out).sum().backward()
            for i, x in enumerate(xs):
                if x.requires_grad:
                    res[f"{name}/grad{i}"] = x.grad.full_tensor().numpy()
                    res[f"{name}/grad{i}/placements"] = np.array(names(x.grad.placements))
                    res[f"{name}/grad{i}/is_dtensor"] = np.array(isinstance(x.grad, DTensor))
    except Exception:  # noqa: BLE001  saved for the test to report, the other cases still run
        res[f"{name}/error"] = np.array(traceback.format_exc())

full = torch.from_numpy(np.random.default_rng(7).integers(-9, 9, REDIST_SHAPE).astype(np.float64))
parts = [np.random.default_rng(70 + r).integers(-9, 9, REDIST_SHAPE).astype(np.float64) for r in range(world)]
parts[-1] = full.numpy() - sum(parts[:-1])
for src in PLACEMENTS:
    for dst in ["S0", "S1", "R"] + (["P"] if src == "P" else []):
        key = f"redistribute/{src}/{dst}"
        try:
            if src == "P":
                leaf = torch.from_numpy(parts[rank].copy()).requires_grad_(True)
                x = DTensor.from_local(leaf, mesh, [Partial()], shape=REDIST_SHAPE, stride=(REDIST_SHAPE[1], 1))
            else:
                x = distribute_tensor(full, mesh, [placement(src)]).requires_grad_(True)
                leaf = x
            y = x.redistribute(mesh, [placement(dst)])
            res[f"{key}/local"] = y.to_local().detach().numpy().copy()
            res[f"{key}/full"] = y.full_tensor().detach().numpy()
            if dst == "P":
                (y.to_local() * 3).sum().backward()
            else:
                (y * y).sum().backward()
            res[f"{key}/grad"] = leaf.grad.numpy() if src == "P" else leaf.grad.full_tensor().numpy()
            if src != "P":
                res[f"{key}/grad/placements"] = np.array(names(leaf.grad.placements))
        except Exception:  # noqa: BLE001
            res[f"{key}/error"] = np.array(traceback.format_exc())

np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
