"""AOTInductor packages with and without pre-packed GEMM weights (issue 15 item 1), per call from Python.

    python bench/aoti_prepack.py [--rounds 7] [--min-time 0.3]

The small GPT of bench/export_aoti.py (d 128, 4 heads, 2 layers, T 64, vocab 96) at batch 1 and 16,
exported once and packaged twice with freezing: `prepack_weights` off (the GEMM packs each weight's
panels at every call) and on (packed once at load). The two packages are timed in interleaved rounds
of at least --min-time seconds; one JSON object per line with the medians and their ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flambeau  # noqa: E402
from bench.small_gpt import small_gpt  # noqa: E402
from flambeau._inductor import aoti_compile_and_package, aoti_load_package  # noqa: E402
from flambeau.export import export  # noqa: E402

GPT = dict(vocab=96, d=128, heads=4, layers=2, block=64)


def mean_call(fn, x, min_time: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        fn(x)
        n += 1
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3)
    opts = ap.parse_args()
    flambeau.manual_seed(0)
    m = small_gpt(flambeau, **GPT).eval()
    with tempfile.TemporaryDirectory() as d:
        for batch in (1, 16):
            x = flambeau.randint(0, GPT["vocab"], (batch, GPT["block"]))
            ep = export(m, (x,))
            runs = {pre: aoti_load_package(aoti_compile_and_package(
                ep, os.path.join(d, f"b{batch}_{pre}.pt2"), inductor_configs={"freezing": True, "prepack_weights": pre}))
                for pre in (False, True)}
            times = {pre: [] for pre in runs}
            for _ in range(opts.rounds):
                for pre, fn in runs.items():
                    times[pre].append(mean_call(fn, x, opts.min_time))
            per_call, prepacked = (statistics.median(times[p]) * 1e3 for p in (False, True))
            print(json.dumps({"workload": f"gpt{batch}", "system": "flambeau-aoti-python", "packed_per_call_ms":
                              round(per_call, 3), "prepacked_ms": round(prepacked, 3),
                              "ratio": round(prepacked / per_call, 3)}), flush=True)


if __name__ == "__main__":
    main()
