"""Compiled NumPy code on another device (issue 14 item 3): inside `with flambeau.device(d)` a compiled NumPy
function gets its ndarray inputs as copies on d, creates its arrays on d (np.arange, np.zeros_like ...),
computes there, returns host numpy.ndarrays and copies the arrays it mutated back into the caller's arrays.

On cpu, d is a third-party device (tests/scripts/compile_numpy_device.py: PrivateUse1 renamed "npu", a NumPy
namespace counting its calls and keeping its own copies of the data); the same script runs on the GPU with
d = "cuda" (`-m cuda`). Its results are checked against NumPy itself, and against torch.compile of the same
code on cpu; what PyTorch does with the inputs under a device context (`torch.as_tensor` of the array, moved by
the context) is checked on the meta device beside flambeau."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import flambeau

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "compile_numpy_device.py"
_spec = importlib.util.spec_from_file_location("compile_numpy_device", SCRIPT)
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

DEVICES = [pytest.param("npu", id="npu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
BACKENDS = ["recorder", "aot_eager", "inductor"]
_reports: dict = {}


def _report(device, tmp_path_factory) -> dict:
    if device not in _reports:
        path = tmp_path_factory.mktemp("np_device") / "report.json"
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(flambeau.__file__).parent.parent))
        r = subprocess.run([sys.executable, str(SCRIPT), device, str(path)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        _reports[device] = json.loads(path.read_text())
    return _reports[device]


def _decode(x):
    if isinstance(x, list):
        return [_decode(e) for e in x]
    if "ndarray" in x:
        return np.array(x["values"], dtype=x["dtype"]).reshape(x["shape"])
    return x


def _assert_same(got, want, path="result"):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}[{i}]")
        return
    want = np.asarray(want)                     # a NumPy scalar comes back as a 0-d array, as torch.compile's
    assert isinstance(got, np.ndarray), f"{path}: {got} returned, NumPy gives an array"
    assert got.dtype == want.dtype and got.shape == want.shape, (path, got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5 if want.dtype == np.float32 else 1e-12, atol=1e-6, err_msg=path)


def _numpy(name):
    """NumPy's own result of the program, and its arguments after the call (the mutated ones changed)."""
    args = tuple(a.copy() for a in P.rng_inputs()[name])
    return P.PROGRAMS[name](*args), list(args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(P.PROGRAMS))
@pytest.mark.parametrize("device", DEVICES)
def test_results_and_written_arrays_equal_numpys(device, name, backend, tmp_path_factory):
    """Both calls under the device context (compiling, then the cached entry) return numpy.ndarrays equal to
    NumPy's, and the caller's arrays hold what NumPy leaves in them: the mutated ones (`inplace`: in-place
    operators, out=, an assignment and a write through a view; `mutate_then_break`: before a graph break,
    read after it) were copied back from the device."""
    entry = _report(device, tmp_path_factory)[f"{name}/{backend}"]
    want, want_args = _numpy(name)
    for call in entry["calls"]:
        _assert_same(_decode(call["result"]), want)
        _assert_same(_decode(call["args_after"]), want_args, "arguments after the call")
    _assert_same(_decode(entry["outside"]["result"]), want, "result outside the context")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(P.PROGRAMS))
@pytest.mark.parametrize("device", DEVICES)
def test_graph_computes_on_the_device_and_compiles_once_per_context(device, name, backend, tmp_path_factory):
    """The graph's example inputs are on the device; every value the recorder backend computes is on it
    (arrays created inside too); the npu namespace does the work; two calls compile once (twice with the
    graph break); outside the context the default-device guard fails and a cpu graph is compiled."""
    report = _report(device, tmp_path_factory)
    entry = report[f"{name}/{backend}"]
    graphs = 2 if name == "mutate_then_break" else 1
    assert entry["graphs"] == graphs
    assert entry["example_devices"] == [[device]] * graphs
    if backend == "recorder":
        assert entry["run_devices"] == [device]
    if device == "npu":
        assert entry["namespace_calls"] > 0
        want_fallbacks = ["whole graph: no code generator for tensors on npu"] if backend == "inductor" else []
        assert entry["fallbacks"] == want_fallbacks
    else:                                       # generated Triton code, not the whole graph left to eager
        assert not any(k.startswith("whole graph") for k in entry["fallbacks"]), entry["fallbacks"]
    # only what the graph mutated is copied back (a, at each of the two calls), nothing else
    assert entry["write_backs"] == (2 if name in ("inplace", "view_write", "mutate_then_break") else 0)
    out = entry["outside"]
    assert out["graphs"] == 2 * graphs
    assert out["example_devices"] == [["cpu"]] * graphs
    if backend == "recorder":
        assert out["run_devices"] == ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
def test_matches_torch_compile_on_cpu(device, tmp_path_factory):
    """The program torch.compile (2.13) traces under a device context (functions and methods: its ndarray
    operators fail under any `torch.device(...)`, pytorch/pytorch#140884), compiled by PyTorch under
    `torch.device("cpu")`, gives what flambeau computed on the device."""
    args = P.rng_inputs()["calls_only"]
    torch._dynamo.reset()
    with torch.device("cpu"):
        want = torch.compile(P.calls_only, backend="eager", fullgraph=True)(*[a.copy() for a in args])
    for backend in BACKENDS:
        _assert_same(_decode(_report(device, tmp_path_factory)[f"calls_only/{backend}"]["calls"][0]["result"]), want)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("lib", [flambeau, torch], ids=["flambeau", "torch"])
def test_inputs_and_created_arrays_follow_the_default_device_as_pytorchs(lib):
    """Traced outside any context, the function is not reused under `with device("meta")`: both libraries
    compile again, give that graph meta copies of the ndarray inputs and compute every value on meta
    (np.zeros_like, np.arange included; meta results cannot come back as NumPy arrays, so the backend stops
    after running the graph); after the context the cpu graph is reused."""
    runs = []

    def backend(gm, example_inputs):
        run = {"inputs": sorted({t.device.type for t in example_inputs}), "values": set(), "calls": 0}
        runs.append(run)

        class Recording(lib.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                for v in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(v, lib.Tensor):
                        run["values"].add(v.device.type)
                return out

        def call(*args):
            run["calls"] += 1
            out = Recording(gm).run(*args)
            if run["inputs"] == ["meta"]:
                raise _Stop
            return out
        return call

    lib._dynamo.reset()
    fn = lib.compile(P.calls_only, backend=backend, fullgraph=True)
    args = P.rng_inputs()["calls_only"]
    _assert_same(list(fn(*args)), P.calls_only(*args))
    with lib.device("meta"):
        with pytest.raises(_Stop):
            fn(*args)
    _assert_same(list(fn(*args)), P.calls_only(*args))
    assert runs == [{"inputs": ["cpu"], "values": {"cpu"}, "calls": 2},
                    {"inputs": ["meta"], "values": {"meta"}, "calls": 1}]


@pytest.mark.parametrize("lib", [flambeau, torch], ids=["flambeau", "torch"])
def test_numpy_api_puts_arrays_where_pytorchs_does(lib):
    """flambeau._numpy / torch._numpy eagerly: `*_like` on the array's device (a meta array, no context), arrays
    created or converted from NumPy inside `with device("meta")` on meta (the default device)."""
    m = importlib.import_module(f"{lib.__name__}._numpy")
    a = m.asarray(lib.ones(2, 3, device="meta"))
    out = {"zeros_like": m.zeros_like(a), "ones_like": m.ones_like(a), "empty_like": m.empty_like(a),
           "full_like": m.full_like(a, 3)}
    with lib.device("meta"):
        out.update({"asarray(ndarray)": m.asarray(np.ones(3)), "array(list)": m.array([1.0, 2.0]),
                    "array(ndarray)": m.array(np.ones(2)), "arange": m.arange(3), "zeros": m.zeros(2),
                    "ones": m.ones(2), "empty": m.empty(2), "eye": m.eye(2), "linspace": m.linspace(0, 1, 3),
                    "identity": m.identity(2), "asarray(float32)": m.asarray(np.float32(1))})
    assert {k: v.tensor.device.type for k, v in out.items()} == {k: "meta" for k in out}
