"""Peak extra memory of scaled_dot_product_attention (one head of 64), math vs blocked path.

    python bench/sdpa_memory.py

Prints JSON lines: T, path, peak bytes allocated during forward (+ backward) beyond the inputs,
measured with tracemalloc (NumPy reports its allocations to it). The blocked path must stay O(T).
"""
from __future__ import annotations

import json
import time
import tracemalloc

import flambeau as torch
import flambeau.nn.functional as F
from flambeau.nn.attention import sdpa_kernel, SDPBackend


def peak(T, backend, backward):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, 64, requires_grad=backward) for _ in range(3))
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            out.sum().backward()
    dt = time.perf_counter() - t0
    p = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return p, dt


def main():
    for T in (1024, 2048, 4096, 8192):
        for name, backend in (("blocked", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
            if name == "math" and T > 4096:
                continue           # 8192² floats = 256 MiB per score matrix: the point of the blocked path
            for backward in (False, True):
                p, dt = peak(T, backend, backward)
                print(json.dumps({"workload": "sdpa_peak_memory", "T": T, "head_dim": 64, "path": name,
                                  "backward": backward, "peak_extra_MiB": round(p / 2**20, 2),
                                  "per_T_KiB": round(p / T / 1024, 2), "seconds": round(dt, 3)}), flush=True)


if __name__ == "__main__":
    main()
