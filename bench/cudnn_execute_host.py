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

`--single` (session 16: why a call costs ~72 us of execute's own time in the B64 ResNet-50 step, against
9-30 us here at batch 1): each call timed alone, the device synchronised before it, median of --reps,
for the three kinds (forward, backward_data, backward_filter) at --batch (64), NCHW or --channels-last,
once with the GPU idle (`*_idle`) and once behind a ~2 ms spin kernel queued first (`*_busy`: the GPU
still working on earlier calls, as in a training step). Per kind: `wrapper` (cudnn.forward /
backward_data / backward_filter), `backend_execute` (cudnnBackendExecute on a kept variant pack),
`new_pack` (variant pack made, executed, destroyed), `torch` (the same call through torch: conv2d /
aten.convolution_backward with one output), `workspace` (the plan's workspace bytes) and `engine` (the
plan's JSON, cut to 160 characters: which engine cuDNN chose). One more row times a no-op kernel launch
through triton_launch (idle and busy): whether driver calls get slower while the GPU works.

    python bench/cudnn_execute_host.py --single --batch 64 [--channels-last] [--reps 40]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.measure import host_us  # noqa: E402

GEOMETRIES = [  # (cin, cout, k, stride, size)
    (64, 64, 3, 1, 56), (256, 64, 1, 1, 56), (128, 128, 3, 2, 56), (256, 256, 3, 1, 14), (1024, 256, 1, 1, 14)]


def _single_us(fn, reps, sync, before=None):
    """Median host time of one call of `fn`, the device synchronised before each (`before` runs after the
    synchronisation, untimed: the spin kernel of a busy run)."""
    times = []
    for _ in range(reps):
        sync()
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    sync()
    return round(statistics.median(times) * 1e6, 2)


_SPIN = r"""extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""
_NOP = r"""extern "C" __global__ void nop(float* p) {}"""


def _engine_json(plan) -> str:
    """The execution plan's JSON representation (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION = 405,
    CUDNN_TYPE_CHAR = 24), cut short: the engine cuDNN chose."""
    import ctypes
    buf = ctypes.create_string_buffer(8192)
    got = ctypes.c_int64()
    if plan.lib.cudnnBackendGetAttribute(plan.plan, 405, 24, 8192, ctypes.byref(got), buf) != 0:
        return "?"
    return buf.value.decode(errors="replace")[:160]


def single(args):
    import cupy
    import flambeau as fl
    from flambeau._backends import cudnn, triton_launch
    try:
        import torch
    except ImportError:
        torch = None
    sync = cupy.cuda.get_current_stream().synchronize
    spin = cupy.RawKernel(_SPIN, "spin")
    cycles = 4_000_000                      # ~2 ms at 1.98 GHz

    def busy():
        spin((1,), (1,), (cycles,))
    R, B, cl = args.reps, args.batch, args.channels_last
    nop = triton_launch.raw_kernel(cupy.RawKernel(_NOP, "nop").kernel, ("*fp32",), 32)
    buf = cupy.empty(16, cupy.float32)
    launch = lambda: triton_launch.launch(nop, (1,), buf)  # noqa: E731
    launch()
    print(json.dumps({"bench": "cudnn_execute_host", "row": "launch", "launch_idle": _single_us(launch, R, sync),
                      "launch_busy": _single_us(launch, R, sync, busy)}))

    def layout(a):
        if not cl:
            return a
        return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for cin, cout, k, s, size in GEOMETRIES:
        st, pad, dil = (s, s), (k // 2, k // 2), (1, 1)
        x = layout(fl.randn(B, cin, size, size, device="cuda").to(fl.bfloat16)._data)
        w = layout(fl.randn(cout, cin, k, k, device="cuda").to(fl.bfloat16)._data)
        y0 = cudnn.forward(x, w, None, st, pad, dil, 1, channels_last=cl)
        gy = layout(cupy.ascontiguousarray(y0))
        calls = {
            "forward": (lambda: cudnn.forward(x, w, None, st, pad, dil, 1, channels_last=cl), (x, w)),
            "backward_data": (lambda: cudnn.backward_data(gy, w, st, pad, dil, 1, x.shape[2:], channels_last=cl),
                              (w, gy)),
            "backward_filter": (lambda: cudnn.backward_filter(x, gy, w.shape, st, pad, dil, 1, channels_last=cl),
                                (x, gy)),
        }
        if torch is not None:
            tx = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(w.shape, device="cuda", dtype=torch.bfloat16)
            if cl:
                cl_format = torch.channels_last
                tx, tw = tx.contiguous(memory_format=cl_format), tw.contiguous(memory_format=cl_format)
            tgy = torch.nn.functional.conv2d(tx, tw, None, st, pad, dil)
            bwd = torch.ops.aten.convolution_backward
            tcalls = {
                "forward": lambda: torch.nn.functional.conv2d(tx, tw, None, st, pad, dil),
                "backward_data": lambda: bwd(tgy, tx, tw, None, st, pad, dil, False, (0, 0), 1, (True, False, False)),
                "backward_filter": lambda: bwd(tgy, tx, tw, None, st, pad, dil, False, (0, 0), 1, (False, True, False)),
            }
        for kind, (call, (pa, pb)) in calls.items():
            row = {"bench": "cudnn_execute_host", "batch": B, "channels_last": cl, "kind": kind,
                   "geometry": f"{cin}->{cout} {k}x{k}/{s} @{size}"}
            out = call()
            if out is None:
                row["error"] = f"cuDNN did not take it: {cudnn.load_error() or cudnn._state['plan_error']}"
                print(json.dumps(row))
                continue
            plan = next(v[2] for v in reversed(list(cudnn._calls.values())) if v[2].kind == kind)
            row["engine"] = _engine_json(plan) if isinstance(plan, cudnn._GraphPlan) else "legacy"
            row["workspace"] = plan.ws
            row["wrapper_idle"] = _single_us(call, R, sync)
            row["wrapper_busy"] = _single_us(call, R, sync, busy)
            if isinstance(plan, cudnn._GraphPlan):
                h = cudnn._handle()
                ptrs = plan.roles(pa.data.ptr, pb.data.ptr, out.data.ptr)
                plan.execute(h, ptrs)
                pack = plan.packs[next(key for key in reversed(list(plan.packs)) if key[:3] == ptrs)]
                key = next(key for key in reversed(list(plan.packs)) if key[:3] == ptrs)
                lib = plan.lib
                run = lambda: lib.cudnnBackendExecute(h, plan.plan, pack)  # noqa: E731
                row["backend_execute_idle"] = _single_us(run, R, sync)
                row["backend_execute_busy"] = _single_us(run, R, sync, busy)

                def new_pack():
                    p = plan._variant_pack(key)
                    lib.cudnnBackendExecute(h, plan.plan, p)
                    lib.cudnnBackendDestroyDescriptor(p)
                row["new_pack_idle"] = _single_us(new_pack, R, sync)
            if torch is not None:
                tc = tcalls[kind]
                tc()
                tsync = torch.cuda.synchronize
                row["torch_idle"] = _single_us(tc, R, tsync)
                row["torch_busy"] = _single_us(tc, R, tsync, lambda: torch.cuda._sleep(cycles))
            print(json.dumps(row))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--single", action="store_true", help="each call timed alone, three kinds, idle and busy")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    if args.single:
        args.batch = args.batch or 64
        return single(args)
    args.batch = args.batch or 1
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
        row["wrapper"] = host_us(lambda: cudnn.forward(x, w, None, st, pad, dil, 1), N, R, sync)
        plan = cudnn._plans[next(key for key in reversed(list(cudnn._plans)) if key[0] == "forward")]
        if not isinstance(plan, cudnn._GraphPlan):
            row["error"] = f"a legacy-API plan ({cudnn._state['plan_error']})"
            print(json.dumps(row))
            continue
        ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
        h = cudnn._handle()
        row["execute_same_pack"] = host_us(lambda: plan.execute(h, ptrs), N, R, sync)
        pack = plan.packs[next(iter(key for key in plan.packs if key[:3] == ptrs))]
        lib = plan.lib
        row["backend_execute"] = host_us(lambda: lib.cudnnBackendExecute(h, plan.plan, pack), N, R, sync)
        ws = cudnn._workspace(plan.ws) if plan.ws else None
        key = ptrs + ((ws.data.ptr,) if ws is not None else (0,))

        def new_pack():
            p = plan._variant_pack(key)
            lib.cudnnBackendExecute(h, plan.plan, p)
            lib.cudnnBackendDestroyDescriptor(p)
        row["execute_new_pack"] = host_us(new_pack, N, R, sync)
        if torch is not None and torch.cuda.is_available():
            tx = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(w.shape, device="cuda", dtype=torch.bfloat16)
            tsync = torch.cuda.synchronize
            row["torch_conv2d"] = host_us(lambda: torch.nn.functional.conv2d(tx, tw, None, st, pad, dil), N, R, tsync)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
