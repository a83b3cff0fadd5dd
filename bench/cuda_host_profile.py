"""Host cost of flambeau's cuda eager path, measured piece by piece (issue 11, item 6).

    python bench/cuda_host_profile.py micro           # per-call cost of each layer of an 8x8 add
    python bench/cuda_host_profile.py add|resnet|gpt  # a loop to run under a sampling profiler
    python bench/cuda_host_profile.py summary FILE    # top frames (self and inclusive) of collapsed stacks
    python bench/cuda_host_profile.py ops             # cProfile of single small ops: where each one's host time goes
    python bench/cuda_host_profile.py steps mlp,resnet [compiled]  # cProfile of training steps: top functions, us per step
    python bench/cuda_host_profile.py conv            # per-call host cost of each layer of a cuDNN convolution
    python bench/cuda_host_profile.py young gpt [compiled]  # what a step's objects give the garbage collector to walk

`micro` prints one JSON line per piece: CuPy's own launch paths (ufunc, ElementwiseKernel, RawKernel
with a preallocated output), the allocation, flambeau's binary kernel, the Tensor wrapper and the
whole `a + b`, PyTorch's `a + b` for reference. Wall time per call, device synchronised at the end.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ADD_CALLS = 200_000
TRAIN_STEPS = 15


def _per_call(fn, sync, n=20000) -> float:
    for _ in range(200):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def micro() -> None:
    import ctypes
    import cupy
    import torch
    import flambeau
    from flambeau._ops import pointwise
    from flambeau._ops._helpers import result_type, cast, opmath
    from flambeau._tensor import Tensor
    sync = cupy.cuda.Device().synchronize
    a = cupy.random.standard_normal((8, 8), dtype=cupy.float32)
    b = cupy.random.standard_normal((8, 8), dtype=cupy.float32)
    out = cupy.empty_like(a)
    ew = cupy.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x + y", "flm_probe_add")
    raw = cupy.RawKernel(r'''extern "C" __global__ void flm_add(const float* x, const float* y, float* z, long long n) {
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) z[i] = x[i] + y[i]; }''', "flm_add")
    n64 = np.int64(64)
    A = flambeau.tensor(cupy.asnumpy(a), device="cuda")
    B = flambeau.tensor(cupy.asnumpy(b), device="cuda")
    dev = A._device
    ta, tb = torch.tensor(cupy.asnumpy(a), device="cuda"), torch.tensor(cupy.asnumpy(b), device="cuda")
    f32 = np.dtype(np.float32)
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    stream = cupy.cuda.get_current_stream()
    slots = (ctypes.c_void_p(a.data.ptr), ctypes.c_void_p(b.data.ptr), ctypes.c_void_p(out.data.ptr),
             ctypes.c_int64(64))
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in slots])
    fptr, sptr, pptr = raw.kernel.ptr, stream.ptr, ctypes.addressof(params)
    launch = cupy.cuda.driver.launchKernel
    pieces = {
        "driver.launchKernel (prebuilt params)": lambda: launch(fptr, 1, 1, 1, 128, 1, 1, 0, sptr, pptr, 0),
        "cupy.add (ufunc)": lambda: cupy.add(a, b),
        "cupy.add out=": lambda: cupy.add(a, b, out=out),
        "ElementwiseKernel(a,b)": lambda: ew(a, b),
        "ElementwiseKernel(a,b,out)": lambda: ew(a, b, out),
        "RawKernel launch, out given": lambda: raw((1,), (128,), (a, b, out, n64)),
        "RawKernel launch + cupy.empty": lambda: raw((1,), (128,), (a, b, cupy.empty((8, 8), f32), n64)),
        "cupy.empty((8,8))": lambda: cupy.empty((8, 8), f32),
        "cupy.empty_like(a)": lambda: cupy.empty_like(a),
        "cupy.ndarray(shape, dtype)": lambda: cupy.ndarray((8, 8), f32),
        "get_current_stream()": cupy.cuda.get_current_stream,
        "stream.ptr": lambda: stream.ptr,
        "a.flags.c_contiguous": lambda: a.flags.c_contiguous,
        "a.dtype == b.dtype": lambda: a.dtype == b.dtype,
        "a.shape == b.shape": lambda: a.shape == b.shape,
        "result_type(a, b)": lambda: result_type(a, b),
        "opmath + 2 casts": lambda: (opmath(result_type(a, b)), cast(cupy, a, f32), cast(cupy, b, f32)),
        "flambeau binary kernel add(cupy, a, b)": lambda: pointwise._add_kernel(cupy, a, b),
        "flambeau op kernel add(cupy, a, b)": lambda: pointwise.add.kernel(cupy, a, b),
        "Tensor._make(out, dev)": lambda: Tensor._make(out, dev),
        "flambeau A + B": lambda: A + B,
        "flambeau.add(A, B)": lambda: flambeau.add(A, B),
        "flambeau A * B": lambda: A * B,
        "flambeau A + 1.0": lambda: A + 1.0,
        "flambeau A.relu()": lambda: A.relu(),
        "flambeau A.sum()": lambda: A.sum(),
        "flambeau A.sum(-1)": lambda: A.sum(-1),
        "flambeau A.mean()": lambda: A.mean(),
        "flambeau A.to(bfloat16)": lambda: A.to(flambeau.bfloat16),
        "flambeau A.exp()": lambda: A.exp(),
        "flambeau A.t().contiguous()": lambda: A.t().contiguous(),
        "flambeau empty((8, 8))": lambda: flambeau.empty((8, 8), device="cuda"),
        "cupy.sum(a)": lambda: cupy.sum(a),
        "a.astype(bfloat16)": lambda: a.astype(bf16),
        "torch a.relu()": lambda: ta.relu(),
        "torch a.sum()": lambda: ta.sum(),
        "torch a.to(bfloat16)": lambda: ta.to(torch.bfloat16),
        "torch a + b": lambda: ta + tb,
        "torch a * b": lambda: ta * tb,
    }
    for name, fn in pieces.items():
        try:
            print(json.dumps({"piece": name, "us_per_call": round(_per_call(fn, sync), 2)}), flush=True)
        except Exception as e:  # a piece that fails is reported, the others still run
            print(json.dumps({"piece": name, "error": f"{type(e).__name__}: {e}"}), flush=True)


CONV_SHAPES = {"small": ((2, 64, 8, 8), (64, 64, 3, 3)),        # host-bound: the call's own cost
               "resnet": ((64, 64, 56, 56), (64, 64, 3, 3))}  # a ResNet-50 layer-1 convolution


def conv_micro() -> None:
    """Per-call wall time of a bf16 3x3 convolution through each layer: flambeau's conv2d (forward,
    forward+backward), cudnn.forward/backward_data/backward_filter, the cached plan's execute, the
    bare cudnnBackendExecute with a prebuilt variant pack, the pieces around it; PyTorch's for reference."""
    import cupy
    import ml_dtypes
    import torch
    import flambeau
    from flambeau._backends import cudnn
    bf16 = np.dtype(ml_dtypes.bfloat16)
    sync = cupy.cuda.Device().synchronize
    rng = np.random.default_rng(0)
    for label, (xs, ws) in CONV_SHAPES.items():
        x = cupy.asarray(rng.standard_normal(xs).astype(bf16))
        w = cupy.asarray(rng.standard_normal(ws).astype(bf16))
        y = cudnn.forward(x, w, None, (1, 1), (1, 1), (1, 1), 1)
        gy = cupy.ones_like(y)
        st = ((1, 1), (1, 1), (1, 1))
        key = ("forward", cupy.cuda.runtime.getDevice(), x.shape, w.shape, y.shape, *st, 1, "bfloat16",
               cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark, cudnn.use_graph_api)
        plan = cudnn._plans[key]
        h = cudnn._handle()
        ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
        work = cupy.empty(max(plan.ws, 1), dtype=cupy.uint8)
        pack = plan._variant_pack(ptrs + (work.data.ptr if plan.ws else 0,))
        X = flambeau.tensor(cupy.asnumpy(x).astype(np.float32), device="cuda").bfloat16()
        W = flambeau.tensor(cupy.asnumpy(w).astype(np.float32), device="cuda").bfloat16().requires_grad_()
        TX = torch.tensor(cupy.asnumpy(x).astype(np.float32), device="cuda").bfloat16()
        TW = torch.tensor(cupy.asnumpy(w).astype(np.float32), device="cuda").bfloat16().requires_grad_()
        pieces = {
            "flambeau F.conv2d (no grad)": lambda: flambeau.nn.functional.conv2d(X.detach(), W.detach(), padding=1),
            "flambeau F.conv2d fwd+bwd (weight grad only)":
                lambda: flambeau.nn.functional.conv2d(X, W, padding=1).sum().backward(),
            "torch F.conv2d (no grad)": lambda: torch.nn.functional.conv2d(TX, TW.detach(), padding=1),
            "torch F.conv2d fwd+bwd (weight grad only)":
                lambda: torch.nn.functional.conv2d(TX, TW, padding=1).sum().backward(),
            "cudnn.forward": lambda: cudnn.forward(x, w, None, *st, 1),
            "cudnn.backward_data": lambda: cudnn.backward_data(gy, w, *st, 1, xs[2:]),
            "cudnn.backward_filter": lambda: cudnn.backward_filter(x, gy, ws, *st, 1),
            "plan.execute(h, ptrs)": lambda: plan.execute(h, ptrs),
            "cudnnBackendExecute (prebuilt pack)": lambda: plan.lib.cudnnBackendExecute(h, plan.plan, pack),
            "cudnnGetVersion() (a bare ctypes call)": plan.lib.cudnnGetVersion,
            "cudnn.forward, legacy API": lambda: _legacy(cudnn, lambda: cudnn.forward(x, w, None, *st, 1)),
            "cudnn._handle()": cudnn._handle,
            "cupy.empty(y.shape)": lambda: cupy.empty(y.shape, bf16),
            "cudnn._ready(x)": lambda: cudnn._ready(x),
            "cudnn._supported(x, w)": lambda: cudnn._supported(x, w),
        }
        print(json.dumps({"conv": label, "x": xs, "w": ws, "plan_ws_bytes": plan.ws,
                          "plan": type(plan).__name__}), flush=True)
        for name, fn in pieces.items():
            try:
                us = _per_call(fn, sync, n=2000 if label == "small" else 200)
                print(json.dumps({"conv": label, "piece": name, "us_per_call": round(us, 2)}), flush=True)
            except Exception as e:  # a piece that fails is reported, the others still run
                print(json.dumps({"conv": label, "piece": name, "error": f"{type(e).__name__}: {e}"[:300]}),
                      flush=True)


def _legacy(cudnn, fn):
    cudnn.use_graph_api = False
    try:
        return fn()
    finally:
        cudnn.use_graph_api = True


OPS_CALLS = 3000
OPS_ROWS = 14


def ops_profile() -> None:
    """For each small op, cProfile over OPS_CALLS calls: the top functions by own time, in us per op call."""
    import cProfile
    import pstats
    import cupy
    import flambeau
    from flambeau._backends import triton_launch as TL, triton_pointwise
    rng = np.random.default_rng(0)
    A = flambeau.tensor(rng.standard_normal((8, 8)).astype(np.float32), device="cuda")
    X = flambeau.tensor(rng.standard_normal((8, 4, 4, 4)).astype(np.float32), device="cuda").bfloat16()
    bn = flambeau.nn.BatchNorm2d(4).to("cuda")
    a = A._data
    out = cupy.empty_like(a)
    kern = TL.compile_kernel(triton_pointwise._act_fwd, triton_pointwise._sig({"X": "*fp32", "Y": "*fp32"}),
                             dict(KIND=3, BLOCK=1024), num_warps=4, num_stages=1)
    args = (np.uint64(a.data.ptr), np.uint64(out.data.ptr), np.int64(64), np.uint64(0), np.uint64(0))
    stream = cupy.cuda.get_current_stream()
    pieces = {
        "A.relu()": lambda: A.relu(),
        "A.sum()": lambda: A.sum(),
        "A.mean()": lambda: A.mean(),
        "A.to(bfloat16)": lambda: A.to(flambeau.bfloat16),
        "zeros((8, 8))": lambda: flambeau.zeros((8, 8), device="cuda"),
        "bn(X) training": lambda: bn(X),
        "TL.launch(relu)": lambda: TL.launch(kern, (1,), TL.Ptr(a.data.ptr), TL.Ptr(out.data.ptr), 64),
        "Function call (relu)": lambda: kern.function((1, 1, 1), (128, 1, 1), args, shared_mem=0, stream=stream),
    }
    sync = cupy.cuda.Device().synchronize
    for name, fn in pieces.items():
        us = _per_call(fn, sync, n=OPS_CALLS)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(OPS_CALLS):
            fn()
        sync()
        prof.disable()
        print(f"== {name}: {us:.2f} us per call (unprofiled)", flush=True)
        st = pstats.Stats(prof)
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:OPS_ROWS]
        for (file, line, fname), (cc, nc, tt, ct, _) in rows:
            print(f"  {tt / OPS_CALLS * 1e6:7.2f} us self {ct / OPS_CALLS * 1e6:7.2f} us incl {nc / OPS_CALLS:5.1f}x  "
                  f"{os.path.basename(file)}:{line}({fname})", flush=True)


def add_loop() -> None:
    import flambeau
    rng = np.random.default_rng(0)
    a = flambeau.tensor(rng.standard_normal((8, 8)).astype(np.float32), device="cuda")
    b = flambeau.tensor(rng.standard_normal((8, 8)).astype(np.float32), device="cuda")
    for _ in range(ADD_CALLS):
        a + b
    flambeau.cuda.synchronize()


def _warm_step(name: str, mode: str = "eager"):
    """One training step of bench/gpu_train.py's workload `name` (bf16 autocast, AdamW) as a function, after
    three warm-up steps; `mode` "compiled" runs `flambeau.compile(model)` (default mode)."""
    import flambeau
    from bench import gpu_models, gpu_train
    spec = gpu_train.WORKLOADS[name]
    rng = np.random.default_rng(0)
    model = spec["build"](flambeau).to("cuda")
    if mode == "compiled":
        model = flambeau.compile(model)
    xs, ys = spec["batch"](rng)
    x, y = flambeau.tensor(xs, device="cuda"), flambeau.tensor(ys, device="cuda")
    opt = flambeau.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step():
        gpu_models.train_step(flambeau, model, opt, x, y, flambeau.bfloat16)
    for _ in range(3):
        step()
    flambeau.cuda.synchronize()
    return step


def train_loop(name: str) -> None:
    import flambeau
    step = _warm_step(name)
    t0 = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        step()
    flambeau.cuda.synchronize()
    print(json.dumps({"loop": name, "ms_per_step": round((time.perf_counter() - t0) * 1e3 / TRAIN_STEPS, 2)}))


PROFILED_STEPS = 5
STEP_ROWS = 40


def steps_profile(names: str, mode: str = "eager") -> None:
    """For each workload of bench/gpu_train.py, cProfile over PROFILED_STEPS flambeau training steps
    (after warm-up): the unprofiled step time, how many operator calls reach the backend per step,
    and the top functions by own and by inclusive time, in us per step. `mode` "compiled" profiles
    `flambeau.compile(model)` (default mode)."""
    import cProfile
    import pstats
    import flambeau
    from bench import measure
    for name in names.split(","):
        step = _warm_step(name, mode)
        t0 = time.perf_counter()
        for _ in range(TRAIN_STEPS):
            step()
        flambeau.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / TRAIN_STEPS
        gc_time, gc_count = _gc_time(step)
        calls = measure.functional_calls(step)
        flambeau.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(PROFILED_STEPS):
            step()
        flambeau.cuda.synchronize()
        prof.disable()
        if os.environ.get("PROFILE_DUMP"):      # the whole table, for pstats offline
            prof.dump_stats(os.path.join(os.environ["PROFILE_DUMP"], f"{name}-{mode}.pstats"))
        print(f"== {name} ({mode}): {ms:.2f} ms per step (unprofiled), {calls} operator calls per step, "
              f"garbage collector {gc_time:.2f} ms in {gc_count:.1f} collections per step", flush=True)
        st = pstats.Stats(prof)
        for title, col in (("own", 2), ("inclusive", 3)):
            print(f"-- top by {title} time, us per step", flush=True)
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][col])[:STEP_ROWS]
            for (file, line, fname), (cc, nc, tt, ct, _) in rows:
                print(f"  {tt / PROFILED_STEPS * 1e6:9.1f} own {ct / PROFILED_STEPS * 1e6:9.1f} incl "
                      f"{nc / PROFILED_STEPS:7.1f}x  {os.path.basename(file)}:{line}({fname})", flush=True)


def _gc_time(step, steps: int = 20) -> tuple:
    """Milliseconds the garbage collector ran per step, and collections per step (gc.callbacks). A full
    collection (generation 2) costs tens of ms in a GPU process and comes every few dozen steps, so a
    short window over- or under-states it: the full ones are printed as they come."""
    import gc
    spent, starts = [0.0, 0], {}

    def hook(phase, info):
        if phase == "start":
            starts["t"] = time.perf_counter()
        else:
            dt = time.perf_counter() - starts.pop("t", time.perf_counter())
            spent[0] += dt
            spent[1] += 1
            if info.get("generation") == 2:
                print(f"  (full collection: {dt * 1e3:.1f} ms, {len(gc.get_objects())} tracked objects)", flush=True)
    _steps_with_gc_callback(step, steps, hook)
    return spent[0] * 1e3 / steps, spent[1] / steps


def _steps_with_gc_callback(step, steps: int, callback) -> None:
    """`steps` calls of `step` with `callback` among the garbage collector's callbacks."""
    import gc
    gc.callbacks.append(callback)
    try:
        for _ in range(steps):
            step()
    finally:
        gc.callbacks.remove(callback)


def young_objects(names: str, mode: str = "eager", steps: int = 10) -> None:
    """For each workload of bench/gpu_train.py, after warm-up: the garbage collector's collections per step
    by generation, the objects it tracks, and what the young generation holds when a collection starts
    (summed over every generation-0 collection of `steps` steps, per type, per step): the objects a step
    makes that the collector must walk, where a step that makes many triggers a collection every ~700."""
    import gc
    import flambeau
    for name in names.split(","):
        step = _warm_step(name, mode)
        kinds: collections.Counter = collections.Counter()

        def hook(phase, info):
            if phase == "start" and info.get("generation") == 0:
                kinds.update(type(o).__module__ + "." + type(o).__qualname__ for o in gc.get_objects(0))
        before = [g["collections"] for g in gc.get_stats()]
        _steps_with_gc_callback(step, steps, hook)
        flambeau.cuda.synchronize()
        per_gen = [round((g["collections"] - b) / steps, 2) for g, b in zip(gc.get_stats(), before)]
        print(f"== {name} ({mode}): collections per step by generation {per_gen}, {len(gc.get_objects())} tracked "
              f"objects; the young generation at its collections, per step:", flush=True)
        for kind, n in kinds.most_common(30):
            print(f"  {n / steps:9.1f}  {kind}", flush=True)


def _frame_name(frame: str) -> str:
    return frame.strip()


def summary(path: str, top: int = 45) -> None:
    """Self and inclusive sample shares per frame from py-spy's raw (collapsed) output."""
    self_c: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(n)
            total += n
            frames = [_frame_name(x) for x in stack.split(";")]
            self_c[frames[-1]] += n
            for fr in set(frames):
                incl[fr] += n
    print(f"== {path}: {total} samples")
    print("-- self")
    for fr, n in self_c.most_common(top):
        print(f"{100 * n / total:6.2f}%  {fr}")
    print("-- inclusive")
    for fr, n in incl.most_common(top + 30):
        print(f"{100 * n / total:6.2f}%  {fr}")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "micro":
        micro()
    elif what == "add":
        add_loop()
    elif what in ("resnet", "gpt"):
        train_loop(what)
    elif what == "ops":
        ops_profile()
    elif what == "steps":
        steps_profile(sys.argv[2] if len(sys.argv) > 2 else "mlp,resnet",
                      sys.argv[3] if len(sys.argv) > 3 else "eager")
    elif what == "young":
        young_objects(sys.argv[2] if len(sys.argv) > 2 else "gpt", sys.argv[3] if len(sys.argv) > 3 else "eager")
    elif what == "conv":
        conv_micro()
    elif what == "summary":
        summary(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {what!r}")
