"""Host time of one cuDNN convolution call on the GPU machine: where cudnn.py's `execute` spends the
~50 us a call that session 14's profile of the eager ResNet-50 step gave it as own time (that is C time:
the ctypes call of cudnnBackendExecute is not a profiled call).

For ResNet-50 bf16 forward geometries (B 1 by default: the GPU finishes each call quickly, so the launch
queue never fills and what is timed is the host), the median over --repeats runs of `--number` calls,
us per call, host time only (the device is synchronised before each run, not inside it):

- `wrapper`: flambeau's cudnn.forward(x, w, ...) (a remembered call: dict hit, checks, allocation, run);
- `execute_same_pack`: plan.execute on the same pointers (the variant pack kept: one cudnnBackendExecute);
- `backend_execute`: lib.cudnnBackendExecute(handle, plan, pack) alone (the pack of the run above);
- `execute_new_pack`: a new variant pack per call (what a pack miss costs: create, 3 attributes,
  finalize, execute, destroy);
- `torch_conv2d`: torch.nn.functional.conv2d of the same bf16 tensors (its whole eager host path).

    python bench/cudnn_execute_host.py [--batch 1] [--number 200] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GEOMETRIES = [  # (cin, cout, k, stride, size)
    (64, 64, 3, 1, 56), (256, 64, 1, 1, 56), (128, 128, 3, 2, 56), (256, 256, 3, 1, 14), (1024, 256, 1, 1, 14)]


def _host_us(fn, number, repeats, sync):
    runs = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e6)
        sync()
    return round(statistics.median(runs), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import cupy
    import flambeau as fl
    from flambeau._backends import cudnn
    sync = cupy.cuda.get_current_stream().synchronize
    N, R = args.number, args.repeats
    try:
        import torch
    except ImportError:
        torch = None
    for cin, cout, k, s, size in GEOMETRIES:
        x = fl.randn(args.batch, cin, size, size, device="cuda").to(fl.bfloat16)._data
        w = fl.randn(cout, cin, k, k, device="cuda").to(fl.bfloat16)._data
        st, pad, dil = (s, s), (k // 2, k // 2), (1, 1)
        row = {"bench": "cudnn_execute_host", "batch": args.batch, "geometry": f"{cin}->{cout} {k}x{k}/{s} @{size}"}
        y = cudnn.forward(x, w, None, st, pad, dil, 1)
        if y is None:
            row["error"] = f"cuDNN did not take it: {cudnn.load_error() or cudnn._state['plan_error']}"
            print(json.dumps(row))
            continue
        row["wrapper"] = _host_us(lambda: cudnn.forward(x, w, None, st, pad, dil, 1), N, R, sync)
        plan = cudnn._plans[next(key for key in reversed(list(cudnn._plans)) if key[0] == "forward")]
        if not isinstance(plan, cudnn._GraphPlan):
            row["error"] = f"a legacy-API plan ({cudnn._state['plan_error']})"
            print(json.dumps(row))
            continue
        ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
        h = cudnn._handle()
        row["execute_same_pack"] = _host_us(lambda: plan.execute(h, ptrs), N, R, sync)
        pack = plan.packs[next(iter(key for key in plan.packs if key[:3] == ptrs))]
        lib = plan.lib
        row["backend_execute"] = _host_us(lambda: lib.cudnnBackendExecute(h, plan.plan, pack), N, R, sync)
        ws = cudnn._workspace(plan.ws) if plan.ws else None
        key = ptrs + ((ws.data.ptr,) if ws is not None else (0,))

        def new_pack():
            p = plan._variant_pack(key)
            lib.cudnnBackendExecute(h, plan.plan, p)
            lib.cudnnBackendDestroyDescriptor(p)
        row["execute_new_pack"] = _host_us(new_pack, N, R, sync)
        if torch is not None and torch.cuda.is_available():
            tx = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(w.shape, device="cuda", dtype=torch.bfloat16)
            tsync = torch.cuda.synchronize
            row["torch_conv2d"] = _host_us(lambda: torch.nn.functional.conv2d(tx, tw, None, st, pad, dil), N, R, tsync)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
