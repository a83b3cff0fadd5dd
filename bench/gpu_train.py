"""Training steps on one GPU: PyTorch and flambeau running the same model code (bench/gpu_models.py).

    python bench/gpu_train.py [--only gpt,resnet,mlp] [--systems torch,flambeau] [--modes eager,compiled]
                              [--steps 10] [--no-profile] [--repeat 3] [--same-process]

`compiled` is `torch.compile(model)` / `flambeau.compile(model)` (default mode; flambeau's generated
Triton kernels on cuda); any other mode name (`reduce-overhead`, `max-autotune`,
`max-autotune-no-cudagraphs`) compiles with `mode=` that mode. A compiled flambeau line adds the
generated kernels and cuBLASLt products launched per step outside CUDA graphs, the extern outputs
copied per step into the layout the compiled code assumed, the CUDA graphs replayed per step and recorded so far, how many kernels were compiled or came from the on-disk
cache, and what ran eagerly (or without a CUDA graph) inside compiled code.

Workloads (issue 11, item 7), all with bf16 autocast and AdamW (each library's default, foreach on cuda):
  gpt     GPT-2 124M (12 layers, d 768, 12 heads, vocab 50257, tied embeddings), B 8 x T 1024
  resnet  ResNet-50, B 64, 3 x 224 x 224, 1000 classes
  resnet_cl  the same, channels-last: model.to(memory_format=channels_last), input
          x.contiguous(memory_format=channels_last) (NHWC cuDNN convolutions, no layout conversions);
          not in the default --only; flambeau's lines add layout_copies_per_step (operands re-laid out
          before cuDNN calls and Triton BatchNorm launches)
  mlp     4 x Linear(256, 256) with ReLU, B 64, 256 classes

For each workload, system and mode, one JSON line: first_step_ms (the first step of a fresh model,
including kernel compilation, cuDNN/cuBLASLt plans, autotuning), ms_per_step (mean over --steps
steps after two warm-up steps, wall clock between device synchronisations), peak_mb (peak memory
the library's allocator handed out since the model was built, weights and optimizer state
included), and, unless --no-profile, kernels / d2h / h2d / syncs per step, counted over one more
step under PyTorch's profiler (bench/gpu_profile.py; d2h = device-to-host copies, each a host
synchronisation). A mode that fails prints its error in the line instead. The last line per
workload gives flambeau/torch ratios. Each library trains its own randomly initialised copy.

Each (workload, mode, system) runs in a fresh process of its own (--same-process runs them all in
this one): on the device VM a host-bound step varies by up to 40% between identical processes, and
a process that ran other models first measures them too. With --repeat N the rounds are interleaved
(torch, flambeau, torch, ...) and the summary line gives the medians and each system's range.

Each line also gives the garbage collector's time per measured step, its collections per generation
and the objects it tracks: a full collection walks every tracked object, and a host-bound flambeau
step that holds one is slower by all of it. A measuring process imports only its own library (and
torch's profiler after the timed steps, unless --no-profile); `--gc-freeze` calls
`gc.freeze()` after the warm-up (both systems), so full collections skip what exists by then;
`--gc-report N` adds what a full collection walks after the timed steps (`measure.heap_report`).
`host_calibration_ms` is the process's time for a fixed Python workload (`measure.host_calibration_ms`) before
the model is built and after the timed steps: the device host's Python speed moves up to 2x between
processes, so two lines' step times compare only where their calibrations agree.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import gpu_models, measure  # noqa: E402
from bench.gpu_profile import counts  # noqa: E402

WORKLOADS = {
    "gpt": dict(build=lambda m: gpu_models.gpt(m), batch=lambda rng: (rng.integers(0, 50257, (8, 1024)),
                                                                       rng.integers(0, 50257, (8, 1024)))),
    "resnet": dict(build=lambda m: gpu_models.resnet50(m),
                   batch=lambda rng: (rng.standard_normal((64, 3, 224, 224)).astype(np.float32),
                                      rng.integers(0, 1000, 64))),
    "resnet_cl": dict(build=lambda m: gpu_models.resnet50(m), channels_last=True,
                      batch=lambda rng: (rng.standard_normal((64, 3, 224, 224)).astype(np.float32),
                                         rng.integers(0, 1000, 64))),
    "mlp": dict(build=lambda m: gpu_models.mlp(m), batch=lambda rng: (rng.standard_normal((64, 256)).astype(np.float32),
                                                                      rng.integers(0, 256, 64))),
}
SYSTEMS = ("torch", "flambeau")


def library(name: str):
    """The library of system `name`, imported at first use: a measuring process imports only its own
    (a flambeau process without torch's objects, whose full garbage collections walk them all)."""
    if name not in SYSTEMS:
        raise SystemExit(f"unknown system {name!r}: one of {SYSTEMS}")
    return importlib.import_module(name)


def _sync(m):
    m.cuda.synchronize()


def _peak(m):
    return m.cuda.max_memory_allocated() / 2**20


def _layout_copies(lib) -> dict:
    """flambeau's counts of operands re-laid out before a cuDNN call or a Triton BatchNorm launch (a
    channels-last model should make none); empty for PyTorch."""
    if lib != "flambeau":
        return {}
    from flambeau._backends import cudnn
    out = {f"cudnn_{k}": v for k, v in cudnn.copies.items()}
    out["cudnn_variant_packs_built"] = cudnn.variant_packs["built"]
    bn = sys.modules.get("flambeau._backends.triton_batch_norm")
    if bn is not None:
        out.update({f"batch_norm_{k}": v for k, v in bn.copies.items()})
    return out


def run(name, lib, mode, steps, profile, top=0, gc_freeze=False, gc_report=0):
    calibration = [measure.host_calibration_ms(repeats=3)]
    m = library(lib)
    spec = WORKLOADS[name]
    rng = np.random.default_rng(0)
    m.manual_seed(0)
    _sync(m)
    m.cuda.reset_peak_memory_stats()
    model = spec["build"](m).to("cuda")
    xs, ys = spec["batch"](rng)
    x, y = m.tensor(xs, device="cuda"), m.tensor(ys, device="cuda")
    if spec.get("channels_last"):
        model = model.to(memory_format=m.channels_last)
        x = x.contiguous(memory_format=m.channels_last)
    opt = m.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    fwd = model
    if mode == "compiled":
        fwd = m.compile(model)
    elif mode != "eager":                   # reduce-overhead, max-autotune, ...: torch.compile's modes
        fwd = m.compile(model, mode=mode)

    def step():
        return gpu_models.train_step(m, fwd, opt, x, y, m.bfloat16)

    t0 = time.perf_counter()
    loss = step()
    _sync(m)
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(2):
        step()
    _sync(m)
    if gc_freeze:
        gc.freeze()
    meter = measure.GcMeter()
    copies0 = _layout_copies(lib)
    t0 = time.perf_counter()
    with meter:
        for _ in range(steps):
            loss = step()
        _sync(m)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    calibration.append(measure.host_calibration_ms(repeats=3))
    copies = {k: round((v - copies0.get(k, 0)) / steps, 2) for k, v in _layout_copies(lib).items()}
    res = {"workload": name, "system": lib, "mode": mode, "first_step_ms": round(first, 1),
           "ms_per_step": round(ms, 2), "peak_mb": round(_peak(m), 1), "loss": round(float(loss.item()), 4),
           "gc_ms_per_step": round(meter.seconds * 1e3 / steps, 2),
           "gc_collections": dict(enumerate(meter.collections)),
           "gc_tracked_objects": len(gc.get_objects()),
           "host_calibration_ms": calibration}
    if copies:
        res["layout_copies_per_step"] = copies
    if lib == "flambeau" and mode != "eager":
        res.update(_flambeau_compiled_facts(step))
    if gc_report:
        res["gc_report"] = measure.heap_report(gc_report)
    if profile:
        res.update({k: v for k, v in counts(step, top=top).items()})
    del model, opt, fwd, x, y, loss
    gc.collect()
    m.cuda.empty_cache()
    return res


def _flambeau_compiled_facts(step) -> dict:
    """Generated Triton kernels launched in one step, and what ran eagerly inside compiled code
    (whole graphs, single ops) since the process started, by reason."""
    from flambeau._backends import cublaslt, triton_launch
    from flambeau._counters import FALLBACKS, counters
    from flambeau._inductor import cudagraphs, triton_runtime, wrapper
    before, gemms = triton_runtime.stats["launches"], cublaslt.calls["gemm"]
    replays, copies = cudagraphs.stats["replays"], wrapper.stats.get("extern_output_copies", 0)
    step()
    _sync(library("flambeau"))
    fallbacks = {str(k): v for k, v in counters[FALLBACKS].items()}
    return {"triton_launches_per_step": triton_runtime.stats["launches"] - before,
            "cublaslt_gemms_per_step": cublaslt.calls["gemm"] - gemms,
            "extern_output_copies_per_step": wrapper.stats.get("extern_output_copies", 0) - copies,
            "cuda_graph_replays_per_step": cudagraphs.stats["replays"] - replays,
            "cuda_graphs_recorded": cudagraphs.stats["recordings"],
            "kernels_compiled": triton_runtime.stats["compiled"],
            "kernels_compiled_in_workers": triton_runtime.stats.get("compiled_in_workers", 0),
            "cubin_cache_hits": triton_runtime.stats["cubin_cache_hits"],
            "modules_imported": triton_runtime.stats.get("modules_imported"),
            "handwritten_kernels": getattr(triton_launch, "stats", None),   # compiled / from the cubin cache
            "eager_fallbacks": dict(list(fallbacks.items())[:8])}


def _in_child(name: str, lib: str, mode: str, a) -> dict:
    """One measurement in a fresh process (see the module docstring)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--same-process", "--only", name, "--systems", lib,
           "--modes", mode, "--steps", str(a.steps), "--top", str(a.top)] + (["--no-profile"] if a.no_profile else []) + \
        (["--gc-freeze"] if a.gc_freeze else []) + ["--gc-report", str(a.gc_report)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    rows = [r for r in rows if r.get("workload") == name and not r.get("summary")]
    if not rows:
        return {"workload": name, "system": lib, "mode": mode, "error": f"exit {p.returncode}",
                "where": p.stderr.splitlines()[-3:]}
    return rows[0]


def _measure(name: str, lib: str, mode: str, a) -> dict:
    if not a.same_process:
        return _in_child(name, lib, mode, a)
    try:
        return run(name, lib, mode, a.steps, not a.no_profile, a.top, a.gc_freeze, a.gc_report)
    except Exception as e:            # one failing system must not hide the others' figures
        gc.collect()
        library(lib).cuda.empty_cache()
        return {"workload": name, "system": lib, "mode": mode, "error": f"{type(e).__name__}: {e}"[:500],
                "where": traceback.format_exc().splitlines()[-3:]}


def _summary(name: str, mode: str, t: list, f: list) -> dict | None:
    tm = [r["ms_per_step"] for r in t if "ms_per_step" in r]
    fm = [r["ms_per_step"] for r in f if "ms_per_step" in r]
    if not tm or not fm:
        return None
    out = {"workload": name, "mode": mode, "summary": True,
           "time_ratio": round(statistics.median(fm) / statistics.median(tm), 2),
           "memory_ratio": round(f[0]["peak_mb"] / max(t[0]["peak_mb"], 1e-9), 2)}
    if len(tm) > 1 or len(fm) > 1:
        out.update({"torch_ms": [min(tm), round(statistics.median(tm), 2), max(tm)],
                    "flambeau_ms": [min(fm), round(statistics.median(fm), 2), max(fm)]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gpt,resnet,mlp")
    ap.add_argument("--systems", default="torch,flambeau")
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--top", type=int, default=0, help="with the profile: the N kernels launched most often")
    ap.add_argument("--repeat", type=int, default=1, help="rounds, interleaved; the summary gives medians and ranges")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after the warm-up steps: full collections skip what exists by then")
    ap.add_argument("--gc-report", type=int, default=0,
                    help="after the timed steps: one timed full collection, the N types with the most references "
                         "and the N biggest containers (measure.heap_report)")
    ap.add_argument("--same-process", action="store_true", help="measure everything in this process")
    a = ap.parse_args(argv)
    lt = None
    if "flambeau" in a.systems.split(","):
        try:
            from flambeau._backends import cublaslt
            lt = cublaslt.version()
        except ImportError:                 # a flambeau from before the cuBLASLt products
            pass
    first = library(a.systems.split(",")[0])
    print(json.dumps({"config": True, "device": first.cuda.get_device_name(),
                      "torch": getattr(sys.modules.get("torch"), "__version__", None),
                      "steps": a.steps, "cublaslt": lt, "isolated": not a.same_process,
                      "repeat": a.repeat}), flush=True)
    for name in a.only.split(","):
        rows: dict = {}
        for _ in range(a.repeat):
            for mode in a.modes.split(","):
                for lib in a.systems.split(","):
                    r = _measure(name, lib, mode, a)
                    rows.setdefault((lib, mode), []).append(r)
                    print(json.dumps(r), flush=True)
        for mode in a.modes.split(","):
            line = _summary(name, mode, rows.get(("torch", mode), []), rows.get(("flambeau", mode), []))
            if line is not None:
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
