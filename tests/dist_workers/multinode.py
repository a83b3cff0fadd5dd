"""Two launchers as two nodes: `multinode.py MODE OUT`. A PyTorch script (runs on flambeau through the aliasing).

env:   every rank writes its torchrun environment and the all_reduce of its rank over the world to
       OUT/env<R>.json.
raise: the last rank (on the last node) raises after init while the others wait in an all_reduce.
flaky: as raise on restart attempt 0, as env on attempt 1.
hang:  every rank writes OUT/started<R>; then the last rank sleeps forever while the others wait in a
       barrier (only stopping a node ends it).
elasticW: (`--nnodes MIN:MAX`) at world size W as env; at any other world size every rank writes
       OUT/started<R>_w<world> (holding its NODE_MARK) and the ranks hang as in hang (only a new rendezvous round ends that).
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if mode.startswith("elastic"):
    mode = "env" if world == int(mode[len("elastic"):]) else "hang"
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if (mode == "raise" or mode == "flaky" and attempt == 0) and rank == world - 1:
    raise RuntimeError(f"rank {rank} on node {os.environ['GROUP_RANK']} raised on purpose")
if mode == "hang":
    with open(os.path.join(out, f"started{rank}" + ("" if sys.argv[1] == "hang" else f"_w{world}")), "w") as fh:
        fh.write(os.environ.get("NODE_MARK", ""))
    while rank == world - 1:
        time.sleep(1)
    dist.barrier()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
if mode in ("env", "flaky"):
    keys = ("TORCHELASTIC_RESTART_COUNT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "NODE_MARK", "ROLE_WORLD_SIZE", "ROLE_NAME")
    found = {k: os.environ.get(k) for k in keys}
    found.update(rank=rank, world=world, total=t.item())
    with open(os.path.join(out, f"env{rank}.json"), "w") as fh:
        json.dump(found, fh)
dist.barrier()
dist.destroy_process_group()
