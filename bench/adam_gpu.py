"""One Adam/AdamW step over GPT-2 124M's parameters (fp32, 148 tensors) on one GPU: PyTorch's
fused=True and foreach=True against flambeau's fused kernel (flambeau/_backends/triton_adam.py),
in one run.

    python bench/adam_gpu.py [--steps 50] [--amsgrad]

One JSON line per system: ms_per_step (mean over --steps steps after 5 warm-up steps, timed with
device events around the whole loop, grads fixed). The last line gives flambeau/torch-fused."""
from __future__ import annotations

import argparse
import json

import numpy as np

D, LAYERS, VOCAB, CTX = 768, 12, 50257, 1024
WARMUP = 5


def gpt2_shapes() -> list:
    block = [(D,), (D,), (D, 3 * D), (3 * D,), (D, D), (D,), (D,), (D,), (D, 4 * D), (4 * D,), (4 * D, D), (D,)]
    return [(VOCAB, D), (CTX, D)] + block * LAYERS + [(D,), (D,)]


def _time(step, n, events):
    for _ in range(WARMUP):
        step()
    start, end = events()
    start.record()
    for _ in range(n):
        step()
    end.record()
    end.synchronize()
    return start, end


def bench_torch(shapes, steps, amsgrad, fused):
    import torch
    ps = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-4, amsgrad=amsgrad, **({"fused": True} if fused else {"foreach": True}))
    s, e = _time(opt.step, steps, lambda: (torch.cuda.Event(enable_timing=True),
                                           torch.cuda.Event(enable_timing=True)))
    return s.elapsed_time(e) / steps


def bench_flambeau(shapes, steps, amsgrad):
    import cupy
    import flambeau
    ps = [flambeau.randn(*s, device="cuda", requires_grad=True) for s in shapes]
    for p in ps:
        p.grad = flambeau.randn(*p.shape, device="cuda")
    opt = flambeau.optim.AdamW(ps, lr=1e-4, amsgrad=amsgrad)
    s, e = _time(opt.step, steps, lambda: (cupy.cuda.Event(), cupy.cuda.Event()))
    return cupy.cuda.get_elapsed_time(s, e) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--amsgrad", action="store_true")
    a = ap.parse_args()
    shapes = gpt2_shapes()
    n = int(sum(np.prod(s) for s in shapes))
    res = {"torch_fused": bench_torch(shapes, a.steps, a.amsgrad, True),
           "torch_foreach": bench_torch(shapes, a.steps, a.amsgrad, False),
           "flambeau_fused": bench_flambeau(shapes, a.steps, a.amsgrad)}
    for name, ms in res.items():
        print(json.dumps({"system": name, "tensors": len(shapes), "elements": n, "amsgrad": a.amsgrad,
                          "ms_per_step": round(ms, 4)}))
    print(json.dumps({"ratio_flambeau_over_torch_fused": round(res["flambeau_fused"] / res["torch_fused"], 3)}))


if __name__ == "__main__":
    main()
