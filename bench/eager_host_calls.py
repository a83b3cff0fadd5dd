"""Host cost of eager cuda op paths, measured on CPU (issue 11: GPU eager speed is host-bound).

A fake CuPy namespace (arrays are NumPy arrays with CuPy's `.data`: a pointer with `.ptr` and
`.device_id`) stands in for the cuda device, and a no-op driver for cuLaunchKernel, so what is timed
is flambeau's Python around the kernels as an eager cuda step runs it. One JSON object per line:
- `cast_forward`: autocast's cast of an activation that requires grad, float32 -> bfloat16
  (`autocast_mode._cast`: `Tensor.to`, the dispatcher, the cast kernel's launch, the graph node);
- `cast_backward`: that cast's derivative with grad mode off (the engine's call: bfloat16 -> float32);
- `autocast_inputs`: autocast's casts of linear's inputs (a bfloat16 activation, a cached weight and bias);
- `launch_values`: one Triton-convention launch of 5 runtime arguments (cuLaunchKernel a no-op);
- `launch`: `triton_launch.launch` of BatchNorm's apply kernel (4 arrays, 3 i32 sizes: the eager
  Triton kernels' path, about 400 launches a ResNet-50 step);
- `record`: `autograd.graph.record` of a binary op on two tensors that require grad;
- `gemm`: `cublaslt.gemm` of a cached layout against a fake cuBLASLt library (the ctypes call no-op).

Compare two checkouts by running this script against each, alternating (the box's load moves the
times), or count instructions with `--callgrind-iterations N` under valgrind:

    PYTHONPATH=/path/to/tree python3 bench/eager_host_calls.py [--only cast_forward]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import timeit
import types

import ml_dtypes
import numpy as np

import flambeau as fl
from flambeau import _backends, _dispatch
from flambeau._backends import cuda_cast, triton_launch as TL
from flambeau._device import canonical
from flambeau._tensor import Tensor

BF16 = np.dtype(ml_dtypes.bfloat16)


class _Pointer:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


_next_address = [1 << 20]


class DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data`: a made-up device address, 256-byte aligned as CuPy's pool's
    (no memory behind it: the fake kernels read nothing), on device 0."""
    __cuda_array_interface__: dict = {}

    @property
    def _c_contiguous(self):
        """CuPy's attribute behind `flags.c_contiguous`."""
        return self.flags.c_contiguous

    @property
    def data(self):
        p = self.__dict__.get("_p")
        if p is None:
            _next_address[0] += 1 << 16
            p = self.__dict__["_p"] = _Pointer(_next_address[0])
        return p


def on_device(f):
    """NumPy's function `f` returning its new arrays as the fake device's (`DevArray`): a fake CuPy
    namespace's `__getattr__` (bench/cross_entropy_host.py, bench/mlp_fake_step.py)."""
    if not callable(f) or isinstance(f, (type, np.ufunc)):
        return f

    def call(*args, **kwargs):
        r = f(*args, **kwargs)
        return r.view(DevArray) if type(r) is np.ndarray else r
    return call


def fake_cupy():
    """A namespace that `cuda_cast.cast` takes for CuPy, with every cast kernel pre-made."""
    xp = types.ModuleType("cupy")
    xp.ndarray = DevArray
    xp.empty = lambda shape, dtype=np.float32: DevArray(shape, dtype)
    xp.__getattr__ = lambda name: getattr(np, name)   # other kernels: NumPy's (ufuncs keep DevArray)
    xp.cuda = types.SimpleNamespace(device=types.SimpleNamespace(get_device_id=lambda: 0),
                                    get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                    runtime=types.SimpleNamespace(getDevice=lambda: 0))
    return xp


def install():
    """Make "cuda" the fake device; returns a function putting back what was there."""
    xp = fake_cupy()
    saved = (_backends._backends.get("cuda"), _backends.array_namespaces.get("cuda"), TL._driver[:],
             dict(cuda_cast._functions), cuda_cast._namespace[:], cuda_cast._device_id[:])
    _backends._backends["cuda"] = _backends.Backend("cuda", xp)
    _backends.array_namespaces["cuda"] = xp
    _dispatch.device_array_types.add(DevArray)
    TL._driver[:] = [lambda *a: None, lambda: 0]
    cuda_cast._device_id[:] = []
    for s in cuda_cast.TYPES:
        for d in cuda_cast.TYPES:
            cuda_cast._functions[(s, d, 0)] = TL.raw_kernel(types.SimpleNamespace(ptr=1), ("*", "*", "i64"),
                                                            cuda_cast.THREADS)

    def restore():
        for d, v in ((_backends._backends, saved[0]), (_backends.array_namespaces, saved[1])):
            if v is None:
                d.pop("cuda", None)
            else:
                d["cuda"] = v
        TL._driver[:] = saved[2]
        cuda_cast._functions.clear()
        cuda_cast._functions.update(saved[3])
        cuda_cast._namespace[:] = saved[4]
        cuda_cast._device_id[:] = saved[5]
    return xp, restore


def cuda_tensor(shape, dtype=np.float32, requires_grad=False, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype).view(DevArray)
    t = Tensor._make(a, canonical("cuda"))
    if requires_grad:
        t.requires_grad_(True)
    return t


def benches(xp):
    from flambeau.amp import autocast_mode
    from flambeau.autograd import graph
    leaf = cuda_tensor((8, 16), requires_grad=True)
    act = leaf * 2                                      # an activation: not cached by autocast
    out = {}

    def cast_forward():
        return autocast_mode._cast(act, "cuda", fl.bfloat16)
    y = cast_forward()
    assert y.dtype is fl.bfloat16 and y.grad_fn is not None and type(y._data) is DevArray
    out["cast_forward"] = (cast_forward, 2000)

    node = y.grad_fn
    g = cuda_tensor((8, 16), BF16)

    def cast_backward():
        with fl.no_grad():
            return node.apply([g])
    r = cast_backward()
    assert r[0].dtype is fl.float32 and type(r[0]._data) is DevArray
    out["cast_backward"] = (cast_backward, 2000)

    # linear's inputs under autocast: a bfloat16 activation, a float32 weight and bias cached as bfloat16
    from flambeau._ops.linear import linear
    from flambeau import _state
    xb = cuda_tensor((8, 16), BF16)
    w, bias = cuda_tensor((4, 16), requires_grad=True), cuda_tensor((4,), requires_grad=True)

    def autocast_inputs():
        saved = _state.set_autocast({"cuda": fl.bfloat16})
        try:
            return autocast_mode.cast_inputs(linear, (xb, w, bias), {})
        finally:
            _state.set_autocast(saved)
    autocast_mode._thread.cache.clear()
    autocast_mode._thread.nesting = 1
    cargs, _ = autocast_inputs()
    assert cargs[0] is xb and cargs[1].dtype is fl.bfloat16 and cargs[1] is autocast_inputs()[0][1]
    out["autocast_inputs"] = (autocast_inputs, 5000)

    kernel = TL.raw_kernel(types.SimpleNamespace(ptr=1), ("*fp32", "*fp32", "*fp32", "i64", "i64"), 128)
    values = (0x10000, 0x20000, 0x30000, 4096, 7)
    out["launch_values"] = (lambda: TL.launch_values(kernel, (32,), values), 10000)
    apply = TL.kernel_of(types.SimpleNamespace(ptr=1), None, ("*bf16", "*bf16", "*fp32", "*fp32", "i32", "i32", "i32"),
                         8, 0, 0)
    arrays = [xp.empty((4,), np.float32) for _ in range(4)]
    out["launch"] = (lambda: TL.launch(apply, (98,), *arrays, 64, 3136, 200704), 10000)

    a, b = cuda_tensor((4,), requires_grad=True), cuda_tensor((4,), requires_grad=True, seed=1)
    prod = a * b
    op = prod.grad_fn._op

    def record():
        graph.record(op, (a, b), None, prod)
    record()
    out["record"] = (record, 5000)
    return out


def fake_cublaslt():
    """Make `cublaslt.gemm` run against a fake library (every entry point a no-op, the heuristic finding
    one algorithm) and the fake CuPy as `import cupy`; returns a function putting back what was there."""
    from flambeau._backends import cublaslt as L

    class Lib:
        def __getattr__(self, name):
            def fn(*args):
                if name.endswith("Create"):
                    args[0]._obj.value = 1
                elif name == "cublasLtMatmulAlgoGetHeuristic":
                    args[9]._obj.value = 1
                return 0
            fn.__name__ = name
            setattr(self, name, fn)
            return fn
    xp = fake_cupy()
    xp.uint8 = np.uint8
    real = sys.modules.get("cupy")
    sys.modules["cupy"] = xp
    saved = dict(L._lib_state)
    L._lib_state.update(lib=Lib(), tried=True)

    def restore():
        L._lib_state.clear()
        L._lib_state.update(saved)
        if real is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = real
    return restore


def gemm_bench():
    """`cublaslt.gemm` of one layout, seen before, against the fake library."""
    from flambeau._backends import cublaslt as L
    restore = fake_cublaslt()
    x = DevArray((64, 96), BF16)
    w = DevArray((80, 96), BF16)

    def call():
        return L.gemm(x, w.T)
    call()
    return call, restore


def _median(fn, number, repeats) -> float:
    return sorted(timeit.repeat(fn, number=number, repeat=repeats))[repeats // 2] / number * 1e6


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--only", default=None, help="one bench by name")
    ap.add_argument("--callgrind-iterations", type=int, default=0,
                    help="run the bench this many times and nothing else (under valgrind --tool=callgrind)")
    a = ap.parse_args()
    xp, restore = install()
    try:
        table = benches(xp)
        gemm_call, gemm_restore = gemm_bench()
        table["gemm"] = (gemm_call, 5000)
        for name, (fn, number) in table.items():
            if a.only and name != a.only:
                continue
            if a.callgrind_iterations:
                gc.disable()                    # its collections would land on some calls, not others
                for _ in range(a.callgrind_iterations):
                    fn()
                gc.enable()
                continue
            print(json.dumps({"bench": name, "us_per_call": round(_median(fn, number, a.repeats), 3)}))
        gemm_restore()
    finally:
        restore()
