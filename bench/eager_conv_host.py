"""Host cost of an eager cuda convolution's Python, measured on CPU (issue 11, eager GPU speed).

The eager ResNet-50 training step on an H100 is host-bound; this times the Python of its convolution
calls with cuDNN and CuPy faked: CuPy arrays are NumPy arrays with CuPy's `.data.ptr`/`.device_id`, the
cuDNN library is Python functions that succeed (counted), a graph plan is made without cuDNN (its
`execute` is the real one, over the fake library). One JSON object per line, `us_per_call` the median
of `--repeats` timeit runs (CPU time of the process) over ResNet-50's convolution geometries (B 64, bf16, NCHW):

- `memory_format`: `conv_memory_format(input, weight, on_cuda=True)` on arrays and on Tensors;
- `cudnn_forward`, `cudnn_backward_data`, `cudnn_backward_filter`: one call of cudnn.forward / backward_data
  / backward_filter (plan already made), `lib_calls` the fake library's calls per call;
- `conv_kernel`, `weight_grad_kernel`: the eager kernels of `convolution` and `_convolution_weight_grad`
  (`_ops/nn_conv.py`) on the fake cuda arrays, cuDNN path;
- `conv_derivative`: the convolution's derivative (input and weight gradients: two convolution calls) in
  a backward without create_graph on the fake cuda tensors, `direct` as it runs (`direct_device`: the
  kernels on the arrays, where the tree has it) and `dispatched` with `direct_device` answering None.

Compare two checkouts by running this same script against each, alternating (the box is loaded), or
count instructions (`--callgrind N`: each row's instructions a call over N rounds):

    PYTHONPATH=/path/to/tree python3 bench/eager_conv_host.py
    CALLGRIND_OUT=/tmp/cg.out PYTHONPATH=/path/to/tree valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file=/tmp/cg.out python3.11 bench/eager_conv_host.py --callgrind 30
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
import timeit
import types

import ml_dtypes
import numpy as np

import flambeau as fl
from flambeau import _backends
from flambeau._backends import cudnn
from flambeau._ops import memory_format, nn_conv

BF16 = np.dtype(ml_dtypes.bfloat16)
# ResNet-50's distinct convolutions: (cin, cout, k, stride, input size), as bench/gpu_models.resnet50
GEOMETRIES = [(3, 64, 7, 2, 224), (64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56),
              (256, 128, 1, 1, 56), (128, 128, 3, 2, 56), (128, 512, 1, 1, 28), (256, 512, 1, 2, 56),
              (512, 256, 1, 1, 28), (256, 256, 3, 2, 28), (256, 1024, 1, 1, 14), (1024, 512, 1, 1, 14),
              (512, 512, 3, 1, 7)]


class DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data.ptr` / `.data.device_id`; constructed as CuPy's `ndarray(shape,
    dtype)`, a new array over the kept block (see `_empty`)."""

    def __new__(cls, shape, dtype=np.float32, memptr=None, strides=None):
        return np.ndarray(shape, dtype, buffer=_BLOCK, strides=strides).view(cls)

    @property
    def _c_contiguous(self):   # CuPy's attribute behind `flags.c_contiguous`
        return self.flags.c_contiguous

    @property
    def data(self):            # read once per array (CuPy's `.data` is a C attribute: cheap)
        d = self.__dict__.get("_data")
        if d is None:
            d = self.__dict__["_data"] = types.SimpleNamespace(ptr=self.ctypes.data, device_id=0)
        return d


_BLOCK = np.empty(1 << 27, np.uint8)     # what a new array of the fake CuPy takes: as CuPy's pool in a
                                         # training loop, the same block call after call


def _empty(shape, dtype=np.float32):
    return np.ndarray(shape, dtype, buffer=_BLOCK).view(DevArray)


def _input(shape, dtype):
    return np.empty(shape, dtype).view(DevArray)


class FakeLib:
    """cuDNN's entry points as Python functions that succeed; `calls` counts them."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        if not name.startswith("cudnn"):
            raise AttributeError(name)

        def fn(*args):
            self.calls += 1
            return 0
        fn.__name__ = name
        setattr(self, name, fn)
        return fn


def _fake_plan_init(self, x_shape, w_shape, y_shape, st, pad, dil, dtype, kind, h, ptrs=None, channels_last=False):
    self.lib, self.kind, self.descs = cudnn._state["lib"], kind, []
    self.scalar = "f"
    self.uids = (ctypes.c_int64 * 3)(1, 2, 3)
    self.plan, self.ws = ctypes.c_void_p(1), 1 << 20


def install_fakes():
    """Fake CuPy and cuDNN in place (for the rest of the process)."""
    xp = types.ModuleType("cupy")
    xp.ndarray, xp.empty, xp.float32, xp.uint8 = DevArray, _empty, np.float32, np.uint8
    xp.ascontiguousarray = lambda a: a if a.flags.c_contiguous else np.ascontiguousarray(a).view(DevArray)
    xp.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                    device=types.SimpleNamespace(get_device_id=lambda: 0),
                                    runtime=types.SimpleNamespace(getDevice=lambda: 0), alloc=lambda nbytes: None)
    xp.lib = np.lib
    sys.modules["cupy"] = xp
    _backends._cupy_namespace[0] = xp
    lib = FakeLib()
    cudnn._state.update(lib=lib, tried=True)
    cudnn._GraphPlan.__init__ = _fake_plan_init
    cudnn._GraphPlan.__del__ = lambda self: None
    cudnn.cudnn_version = 90000
    return xp, lib


def _instructions(fn, rounds) -> int:
    """Instructions callgrind counts for `rounds` calls of fn: the count with them less the count without
    (the callgrind_control calls' own share); each count zeroed, switched on, switched off and dumped
    (the newest file of `--callgrind-out-file`, named by CALLGRIND_OUT)."""
    import glob
    import os
    import subprocess
    pid = str(os.getpid())
    base = os.environ["CALLGRIND_OUT"]

    def ctl(*what):
        subprocess.run(["callgrind_control", *what, pid], capture_output=True)

    def count(n):
        ctl("-z")
        ctl("-i", "on")
        for _ in range(n):
            fn()
        ctl("-i", "off")
        ctl("-d")
        dumps = [f for f in glob.glob(base + ".*") if f.rsplit(".", 1)[1].isdigit()]
        with open(max(dumps, key=lambda f: int(f.rsplit(".", 1)[1]))) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1])
        raise RuntimeError("no totals in the callgrind dump")
    return count(rounds) - count(0)


def _median(fn, number, repeats) -> float:
    """Median us per call of CPU time of this process (on a loaded box wall time counts other processes)."""
    t = timeit.Timer(fn, timer=time.process_time)
    return sorted(t.repeat(number=number, repeat=repeats))[repeats // 2] / number * 1e6


def _cases(dtype=BF16, n=64):
    out = []
    for cin, cout, k, s, size in GEOMETRIES:
        x = _input((n, cin, size, size), dtype)
        w = _input((cout, cin, k, k), dtype)
        st, pad, dil = (s, s), (k // 2, k // 2), (1, 1)
        osz = (size + 2 * (k // 2) - k) // s + 1
        gy = _input((n, cout, osz, osz), dtype)
        out.append((x, w, gy, st, pad, dil))
    return out


def _derivative_rows(cases):
    """The derivative on the fake cuda tensors of `cases` (see `main`), as it runs and dispatched."""
    from flambeau import _dispatch
    from flambeau._ops import _helpers
    dev = fl.device("cuda")
    _backends.array_namespaces["cuda"] = sys.modules["cupy"]
    _dispatch.device_array_types.add(DevArray)
    deriv = nn_conv.convolution.derivative
    tensors = [tuple(fl.Tensor._make(a, dev) for a in (gy, x, w)) + (st, pad, dil) for x, w, gy, st, pad, dil in cases]

    def call():
        with fl.no_grad():
            for g, x, w, st, pad, dil in tensors:
                deriv(g, x, w, None, st, pad, dil, False, 1, (True, True, False))
    mod = nn_conv if hasattr(nn_conv, "direct_device") else _helpers

    def dispatched():
        real = getattr(mod, "direct_device", None)
        mod.direct_device = lambda *ts: None
        try:
            call()
        finally:
            mod.direct_device = real
    return [("conv_derivative", "direct", call), ("conv_derivative", "dispatched", dispatched)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--callgrind", type=int, default=0, help="N: under `valgrind --tool=callgrind "
                    "--instr-atstart=no --callgrind-out-file=$CALLGRIND_OUT`, each row's instructions a call over "
                    "N rounds (callgrind_control)")
    args = ap.parse_args()
    xp, lib = install_fakes()
    cases = _cases()
    R, N = args.repeats, args.number
    rows = []

    def each(fn):
        return lambda: [fn(*c) for c in cases]

    dev = fl.device("cuda")
    tensors = [(fl.Tensor._make(x, dev), fl.Tensor._make(w, dev)) for x, w, *_ in cases]
    rows.append(("memory_format", "arrays", each(lambda x, w, *r: memory_format.conv_memory_format(x, w, True))))
    rows.append(("memory_format", "tensors",
                 lambda: [memory_format.conv_memory_format(x, w, True) for x, w in tensors]))
    rows.append(("cudnn_forward", "", each(lambda x, w, gy, st, pad, dil: cudnn.forward(x, w, None, st, pad, dil, 1))))
    rows.append(("cudnn_backward_data", "", each(
        lambda x, w, gy, st, pad, dil: cudnn.backward_data(gy, w, st, pad, dil, 1, x.shape[2:]))))
    rows.append(("cudnn_backward_filter", "", each(
        lambda x, w, gy, st, pad, dil: cudnn.backward_filter(x, gy, w.shape, st, pad, dil, 1))))
    conv, wgrad = nn_conv.convolution.kernel, nn_conv._convolution_weight_grad.kernel
    rows.append(("conv_kernel", "forward", each(
        lambda x, w, gy, st, pad, dil: conv(xp, x, w, None, st, pad, dil, False, (0, 0), 1))))
    rows.append(("conv_kernel", "transposed", each(
        lambda x, w, gy, st, pad, dil: conv(xp, gy, w, None, st, pad, dil, True,
                                            nn_conv._adjoint_output_padding(x.shape[2:], gy.shape[2:], w.shape[2:],
                                                                            st, pad, dil), 1))))
    rows.append(("weight_grad_kernel", "", each(
        lambda x, w, gy, st, pad, dil: wgrad(xp, x, gy, w.shape, st, pad, dil, 1))))
    rows += _derivative_rows(cases)
    if args.callgrind:
        for bench, variant, fn in rows:
            fn()
            print(json.dumps({"bench": bench, "variant": variant,
                              "instructions_per_call": _instructions(fn, args.callgrind) // (args.callgrind * len(cases))}))
        return
    for bench, variant, fn in rows:
        fn()                                         # plans, caches
        before = lib.calls
        fn()
        per = (lib.calls - before) / len(cases)
        us = _median(fn, max(1, N // len(cases)), R) / len(cases)
        print(json.dumps({"bench": bench, "variant": variant, "us_per_call": round(us, 3), "lib_calls": per}))


if __name__ == "__main__":
    main()
