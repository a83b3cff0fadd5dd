"""Process CPU time per call of LayerNorm forward (native_layer_norm) and backward
(native_layer_norm_backward) on CPU, float32, weight and bias: flambeau's C++ rows
(cpu_kernels.layer_norm*), flambeau's NumPy path (the kernels declined) and PyTorch, measured in the
same run, interleaved.

    PYTHONPATH=$PWD python3 bench/layer_norm_cpu.py [--threads N]

Shapes: 64x64 (bench/distributed_train.py --small), 64x256 and 16*256x384. Prints medians over ROUNDS rounds of the per-call
process CPU time (all threads counted), and the ratios to PyTorch. The box may be shared: say `uptime`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import flambeau as fl
from flambeau._backends import cpu_kernels
from flambeau._ops.norm_loss import native_layer_norm_backward

ROUNDS = 9


def per_call(fn, n):
    fn()
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads / OMP for both (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    real_f, real_b = cpu_kernels.layer_norm, cpu_kernels.layer_norm_backward
    rng = np.random.default_rng(0)
    for rows, cols in ((64, 64), (64, 256), (16 * 256, 384)):
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        w = rng.standard_normal(cols, dtype=np.float32)
        b = rng.standard_normal(cols, dtype=np.float32)
        gy = rng.standard_normal((rows, cols), dtype=np.float32)
        fx, fw, fb, fg = (fl.tensor(a) for a in (x, w, b, gy))
        tx, tw, tb, tg = (torch.tensor(a) for a in (x, w, b, gy))
        _, fm, fr = fl.native_layer_norm(fx, (cols,), fw, fb, 1e-5)
        _, tm, tr = torch.native_layer_norm(tx, (cols,), tw, tb, 1e-5)
        n = max(5, 200_000 // (rows * cols // 64))
        cases = {
            "fwd flambeau C++": lambda: fl.native_layer_norm(fx, (cols,), fw, fb, 1e-5),
            "fwd torch": lambda: torch.native_layer_norm(tx, (cols,), tw, tb, 1e-5),
            "bwd flambeau C++": lambda: native_layer_norm_backward(fg, fx, (cols,), fm, fr, fw, fb),
            "bwd torch": lambda: torch.ops.aten.native_layer_norm_backward(tg, tx, [cols], tm, tr, tw, tb,
                                                                          [True, True, True]),
        }
        numpy_cases = {
            "fwd flambeau NumPy": cases["fwd flambeau C++"],
            "bwd flambeau NumPy": cases["bwd flambeau C++"],
        }
        times = {k: [] for k in list(cases) + list(numpy_cases)}
        for _ in range(ROUNDS):
            for k, fn in cases.items():
                times[k].append(per_call(fn, n))
            cpu_kernels.layer_norm = lambda *a: None
            cpu_kernels.layer_norm_backward = lambda *a: None
            for k, fn in numpy_cases.items():
                times[k].append(per_call(fn, n))
            cpu_kernels.layer_norm, cpu_kernels.layer_norm_backward = real_f, real_b
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(f"{rows}x{cols} (median of {ROUNDS} rounds x {n} calls, us/call, process CPU):")
        for d in ("fwd", "bwd"):
            t = med[f"{d} torch"]
            print(f"  {d}: C++ {med[f'{d} flambeau C++']:8.1f}  NumPy {med[f'{d} flambeau NumPy']:8.1f}  "
                  f"torch {t:8.1f}   C++/torch {med[f'{d} flambeau C++'] / t:.2f}x  "
                  f"NumPy/torch {med[f'{d} flambeau NumPy'] / t:.2f}x")


if __name__ == "__main__":
    main()
