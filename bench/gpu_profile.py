"""Count what a piece of GPU work launches, from PyTorch's profiler (CUPTI sees every kernel and copy
of the process, CuPy's and cuBLAS's included, so the same count serves flambeau and PyTorch).

    counts(fn, steps=1, stacks=False) -> dict
        kernels, d2h (device-to-host copies), h2d, syncs (stream/device/event synchronisations)
        per step, gpu_busy_ms (the union of kernel, copy and memset intervals per step: the time the
        GPU worked, to set beside the step's wall time), and with stacks=True `d2h_sites` / `h2d_sites`: for each copy, the innermost
        Python frames (from the profiler's Python tracer) that were running when it happened.
        `syncs` includes the two synchronisations the counting itself makes.

A device-to-host copy of pageable memory blocks the host until the GPU has caught up: it is the
"host sync" counted here. Used by bench/gpu_train.py and tests/test_cuda_syncs.py.
"""
from __future__ import annotations

import collections

from bench import measure

_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
               "cuCtxSynchronize", "cuEventSynchronize")


def _trace(fn, steps, stacks):
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return measure.trace_events(prof)


def _sites(events, copies, depth=6):
    """For each copy, the innermost python_function frames covering its start (outermost last)."""
    py = [e for e in events if e.get("cat") == "python_function" and "dur" in e]
    out = collections.Counter()
    for c in copies:
        t = c["ts"]
        frames = sorted((e for e in py if e["ts"] <= t <= e["ts"] + e["dur"]), key=lambda e: e["dur"])
        names = [e["name"] for e in frames if "site-packages" not in e["name"] or "flambeau" in e["name"]]
        out[" <- ".join(names[:depth])] += 1
    return [{"count": n, "frames": k} for k, n in out.most_common()]


def _busy_us(events) -> float:
    """Microseconds covered by at least one of `events` (intervals merged: kernels may overlap)."""
    return measure.union_us((e["ts"], e["ts"] + e.get("dur", 0)) for e in events)


def counts(fn, steps: int = 1, stacks: bool = False, top: int = 0) -> dict:
    """Kernels, copies and synchronisations per step of `fn` (run `steps` times under the profiler);
    with `top`, the `top` kernel names launched most often (`top_kernels`: name, count and ms per step)."""
    events = _trace(fn, steps, stacks)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    d2h = [e for e in copies if "DtoH" in e.get("name", "")]
    h2d = [e for e in copies if "HtoD" in e.get("name", "")]
    syncs = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in _SYNC_CALLS]
    res = {"kernels": len(kernels) / steps, "d2h": len(d2h) / steps, "h2d": len(h2d) / steps,
           "syncs": len(syncs) / steps,
           "gpu_busy_ms": round(_busy_us([e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
                                / steps / 1e3, 2)}
    if top:
        by = collections.defaultdict(lambda: [0, 0.0])
        for k in kernels:
            by[k["name"][:90]][0] += 1
            by[k["name"][:90]][1] += k.get("dur", 0)
        res["top_kernels"] = [(n, c / steps, round(d / steps / 1e3, 3))
                              for n, (c, d) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]]
    if stacks:
        res["d2h_sites"] = _sites(events, d2h)
        res["h2d_sites"] = _sites(events, h2d)
    return res
