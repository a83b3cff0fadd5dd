"""BatchNorm + ReLU training steps compiled on one GPU at ResNet-50's sizes (batch 64, bfloat16
activations, float32 parameters): the Triton reduction kernels flambeau generates, under variants
of its code generator in one process, beside torch.compile of the same function in the same run.

    python bench/bn_reduce_gpu.py [--shapes 64x256x56x56,64x64x112x112] [--variants default,p1024]
                                  [--reps 20] [--top 6]

A step is y = relu(batch_norm(x, running_mean, running_var, w, b, training=True)) then y.backward(dy).
Variants (flambeau's inductor config; the function is recompiled for each):
  default    the tree's own defaults (the variant to compare between checkouts)
  p1024      split reductions aiming at 1024 programs (triton_split_programs; default 512)
  r2048      RBLOCK 2048 for looped rows and split parts (triton_loop_block; default 1024)
One JSON line per (shape, system): ms per step (median of --reps between CUDA events after warm-up),
GPU busy ms and kernels per step (PyTorch's profiler, which sees CuPy's and Triton's kernels too), and
the --top kernels by device time (name, launches, ms per step). Uses public API and config names
only (a variant whose knob this tree lacks is skipped), so the same file measures another checkout
(PYTHONPATH=<tree>), its torch.compile line the common peer.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import measure  # noqa: E402
from bench.gpu_profile import _busy_us, _trace  # noqa: E402

SHAPES = "64x64x112x112,64x256x56x56,64x512x28x28,64x1024x14x14,64x2048x7x7"
VARIANTS = {"default": {},
            "p1024": {"triton_split_programs": 1024},
            "r2048": {"triton_loop_block": 2048}}


def _step_fn(lib, shape):
    rng = np.random.default_rng(0)
    c = shape[1]
    x = lib.tensor((rng.standard_normal(shape, dtype=np.float32) * 2 + 1), device="cuda").to(lib.bfloat16)
    x.requires_grad_()
    w = lib.tensor(rng.standard_normal(c, dtype=np.float32), device="cuda", requires_grad=True)
    b = lib.tensor(rng.standard_normal(c, dtype=np.float32), device="cuda", requires_grad=True)
    dy = lib.tensor(rng.standard_normal(shape, dtype=np.float32), device="cuda").to(lib.bfloat16)
    rm = lib.zeros(c, device="cuda")
    rv = lib.ones(c, device="cuda")

    def f(x, w, b):           # running statistics as nn.BatchNorm2d's (their update is part of the step)
        return lib.nn.functional.relu(lib.nn.functional.batch_norm(x, rm, rv, w, b, training=True))
    cf = lib.compile(f)

    def step():
        x.grad = w.grad = b.grad = None
        cf(x, w, b).backward(dy)
    return step


def _measure(lib, system, shape, args):
    import torch
    step = _step_fn(lib, shape)
    events = measure.torch_events() if lib is torch else measure.cupy_events()
    ms = measure.median_event_ms(step, 3, args.reps, events)
    ev = [e for e in _trace(step, 3, False) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        by[e["name"][:60]][0] += 1
        by[e["name"][:60]][1] += e.get("dur", 0)
    top = sorted(by.items(), key=lambda kv: -kv[1][1])[:args.top]
    print(json.dumps({"shape": "x".join(map(str, shape)), "system": system, "ms": round(ms, 4),
                      "gpu_busy_ms": round(_busy_us(ev) / 3 / 1e3, 4), "kernels": len(ev) / 3,
                      "top": [(n, c / 3, round(d / 3 / 1e3, 4)) for n, (c, d) in top]}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--variants", default="default,p1024,r2048")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args()
    import torch
    import flambeau
    from flambeau._inductor import config
    for s in args.shapes.split(","):
        shape = tuple(int(d) for d in s.split("x"))
        _measure(torch, "torch-compile", shape, args)
        for v in args.variants.split(","):
            knobs = VARIANTS[v]
            if not all(hasattr(config, k) for k in knobs):
                print(json.dumps({"shape": s, "system": f"flambeau-{v}", "skipped": "knob missing in this tree"}))
                continue
            saved = {k: getattr(config, k) for k in knobs}
            for k, val in knobs.items():
                setattr(config, k, val)
            flambeau._dynamo.reset()
            try:
                _measure(flambeau, f"flambeau-{v}", shape, args)
            finally:
                for k, val in saved.items():
                    setattr(config, k, val)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
