"""Host cost of the pieces around a compiled training step that scale with the parameter count (issue 13),
measured on CPU (the same code runs for cuda):

- `function`: an `autograd.Function` over 161 leaf parameters saving 325 tensors (as the AOT Function of a
  compiled ResNet-50 step), whose backward hands 161 fresh gradients: `apply`, the engine, the leaves'
  accumulation, `.grad` cleared (`us`: forward + backward);
- `fused_adam`: one AdamW step over 161 parameters on a fake cuda device (NumPy arrays with CuPy's `.data.ptr`),
  the Triton launch a no-op: the fused step's bookkeeping (`_FusedPlan`: checks, step counts, versions)
  and `_step_groups` (`us`: minus the cost of setting the gradients).

One JSON line each, medians of `--repeats` runs of CPU process time (the box is shared). Compare trees by
running this script against each, alternating:

    PYTHONPATH=/path/to/tree python3 bench/training_step_host.py
"""
from __future__ import annotations

import argparse
import json
import time
import timeit
import types

import numpy as np

import flambeau as fl
from flambeau._tensor import Tensor

N_PARAMS, N_SAVED = 161, 325


def _median_us(fn, number: int, repeats: int) -> float:
    return sorted(timeit.timeit(fn, number=number, timer=time.process_time) / number * 1e6
                  for _ in range(repeats))[repeats // 2]


def function(number: int, repeats: int) -> dict:
    params = [fl.randn(4, 3).requires_grad_() for _ in range(N_PARAMS)]
    acts = [fl.randn(2, 2) for _ in range(N_SAVED)]
    grads = [np.ones((4, 3), np.float32) for _ in range(N_PARAMS)]
    dev = params[0]._device

    class Step(fl.autograd.Function):
        @staticmethod
        def forward(ctx, *ps):
            ctx.save_for_backward(*acts)
            return Tensor._make(np.zeros((), np.float32), dev)

        @staticmethod
        def backward(ctx, g):
            ctx.saved_tensors
            return tuple(Tensor._make(a.copy(), dev) for a in grads)

    def step():
        Step.apply(*params).backward()
        for p in params:
            p.grad = None
    for _ in range(20):
        step()
    return {"bench": "function", "params": N_PARAMS, "saved": N_SAVED, "us": round(_median_us(step, number, repeats), 1)}


def fused_adam(number: int, repeats: int) -> dict:
    from flambeau import _backends
    from flambeau._backends import triton_adam, triton_launch
    from flambeau._device import device

    class DevArray(np.ndarray):
        @property
        def data(self):
            return types.SimpleNamespace(ptr=self.ctypes.data)
    triton_adam.launch = lambda *a, **k: None
    triton_launch.available = lambda: True
    _backends._backends["cuda"] = _backends.Backend("cuda", np)
    _backends.array_namespaces["cuda"] = np
    cuda = device("cuda")
    rng = np.random.default_rng(0)

    def dev(a):
        return Tensor._make(np.array(a, np.float32).view(DevArray), cuda)
    params = [dev(rng.standard_normal((8, 8))) for _ in range(N_PARAMS)]
    for p in params:
        p.requires_grad_(True)
    opt = fl.optim.AdamW(params, lr=1e-3)
    for p in params:
        opt.state[p].update(step=fl.tensor(0.0), exp_avg=dev(np.zeros(p.shape)), exp_avg_sq=dev(np.zeros(p.shape)))
    grads = [dev(np.ones((8, 8))) for _ in params]

    def set_grads():
        for p, g in zip(params, grads):
            p.grad = g

    def step():
        set_grads()
        opt.step()
    for _ in range(5):
        step()
    us = _median_us(step, number, repeats) - _median_us(set_grads, number, repeats)
    return {"bench": "fused_adam", "params": N_PARAMS, "us": round(us, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="function,fused_adam")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--number", type=int, default=50)
    args = ap.parse_args()
    for name in args.only.split(","):
        print(json.dumps({"function": function, "fused_adam": fused_adam}[name](args.number, args.repeats)))


if __name__ == "__main__":
    main()
