"""cuDNN convolution timing: flambeau's F.conv2d on cuda (cuDNN with allow_tf32 off and on, with
heuristic and with benchmarked algorithm choice, and the CuPy im2col path with cuDNN disabled) against torch.nn.functional.conv2d on the same GPU (its
default flags, and with torch.backends.cudnn.allow_tf32 = False). Forward and forward+backward
(input and weight gradients), float32; each figure is the median of 20 synchronized runs after
warm-up, in milliseconds. Prints one line per case and configuration.

    python bench/conv_cudnn.py [--runs 20] [--no-im2col]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

CASES = [  # name, x shape, w shape, kwargs
    ("3x3", (32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ("3x3_stride2", (32, 64, 56, 56), (128, 64, 3, 3), dict(padding=1, stride=2)),
    ("1x1", (32, 256, 28, 28), (64, 256, 1, 1), {}),
    ("depthwise3x3", (32, 128, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=128)),
]


def timer(m, fn, runs):
    for _ in range(3):
        fn()
    m.cuda.synchronize()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        m.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def bench(m, xs, ws, kw, backward, runs):
    rng = np.random.default_rng(0)
    x = m.tensor(rng.standard_normal(xs).astype(np.float32), device="cuda", requires_grad=backward)
    w = m.tensor((rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32), device="cuda",
                 requires_grad=backward)
    F = m.nn.functional
    y0 = F.conv2d(x, w, **kw)
    g = m.tensor(rng.standard_normal(tuple(y0.shape)).astype(np.float32), device="cuda")
    del y0

    def fwd():
        return F.conv2d(x, w, **kw)

    def fwd_bwd():
        x.grad = w.grad = None
        F.conv2d(x, w, **kw).backward(g)
    if backward:
        return timer(m, fwd_bwd, runs)
    with m.no_grad():
        return timer(m, fwd, runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--no-im2col", action="store_true")
    a = ap.parse_args()
    import torch
    import flambeau
    from flambeau._backends import cudnn
    print(f"device {torch.cuda.get_device_name()}  cuDNN (flambeau) {cudnn.version()} from {cudnn._state['path']}"
          f"  torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}"
          f"  torch default cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}", flush=True)
    torch_default = torch.backends.cudnn.allow_tf32
    for name, xs, ws, kw in CASES:
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            r = {}
            torch.backends.cudnn.allow_tf32 = torch_default
            r["torch_default"] = bench(torch, xs, ws, kw, backward, a.runs)
            torch.backends.cudnn.allow_tf32 = False
            r["torch_fp32"] = bench(torch, xs, ws, kw, backward, a.runs)
            torch.backends.cudnn.allow_tf32 = torch_default
            for tf32 in (False, True):
                cudnn.allow_tf32 = tf32
                r[f"flambeau_cudnn_tf32={tf32}"] = bench(flambeau, xs, ws, kw, backward, a.runs)
                cudnn.benchmark = True
                r[f"flambeau_cudnn_benchmark_tf32={tf32}"] = bench(flambeau, xs, ws, kw, backward, a.runs)
                cudnn.benchmark = False
            cudnn.allow_tf32 = False
            if not a.no_im2col:
                cudnn.enabled = False
                r["flambeau_im2col"] = bench(flambeau, xs, ws, kw, backward, max(3, a.runs // 4))
                cudnn.enabled = True
            cells = "  ".join(f"{k} {v:.3f} ms" for k, v in r.items())
            ratios = (f"ratio fp32/fp32 {r['flambeau_cudnn_tf32=False'] / r['torch_fp32']:.2f}x  "
                      f"tf32/tf32 {r['flambeau_cudnn_tf32=True'] / r['torch_default']:.2f}x")
            print(f"{name:13s} {mode:8s} {cells}  |  {ratios}", flush=True)


if __name__ == "__main__":
    main()
