"""Host cost of the MLP bench's eager training step (bench/gpu_models.py `mlp`: 4 x Linear(256, 256), B64,
bf16 autocast, cross-entropy; forward + backward, gradients dropped, no optimizer step) on CPU, on the fake
cuda device of `bench/eager_host_calls.py`: NumPy arrays stand in for CuPy's (NumPy's functions return fake
device arrays), kernel launches and cuBLASLt are no-ops, Triton compiles stubbed, so what is timed is
flambeau's Python around the kernels, as `python3 bench/cuda_host_profile.py steps mlp` profiles it on the GPU
machine. NumPy's reductions stand in for CuPy's (~40 us of host each there): a path using them looks cheaper
here than it is there. Prints the median and the runs (us per step); --profile adds cProfile's top functions.
Compare trees by running it with PYTHONPATH set to each, alternating (the box's load moves the times):

    PYTHONPATH=/path/to/tree python3 bench/mlp_fake_step.py [--profile]
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import types

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # (PYTHONPATH's tree first)

import numpy as np  # noqa: E402


class _Device(contextlib.nullcontext):
    id = 0

    def __init__(self, dev=0):
        super().__init__()


def install():
    """The fake device as far as the MLP step needs it; returns the function putting back what it can."""
    from bench import eager_host_calls as E
    from flambeau._backends import device_checks, triton_launch as TL
    xp, restore = E.install()
    xp.__getattr__ = lambda name: E.on_device(getattr(np, name))
    xp.cuda.Device = _Device
    xp.uint8 = np.uint8
    E.DevArray.device = property(lambda self: types.SimpleNamespace(id=0))      # (check_range reads it)
    TL._available[:] = [True]
    fn = types.SimpleNamespace(ptr=1)

    def compile_kernel(f, sig, const, num_warps=4, num_stages=3, aligned=()):
        return TL.kernel_of(fn, None, tuple(sig[n] for n in f.arg_names if sig[n] != "constexpr"), num_warps, 0, 0)
    TL.compile_kernel = compile_kernel
    device_checks._module[:] = [lambda *a: None]
    gemm_restore = E.fake_cublaslt()
    sys.modules["cupy"] = xp
    from flambeau._backends import triton_cross_entropy as X
    X.cupy = xp

    def undo():
        gemm_restore()
        restore()
    return undo


def main():
    import flambeau as fl
    from bench import eager_host_calls as E, gpu_models
    from flambeau._device import canonical
    from flambeau._tensor import Tensor
    undo = install()
    model = gpu_models.mlp(fl)
    for p in model.parameters():
        p._data, p._device = p._data.view(E.DevArray), canonical("cuda")
    rng = np.random.default_rng(0)
    x = Tensor._make(rng.standard_normal((64, 256)).astype(np.float32).view(E.DevArray), canonical("cuda"))
    y = Tensor._make(rng.integers(0, 256, 64).view(E.DevArray), canonical("cuda"))

    def step():
        with fl.autocast(device_type="cuda", dtype=fl.bfloat16):
            loss = model(x, y)
        loss.backward()
        for p in model.parameters():
            p.grad = None
    try:
        for _ in range(3):
            step()
        runs = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(30):
                step()
            runs.append((time.perf_counter() - t0) / 30 * 1e6)
        tree = os.path.dirname(os.path.dirname(os.path.abspath(fl.__file__)))
        print(json.dumps({"bench": "mlp_fake_step", "tree": tree, "us_per_step": round(statistics.median(runs), 1),
                          "runs": [round(r) for r in runs]}), flush=True)
        if "--profile" in sys.argv:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(50):
                step()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    finally:
        undo()


if __name__ == "__main__":
    main()
