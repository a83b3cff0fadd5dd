"""Convolution benchmark: flambeau vs PyTorch in the same process (same thread count), forward,
forward+backward (input and weight grads), stride 2, 1x1 and depthwise. Each case is timed as the
minimum over repeated runs, flambeau and torch interleaved so that load from other processes hits
both alike. Prints one JSON object per line.

    python bench/conv.py [--device cpu|cuda] [--repeats 7] [--threads N] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def cases(quick: bool):
    n = 8 if quick else 32
    return [  # name, x shape, w shape, kwargs, backward
        ("conv3x3_fwd", (n, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), False),
        ("conv3x3_fwd_bias", (n, 64, 56, 56), (64, 64, 3, 3), dict(padding=1, bias=True), False),
        ("conv3x3_fwd_bwd", (n, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), True),
        ("conv3x3_stride2_fwd", (n, 64, 56, 56), (128, 64, 3, 3), dict(padding=1, stride=2), False),
        ("conv3x3_stride2_fwd_bwd", (n, 64, 56, 56), (128, 64, 3, 3), dict(padding=1, stride=2), True),
        ("conv1x1_fwd", (n, 256, 28, 28), (64, 256, 1, 1), {}, False),
        ("conv1x1_fwd_bwd", (n, 256, 28, 28), (64, 256, 1, 1), {}, True),
        ("depthwise3x3_fwd", (n, 128, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=128), False),
        ("depthwise3x3_fwd_bwd", (n, 128, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=128), True),
        ("conv7x7_stride2_fwd", (n, 3, 224, 224), (64, 3, 7, 7), dict(padding=3, stride=2), False),
    ]


def make(m, device, xs, ws, kw, backward, rng):
    x = m.tensor(rng.standard_normal(xs).astype(np.float32), device=device, requires_grad=backward)
    w = m.tensor((rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32), device=device,
                 requires_grad=backward)
    kw = dict(kw)
    b = m.tensor(rng.standard_normal(ws[0]).astype(np.float32), device=device) if kw.pop("bias", False) else None
    F = m.nn.functional

    def fwd():
        return F.conv2d(x, w, b, **kw)

    def fwd_bwd():
        x.grad = w.grad = None
        y = F.conv2d(x, w, b, **kw)
        y.backward(m.ones_like(y))
        return y
    return (fwd_bwd if backward else fwd), (x, w)


def sync(m, device):
    if device == "cuda":
        m.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    import torch
    import flambeau
    torch.set_num_threads(a.threads)
    for name, xs, ws, kw, bwd in cases(a.quick):
        if a.only and a.only not in name:
            continue
        fns = {}
        for label, m in (("flambeau", flambeau), ("torch", torch)):
            fns[label] = make(m, a.device, xs, ws, kw, bwd, np.random.default_rng(0))
        yf, yt = fns["flambeau"][0](), fns["torch"][0]()
        ref = yt.detach().cpu().numpy()
        err = float(np.abs(yf.detach().cpu().numpy() - ref).max() / (np.abs(ref).max() + 1e-12))
        if bwd:
            gerr = [float(np.abs(f.grad.cpu().numpy() - t.grad.cpu().numpy()).max() / (np.abs(t.grad.cpu().numpy()).max()
                                                                                        + 1e-12))
                    for f, t in zip(fns["flambeau"][1], fns["torch"][1])]
            err = max([err] + gerr)
        times = {k: [] for k in fns}
        for _ in range(a.repeats):
            for label, m in (("flambeau", flambeau), ("torch", torch)):
                sync(m, a.device)
                t0 = time.perf_counter()
                fns[label][0]()
                sync(m, a.device)
                times[label].append(time.perf_counter() - t0)
        tf, tt = min(times["flambeau"]), min(times["torch"])
        print(json.dumps({"case": name, "device": a.device, "threads": a.threads, "x": list(xs), "w": list(ws),
                          "kwargs": kw, "flambeau_ms": round(tf * 1e3, 2), "torch_ms": round(tt * 1e3, 2),
                          "ratio": round(tf / tt, 2), "max_rel_err": err}), flush=True)


if __name__ == "__main__":
    main()
