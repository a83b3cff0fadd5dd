"""all_reduce bandwidth, flambeau vs PyTorch in the same run: on CPU (flambeau's MPI engine behind
backend="gloo" vs PyTorch's gloo) or on cuda (flambeau's NCCL backend vs PyTorch's NCCL backend).

    python bench/distributed.py [--nproc 2] [--sizes 4K,64K,1M,16M,64M,256M] [--min-time 0.5]
    python bench/distributed.py --device cuda [--nproc 2] [--sizes 1M,4M,16M,64M,256M,1G]

The driver launches the same worker script twice: under `python -m flambeau.distributed.run` (where
`import torch` is flambeau) and under `python -m torch.distributed.run` (PyTorch itself). Each worker
all-reduces float32 tensors of every size (sum, synchronous, after warm-up) and rank 0 prints one JSON
object per size: workload, system, device, bytes, seconds per all_reduce, algorithm bandwidth (bytes /
time) and bus bandwidth (algbw * 2 (n-1) / n, NCCL-tests' convention). On CPU each timed all_reduce is
followed by a one-float all_reduce on which the ranks agree when to stop (the same for both systems, so
small sizes read about twice their cost). On cuda each rank uses the GPU of its LOCAL_RANK; the ranks
agree on an iteration count from a timed probe, then time that many back-to-back all_reduces between two
device synchronisations (as nccl-tests does). Timings from a loaded machine are noise.
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
CPU_SIZES = "4K,64K,1M,16M,64M,256M"
CUDA_SIZES = "1M,4M,16M,64M,256M,1G"


def _bytes(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


PROBE_ITERS = 5
MIN_ITERS = 5


def cuda_worker(sizes: list, min_time: float) -> None:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    system = "flambeau-nccl" if torch.__name__ == "flambeau" else "torch-nccl"
    for nbytes in sizes:
        t = torch.ones(nbytes // FLOAT32_BYTES, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(PROBE_ITERS):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        per_op = (time.perf_counter() - start) / PROBE_ITERS
        iters = torch.tensor([max(MIN_ITERS, int(min_time / max(per_op, 1e-9)))], device="cuda")
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)            # every rank runs the same count
        iters = int(iters.item())
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        if rank == 0:
            algbw = nbytes / seconds
            print(json.dumps({"workload": "all_reduce", "system": system, "device": "cuda", "world_size": world,
                              "bytes": nbytes, "iters": iters, "s_per_op": seconds, "algbw_GBps": algbw / 1e9,
                              "busbw_GBps": algbw * 2 * (world - 1) / world / 1e9}), flush=True)
    dist.destroy_process_group()


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
            print(json.dumps({"workload": "all_reduce", "system": system, "device": "cpu", "world_size": world,
                              "bytes": nbytes,
                              "iters": iters, "s_per_op": seconds, "algbw_GBps": algbw / 1e9,
                              "busbw_GBps": algbw * 2 * (world - 1) / world / 1e9}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--sizes", default=None, help=f"default: {CPU_SIZES} on cpu, {CUDA_SIZES} on cuda")
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = args.sizes or (CUDA_SIZES if args.device == "cuda" else CPU_SIZES)
    sizes = [_bytes(s) for s in args.sizes.split(",")]
    if args.worker:
        (cuda_worker if args.device == "cuda" else worker)(sizes, args.min_time)
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    tail = [os.path.abspath(__file__), "--worker", "--device", args.device, "--sizes", args.sizes,
            "--min-time", str(args.min_time)]
    for launcher in ("flambeau.distributed.run", "torch.distributed.run"):
        cmd = [sys.executable, "-m", launcher, "--nproc-per-node", str(args.nproc)] + tail
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
