"""Fused attention on cuda: forward+backward of scaled_dot_product_attention, flambeau's cuDNN and
Triton backends against PyTorch's cuDNN, flash and memory-efficient backends in the same process.

    python bench/sdpa_gpu.py [--shapes 8x12x4096x64,8x12x1024x64] [--sweep]

Prints one JSON object per line (workload, system, backend, ms for forward+backward through autograd,
and for flambeau also the kernels alone). `--sweep` first times a few Triton block configurations
at head dim 64 and keeps the fastest for the rest of the run. Times are medians of CUDA-event
intervals after warm-up; inputs are random bf16, causal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import measure  # noqa: E402

WARMUP = 3
REPS = 20


def bench_flambeau(B, H, T, E, backend):
    import flambeau
    import flambeau.nn.functional as F
    from flambeau._ops import attention as A
    rng = np.random.default_rng(0)
    q, k, v = (flambeau.tensor(rng.standard_normal((B, H, T, E)).astype(np.float32), device="cuda")
               .to(flambeau.bfloat16).requires_grad_() for _ in range(3))
    g = flambeau.tensor(rng.standard_normal((B, H, T, E)).astype(np.float32), device="cuda").to(flambeau.bfloat16)

    def step():
        with A.sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        flambeau.autograd.grad(out, [q, k, v], g)
    return measure.median_event_ms(step, WARMUP, REPS)


def bench_kernels(B, H, T, E, which):
    """The backend functions alone (no dispatch, no autograd)."""
    import cupy
    from flambeau._backends import cudnn_attention, triton_attention
    q, k, v, g = (cupy.asarray(np.random.default_rng(i).standard_normal((B, H, T, E)), dtype=np.float32)
                  .astype(_bf16()) for i in range(4))
    rng = cupy.zeros(2, dtype=np.int64)
    sc = 1 / np.sqrt(E)
    if which == "cudnn-fwd":
        def step():
            cudnn_attention.forward(q, k, v, 0.0, rng, True, sc)
    elif which == "triton-fwd":
        def step():
            triton_attention.forward(q, k, v, None, 0.0, rng, True, sc)
    elif which == "cudnn":
        def step():
            o, st = cudnn_attention.forward(q, k, v, 0.0, rng, True, sc)
            cudnn_attention.backward(g, q, k, v, o, st, 0.0, rng, True, sc)
    else:
        def step():
            o, st = triton_attention.forward(q, k, v, None, 0.0, rng, True, sc)
            triton_attention.backward(g, q, k, v, o, st, None, 0.0, rng, True, sc)
    return measure.median_event_ms(step, WARMUP, REPS)


def _bf16():
    import ml_dtypes
    return ml_dtypes.bfloat16


def bench_torch(B, H, T, E, backend_name):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(B, H, T, E, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, E, device="cuda", dtype=torch.bfloat16)
    be = getattr(SDPBackend, backend_name)

    def step():
        with sdpa_kernel(be):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, [q, k, v], g)
    return measure.median_event_ms(step, WARMUP, REPS, measure.torch_events())


def sweep(B, H, T, E):
    """Time candidate Triton block configurations at head dim E; keep the fastest of each kernel."""
    from flambeau._backends import triton_attention as TA
    candidates = {
        "FWD_CONFIG": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
        "DKDV_CONFIG": [(32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 2)],
        "DQ_CONFIG": [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)],
    }
    for table, configs in candidates.items():
        best = None
        for cfg in configs:
            getattr(TA, table)[E] = cfg
            try:
                ms = bench_kernels(B, H, T, E, "triton")
            except Exception as e:          # a config may not fit shared memory
                print(json.dumps({"sweep": table, "config": cfg, "error": str(e)[:200]}), flush=True)
                continue
            print(json.dumps({"sweep": table, "config": cfg, "ms": round(ms, 3)}), flush=True)
            if best is None or ms < best[0]:
                best = (ms, cfg)
        getattr(TA, table)[E] = best[1]
        print(json.dumps({"sweep": table, "best": best[1], "ms": round(best[0], 3)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x12x4096x64,8x12x1024x64")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile flambeau's cuDNN step at the last shape")
    args = ap.parse_args()
    from flambeau._ops import attention as A
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.sweep:
        sweep(*shapes[0])
    for B, H, T, E in shapes:
        work = f"sdpa_fwd_bwd_B{B}_H{H}_T{T}_D{E}_bf16_causal"
        rows = []
        for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
            rows.append(("torch-eager", name, bench_torch(B, H, T, E, name)))
        for name, be in (("CUDNN_ATTENTION", A.SDPBackend.CUDNN_ATTENTION), ("FLASH_ATTENTION", A.SDPBackend.FLASH_ATTENTION)):
            try:
                rows.append(("flambeau-eager", name, bench_flambeau(B, H, T, E, be)))
            except Exception as e:
                print(json.dumps({"workload": work, "system": "flambeau-eager", "backend": name,
                                  "error": str(e)[:300]}), flush=True)
        for which in ("cudnn", "triton", "cudnn-fwd", "triton-fwd"):
            try:
                rows.append(("flambeau-kernels", which, bench_kernels(B, H, T, E, which)))
            except Exception as e:
                print(json.dumps({"workload": work, "system": "flambeau-kernels", "backend": which,
                                  "error": str(e)[:300]}), flush=True)
        best_torch = min(ms for s, _, ms in rows if s == "torch-eager")
        for system, backend, ms in rows:
            print(json.dumps({"workload": work, "system": system, "backend": backend, "ms": round(ms, 3),
                              "vs_best_torch": round(ms / best_torch, 3)}), flush=True)


    if args.profile:
        import cProfile
        import pstats
        B, H, T, E = shapes[-1]
        prof = cProfile.Profile()
        prof.enable()
        bench_flambeau(B, H, T, E, A.SDPBackend.CUDNN_ATTENTION)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
