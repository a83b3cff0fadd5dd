"""Eager-mode benchmark: per-op overhead on small tensors and large-tensor throughput,
flambeau vs PyTorch eager in the same process. Prints one JSON object per line.

    python bench/eager_ops.py [--device cpu|cuda] [--quick]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _sync(mod, device):
    if device == "cuda":
        mod.cuda.synchronize()


def timeit(fn, mod, device, min_time=0.3, max_iters=20000):
    fn()
    _sync(mod, device)
    n, total = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(mod, device)
        total = time.perf_counter() - t0
        if total >= min_time or n >= max_iters:
            return total / n
        n = min(max_iters, max(n * 2, int(n * min_time / max(total, 1e-9))))


def workloads(m, device):
    rng = np.random.default_rng(0)

    def T(*shape):
        return m.tensor(rng.standard_normal(shape).astype(np.float32), device=device)

    a8, b8 = T(8, 8), T(8, 8)
    idx = m.tensor([0, 2, 4], device=device)
    big1, big2 = T(4 * 1024 * 1024), T(4 * 1024 * 1024)
    sm = T(4096, 1024)
    mm1, mm2 = T(1024, 1024), T(1024, 1024)
    x = T(32, 64, 56, 56)
    w = T(64, 64, 3, 3)
    F = m.nn.functional
    return [
        ("small_add_8x8", lambda: a8 + b8),
        ("small_mul_8x8", lambda: a8 * b8),
        ("small_sum_8x8", lambda: a8.sum()),
        ("small_matmul_8x8", lambda: a8 @ b8),
        ("small_index_8x8", lambda: a8[idx]),
        ("small_slice_8x8", lambda: a8[1:3]),
        ("large_add_4M", lambda: big1 + big2),
        ("large_softmax_4096x1024", lambda: m.softmax(sm, dim=-1)),
        ("large_matmul_1024", lambda: mm1 @ mm2),
        ("large_conv2d_32x64x56x56_3x3", lambda: F.conv2d(x, w, padding=1)),
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    import torch
    import flambeau
    torch.set_num_threads(torch.get_num_threads())
    results = {}
    for sysname, mod in (("torch-eager", torch), ("flambeau-eager", flambeau)):
        for name, fn in workloads(mod, args.device):
            if args.quick and name.startswith("large_conv"):
                continue
            try:
                t = timeit(fn, mod, args.device, min_time=0.1 if args.quick else 0.3)
            except Exception as e:  # an op missing is reported, not fatal
                print(json.dumps({"workload": name, "system": sysname, "error": f"{type(e).__name__}: {e}"}))
                continue
            results[(sysname, name)] = t
            print(json.dumps({"workload": name, "system": sysname, "device": args.device,
                              "step_time_us": round(t * 1e6, 2)}), flush=True)
    for (sysname, name), t in results.items():
        if sysname == "flambeau-eager" and ("torch-eager", name) in results:
            print(json.dumps({"workload": name, "ratio_flambeau_over_torch":
                              round(t / results[("torch-eager", name)], 2), "device": args.device}))


if __name__ == "__main__":
    main()
