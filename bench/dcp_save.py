"""Distributed checkpoint save/load throughput: every rank saves its shard of a state dict with
`distributed.checkpoint.save`, then loads it back; rank 0 prints one JSON object per round.

    python -m flambeau.distributed.run --nproc-per-node 2 bench/dcp_save.py DIR [--mb 256] [--rounds 3]

The state dict is `--mb` MiB of float32 in 16 tensors, sharded row-wise over the ranks as DTensors
(Shard(0), what FSDP2 holds), so each rank writes about mb / world MiB. Reported: seconds per save
(barrier to barrier, metadata commit included; files fsynced) and per load, and the aggregate
MB/s (all ranks' bytes / time). Timings from a loaded machine are noise; the disk is whatever DIR is on.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import flambeau as torch
import flambeau.distributed as dist
import flambeau.distributed.checkpoint as dcp
from flambeau.distributed.device_mesh import init_device_mesh
from flambeau.distributed.tensor import Shard, distribute_tensor

TENSORS = 16
MIB = 1024 * 1024
FLOAT32_BYTES = 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    cols = 1024
    rows = args.mb * MIB // (TENSORS * cols * FLOAT32_BYTES)
    torch.manual_seed(0)
    state = {f"layer{i}.weight": distribute_tensor(torch.randn(rows, cols), mesh, [Shard(0)]) for i in range(TENSORS)}
    total = TENSORS * rows * cols * FLOAT32_BYTES
    for r in range(args.rounds):
        folder = os.path.join(args.dir, f"round{r}")
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=folder)
        dist.barrier()
        t1 = time.perf_counter()
        dcp.load(state, checkpoint_id=folder)
        dist.barrier()
        t2 = time.perf_counter()
        if rank == 0:
            print(json.dumps({"workload": "dcp_save_load", "system": "flambeau", "world": world,
                              "mib": total / MIB, "save_s": round(t1 - t0, 4), "load_s": round(t2 - t1, 4),
                              "save_mb_s": round(total / MIB / (t1 - t0), 1),
                              "load_mb_s": round(total / MIB / (t2 - t1), 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
