"""Host cost of a compiled graph's calls that run outside generated kernels, measured on CPU.

One JSON object per line:
- `extern`: make_extern's call for each extern of a small compiled conv training step (conv/BN/ReLU,
  strided 1x1 conv with bias), the op's kernel replaced by a stub returning a preallocated array, so
  what is timed is building the kernel's arguments from the wrapper's arrays (`us_per_call`, median
  of `--repeats` timeit runs);
- `launcher`: one `triton_runtime.Launcher` call of a static graph's kernel (3 buffers) on "cuda",
  with the kernel build and cuLaunchKernel replaced by no-ops: the Python of a launch.

Compare two checkouts by running this same script against each (the box's load moves the times;
alternate the runs):

    PYTHONPATH=/path/to/tree python3 bench/compiled_host_calls.py
"""
from __future__ import annotations

import argparse
import json
import timeit
import types

import numpy as np

import flambeau as fl
from flambeau import _dtype as D
from flambeau._backends import triton_launch as TL
from flambeau._device import device
from flambeau._inductor import triton_runtime as rt, wrapper
from flambeau._inductor.codegen_triton import Launch
from flambeau._inductor.ir import InputBuffer, Layout


def _median(fn, number, repeats) -> float:
    return sorted(timeit.repeat(fn, number=number, repeat=repeats))[repeats // 2] / number * 1e6


def externs(repeats: int):
    eks, real = [], wrapper.make_extern

    def spy(ek, xp=np):
        eks.append(ek)
        return real(ek, xp)
    wrapper.make_extern = spy
    nn = fl.nn
    m = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 16, 1, stride=2))

    def step(x):
        loss = m(x).sum()
        loss.backward()
        return loss
    try:
        fl.compile(step)(fl.randn(2, 8, 10, 10, requires_grad=True))
    finally:
        wrapper.make_extern = real
    out = np.zeros((2, 8, 10, 10), np.float32)
    contiguous = type("Contiguous", (), {"is_contiguous": lambda self: True})()
    for ek in eks:
        name = getattr(ek.op, "name", str(ek.op))
        stub = types.SimpleNamespace(op=types.SimpleNamespace(name=name + "_stub", kernel=lambda xp, *a, **k: out),
                                     args=ek.args, kwargs=ek.kwargs, inputs=ek.inputs, outputs=getattr(ek, "outputs", []),
                                     n_outputs=getattr(ek, "n_outputs", 0),
                                     layout=None if ek.layout is None else contiguous)
        fn, bases, _ = real(stub, np)
        arrays = [np.zeros((2, 8, 10, 10), np.float32) for _ in bases]
        print(json.dumps({"bench": "extern", "op": name, "us_per_call": round(_median(lambda: fn(*arrays), 2000, repeats), 3)}))


def launcher(repeats: int):
    class Arr:
        def __init__(self, ptr):
            self.data = types.SimpleNamespace(ptr=ptr)
    fn = types.SimpleNamespace(src="def k(): pass", __name__="k")
    bufs = [InputBuffer(n, Layout((10,), D.float32)) for n in "abc"]
    saved = TL._driver[:], rt.Launcher._kernel
    TL._driver[:] = [lambda *a: None, lambda: 0]
    rt.Launcher._kernel = lambda self, la, f, aligned: TL.kernel_of(
        types.SimpleNamespace(ptr=1), None, tuple(t for t in la.signature().values() if t != "constexpr"), 4, 0, 0)
    try:
        L = rt.Launcher(types.SimpleNamespace(k1=fn), Launch("k1", bufs, [], 100000, 1024), device("cuda"))
        call = L.entry() if hasattr(L, "entry") else L          # what the generated wrapper calls
        args = [Arr(0x1000 * (i + 1)) for i in range(3)]
        call(*args)
        print(json.dumps({"bench": "launcher", "us_per_call": round(_median(lambda: call(*args), 20000, repeats), 3)}))
    finally:
        TL._driver[:], rt.Launcher._kernel = saved


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    externs(a.repeats)
    launcher(a.repeats)
