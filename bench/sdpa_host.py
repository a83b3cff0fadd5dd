"""Host time of one cuDNN fused attention call on the GPU machine (GPT-2 runs 12 forwards and 12 backwards
a step; session 16's profile gave the frontend's execute ~116 us a call), beside PyTorch's SDPA.

GPT-2's heads (q, k, v split from a (B, T, 3 * 768) bf16 projection, viewed (B, 12, T, 64), causal), B 1
by default (the GPU finishes each call quickly, so what is timed is the host); the median over
--repeats runs of --number calls, us per call, host time only (the device is synchronised before and
after each run, not inside it):

- `fwd_wrapper` / `bwd_wrapper`: flambeau's cudnn_attention.forward / backward (graph lookup, outputs'
  allocation, execute), `bwd_joint`: the backward writing dq, dk, dv into one buffer (what the eager
  derivative asks for: the split's backward then needs no cat);
- `fwd_execute` / `bwd_execute`: the frontend's `graph.execute({tensor: pointer}, workspace, handle=)`
  alone (its Python wrapper: the {uid: pointer} dict per call, then the pybind `_execute`);
- `fwd_uid_execute` / `bwd_uid_execute`: the pybind `graph._execute({uid: pointer}, workspace, handle)`
  with a prebuilt dict (what the wrapper calls now);
- `cat`: cupy.concatenate of three (B, T, 768) gradient views along the last dim (what the split's
  backward paid before the joint buffer);
- `torch_fwd` / `torch_fwd_bwd`: torch.nn.functional.scaled_dot_product_attention (cuDNN backend
  forced) forward alone, and forward + backward (torch.autograd.grad) minus nothing: its whole eager path.

    python bench/sdpa_host.py [--batch 1] [--seq 1024] [--number 200] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.measure import host_us  # noqa: E402

H, E = 12, 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import cupy
    import numpy as np
    import flambeau as fl
    from flambeau._backends import cudnn_attention as CA
    B, T, C = args.batch, args.seq, H * E
    N, R = args.number, args.repeats
    sync = cupy.cuda.get_current_stream().synchronize
    row = {"bench": "sdpa_host", "batch": B, "seq": T, "heads": H, "head_dim": E}
    if not CA.available():
        row["error"] = f"cuDNN frontend not available: {CA.load_error()}"
        print(json.dumps(row))
        return
    qkv = fl.randn(B, T, 3 * C, device="cuda").to(fl.bfloat16)._data
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, E).transpose(0, 2, 1, 3) for i in range(3))
    rng = cupy.zeros(2, dtype=np.int64)
    scale = 1.0 / E ** 0.5
    if not CA.supports(q.shape, k.shape, "bfloat16", True, 0.0):
        row["error"] = f"cuDNN builds no plan: {CA.unsupported_reason()}"
        print(json.dumps(row))
        return
    out, stats = CA.forward(q, k, v, 0.0, rng, True, scale)
    do = cupy.ones_like(out)
    row["fwd_wrapper"] = host_us(lambda: CA.forward(q, k, v, 0.0, rng, True, scale), N, R, sync)
    row["bwd_wrapper"] = host_us(lambda: CA.backward(do, q, k, v, out, stats, 0.0, rng, True, scale), N, R, sync)
    row["bwd_joint"] = host_us(lambda: CA.backward(do, q, k, v, out, stats, 0.0, rng, True, scale, joint=True),
                                N, R, sync)
    cudnn = CA._module()
    handle = CA._handle(cudnn)
    grads = CA.backward(do, q, k, v, out, stats, 0.0, rng, True, scale)
    for kind, (g, run, keys, nbytes), ptrs in (
            ("fwd", CA._fwd_run(cudnn, handle, q, k, v, out, True, scale, 0.0),
             (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, stats.data.ptr, 0, 0)),
            ("bwd", CA._bwd_run(cudnn, handle, q, k, v, out, do, *grads, True, scale, 0.0),
             (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, do.data.ptr, stats.data.ptr,
              *(a.data.ptr for a in grads), 0, 0))):
        wsp = CA._workspace(cupy, nbytes)
        pack = {t: p for t, p in zip(_graph_tensors(CA, g, kind), ptrs) if t is not None}
        row[f"{kind}_execute"] = host_us(lambda: g.execute(pack, wsp, handle=handle), N, R, sync)
        if run is not None:
            uids = {u: p for u, p in zip(keys, ptrs) if u is not None}
            row[f"{kind}_uid_execute"] = host_us(lambda: run(uids, wsp, handle), N, R, sync)
    pieces = [a.transpose(0, 2, 1, 3).reshape(B, T, C) for a in grads]
    row["cat"] = host_us(lambda: cupy.concatenate(pieces, axis=2), N, R, sync)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tqkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        tq, tk, tv = (z.view(B, T, H, E).transpose(1, 2) for z in tqkv.split(C, 2))
        tsync = torch.cuda.synchronize
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            with torch.no_grad():
                row["torch_fwd"] = host_us(lambda: sdpa(tq, tk, tv, is_causal=True), N, R, tsync)
            tdo = torch.ones(B, H, T, E, device="cuda", dtype=torch.bfloat16)
            row["torch_fwd_bwd"] = host_us(
                lambda: torch.autograd.grad(sdpa(tq, tk, tv, is_causal=True), (tq, tk, tv), tdo), N, R, tsync)
    print(json.dumps(row), flush=True)


def _graph_tensors(CA, g, kind):
    """The frontend tensors of cached graph `g` in `_execute`'s pointer order."""
    for entry in CA._graphs.values():
        if entry[0] is g:
            return entry[1]
    raise LookupError(f"no cached {kind} graph")


if __name__ == "__main__":
    main()
