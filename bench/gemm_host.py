"""Host time of one cuBLASLt product on the GPU machine: where `cublaslt.gemm`'s ~34 us of own time a call
(session 16's profile of the eager GPT-2 step, 150 calls a step) goes, beside PyTorch's matmul.

For GPT-2's bf16 linear shapes (x (rows, k) @ w.T, w (n, k); rows 8192 = B8 x T1024 by default), the
median over --repeats runs of --number calls, us per call, host time only (the device is synchronised
before and after each run, not inside it):

- `wrapper`: flambeau's `cublaslt.gemm(x, w.T)` (a layout seen before: its lookups, the output's
  allocation, the ctypes call);
- `wrapper_bias`: the same with the bias epilogue (`gemm(x, w.T, bias=b)`);
- `alloc`: the output's allocation alone (`cupy.ndarray(shape, dtype)`, through flambeau's pool hook);
- `ctypes_matmul`: the bare ctypes `cublasLtMatmul` call with the wrapper's cached descriptors and
  algorithm, every argument prepared (the same output pointer each call);
- `ctypes_prebuilt`: that call with its argument tuple made once (`fn(*args)`: no tuple building);
- `torch_matmul`: `torch.matmul(tx, tw.t())` of bf16 tensors of the same shapes (its whole eager path);
- `torch_linear`: `torch.nn.functional.linear(tx, tw, tb)`;
- `flambeau_linear`: `flambeau.nn.functional.linear(x, w, b)` under no_grad (the whole eager op).

    python bench/gemm_host.py [--rows 8192] [--number 100] [--repeats 5]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.measure import host_us  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]       # (k, n) of GPT-2's linears


def compiled_of(L, x, w):
    """The cuBLASLt objects (`cublaslt._Compiled`) that `L.gemm(x, w.T)` made for this layout, bias-free
    epilogue: what a bench calls `cublasLtMatmul` with directly, after one `L.gemm(x, w.T)`."""
    lay = L._layouts[(x.shape, x.strides, w.T.shape, w.T.strides, x.dtype)]
    return next(c for key, c in lay.compiled.items() if key[4] == L.EPILOGUE_DEFAULT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--number", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import cupy
    import flambeau as fl
    from flambeau._backends import cublaslt as L
    sync = cupy.cuda.get_current_stream().synchronize
    N, R = args.number, args.repeats
    try:
        import torch
    except ImportError:
        torch = None
    if not L.available():
        print(json.dumps({"bench": "gemm_host", "error": f"cuBLASLt not available: {L.load_error()}"}))
        return
    for k, n in SHAPES:
        xt = fl.randn(args.rows, k, device="cuda").to(fl.bfloat16)
        wt = fl.randn(n, k, device="cuda").to(fl.bfloat16)
        bt = fl.randn(n, device="cuda").to(fl.bfloat16)
        x, w, b = xt._data, wt._data, bt._data
        row = {"bench": "gemm_host", "rows": args.rows, "k": k, "n": n}
        row["wrapper"] = host_us(lambda: L.gemm(x, w.T), N, R, sync)
        row["wrapper_bias"] = host_us(lambda: L.gemm(x, w.T, bias=b), N, R, sync)
        shape, dt = (args.rows, n), x.dtype
        row["alloc"] = host_us(lambda: cupy.ndarray(shape, dt), N, R, sync)
        comp = compiled_of(L, x, w)
        d = cupy.ndarray(shape, dt)
        dev = d.data.device_id
        stream = cupy.cuda.get_current_stream().ptr
        ws = L._workspaces[(dev, stream)]
        lib, handle = L._lib_state["lib"], L._handles[dev]
        fn = lib.cublasLtMatmul
        pa, pb, pd, pw = w.data.ptr, x.data.ptr, d.data.ptr, ws.data.ptr

        def bare():
            return fn(handle, comp.desc, L._BY_ONE, pa, comp.la, pb, comp.lb, L._BY_ZERO, pd, comp.ld, pd, comp.ld,
                      comp.by_algo, pw, comp.ws, stream)
        assert bare() == 0
        row["ctypes_matmul"] = host_us(bare, N, R, sync)
        prebuilt = (handle, comp.desc, L._BY_ONE, ctypes.c_void_p(pa), comp.la, ctypes.c_void_p(pb), comp.lb,
                    L._BY_ZERO, ctypes.c_void_p(pd), comp.ld, ctypes.c_void_p(pd), comp.ld, comp.by_algo,
                    ctypes.c_void_p(pw), ctypes.c_size_t(comp.ws), ctypes.c_void_p(stream))
        row["ctypes_prebuilt"] = host_us(lambda: fn(*prebuilt), N, R, sync)
        with fl.no_grad():
            row["flambeau_linear"] = host_us(lambda: fl.nn.functional.linear(xt, wt, bt), N, R, sync)
        if torch is not None and torch.cuda.is_available():
            tx = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            tb = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            tsync = torch.cuda.synchronize
            with torch.no_grad():
                row["torch_matmul"] = host_us(lambda: torch.matmul(tx, tw.t()), N, R, tsync)
                row["torch_linear"] = host_us(lambda: torch.nn.functional.linear(tx, tw, tb), N, R, tsync)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
