"""Host cost of a compiled graph's calls that run outside generated kernels, measured on CPU.

One JSON object per line:
- `extern`: make_extern's call for each extern of a small compiled conv training step (conv/BN/ReLU,
  strided 1x1 conv with bias), the op's kernel replaced by a stub returning a preallocated array, so
  what is timed is building the kernel's arguments from the wrapper's arrays (`us_per_call`, median
  of `--repeats` timeit runs);
- `launcher`: one `triton_runtime.Launcher` call of a static graph's kernel (3 buffers) on "cuda",
  with the kernel build and cuLaunchKernel replaced by no-ops: the Python of a launch;
- `graph`: one call of a whole compiled graph on "cuda" (`compile_fx`: LayerNorm, GELU, softmax, two
  reductions; its Triton kernels generated for cuda, 3 launches), on a fake CuPy whose arrays are NumPy
  arrays with CuPy's `.data` (a memory pointer with `.ptr`, `+ offset`, `.mem`), the kernel build and
  cuLaunchKernel no-ops: the wrapper's Python (allocations, views, launches, output tensors). NumPy's
  allocation is cheaper than CuPy's pool, so an allocation saved counts for less here than on the GPU.

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
    fn = types.SimpleNamespace(src="def k(): pass", __name__="k", name="k", key="k")
    bufs = [InputBuffer(n, Layout((10,), D.float32)) for n in "abc"]
    saved = TL._driver[:], rt.Launcher._kernel
    TL._driver[:] = [lambda *a: None, lambda: 0]
    rt.Launcher._kernel = lambda self, la, f, aligned: TL.kernel_of(
        types.SimpleNamespace(ptr=1), None, tuple(t for t in la.signature().values() if t != "constexpr"), 4, 0, 0)
    try:
        L = rt.Launcher(types.SimpleNamespace(k1=fn, kernel=lambda name: fn), Launch("k1", bufs, [], 100000, 1024), device("cuda"))
        call = L.entry() if hasattr(L, "entry") else L          # what the generated wrapper calls
        args = [Arr(0x1000 * (i + 1)) for i in range(3)]
        call(*args)
        print(json.dumps({"bench": "launcher", "us_per_call": round(_median(lambda: call(*args), 20000, repeats), 3)}))
    finally:
        TL._driver[:], rt.Launcher._kernel = saved


class _FakePointer:
    """A CuPy MemoryPointer on a NumPy array: `.ptr`, `.mem` (the owner), `+ bytes`."""
    __slots__ = ("owner", "offset", "ptr", "mem")

    def __init__(self, owner, offset: int, base: int):
        self.owner, self.offset, self.mem, self.ptr = owner, offset, owner, base + offset

    def __add__(self, n: int):
        return _FakePointer(self.owner, self.offset + n, self.ptr - self.offset)


class _DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data`: an allocation's pointer made once, a view's the pointer it
    was made on (as CuPy keeps it)."""
    __cuda_array_interface__: dict = {}

    @property
    def data(self):
        p = self.__dict__.get("_p")
        if p is None:
            p = self.__dict__["_p"] = _FakePointer(self, 0, self.__array_interface__["data"][0])
        return p


def _fake_cupy():
    def empty(shape, dtype=np.float32):
        return np.empty(shape, dtype).view(_DevArray)

    def ndarray(shape, dtype, memptr):
        a = np.ndarray(shape, dtype, memptr.owner, memptr.offset).view(_DevArray)
        a.__dict__["_p"] = memptr
        return a

    class Device:
        compute_capability = "90"

        def __init__(self, i=0):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return None
    xp = types.SimpleNamespace(empty=empty, ndarray=ndarray, copyto=np.copyto, int32=np.int32, uint8=np.uint8,
                               zeros=lambda shape, dtype=np.float32: np.zeros(shape, dtype).view(_DevArray))
    xp.cuda = types.SimpleNamespace(Device=Device, get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    return xp


def graph(repeats: int):
    from flambeau import _backends
    from flambeau._decomp import DecompositionMode
    from flambeau._inductor import compile_fx, config
    from flambeau._tensor import Tensor
    from flambeau.fx.experimental.proxy_tensor import make_fx
    F = fl.nn.functional

    def fn(x, w, b):
        with DecompositionMode():
            h = F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) * w + b
            h = (h.softmax(-1) * x).tanh()
            return h.sum(-1), h.amax(0) + 1
    saved = (_backends._backends.get("cuda"), TL._driver[:], TL.available, rt.Launcher._kernel, config.backend,
             config.compile_threads)
    _backends._backends["cuda"] = _backends.Backend("cuda", _fake_cupy())
    TL._driver[:] = [lambda *a: None, lambda: 0]
    TL.available = lambda: True
    rt.Launcher._kernel = lambda self, la, f, aligned: TL.kernel_of(
        types.SimpleNamespace(ptr=1), None, tuple(t for t in la.signature().values() if t != "constexpr"), 4, 0, 0)
    config.backend, config.compile_threads = "triton", 1
    try:
        cuda = device("cuda")
        rng = np.random.default_rng(0)
        args = [Tensor._make(rng.standard_normal(s).astype(np.float32).view(_DevArray), cuda)
                for s in ((64, 128), (128,), (128,))]
        c = compile_fx(make_fx(fn, tracing_mode="fake")(*args), args)
        assert c.artifact is not None and c.artifact.backend == "triton", c.eager_reason
        c(*args)
        print(json.dumps({"bench": "graph", "kernels": c.kernel_count,
                          "us_per_call": round(_median(lambda: c(*args), 2000, repeats), 3)}))
    finally:
        if saved[0] is None:
            _backends._backends.pop("cuda", None)
        else:
            _backends._backends["cuda"] = saved[0]
        TL._driver[:], TL.available, rt.Launcher._kernel = saved[1], saved[2], saved[3]
        config.backend, config.compile_threads = saved[4], saved[5]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    externs(a.repeats)
    launcher(a.repeats)
    graph(a.repeats)
