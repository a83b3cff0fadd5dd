"""Compiled NumPy code under `with flambeau.device(<device>)`: run by tests/test_compile_numpy_device.py in a
fresh process, as `python compile_numpy_device.py npu OUT.json` (a third-party device renamed "npu", backed by
a NumPy namespace that counts its calls and keeps its own copies of the data, so nothing reaches the caller's
arrays unless it is copied back) or `... cuda OUT.json` (the GPU). Writes one JSON object of what it
observed: each program's results (arrays as dtype/shape/values), the devices of every value the graph computed
at run time (an fx Interpreter backend), compile counts, the namespace's call counts, the copies back into the
caller's arrays."""
import collections
import json
import os
import sys

import numpy as np

import flambeau
from flambeau._counters import counters
from flambeau._numpy import _wrappers
from flambeau._dynamo.backends.registry import lookup_backend
from flambeau.fx.interpreter import Interpreter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from privateuse1_backend import CountingNumpy  # noqa: E402  NumPy with its calls counted (this folder)


# ---- the NumPy programs (module-level: NumPy is read as the global `np`) -------------------------------------
def mlp_step(x, w1, w2):
    h = np.maximum(x @ w1, 0.0)
    out = h @ w2
    return np.exp(out - out.max(axis=1, keepdims=True)).sum(axis=-1), out.T


def creation(a):
    z = np.zeros((2, 3)) + np.ones(3) * np.arange(3) + np.eye(2, 3) + np.full((2, 3), 7)
    return z + a, np.linspace(0.0, 1.0, 5), np.zeros_like(a) + 1, np.array([1.0, 2.0, 3.0]) * a


def inplace(a, b):
    a += 1.0
    a *= b
    np.add(a, b, out=a)
    a[0] = 5.0
    a[1:, ::2] *= -2.0          # through a view
    return b.sum()


def view_write(a):
    v = a[1:, ::2]
    np.multiply(v, -2.0, out=v)          # the array itself is not named: the write goes through the view
    return np.sum(a)


def mutate_then_break(a):
    a += 1.0
    flambeau._dynamo.graph_break()
    return a * 2.0


def transposed(a):
    return np.cumsum(a, axis=1), a @ a.T


def calls_only(x, w):
    """NumPy functions and methods, no operators: what torch.compile (2.13) traces under a device context."""
    h = np.maximum(np.matmul(x, w), 0.0)
    return (np.sum(np.exp(np.subtract(h, np.max(h, axis=1, keepdims=True))), axis=-1), np.zeros_like(x),
            np.arange(3.0), x.sum(axis=0))


class DeviceRecorder:
    """A backend recording the devices of each graph's example inputs, then compiling it with `backend`; the
    "recorder" backend runs the graph node by node instead, recording the device of every tensor computed."""

    def __init__(self, backend: str):
        self.backend = backend
        self.example_devices = []
        self.run_devices = set()

    def __call__(self, gm, example_inputs):
        self.example_devices.append(sorted({t.device.type for t in example_inputs}))
        if self.backend != "recorder":
            return lookup_backend(self.backend)(gm, example_inputs)
        recorder = self

        class Recording(Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                for v in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(v, flambeau.Tensor):
                        recorder.run_devices.add(v.device.type)
                return out
        return lambda *args: Recording(gm).run(*args)


def encode(x):
    if isinstance(x, np.ndarray):
        return {"ndarray": True, "dtype": str(x.dtype), "shape": list(x.shape), "values": x.tolist()}
    if isinstance(x, (tuple, list)):
        return [encode(e) for e in x]
    return {"other": type(x).__name__, "repr": repr(x)}


def rng_inputs():
    rng = np.random.default_rng(0)
    return {
        "mlp_step": (rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32),
                     rng.standard_normal((6, 3)).astype(np.float32)),
        "creation": (rng.standard_normal((2, 3)),),
        "inplace": (rng.standard_normal((3, 4)), rng.standard_normal((3, 4))),
        "mutate_then_break": (rng.standard_normal((2, 3)),),
        "view_write": (rng.standard_normal((3, 4)),),
        "transposed": (np.asarray(rng.standard_normal((4, 3)), dtype=np.float32).T,),
        "calls_only": (rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)),
    }


PROGRAMS = {"mlp_step": mlp_step, "creation": creation, "inplace": inplace,
            "mutate_then_break": mutate_then_break, "transposed": transposed, "calls_only": calls_only,
            "view_write": view_write}


WRITE_BACKS = collections.Counter()
_write_back = _wrappers.write_back


def counting_write_back(a, t):
    WRITE_BACKS["calls"] += 1
    _write_back(a, t)


def run_program(name, device, backend):
    fn = PROGRAMS[name]
    flambeau._dynamo.reset()
    counters.clear()
    WRITE_BACKS.clear()
    rec = DeviceRecorder(backend)
    compiled = flambeau.compile(fn, backend=rec, fullgraph=name != "mutate_then_break")
    calls = []
    for _ in range(2):                      # the second call reuses the entry (compile once)
        args = tuple(a.copy() for a in rng_inputs()[name])
        with flambeau.device(device):
            out = compiled(*args)
        calls.append({"result": encode(out), "args_after": encode(list(args))})
    entry = {"calls": calls, "graphs": counters["stats"]["unique_graphs"], "example_devices": list(rec.example_devices),
             "run_devices": sorted(rec.run_devices),
             "fallbacks": sorted(counters["inductor_fallbacks"]), "graph_breaks": sorted(counters["graph_break"]),
             "write_backs": WRITE_BACKS["calls"]}
    rec.example_devices, rec.run_devices = [], set()
    args = tuple(a.copy() for a in rng_inputs()[name])
    out = compiled(*args)                   # no device context: a new entry that computes on cpu
    entry["outside"] = {"result": encode(out), "graphs": counters["stats"]["unique_graphs"],
                        "example_devices": rec.example_devices, "run_devices": sorted(rec.run_devices)}
    return entry


def main(device: str, path: str) -> None:
    report = {"device": device}
    if device != "cuda":
        xp = CountingNumpy()
        flambeau.utils.rename_privateuse1_backend(device)
        # the device keeps its own copies: nothing reaches a caller's array unless it is copied back
        flambeau.utils.register_privateuse1_array_backend(
            xp, asarray=lambda data, dt: np.array(data, dtype=dt, copy=True), to_numpy=lambda a: np.array(a, copy=True))
    _wrappers.write_back = counting_write_back      # read when an entry is generated: count the copies back
    backends = ["recorder", "aot_eager", "inductor"]
    for name in PROGRAMS:
        for backend in backends:
            if device != "cuda":
                before = sum(xp.calls.values())
            entry = run_program(name, device, backend)
            if device != "cuda":
                entry["namespace_calls"] = sum(xp.calls.values()) - before
            report[f"{name}/{backend}"] = entry
    with open(path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
