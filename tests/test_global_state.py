"""flambeau leaves the process as it found it: `import flambeau` and a first compile change neither
NumPy's error state, the environment, nor glibc's malloc (an opt-in); OpenMP's spin count reaches
libgomp without staying in the environment; eager ops give PyTorch's silent inf/nan without NumPy
warnings, while the user's own NumPy code still warns."""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import flambeau

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROBE = r"""
import ctypes, json, os, sys
import numpy as np
np.seterr(divide="warn", over="raise", under="ignore", invalid="print")   # the user's choice
before = (np.geterr(), dict(os.environ))
called = []


class SpyCDLL(ctypes.CDLL):
    def __getattr__(self, name):
        called.append(name)
        return super().__getattr__(name)


ctypes.CDLL = SpyCDLL
import flambeau
after_import = (np.geterr(), dict(os.environ))
f = flambeau.compile(lambda x: (x * 2).sin().sum())
f(flambeau.randn(1 << 17))          # big enough for a parallel (OpenMP) kernel
after_compile = (np.geterr(), dict(os.environ))
gomp = any("libgomp" in line for line in open("/proc/self/maps"))
if gomp:
    ctypes.CDLL("libgomp.so.1").omp_display_env(1)
    ctypes.CDLL(None).fflush(None)
print("RESULT" + json.dumps({"before": before, "after_import": after_import, "after_compile": after_compile,
                              "mallopt": "mallopt" in called, "gomp": gomp}))
"""


def _probe(**env):
    e = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY",
                                                          "FLAMBEAU_TUNE_MALLOC")}
    e.update(env, PYTHONPATH=_ROOT + os.pathsep + e.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):]), r.stderr          # omp_display_env writes to stderr


def test_import_and_first_compile_leave_numpy_environment_and_malloc_alone():
    res, err = _probe()
    assert res["after_import"] == res["before"]
    assert res["after_compile"] == res["before"]
    assert "GOMP_SPINCOUNT" not in res["after_compile"][1]
    assert not res["mallopt"]
    if res["gomp"]:        # the C++ backend loaded libgomp: it took the spin count for flambeau's threads
        assert "GOMP_SPINCOUNT = '10000'" in err, err


def test_malloc_tuning_is_an_opt_in():
    res, _ = _probe(FLAMBEAU_TUNE_MALLOC="1")
    assert res["mallopt"]
    assert res["after_compile"][0] == res["before"][0]


def _no_numpy_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return fn()


@pytest.mark.parametrize("name,fn", [
    ("div_by_zero", lambda m: m.tensor([1.0, -1.0, 0.0]) / 0),
    ("log_of_negative", lambda m: m.log(m.tensor([-1.0, 0.0, 2.0]))),
    ("exp_overflow", lambda m: m.exp(m.tensor([1000.0, 1.0], dtype=m.float32))),
    ("inf_minus_inf", lambda m: m.tensor([math.inf]) - m.tensor([math.inf])),
    ("inf_minus_inf_on_worker_threads", lambda m: m.full((1 << 19,), math.inf) - m.full((1 << 19,), math.inf)),
    ("mul_overflow_float16", lambda m: m.tensor([60000.0], dtype=m.float16) * 2),
    ("cast_overflow_to_float16", lambda m: m.tensor([1e10, -1e10]).half()),
    ("sum_overflow_float16", lambda m: m.full((4,), 60000.0, dtype=m.float16).sum()),
    ("matmul_with_inf", lambda m: m.tensor([[math.inf, 1.0]]) @ m.tensor([[0.0], [1.0]])),
    ("sqrt_of_negative", lambda m: m.sqrt(m.tensor([-4.0, 4.0]))),
    ("int_div_by_zero_float_result", lambda m: m.tensor([1, 0]) / m.tensor([0, 0])),
])
def test_inf_nan_results_are_silent_like_pytorch(name, fn):
    ours = _no_numpy_warnings(lambda: fn(flambeau))
    ref = fn(torch)
    torch.testing.assert_close(torch.from_numpy(np.array(ours.float()._host())), ref.float(), equal_nan=True)


def test_nan_to_integer_cast_is_silent():
    _no_numpy_warnings(lambda: flambeau.tensor([math.nan, math.inf]).long())


def test_user_numpy_still_warns_after_flambeau_ops():
    _no_numpy_warnings(lambda: flambeau.tensor([1.0]) / 0)
    with pytest.warns(RuntimeWarning):
        np.array([1.0]) / 0


# Ops tagged no_fp_errors run without the dispatcher's silencing, so their kernels must raise no
# floating-point error for any value: each is called here on inf/nan/huge/tiny values while the
# user's NumPy state is "raise". A tagged op missing here fails the first test.
_EDGE_VALUES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, 3e38, -3e38, 65504.0, -1.5]
_NO_FP_ERRORS_CALLS = {
    "relu": lambda m, x, idx: m.relu(x),
    "clone": lambda m, x, idx: x.clone(),
    "index.Tensor": lambda m, x, idx: x[idx],
}


def test_ops_tagged_no_fp_errors_raise_none_on_inf_nan_and_huge_values():
    from flambeau._ops._registry import OPS
    tagged = {op.name for op in OPS.values() if flambeau.Tag.no_fp_errors in op.tags}
    assert tagged == set(_NO_FP_ERRORS_CALLS), "each op tagged no_fp_errors needs its edge-value call here"
    for name, call in _NO_FP_ERRORS_CALLS.items():
        for dt in ("float16", "bfloat16", "float32", "float64"):
            ref_in = torch.tensor(_EDGE_VALUES, dtype=getattr(torch, dt))
            x = flambeau.tensor(ref_in.float().numpy()).to(getattr(flambeau, dt))
            idx = flambeau.tensor([0, 2, 2, 9])
            with np.errstate(all="raise"):                       # the user's choice: an FP error raises
                ours = call(flambeau, x, idx)
            ref = call(torch, ref_in, torch.tensor([0, 2, 2, 9]))
            torch.testing.assert_close(torch.from_numpy(np.array(ours.float()._host())), ref.float(),
                                       equal_nan=True, msg=f"{name} {dt}")


def test_dispatch_silences_fp_errors_only_around_kernels_that_can_raise(monkeypatch):
    from flambeau import _dispatch
    calls = []
    run = _dispatch._run_quiet
    monkeypatch.setattr(_dispatch, "_run_quiet", lambda *a, **k: calls.append(1) or run(*a, **k))
    x = flambeau.tensor([[1.0, -1.0], [2.0, 0.5]])
    flambeau.relu(x), x.clone(), x[flambeau.tensor([1])], x.view(4), x.t()
    assert calls == []
    flambeau.exp(x), x + x, x.sum()
    assert len(calls) == 3


def _overflowing_ops():
    x = flambeau.tensor([1e38, -1.0, 0.0])
    return [(x * 10).tolist(), (x / 0).tolist(), x.log().tolist()]


_OVERFLOWED = [[math.inf, -10.0, 0.0], [math.inf, -math.inf, math.nan], [math.log(1e38), math.nan, -math.inf]]


def _same_floats(got, want):
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b), (got, want)


def test_an_op_run_by_a_kernel_is_silent_too():
    """The quiet context is entered already (a kernel running an op): the op falls back to setting
    NumPy's error state, and is silent all the same."""
    from flambeau import _fp_errors

    def kernel_running_ops():
        with np.errstate(all="raise"):                   # inside the context: what a kernel might set
            return _overflowing_ops()

    _same_floats(_fp_errors.run_quiet(kernel_running_ops), _OVERFLOWED)


def test_ops_are_silent_while_another_thread_holds_the_quiet_context():
    import threading
    from flambeau import _fp_errors
    inside, release = threading.Event(), threading.Event()

    def hold():
        inside.set()
        release.wait(30)

    t = threading.Thread(target=_fp_errors.run_quiet, args=(hold,))
    t.start()
    try:
        assert inside.wait(30)
        with np.errstate(all="raise"):
            _same_floats(_overflowing_ops(), _OVERFLOWED)
    finally:
        release.set()
        t.join()
