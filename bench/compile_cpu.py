"""Generated CPU kernels (flambeau._inductor) vs PyTorch eager, in the same process.

For each workload: the graph is traced with make_fx under DecompositionMode and compiled with
compile_fx; we report the step time of flambeau eager, flambeau compiled and PyTorch eager
(and torch.compile with --torch-compile), the cold compile time (fresh cache directory), and the
warm compile time (a new compile of the same graph served by the on-disk cache, as in a new
process). Timings interleave the systems round by round and report medians. One JSON object per
line; ratios are what matter (absolute times are noise on a shared machine).

    python bench/compile_cpu.py [--rounds 7] [--torch-compile]

Note: PyTorch ships its own libgomp.so.1; once torch is imported, our kernels share its OpenMP
runtime, whose worker threads spin ~300k iterations after each parallel region and then fight
NumPy's BLAS threads for the cores (the MLP workload, extern matmuls between kernels, suffers).
flambeau alone shortens the spin (GOMP_SPINCOUNT=10000) before it loads libgomp; to give this
same-process comparison the same setting, run with `GOMP_SPINCOUNT=10000` in the environment.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench import measure  # noqa: E402

import flambeau  # noqa: E402
from flambeau._decomp import DecompositionMode  # noqa: E402
from flambeau import _cpp_builder as cpp_builder  # noqa: E402
from flambeau._inductor import compile_fx, config  # noqa: E402
from flambeau.fx.experimental.proxy_tensor import make_fx  # noqa: E402


def ln_gelu_tanh(T, x, w, b):
    y = T.nn.functional.layer_norm(x, (x.shape[-1],), w, b) * 1.5 + 0.1
    return T.nn.functional.gelu(y).tanh()


def softmax(T, x):
    return x.softmax(-1)


def pointwise_chain(T, x, y):
    return ((x * y + 1).sigmoid() * x - y.abs().sqrt()).relu()


def mlp(T, x, w1, b1, w2, b2):
    F = T.nn.functional
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def column_sum(T, g):
    return g.sum(0)


def workloads(rng):
    def a(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    return [
        ("ln_gelu_tanh_256x1024", ln_gelu_tanh, [a(256, 1024), a(1024), a(1024)]),
        ("softmax_256x1024", softmax, [a(256, 1024)]),
        ("pointwise_chain_1M", pointwise_chain, [a(1024, 1024), a(1024, 1024)]),
        ("column_sum_1024x1024", column_sum, [a(1024, 1024)]),
        ("mlp_64x512x2048", mlp, [a(64, 512), a(2048, 512) * 0.05, a(2048), a(512, 2048) * 0.05, a(512)]),
    ]


def trace(fn, args):
    def f(*xs):
        with DecompositionMode():
            return fn(flambeau, *xs)
    return make_fx(f, tracing_mode="fake")(*args)


def median_time(fn, min_time=0.05):
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            return t / n
        n *= 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--torch-compile", action="store_true")
    opts = ap.parse_args()
    rng = np.random.default_rng(0)
    for name, fn, arrays in workloads(rng):
        fx = [flambeau.tensor(x) for x in arrays]
        tx = [torch.from_numpy(x.copy()) for x in arrays]
        gm = trace(fn, fx)
        with tempfile.TemporaryDirectory() as d:
            cpp_builder.cache_dir = d
            cpp_builder._loaded.clear()
            cpp_builder._flags_cache.clear()
            t0 = time.perf_counter()
            compiled = compile_fx(gm, fx)
            cold = time.perf_counter() - t0
            cpp_builder._loaded.clear()
            cpp_builder._flags_cache.clear()
            t0 = time.perf_counter()
            compile_fx(trace(fn, fx), fx)
            warm_with_trace = time.perf_counter() - t0
            cpp_builder._loaded.clear()
            cpp_builder._flags_cache.clear()
            t0 = time.perf_counter()
            compile_fx(gm, fx)
            warm = time.perf_counter() - t0
        systems = {
            "flambeau-eager": lambda: fn(flambeau, *fx),
            "flambeau-compile": lambda: compiled(*fx),
            "torch-eager": lambda: fn(torch, *tx),
        }
        first = {"flambeau-compile": cold}
        if opts.torch_compile:
            tc = torch.compile(lambda *xs: fn(torch, *xs))
            t0 = time.perf_counter()
            tc(*tx)
            first["torch-compile"] = time.perf_counter() - t0
            systems["torch-compile"] = lambda: tc(*tx)
        times, med = measure.interleaved_rounds(systems, opts.rounds, median_time)
        for k, v in med.items():
            rec = {"workload": name, "system": k, "step_ms": round(v * 1e3, 4),
                   "vs_torch_eager": round(med["torch-eager"] / v, 3)}
            if k in first:
                rec["first_call_s"] = round(first[k], 4)
            if k == "flambeau-compile":
                rec.update(warm_compile_s=round(warm, 4), warm_compile_with_trace_s=round(warm_with_trace, 4),
                           kernels=compiled.kernel_count, fallbacks=compiled.fallback_ops)
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
