"""FSDP2 checkpoints: `dcp_fsdp.py MODE FOLDER OUT` under the launcher; the test imports the model and data.

save: every rank builds the model from seed 0, shards it with fully_shard (each Linear, then the root; the
      6-row layer shards unevenly over 4 ranks), trains STEPS_BEFORE AdamW steps, saves model and optimizer
      (get_state_dict: Shard(0) DTensors) to FOLDER/ckpt, trains STEPS_AFTER more; rank 0 writes the
      losses of those to OUT/reference.npy.
load: every rank builds the model from another seed and an optimizer with another learning rate, shards
      it over this world, loads FOLDER/ckpt (dcp.load + set_state_dict), trains STEPS_AFTER steps; rank 0
      writes the losses to OUT/loaded<W>.npy.
Every rank trains on the same whole batch (FSDP averages identical gradients), in float64.
"""
import os
import sys

import numpy as np

import flambeau
import flambeau.distributed as dist
import flambeau.distributed.checkpoint as dcp
from flambeau.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from flambeau.distributed.device_mesh import init_device_mesh
from flambeau.distributed.fsdp import fully_shard

STEPS_BEFORE, STEPS_AFTER, LR = 2, 3, 0.05


def build(nn):
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))


def batch(lib, step):
    g = np.random.default_rng(50 + step)
    return lib.from_numpy(g.standard_normal((8, 5))), lib.from_numpy(g.standard_normal((8, 3)))


def train(lib, model, opt, steps) -> list:
    losses = []
    for step in steps:
        x, y = batch(lib, step)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def sharded_model(seed, world):
    flambeau.manual_seed(seed)
    model = build(flambeau.nn).double()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, flambeau.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main(mode, folder, out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(folder, "ckpt")
    if mode == "save":
        model = sharded_model(0, world)
        opt = flambeau.optim.AdamW(model.parameters(), lr=LR)
        train(flambeau, model, opt, range(STEPS_BEFORE))
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        losses = train(flambeau, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
        if rank == 0:
            np.save(os.path.join(out, "reference.npy"), np.array(losses))
    else:
        model = sharded_model(1, world)
        opt = flambeau.optim.AdamW(model.parameters(), lr=10 * LR)
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        losses = train(flambeau, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
        if rank == 0:
            np.save(os.path.join(out, f"loaded{world}.npy"), np.array(losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
