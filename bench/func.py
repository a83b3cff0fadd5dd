"""Per-sample gradients of a small CNN (batch 64): flambeau's `vmap(grad(loss))` against a Python loop
over the samples (one backward each) and against PyTorch's `torch.func.vmap(grad(...))` and PyTorch's own
loop, in one run.

    python bench/func.py [--batch 64] [--steps 5] [--interleave]

One JSON line per system: ms_per_step (median wall time of --steps after one warm-up), cpu_ms_per_step
(median process CPU time, all threads: steadier than wall time on a shared machine), first_call_ms,
minflt_per_step (median minor page faults: memory given back to the system and faulted in again);
the last line gives the ratios loop/vmap of both libraries and flambeau-vmap/torch-func. Wall timings
from a loaded machine are noise. With --interleave the timed steps go round the four systems (one step
of each per round) instead of one system's steps after the other's, so that a change of the machine's
load during the run falls on all of them (for the loop/vmap ratios; the systems then share the heap
between steps and PyTorch's steps fault pages in again: read vmap/torch.func from a plain run)."""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

NUM_CLASSES = 10


def _model(m):
    m.manual_seed(0)
    return m.nn.Sequential(m.nn.Conv2d(1, 8, 3), m.nn.ReLU(), m.nn.MaxPool2d(2), m.nn.Conv2d(8, 16, 3),
                           m.nn.ReLU(), m.nn.Flatten(), m.nn.Linear(16 * 11 * 11, NUM_CLASSES))


def _vmap_grad(m, func, model, x, t):
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, ti):
        return m.nn.functional.cross_entropy(func.functional_call(model, p, (xi.unsqueeze(0),)), ti.unsqueeze(0))
    return lambda: func.vmap(func.grad(loss), in_dims=(None, 0, 0))(params, x, t)


def _loop(m, model, x, t):
    def step():
        out = []
        for i in range(x.shape[0]):
            model.zero_grad()
            m.nn.functional.cross_entropy(model(x[i:i + 1]), t[i:i + 1]).backward()
            out.append({k: p.grad.clone() for k, p in model.named_parameters()})
        return out
    return step


def _first(step):
    t0 = time.perf_counter()
    step()
    return (time.perf_counter() - t0) * 1e3


def _measure(step, record):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    record[0].append((time.perf_counter() - t0) * 1e3)
    record[1].append((time.process_time() - c0) * 1e3)
    record[2].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)


def _summary(record, first):
    times, cpu, faults = record
    return float(np.median(times)), float(np.median(cpu)), first, int(np.median(faults))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--interleave", action="store_true", help="time one step of each system per round")
    args = ap.parse_args()
    import flambeau as fl
    import flambeau.func
    import torch
    import torch.func
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
    ts = rng.integers(0, NUM_CLASSES, args.batch)
    steps, firsts, records = {}, {}, {}
    for system, m, func in (("flambeau-vmap", fl, fl.func), ("flambeau-loop", fl, None),
                            ("torch-func", torch, torch.func), ("torch-loop", torch, None)):
        model = _model(m)
        x, t = m.tensor(xs), m.tensor(ts)
        steps[system] = _vmap_grad(m, func, model, x, t) if func is not None else _loop(m, model, x, t)
        records[system] = ([], [], [])
        firsts[system] = _first(steps[system])
        if not args.interleave:
            for _ in range(args.steps):
                _measure(steps[system], records[system])
    if args.interleave:
        for _ in range(args.steps):
            for system, step in steps.items():
                _measure(step, records[system])
    results, cpu_results = {}, {}
    for system in steps:
        ms, cpu_ms, first, faults = _summary(records[system], firsts[system])
        results[system], cpu_results[system] = ms, cpu_ms
        print(json.dumps({"workload": f"per_sample_grad_cnn_b{args.batch}", "system": system,
                          "ms_per_step": round(ms, 3), "cpu_ms_per_step": round(cpu_ms, 3),
                          "first_call_ms": round(first, 3), "minflt_per_step": faults}))
    ratios = {}
    for kind, r in (("", results), ("cpu_", cpu_results)):
        ratios[kind + "loop_over_vmap"] = round(r["flambeau-loop"] / r["flambeau-vmap"], 3)
        ratios[kind + "flambeau_vmap_over_torch_func"] = round(r["flambeau-vmap"] / r["torch-func"], 3)
        ratios[kind + "torch_loop_over_torch_func"] = round(r["torch-loop"] / r["torch-func"], 3)
    print(json.dumps({"workload": f"per_sample_grad_cnn_b{args.batch}", **ratios}))


if __name__ == "__main__":
    main()
