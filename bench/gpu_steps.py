"""One training step's time, phase by phase, step by step: is it the host or the GPU (bench/gpu_models.py code).

    python bench/gpu_steps.py [--only gpt] [--system flambeau] [--mode compiled] [--steps 10]
                              [--profile N] [--dump FILE]

One workload, one library, one mode in this process (run each in its own process: a compile in the
same process slows what follows). After two warm-up steps, `--steps` steps each timed on the host
around its phases (forward under autocast, backward, optimizer step, zero_grad), then a device
synchronisation: `host_ms` is the time for the host to issue the whole step, `wall_ms` the time
until the GPU finished it. A step whose wall time barely exceeds its host time is host-bound;
a phase that takes long on the host while issuing little work hides a synchronisation. Prints one
JSON line per step, then the medians. With `--profile N`, N more steps under cProfile (the top
functions by own time printed; with `--dump`, the statistics written to FILE for `python -m pstats`).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.gpu_train import LIBS, WORKLOADS  # noqa: E402

PHASES = ("forward", "backward", "optimizer", "zero_grad")
PROFILE_ROWS = 45


def phased_step(m, fwd, opt, x, y):
    """One step of bench/gpu_models.train_step with the host time of each phase (ms), and the loss."""
    t = [time.perf_counter()]
    with m.autocast(device_type="cuda", dtype=m.bfloat16):
        loss = fwd(x, y)
    t.append(time.perf_counter())
    loss.backward()
    t.append(time.perf_counter())
    opt.step()
    t.append(time.perf_counter())
    opt.zero_grad(set_to_none=True)
    t.append(time.perf_counter())
    return loss, {p: round((b - a) * 1e3, 3) for p, a, b in zip(PHASES, t, t[1:])}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gpt")
    ap.add_argument("--system", default="flambeau")
    ap.add_argument("--mode", default="compiled")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args(argv)
    m = LIBS[a.system]
    spec = WORKLOADS[a.only]
    rng = np.random.default_rng(0)
    m.manual_seed(0)
    model = spec["build"](m).to("cuda")
    xs, ys = spec["batch"](rng)
    x, y = m.tensor(xs, device="cuda"), m.tensor(ys, device="cuda")
    opt = m.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    fwd = model if a.mode == "eager" else m.compile(model) if a.mode == "compiled" else m.compile(model, mode=a.mode)
    t0 = time.perf_counter()
    phased_step(m, fwd, opt, x, y)
    m.cuda.synchronize()
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(2):
        phased_step(m, fwd, opt, x, y)
    m.cuda.synchronize()
    rows = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        _, phases = phased_step(m, fwd, opt, x, y)
        t1 = time.perf_counter()
        m.cuda.synchronize()
        t2 = time.perf_counter()
        rows.append(dict(step=i, host_ms=round((t1 - t0) * 1e3, 2), wall_ms=round((t2 - t0) * 1e3, 2), **phases))
        print(json.dumps(rows[-1]), flush=True)
    med = {k: round(statistics.median(r[k] for r in rows), 2) for k in ("host_ms", "wall_ms") + PHASES}
    print(json.dumps({"workload": a.only, "system": a.system, "mode": a.mode, "first_step_ms": round(first, 1),
                      "median": med, "wall_min": min(r["wall_ms"] for r in rows),
                      "wall_max": max(r["wall_ms"] for r in rows)}), flush=True)
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.profile):
            phased_step(m, fwd, opt, x, y)
        m.cuda.synchronize()
        prof.disable()
        if a.dump:
            prof.dump_stats(a.dump)
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(PROFILE_ROWS)
        st.sort_stats("cumtime").print_stats(PROFILE_ROWS)


if __name__ == "__main__":
    main()
