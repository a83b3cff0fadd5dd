"""Host cost of an eager training step of the GPU benches' models (bench/gpu_models.py; forward + backward under
bf16 autocast, gradients dropped, no optimizer step) on CPU, on the fake
cuda device of `bench/eager_host_calls.py`: NumPy arrays stand in for CuPy's (NumPy's functions return fake
device arrays), kernel launches and cuBLASLt are no-ops, Triton compiles stubbed, so what is timed is
flambeau's Python around the kernels, as `python3 bench/cuda_host_profile.py steps mlp|gpt` profiles it on
the GPU machine. NumPy's reductions stand in for CuPy's (~40 us of host each there): a path using them looks
cheaper here than it is there. Models (`--model`):

    mlp   4 x Linear(256, 256), B64, cross-entropy (the bench's `mlp`)
    gpt   GPT-2's layout as the bench runs it (12 blocks of 12 heads, tied embeddings, causal SDPA through the
          cuDNN path with its two frontend calls no-ops) at a small width (d 96, vocab 512, B2 x T64): about the
          ops and graph of GPT-2 124M's step (302 op calls and 370 backward nodes a step here, 278 and 349 on the
          GPU: the fake attention's q, k, v gradients are not one buffer, so the split's backward concatenates
          them), with far less NumPy work behind the fake device's arrays

Prints the median and the runs (us per step); --profile adds cProfile's top functions. Compare trees by running
it with PYTHONPATH set to each, alternating (the box's load moves the times):

    PYTHONPATH=/path/to/tree python3 bench/mlp_fake_step.py [--model gpt] [--profile]
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


class _RawModule:
    """CuPy's RawModule whose kernels launch nothing (the embedding's backward)."""

    def __init__(self, *args, **kwargs):
        pass

    def get_function(self, name):
        return lambda *args, **kwargs: None


def _fake_cudnn_attention():
    """cuDNN's attention as available, its forward and backward returning empty arrays of their outputs'
    shapes (the frontend's execute calls skipped); returns the function putting the modules back."""
    from bench import eager_host_calls as E
    from flambeau._backends import cudnn_attention as C
    from flambeau._ops import attention_fused as F
    saved = C.available, C.supports, C.forward, C.backward, F._cuda_only

    def forward(q, k, v, dropout_p, rng, is_causal, scale):
        return E.DevArray(q.shape, q.dtype), E.DevArray(q.shape[:3], np.float32)

    def backward(grad_out, q, k, v, out, stats, dropout_p, rng, is_causal, scale, joint=False):
        return tuple(E.DevArray(a.shape, a.dtype) for a in (q, k, v))
    C.available, C.supports, C.forward, C.backward = (lambda: True), (lambda *a: True), forward, backward
    F._cuda_only = lambda *a: None          # (the fake device's arrays are NumPy's)

    def undo():
        C.available, C.supports, C.forward, C.backward, F._cuda_only = saved
    return undo


def install():
    """The fake device as far as the models' steps need it; returns the function putting back what it can (the
    multiprocessor count and the fake namespace's RawModule stay: this runs in a bench's own process)."""
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
    TL._sm_counts[0] = 132
    xp.RawModule = _RawModule
    gemm_restore = E.fake_cublaslt()
    sys.modules["cupy"] = xp
    from flambeau._backends import triton_cross_entropy as X
    X.cupy = xp

    attention_restore = _fake_cudnn_attention()
    from flambeau import cuda
    cuda_available, cuda.is_available = cuda.is_available, lambda: True    # else autocast turns itself off

    def undo():
        cuda.is_available = cuda_available
        attention_restore()
        gemm_restore()
        restore()
    return undo


def main():
    import flambeau as fl
    from bench import eager_host_calls as E, gpu_models
    from flambeau._device import canonical
    from flambeau._tensor import Tensor
    name = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "mlp"
    undo = install()
    rng = np.random.default_rng(0)
    if name == "gpt":
        model = gpu_models.gpt(fl, vocab=512, block=64, d=96, layers=12, heads=12)
        xs, ys = rng.integers(0, 512, (2, 64)), rng.integers(0, 512, (2, 64))
    else:
        model = gpu_models.mlp(fl)
        xs, ys = rng.standard_normal((64, 256)).astype(np.float32), rng.integers(0, 256, 64)
    for p in model.parameters():
        p._data, p._device = p._data.view(E.DevArray), canonical("cuda")
    x, y = (Tensor._make(a.view(E.DevArray), canonical("cuda")) for a in (xs, ys))

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
        print(json.dumps({"bench": "mlp_fake_step", "model": name, "tree": tree,
                          "us_per_step": round(statistics.median(runs), 1), "runs": [round(r) for r in runs]}),
              flush=True)
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
