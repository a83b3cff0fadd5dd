"""Host us of a bare cuBLASLt product as a training step calls it, on the GPU machine.

Inside a compiled or eager GPT-2 step flambeau's `cublasLtMatmul` call takes ~30-70 us of host time (session 23,
per call site), against ~15 us when one product is called again and again (`bench/gemm_host.py`,
`bench/side_stream_host.py`). A step's products change pointers and descriptors from call to call; this
separates the two, for GPT-2's bf16 shapes at `--rows` rows, host us per call (median of --repeats runs of
--number calls, the device synchronised between runs):

    same      one product, the same pointers each call
    ptrs      one product, its operands and output cycling through 8 sets of buffers
    descs     the 4 products of GPT-2's linears in turn, each with its own fixed buffers
    both      the 4 products in turn, each cycling through its 8 buffer sets

and, for the first shape, each of the heuristic's first --algos algorithms: host us under `ptrs` and device us
a call (events around the run), so a cheaper-to-issue algorithm can be weighed against its device time.

    python bench/gemm_pattern_host.py [--rows 64] [--number 200] [--repeats 5] [--algos 8]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]       # (k, n) of GPT-2's linears
SETS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--algos", type=int, default=8)
    args = ap.parse_args()
    import cupy
    import flambeau as fl
    from flambeau._backends import cublaslt as L
    from bench.gemm_host import compiled_of
    if not L.available():
        print(json.dumps({"bench": "gemm_pattern_host", "error": f"cuBLASLt not available: {L.load_error()}"}))
        return
    dev = cupy.cuda.Device()
    stream = cupy.cuda.get_current_stream().ptr
    lib, fn = L._lib_state["lib"], L._lib_state["lib"].cublasLtMatmul
    products = []            # per shape: (compiled, [(pa, pb, pd)] * SETS)
    for k, n in SHAPES:
        bufs = []
        for _ in range(SETS):
            x = fl.randn(args.rows, k, device="cuda").to(fl.bfloat16)._data
            w = fl.randn(n, k, device="cuda").to(fl.bfloat16)._data
            d = L.gemm(x, w.T)
            bufs.append((x, w, d))
        x, w, _ = bufs[0]
        comp = compiled_of(L, x, w)
        products.append((comp, [(w.data.ptr, x.data.ptr, d.data.ptr) for x, w, d in bufs], bufs))
    handle = L._handles[dev.id]
    ws = L._workspaces[(dev.id, stream)]

    def call(comp, ptrs, algo=None, ws_bytes=None):
        pa, pb, pd = ptrs
        return fn(handle, comp.desc, L._BY_ONE, pa, comp.la, pb, comp.lb, L._BY_ZERO, pd, comp.ld, pd, comp.ld,
                  algo or comp.by_algo, ws.data.ptr, comp.ws if ws_bytes is None else ws_bytes, stream)

    def host_us(seq):
        runs = []
        for _ in range(args.repeats):
            dev.synchronize()
            t0 = time.perf_counter()
            for c in seq:
                call(*c)
            runs.append((time.perf_counter() - t0) / len(seq) * 1e6)
        dev.synchronize()
        return round(statistics.median(runs), 2)

    N = args.number
    first = products[0]
    patterns = {
        "same": [(first[0], first[1][0])] * N,
        "ptrs": [(first[0], first[1][i % SETS]) for i in range(N)],
        "descs": [(products[i % 4][0], products[i % 4][1][0]) for i in range(N)],
        "both": [(products[i % 4][0], products[i % 4][1][(i // 4) % SETS]) for i in range(N)],
    }
    print(json.dumps({"bench": "gemm_pattern_host", "rows": args.rows,
                      **{p: host_us(seq) for p, seq in patterns.items()}}), flush=True)

    comp = first[0]
    pref = ctypes.c_void_p()
    L._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    sp = lib.cublasLtMatmulPreferenceSetAttribute
    L._set(sp, pref, L.PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(L.WORKSPACE_BYTES))
    for name in "abcd":
        L._set(sp, pref, L.PREF_MIN_ALIGNMENT[name], ctypes.c_uint32(L.MAX_ALIGNMENT))
    res, got = (L._Heuristic * args.algos)(), ctypes.c_int(0)
    L._check(lib.cublasLtMatmulAlgoGetHeuristic(handle, comp.desc, comp.la, comp.lb, comp.ld, comp.ld, pref,
                                                args.algos, res, ctypes.byref(got)), "cublasLtMatmulAlgoGetHeuristic")
    lib.cublasLtMatmulPreferenceDestroy(pref)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for i in range(got.value):
        algo = ctypes.byref(res[i].algo)
        seq = [(comp, first[1][j % SETS], algo, res[i].workspaceSize) for j in range(N)]
        if call(*seq[0]) != 0:
            continue
        h = host_us(seq)
        dev.synchronize()
        start.record()
        for c in seq:
            call(*c)
        end.record()
        end.synchronize()
        print(json.dumps({"bench": "gemm_pattern_host", "rows": args.rows, "algo_rank": i,
                          "algo": bytes(res[i].algo)[:16].hex(), "workspace": res[i].workspaceSize,
                          "waves": round(res[i].wavesCount, 3), "ptrs_host_us": h,
                          "device_us": round(cupy.cuda.get_elapsed_time(start, end) * 1e3 / N, 2)}), flush=True)


if __name__ == "__main__":
    main()
