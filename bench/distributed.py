"""all_reduce bandwidth, flambeau (MPI engine, backend="gloo") vs PyTorch's gloo, in the same run.

    python bench/distributed.py [--nproc 2] [--sizes 4K,64K,1M,16M,64M,256M] [--min-time 0.5]

The driver launches the same worker script twice: under `python -m flambeau.distributed.run` (where
`import torch` is flambeau) and under `python -m torch.distributed.run` (PyTorch itself). Each worker
all-reduces float32 tensors of every size (sum, synchronous, after warm-up) and rank 0 prints one JSON
object per size: workload, system, bytes, seconds per all_reduce, algorithm bandwidth (bytes / time)
and bus bandwidth (algbw * 2 (n-1) / n, NCCL-tests' convention). Each timed all_reduce is followed by a
one-float all_reduce on which the ranks agree when to stop (the same for both systems, so small sizes
read about twice their cost). Timings from a loaded machine are noise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

UNITS = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
WARMUP = 3
FLOAT32_BYTES = 4


def _bytes(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def worker(sizes: list, min_time: float) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    system = "flambeau" if torch.__name__ == "flambeau" else "torch-gloo"
    for nbytes in sizes:
        t = torch.ones(nbytes // FLOAT32_BYTES)
        for _ in range(WARMUP):
            dist.all_reduce(t)
        dist.barrier()
        iters, start = 0, time.perf_counter()
        while True:
            dist.all_reduce(t)
            iters += 1
            done = [float(time.perf_counter() - start >= min_time)]
            flag = torch.tensor(done)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)       # every rank stops after the same iteration
            if flag.item() > 0:
                break
        seconds = (time.perf_counter() - start) / iters
        if rank == 0:
            algbw = nbytes / seconds
            print(json.dumps({"workload": "all_reduce", "system": system, "world_size": world, "bytes": nbytes,
                              "iters": iters, "s_per_op": seconds, "algbw_GBps": algbw / 1e9,
                              "busbw_GBps": algbw * 2 * (world - 1) / world / 1e9}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M")
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [_bytes(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.min_time)
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    tail = [os.path.abspath(__file__), "--worker", "--sizes", args.sizes, "--min-time", str(args.min_time)]
    for launcher in ("flambeau.distributed.run", "torch.distributed.run"):
        cmd = [sys.executable, "-m", launcher, "--nproc-per-node", str(args.nproc)] + tail
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
