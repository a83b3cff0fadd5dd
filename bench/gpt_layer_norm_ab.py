"""The small GPT's eager CPU training step (bench/distributed_train.py --small: 2 layers, width 64,
B 2, T 32, AdamW, float32, one thread) in one process, three ways interleaved: flambeau with its
LayerNorm C++ rows (cpu_kernels.layer_norm*), flambeau with them declined (the NumPy path), and
PyTorch. Process CPU time per step, median over rounds; ratios to PyTorch in the same rounds.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python3 bench/gpt_layer_norm_ab.py [--rounds 15] [--steps 40]

The box may be shared: say `uptime` next to the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import gpu_models  # noqa: E402
from bench.distributed_train import SMALL, LR  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    import torch
    import flambeau
    from flambeau._backends import cpu_kernels
    torch.set_num_threads(1)
    cfg = SMALL
    rng = np.random.default_rng(1234)
    data = rng.integers(0, cfg["vocab"], (2, cfg["batch"], cfg["seq"]))
    runs = {}
    for m in (flambeau, torch):
        m.manual_seed(0)
        model = gpu_models.gpt(m, vocab=cfg["vocab"], block=cfg["block"], d=cfg["d"], layers=cfg["layers"],
                               heads=cfg["heads"])
        opt = m.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
        x, y = m.tensor(data[0]), m.tensor(data[1])
        runs[m.__name__] = (m, model, opt, x, y)
    real = cpu_kernels.layer_norm, cpu_kernels.layer_norm_backward

    def steps(name):
        m, model, opt, x, y = runs[name]
        t = time.process_time()
        for _ in range(args.steps):
            gpu_models.train_step(m, model, opt, x, y)
        return (time.process_time() - t) / args.steps * 1e3

    def numpy_path():
        cpu_kernels.layer_norm = lambda *a: None
        cpu_kernels.layer_norm_backward = lambda *a: None
        try:
            return steps("flambeau")
        finally:
            cpu_kernels.layer_norm, cpu_kernels.layer_norm_backward = real

    for f in (lambda: steps("flambeau"), numpy_path, lambda: steps("torch")):
        f()                                                   # warm up
    t = {"C++": [], "NumPy": [], "torch": []}
    for _ in range(args.rounds):
        t["C++"].append(steps("flambeau"))
        t["NumPy"].append(numpy_path())
        t["torch"].append(steps("torch"))
    ratio = {k: statistics.median(a / b for a, b in zip(t[k], t["torch"])) for k in ("C++", "NumPy")}
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"small GPT eager CPU step, ms process CPU (median of {args.rounds} rounds x {args.steps} steps): "
          f"flambeau C++ LN {med['C++']:.3f}  flambeau NumPy LN {med['NumPy']:.3f}  torch {med['torch']:.3f}")
    print(f"  per-round ratio to torch (median): C++ LN {ratio['C++']:.3f}x  NumPy LN {ratio['NumPy']:.3f}x")


if __name__ == "__main__":
    main()
