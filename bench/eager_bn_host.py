"""Host cost of the eager cuda BatchNorm wrappers' Python (`_backends/triton_batch_norm.py` forward and
backward), measured on CPU: CuPy's array constructor is a NumPy array over one kept block, the kernel
build and launch are no-ops, 132 multiprocessors (an H100). ResNet-50's BatchNorm inputs at B 64, bf16,
NCHW (split kernels and one-program-per-channel ones). One JSON line per direction, `us_per_call` the
median of `--repeats` timeit runs (CPU time of the process), `arrays_per_call` the CuPy arrays it
allocates (each a pool allocation, a free and an array object on the GPU, which this fake makes cheap).

    PYTHONPATH=/path/to/tree python3 bench/eager_bn_host.py [--callgrind N]

`--callgrind N`: run N rounds with callgrind's instrumentation on (start the script under
`valgrind --tool=callgrind --instr-atstart=no`; it switches it on and off with callgrind_control),
for instruction counts that the box's load does not move.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import timeit
import types

import ml_dtypes
import numpy as np

from flambeau._backends import triton_batch_norm as BN, triton_launch as TL

SHAPES = [(64, 112), (64, 56), (256, 56), (128, 56), (128, 28), (512, 28), (256, 28), (256, 14), (1024, 14),
          (512, 14), (512, 7), (2048, 7)]     # (channels, height = width)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--callgrind", type=int, default=0)
    args = ap.parse_args()
    block = np.empty(1 << 27, np.uint8)
    made = [0]

    def ndarray(shape, dtype):
        made[0] += 1
        return np.ndarray(shape, dtype, buffer=block)
    BN.cupy = types.SimpleNamespace(ndarray=ndarray)
    TL.launch = lambda kernel, grid, *a: None
    TL.compile_kernel = lambda fn, sig, const, **kw: fn
    TL.multiprocessors = lambda: 132
    TL.current_device = lambda: 0
    TL.current_stream = lambda: 0
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cases = []
    for C, H in SHAPES:
        x = np.empty((64, C, H, H), bf16)
        cases.append((x,) + tuple(np.empty(C, np.float32) for _ in range(6)))

    def forward():
        for x, w, b, rm, rv, _, _ in cases:
            BN.forward(x, w, b, rm, rv, 0.1, 1e-5)

    def backward():
        for x, w, b, _, _, mean, rstd in cases:
            BN.backward(x, x, w, b, mean, rstd)
    forward(), backward()
    if args.callgrind:
        def ctl(what):
            subprocess.run(["callgrind_control", "-i", what, str(os.getpid())], capture_output=True)
        ctl("on")
        for _ in range(args.callgrind):
            forward(), backward()
        ctl("off")
        return
    for fn in (forward, backward):
        made[0] = 0
        fn()
        arrays = made[0] / len(cases)
        t = timeit.Timer(fn, timer=time.process_time)
        us = sorted(t.repeat(number=args.number, repeat=args.repeats))[args.repeats // 2] / args.number / len(cases)
        print(json.dumps({"bench": "batch_norm_" + fn.__name__, "us_per_call": round(us * 1e6, 3),
                          "arrays_per_call": arrays}))


if __name__ == "__main__":
    main()
