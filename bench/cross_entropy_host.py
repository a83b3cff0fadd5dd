"""Host time of the fused cuda cross-entropy (`_backends/triton_cross_entropy.py`, issue 11: the MLP step's
mean loss), us per call, median over --repeats runs of --number calls (the device synchronised before and
after each run, not inside it).

On the GPU machine (default): flambeau's `F.cross_entropy(x, t)` forward alone and forward + backward
(`loss.backward()`, the input's gradient cleared each call) beside PyTorch's, for each --reduction, at the
MLP bench's shape (64 x 256 float32) and --shape. With --fake (no GPU): the kernel wrappers alone
(`forward`/`backward` of the module) with a stand-in CuPy (arrays are metadata) and a driver call that does
nothing, so what is timed is their Python: argument checks, allocations' bookkeeping, kernel lookups and
the parameter-block writes of `triton_launch.launch`. With --fake-device (no GPU): flambeau's whole
`F.cross_entropy` forward + backward on the fake cuda device of `bench/eager_host_calls.py` (NumPy arrays
standing in for CuPy's, kernel launches no-ops, Triton compiles stubbed): run it with PYTHONPATH set to each
of two trees, alternating, to compare them (NumPy's reductions stand in for CuPy's, which cost ~40 us of
host each on the H100 machine, so a path with CuPy reductions looks cheaper here than it is there).

    python bench/cross_entropy_host.py [--shape 64,256] [--reduction mean,sum,none] [--fake | --fake-device]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import types

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # (PYTHONPATH's tree first)

import numpy as np  # noqa: E402

from bench.measure import host_us  # noqa: E402

RED = {"none": 0, "mean": 1, "sum": 2}


def gpu(shape, reductions, number, repeats):
    import cupy
    import flambeau as fl
    import torch
    sync = cupy.cuda.get_current_stream().synchronize
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    t = rng.integers(0, shape[1], shape[0])
    for red in reductions:
        row = {"bench": "cross_entropy_host", "shape": list(shape), "reduction": red}
        for name, lib, s in (("flambeau", fl, sync), ("torch", torch, torch.cuda.synchronize)):
            xl = lib.tensor(x, device="cuda", requires_grad=True)
            tl_ = lib.tensor(t, device="cuda")
            F = lib.nn.functional

            def fwd():
                return F.cross_entropy(xl, tl_, reduction=red)

            def step():
                xl.grad = None
                loss = fwd()
                (loss if red != "none" else loss.sum()).backward()
            step()
            s()
            row[f"{name}_forward"] = host_us(fwd, number, repeats, s)
            row[f"{name}_forward_backward"] = host_us(step, number, repeats, s)
        print(json.dumps(row), flush=True)


class _Mem:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class _Flags:
    c_contiguous = True


class FakeArray:
    """What the wrappers read of a CuPy array (a C-contiguous one): metadata only."""
    _next = [0x10000]
    flags = _Flags()

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim, self.itemsize = len(self.shape), self.dtype.itemsize
        self.size = int(np.prod(self.shape))
        st, acc = [], self.itemsize
        for n in reversed(self.shape):
            st.insert(0, acc)
            acc *= max(n, 1)
        self.strides = tuple(st)
        self.data = _Mem(self._next[0])
        self._next[0] += 256 * (1 + self.size * self.itemsize // 256)


def fake(shape, reductions, number, repeats):
    from flambeau._backends import device_checks, triton_cross_entropy as X, triton_launch as TL
    X.cupy = types.SimpleNamespace(ndarray=FakeArray, ascontiguousarray=lambda a: a)
    TL._driver[:] = [lambda *a: None, lambda: 0]
    TL.current_device = lambda: 0
    device_checks._buffers[0] = FakeArray((2,), np.uint64)
    fn = types.SimpleNamespace(ptr=1)

    def compile_kernel(f, sig, const, num_warps=4, num_stages=3):
        return TL.kernel_of(fn, None, tuple(sig[n] for n in f.arg_names if sig[n] != "constexpr"), num_warps, 0, 0)
    TL.compile_kernel = compile_kernel
    x, t = FakeArray(shape, np.float32), FakeArray(shape[:1], np.int64)
    for red in reductions:
        code = RED[red]
        g = FakeArray(() if code else shape[:1], np.float32)
        row = {"bench": "cross_entropy_host", "fake": True, "shape": list(shape), "reduction": red,
               "forward": host_us(lambda: X.forward(x, t, -100, code), number, repeats, lambda: None),
               "backward": host_us(lambda: X.backward(g, x, t, -100, code), number, repeats, lambda: None)}
        print(json.dumps(row), flush=True)


def fake_device(shape, reductions, number, repeats):
    import contextlib
    import flambeau as fl
    from bench import eager_host_calls as E
    from flambeau._backends import device_checks, triton_launch as TL
    from flambeau._device import canonical
    from flambeau._tensor import Tensor
    xp, restore = E.install()
    xp.cuda.Device = lambda dev: contextlib.nullcontext()
    xp.__getattr__ = lambda name: E.on_device(getattr(np, name))     # NumPy's functions making fake device arrays
    E.DevArray.device = property(lambda self: types.SimpleNamespace(id=0))        # (check_range reads it)
    sys.modules["cupy"] = xp
    TL._available[:] = [True]
    fn = types.SimpleNamespace(ptr=1)

    def compile_kernel(f, sig, const, num_warps=4, num_stages=3, aligned=()):
        return TL.kernel_of(fn, None, tuple(sig[n] for n in f.arg_names if sig[n] != "constexpr"), num_warps, 0, 0)
    TL.compile_kernel = compile_kernel
    device_checks._module[:] = [lambda *a: None]        # check_range's raw kernel (trees that launch it)
    from flambeau._backends import triton_cross_entropy as X
    X.cupy = xp
    x = E.cuda_tensor(shape, requires_grad=True)
    t = Tensor._make(np.random.default_rng(1).integers(0, shape[1], shape[0]).view(E.DevArray), canonical("cuda"))
    F = fl.nn.functional
    try:
        ones = Tensor._make(np.ones(shape[0], np.float32).view(E.DevArray), canonical("cuda"))
        for red in reductions:
            def step():
                x.grad = None
                out = F.cross_entropy(x, t, reduction=red)
                out.backward(ones if red == "none" else None)       # "none": a gradient per row
            step()
            print(json.dumps({"bench": "cross_entropy_host", "fake_device": True, "tree": os.path.dirname(
                os.path.dirname(os.path.abspath(fl.__file__))), "shape": list(shape), "reduction": red,
                "forward_backward": host_us(step, number, repeats, lambda: None)}), flush=True)
    finally:
        restore()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64,256")
    ap.add_argument("--reduction", default="mean,sum,none")
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--fake-device", action="store_true")
    a = ap.parse_args()
    shape = tuple(int(v) for v in a.shape.split(","))
    (fake if a.fake else fake_device if a.fake_device else gpu)(shape, a.reduction.split(","), a.number, a.repeats)


if __name__ == "__main__":
    main()
