"""2:4 semi-structured sparse matmul on cuda: flambeau's cuSPARSELt path (`to_sparse_semi_structured`,
`mm`) against flambeau's dense cuBLASLt `mm`, and PyTorch's `to_sparse_semi_structured` (cuSPARSELt)
against PyTorch's dense `mm`, in the same process on the same operands.

    python bench/sparse_semi_structured.py [--sizes 8192,16384] [--dtypes float16,bfloat16,int8]

Prints one JSON object per line: workload (dtype, n for n x n x n), system, ms (median of CUDA-event
intervals after warm-up), and `speedup_vs_dense` (the same system's dense time / its sparse time).
A is 2:4 sparse (pattern [0, 0, 1, 1] per group), B dense; int8 B is column-major (cuSPARSELt's int8
layout) and its dense peer is torch._int_mm (int32 out) / flambeau's float16 mm (flambeau has no int8
tensor-core GEMM on cuda).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import measure  # noqa: E402

WARMUP = 3
REPS = 10


def _operands(n: int, dtype: str):
    import cupy
    rs = cupy.random.RandomState(0)
    mask = cupy.tile(cupy.asarray([0, 0, 1, 1], dtype=cupy.float32), (n, n // 4))
    if dtype == "int8":
        a = (rs.randint(-3, 4, (n, n)).astype(cupy.float32) * mask).astype(cupy.int8)
        b = rs.randint(-3, 4, (n, n)).astype(cupy.int8)
    else:
        a = rs.standard_normal((n, n), dtype=cupy.float32) * mask
        b = rs.standard_normal((n, n), dtype=cupy.float32)
    return a, b


def bench(n: int, dtype: str) -> list:
    import cupy
    import flambeau
    import torch
    from flambeau.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
    rows = []
    a32, b32 = _operands(n, dtype)
    fdt = getattr(flambeau, dtype)
    tdt = getattr(torch, dtype)
    dev = flambeau.device("cuda")
    if dtype == "int8":
        fa = flambeau.Tensor._make(a32, dev, fdt)
        fb = flambeau.Tensor._make(cupy.ascontiguousarray(b32.T), dev, fdt).t()          # column-major
        ta, tb = torch.from_dlpack(a32), torch.from_dlpack(cupy.ascontiguousarray(b32.T)).t()
        # flambeau has no int8 tensor-core GEMM on cuda: its dense peer is the float16 product of the same size
        fa_dense, fb_dense = fa.to(flambeau.float16), fb.contiguous().to(flambeau.float16)
    else:
        fa = flambeau.Tensor._make(a32, dev, flambeau.float32).to(fdt)
        fb = flambeau.Tensor._make(b32, dev, flambeau.float32).to(fdt)
        ta, tb = torch.from_dlpack(a32).to(tdt), torch.from_dlpack(b32).to(tdt)
        fa_dense, fb_dense = fa, fb
    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    fs = to_sparse_semi_structured(fa)
    sync = cupy.cuda.Device().synchronize
    dense_ms = measure.median_event_ms(lambda: flambeau.mm(fa_dense, fb_dense), WARMUP, REPS, sync=sync)
    sparse_ms = measure.median_event_ms(lambda: flambeau.mm(fs, fb), WARMUP, REPS, sync=sync)
    row = {"workload": f"2:4 mm {dtype} {n}^3", "system": "flambeau", "dense_ms": dense_ms, "sparse_ms": sparse_ms,
           "speedup_vs_dense": dense_ms / sparse_ms, "cusparselt": fs._cslt is not None}
    if dtype != "int8":
        row["max_abs_diff_vs_dense"] = float((flambeau.mm(fs, fb).float() - flambeau.mm(fa, fb).float()).abs().max().item())
    rows.append(row)
    torch.sparse.SparseSemiStructuredTensor._FORCE_CUTLASS = False
    ts = torch.sparse.to_sparse_semi_structured(ta)
    tdense = (lambda: torch._int_mm(ta, tb)) if dtype == "int8" else (lambda: torch.mm(ta, tb))
    tsync = torch.cuda.synchronize
    t_dense = measure.median_event_ms(tdense, WARMUP, REPS, sync=tsync)
    t_sparse = measure.median_event_ms(lambda: torch.mm(ts, tb), WARMUP, REPS, sync=tsync)
    rows.append({"workload": f"2:4 mm {dtype} {n}^3", "system": "torch", "dense_ms": t_dense, "sparse_ms": t_sparse,
                 "speedup_vs_dense": t_dense / t_sparse})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8192,16384")
    ap.add_argument("--dtypes", default="float16,bfloat16,int8")
    args = ap.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        for dtype in args.dtypes.split(","):
            if dtype == "int8" and n < 16384:
                continue
            try:
                for row in bench(n, dtype):
                    print(json.dumps(row), flush=True)
            except Exception as e:          # one failing workload must not hide the others' figures
                print(json.dumps({"workload": f"2:4 mm {dtype} {n}^3", "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
