"""Optimizer step time over many small parameters: multi-tensor (foreach) vs per-parameter loop,
flambeau vs PyTorch in the same process. Prints JSON lines.

    python bench/optim_step.py
"""
from __future__ import annotations

import json
import time

import numpy as np


def run(mod, opt_name, foreach, nparams=200, shape=(64, 64), steps=20):
    rng = np.random.default_rng(0)
    params = [mod.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True) for _ in range(nparams)]
    for p in params:
        p.grad = mod.tensor(rng.standard_normal(shape).astype(np.float32))
    opt = getattr(mod.optim, opt_name)(params, lr=1e-3, foreach=foreach)
    opt.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    import torch
    import flambeau
    res = {}
    for opt in ("SGD", "Adam", "AdamW"):
        for sysname, mod in (("torch-eager", torch), ("flambeau-eager", flambeau)):
            for foreach in (False, True):
                t = run(mod, opt, foreach)
                res[(opt, sysname, foreach)] = t
                print(json.dumps({"workload": f"{opt}_step_200x64x64", "system": sysname, "foreach": foreach,
                                  "step_time_ms": round(t * 1e3, 3)}), flush=True)
        print(json.dumps({"workload": f"{opt}_step_200x64x64", "ratio_flambeau_over_torch_foreach":
                          round(res[(opt, "flambeau-eager", True)] / res[(opt, "torch-eager", True)], 2),
                          "flambeau_foreach_speedup_over_loop":
                          round(res[(opt, "flambeau-eager", False)] / res[(opt, "flambeau-eager", True)], 2)}))


if __name__ == "__main__":
    main()
