"""Host time of a CUDA library call while other work is pending on another stream (the GPU machine).

A DDP step whose all-reduces overlap backward (compiled GPT-2 split in 13 subgraphs) took ~3 ms more host
time a step than the same graph whole, with the same Python calls: its cuBLASLt and cuDNN calls ran slower
while the reductions were queued. This times, in one process, host us per call (median of --repeats runs of
--number calls; the device synchronised between runs, not inside them) of

- `gemm`: the bare ctypes `cublasLtMatmul` of flambeau's cached descriptors (bf16, rows x 768 @ 768 x 2304);
- `launch`: a CuPy elementwise kernel (`cupy.add(a, b, out=c)`),

with the compute stream (CuPy's current stream) and a side stream in these states, set up before each run:

    idle              nothing queued
    compute_busy      a long product queued on the compute stream itself (the calls queue behind it)
    side_busy         a long product queued on the side stream
    side_waits        the side stream waiting on an event recorded on the compute stream after a long product
    nccl_waits        as side_waits, then an NCCL all-reduce (a one-rank communicator) queued on the side stream
                      behind the wait: what DDP's overlapped reduction leaves pending while backward launches

    python bench/side_stream_host.py [--rows 64] [--number 100] [--repeats 7]

Prints one JSON line per state: us per call of each.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--number", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import cupy
    from cupy.cuda import nccl
    import flambeau as fl
    from flambeau._backends import cublaslt as L
    from bench.gemm_host import compiled_of

    if not L.available():
        print(json.dumps({"bench": "side_stream_host", "error": f"cuBLASLt not available: {L.load_error()}"}))
        return
    x = fl.randn(args.rows, 768, device="cuda").to(fl.bfloat16)._data
    w = fl.randn(2304, 768, device="cuda").to(fl.bfloat16)._data
    L.gemm(x, w.T)
    comp = compiled_of(L, x, w)
    d = cupy.ndarray((args.rows, 2304), x.dtype)
    compute = cupy.cuda.get_current_stream()
    side = cupy.cuda.Stream(non_blocking=True)
    ws = L._workspaces[(d.data.device_id, compute.ptr)]
    lib, handle, fn = L._lib_state["lib"], L._handles[d.data.device_id], L._lib_state["lib"].cublasLtMatmul

    def gemm():
        return fn(handle, comp.desc, L._BY_ONE, w.data.ptr, comp.la, x.data.ptr, comp.lb, L._BY_ZERO, d.data.ptr,
                  comp.ld, d.data.ptr, comp.ld, comp.by_algo, ws.data.ptr, comp.ws, compute.ptr)
    assert gemm() == 0
    a, b, c = (cupy.ones(4096, cupy.float32) for _ in range(3))

    def launch():
        cupy.add(a, b, out=c)

    big = cupy.ones((4096, 4096), cupy.float32)
    grads = cupy.ones(25 * 2 ** 18, cupy.float32)           # 25 MiB, one bucket
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    event = cupy.cuda.Event(disable_timing=True)

    def long_product(stream):
        with stream:
            for _ in range(4):
                cupy.matmul(big, big)

    def setup(state):
        if state == "compute_busy":
            long_product(compute)
        elif state == "side_busy":
            long_product(side)
        elif state in ("side_waits", "nccl_waits"):
            long_product(compute)
            event.record(compute)
            side.wait_event(event)
            if state == "nccl_waits":
                comm.allReduce(grads.data.ptr, grads.data.ptr, grads.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                               side.ptr)

    for state in ("idle", "compute_busy", "side_busy", "side_waits", "nccl_waits", "idle"):
        row = {"bench": "side_stream_host", "state": state, "rows": args.rows}
        for name, call in (("gemm", gemm), ("launch", launch)):
            runs = []
            for _ in range(args.repeats):
                cupy.cuda.Device().synchronize()
                setup(state)
                t0 = time.perf_counter()
                for _ in range(args.number):
                    call()
                runs.append((time.perf_counter() - t0) / args.number * 1e6)
            cupy.cuda.Device().synchronize()
            row[name + "_us"] = round(statistics.median(runs), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
