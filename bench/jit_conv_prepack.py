"""Frozen JIT graphs (Python wrapper) with and without convolution weights packed once, per call.

    python bench/jit_conv_prepack.py [--rounds 7] [--min-time 0.3] [--batch 1 8]

A four-layer 3x3 CNN (3->32->64->64->128, two stride-2 layers) on 32x32 images, compiled with
`config.freezing` twice: `prepack_weights` off (the eager convolution kernel packs each weight's tiles
at every call) and on (`cpu_kernels.conv2d_plan_packed`: packed once at compile). The two and PyTorch's
eager module are timed in interleaved rounds of at least --min-time seconds; one JSON object per line
with the medians and their ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flambeau as fl  # noqa: E402
from flambeau._inductor import config  # noqa: E402


def net(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, stride=2, padding=1))


def mean_call(fn, min_time: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    a = ap.parse_args()
    fl.manual_seed(0)
    m, tm = net(fl).eval(), net(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    saved = config.freezing, config.prepack_weights
    config.freezing = True
    try:
        for batch in a.batch:
            x = fl.randn(batch, 3, 32, 32)
            tx = torch.tensor(x.numpy())
            fns = {}
            for pre in (False, True):
                config.prepack_weights = pre
                fl._dynamo.reset()
                f = fl.compile(m)
                with fl.no_grad():
                    f(x)
                fns["packed-once" if pre else "packed-per-call"] = lambda f=f: f(x)
            fns["torch-eager"] = lambda: tm(tx)
            times = {k: [] for k in fns}
            with fl.no_grad(), torch.no_grad():
                for _ in range(a.rounds):
                    for k, fn in fns.items():
                        times[k].append(mean_call(fn, a.min_time))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(json.dumps({"workload": f"cnn4-b{batch}", **{f"{k}_ms": round(v, 3) for k, v in med.items()},
                              "once/per_call": round(med["packed-once"] / med["packed-per-call"], 3),
                              "once/torch": round(med["packed-once"] / med["torch-eager"], 3)}))
    finally:
        config.freezing, config.prepack_weights = saved
        fl._dynamo.reset()


if __name__ == "__main__":
    main()
