"""Where a training step's time goes, flambeau beside PyTorch on the same GPU (bench/gpu_models.py code).

    python bench/gpu_top.py [--only resnet,gpt] [--modes eager,compiled] [--rows 30] [--steps 2] [--dump DIR]

For each workload and system: the top GPU kernels by total device time over `--steps` profiled steps
(PyTorch's profiler sees every kernel of the process, CuPy's, cuDNN's and Triton's included), grouped
by name, with count and share; then for flambeau the top Python functions by own host time (cProfile
over the same number of steps, run separately so the tracer does not distort the kernel table).
Printed as plain text tables, meant to be read, not parsed. With --dump, the cProfile statistics are
also written to DIR/<workload>.prof (read them with `python -m pstats`).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flambeau  # noqa: E402
from bench import gpu_models  # noqa: E402
from bench.gpu_profile import _trace  # noqa: E402
from bench.gpu_train import WORKLOADS, library  # noqa: E402

NAME_WIDTH = 110


def _setup(name, lib, mode="eager"):
    m = library(lib)
    rng = np.random.default_rng(0)
    m.manual_seed(0)
    model = WORKLOADS[name]["build"](m).to("cuda")
    xs, ys = WORKLOADS[name]["batch"](rng)
    x, y = m.tensor(xs, device="cuda"), m.tensor(ys, device="cuda")
    opt = m.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    fwd = m.compile(model) if mode == "compiled" else model
    return m, (lambda: gpu_models.train_step(m, fwd, opt, x, y, m.bfloat16))


def kernel_table(events, steps, rows):
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            total[e["name"][:NAME_WIDTH]] += e.get("dur", 0)
            count[e["name"][:NAME_WIDTH]] += 1
    busy = sum(total.values())
    print(f"  GPU busy {busy / steps / 1e3:.2f} ms/step, {sum(count.values()) / steps:.0f} kernels+copies/step")
    for name, us in total.most_common(rows):
        print(f"  {us / steps / 1e3:8.3f} ms {100 * us / max(busy, 1):5.1f}% {count[name] / steps:6.0f}x  {name}")
    span = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if span:
        t0 = min(e["ts"] for e in span)
        t1 = max(e["ts"] + e.get("dur", 0) for e in span)
        print(f"  GPU span {(t1 - t0) / steps / 1e3:.2f} ms/step (busy/span = {busy / max(t1 - t0, 1):.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="resnet")
    ap.add_argument("--systems", default="torch,flambeau")
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args(argv)
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name, mode in ((n, md) for n in a.only.split(",") for md in a.modes.split(",")):
        for lib in a.systems.split(","):
            m, step = _setup(name, lib, mode)
            for _ in range(3):
                step()
            m.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            m.cuda.synchronize()
            print(f"== {name} {lib} {mode}: {(time.perf_counter() - t0) * 1e3 / a.steps:.2f} ms/step wall", flush=True)
            kernel_table(_trace(step, a.steps, False), a.steps, a.rows)
            if lib == "flambeau":
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(a.steps):
                    step()
                m.cuda.synchronize()
                prof.disable()
                if a.dump:
                    prof.dump_stats(os.path.join(a.dump, f"{name}.prof"))
                st = pstats.Stats(prof)
                st.sort_stats("tottime").print_stats(a.rows)
                st.sort_stats("cumtime").print_stats(a.rows)
            del step
            m.cuda.empty_cache()
            sys.stdout.flush()


if __name__ == "__main__":
    main()
