"""Matrix-product templates (mode="max-autotune", flambeau/_inductor/mm_template.py) at GPT-2's sizes, bfloat16,
on one GPU: each template configuration alone, cuBLASLt + the epilogue kernel (the extern choice), what
flambeau's max-autotune chose, beside torch.compile(mode=--mode) and PyTorch eager of the same function.

    python bench/mm_template_gpu.py [--cases qkv,fc_gelu,proj_residual] [--reps 10] [--inner 10]
                                    [--mode max-autotune]

Cases (x: 8192x768 or 8192x3072 activations, w as nn.Linear stores it, bias, residual r):
  qkv            x @ w.t()                 8192x768 @ 768x2304
  fc_gelu        gelu_tanh(x @ w.t() + b)  8192x768 @ 768x3072
  proj_residual  x @ w.t() + r             8192x3072 @ 3072x768
One JSON line per (case, system): ms per call (median over --reps of --inner calls back to back between CUDA
events, after warm-up), and TFLOP/s of the product. flambeau's per-choice lines call the chosen kernel(s)
directly (`TemplateChoice.run`), without the wrapper; "flambeau-<mode>" and the torch lines are whole
compiled calls (flambeau's once without CUDA graphs, where it chooses, once in --mode).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import measure  # noqa: E402

CASES = {"qkv": (768, 2304), "fc_gelu": (768, 3072), "proj_residual": (3072, 768)}
M = 8192


def _fn(lib, case):
    F = lib.nn.functional
    if case == "qkv":
        return lambda x, w: x @ w.t()
    if case == "fc_gelu":
        return lambda x, w, b: F.gelu(x @ w.t() + b, approximate="tanh")
    return lambda x, w, r: x @ w.t() + r


def _args(lib, case):
    k, n = CASES[case]
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((M, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32) / k ** 0.5]
    host.append(rng.standard_normal(n, dtype=np.float32) if case == "fc_gelu" else
                rng.standard_normal((M, n), dtype=np.float32))
    if case == "qkv":
        host.pop()
    return [lib.tensor(h, device="cuda").to(lib.bfloat16) for h in host]


def _time(fn, events, args) -> float:
    def burst():
        for _ in range(args.inner):
            fn()
    return measure.median_event_ms(burst, 3, args.reps, events) / args.inner


def _line(case, system, ms, **extra):
    k, n = CASES[case]
    print(json.dumps({"case": case, "shape": f"{M}x{k}@{k}x{n}", "system": system, "ms": round(ms, 4),
                      "tflops": round(2 * M * k * n / ms / 1e9, 1), **extra}), flush=True)


def _flambeau(case, args):
    import flambeau as fl
    from flambeau._inductor import mm_template
    fl._dynamo.reset()
    _graphs.clear()
    xs = _args(fl, case)
    before = dict(mm_template.stats)
    cf = fl.compile(_fn(fl, case), mode="max-autotune-no-cudagraphs")
    cf(*xs)
    events = measure.cupy_events()
    _line(case, "flambeau-max-autotune-no-cudagraphs", _time(lambda: cf(*xs), events, args),
          timed_now=mm_template.stats["tuned"] - before["tuned"])
    seen = {}                              # the template's TemplateChoice and the arrays a call passes it
    for g in _graphs:
        ns = g.artifact.call.__globals__
        for name, v in list(ns.items()):
            if isinstance(v, mm_template.TemplateChoice):
                def record(*a, _v=v, _name=name):
                    seen[_name] = (_v, a)
                    return _v(*a)
                ns[name] = record
    cf(*xs)
    for name, (choice, call_args) in seen.items():
        for i, t in enumerate(choice.templates):
            la, c = t.launch, t.launch.constexprs
            _line(case, f"flambeau-template[{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']},w{la.num_warps},"
                        f"s{la.num_stages}]", _time(lambda i=i: choice.run(i, call_args), events, args),
                  chosen=choice.choice == i)
        n = len(choice.templates)
        _line(case, "flambeau-cublaslt+epilogue", _time(lambda: choice.run(n, call_args), events, args),
              chosen=choice.choice == n)
    if args.mode != "max-autotune-no-cudagraphs":      # the whole call in the peer's mode (the choice: from disk)
        fl._dynamo.reset()
        cm = fl.compile(_fn(fl, case), mode=args.mode)
        _line(case, f"flambeau-{args.mode}", _time(lambda: cm(*xs), events, args))


_graphs: list = []                 # the CompiledGraphs made (`_spy`)


def _spy():
    import flambeau._inductor as inductor
    inductor.config.keep_ir = True
    real = inductor.compile_fx

    def spy(gm, example_inputs=None, **kw):
        c = real(gm, example_inputs, **kw)
        _graphs.append(c)
        return c
    inductor.compile_fx = spy


def _torch(case, args):
    import torch
    xs = _args(torch, case)
    fn = _fn(torch, case)
    events = measure.torch_events()
    _line(case, "torch-eager", _time(lambda: fn(*xs), events, args))
    torch._dynamo.reset()
    tf = torch.compile(fn, mode=args.mode)
    tf(*xs)
    _line(case, f"torch-compile-{args.mode}", _time(lambda: tf(*xs), events, args))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--mode", default="max-autotune", help="torch.compile's mode, and flambeau's whole-call line")
    args = p.parse_args()
    _spy()
    for case in args.cases.split(","):
        _flambeau(case, args)
        _torch(case, args)


if __name__ == "__main__":
    main()
