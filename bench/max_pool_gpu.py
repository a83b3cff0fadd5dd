"""Max pooling on one GPU, flambeau beside PyTorch in the same process: ResNet-50's stem pool
(3x3, stride 2, padding 1) on (64, 64, 112, 112) bfloat16 by default.

    python bench/max_pool_gpu.py [--shape 64,64,112,112] [--dtype bfloat16] [--kernel 3] [--stride 2]
                                 [--padding 1] [--reps 20]

One JSON line per system and direction (forward: F.max_pool2d(x) on an input that requires grad;
backward: autograd.grad of that output): kernels per call (PyTorch's profiler sees every kernel of
the process, CuPy's included: bench/gpu_profile.py), gpu_busy_ms per call, and ms (median of --reps
calls between CUDA events, after 3 warm-ups). Uses only public API, so the same file measures an
older flambeau (PYTHONPATH=<its tree>).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import measure  # noqa: E402
from bench.gpu_profile import counts  # noqa: E402


def run(lib, name, args):
    import torch
    shape = tuple(int(s) for s in args.shape.split(","))
    x = lib.tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32), device="cuda")
    x = x.to(getattr(lib, args.dtype)).requires_grad_()
    pool = lib.nn.functional.max_pool2d
    y = pool(x, args.kernel, args.stride, args.padding)
    dy = lib.ones_like(y)
    calls = {"forward": lambda: pool(x, args.kernel, args.stride, args.padding),
             "backward": lambda: lib.autograd.grad(y, x, dy, retain_graph=True)}
    events = measure.torch_events() if lib is torch else measure.cupy_events()
    for direction, fn in calls.items():
        ms = measure.median_event_ms(fn, 3, args.reps, events)
        c = counts(fn, steps=3)
        print(json.dumps({"system": name, "direction": direction, "shape": shape, "dtype": args.dtype,
                          "kernels": c["kernels"], "gpu_busy_ms": c["gpu_busy_ms"], "ms": round(ms, 4)}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="64,64,112,112")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--kernel", type=int, default=3)
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--padding", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    import torch
    import flambeau
    run(torch, "torch", args)
    run(flambeau, "flambeau", args)


if __name__ == "__main__":
    main()
