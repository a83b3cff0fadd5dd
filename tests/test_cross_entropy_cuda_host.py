"""The host side of the fused cross-entropy on cuda (issue 11: a mean loss cost ~350 us of host a MLP step in
CuPy reductions, casts and a separate bounds-check launch), on CPU: flambeau's F.cross_entropy forward and
backward on the fake cuda device of `bench/eager_host_calls.py` (NumPy arrays standing in for CuPy's, a
recording cuLaunchKernel, Triton's compiler stubbed). A mean or sum loss is the row kernel and one reduction
program forward, (mean: one scaling program and) the row kernel backward, each launch with its arguments, and
no array method (sum, astype, comparison) or CuPy function runs on the device arrays besides the outputs'
allocations. The kernels' values are checked under Triton's interpreter (tests/scripts/
triton_cross_entropy_interp.py) and on the GPU (tests/test_norm_fused.py, `cuda` marks)."""
import contextlib
import sys
import types

import numpy as np
import pytest

import flambeau as fl
from bench import eager_host_calls as E
from flambeau._backends import device_checks, triton_launch as TL
from flambeau._device import canonical
from flambeau._tensor import Tensor

ROWS, CLASSES = 64, 256


@pytest.fixture
def fake_cuda(monkeypatch):
    """The fake device with Triton kernels as recorded launches: yields the list of (kernel name, grid,
    argument values) launched and the names of the namespace's (NumPy's for CuPy's) functions looked up;
    the device arrays' reductions, casts, comparisons and divisions raise."""
    from flambeau._backends import triton_cross_entropy as X
    xp, restore = E.install()
    used = []

    def numpy_fn(name):
        used.append(name)
        f = getattr(np, name)
        if not callable(f) or isinstance(f, (type, np.ufunc)):
            return f
        return lambda *a, **k: (lambda r: r.view(E.DevArray) if type(r) is np.ndarray else r)(f(*a, **k))
    xp.__getattr__ = numpy_fn
    xp.cuda.Device = lambda dev: contextlib.nullcontext()
    monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setattr(X, "cupy", xp)
    monkeypatch.setattr(TL, "_available", [True])
    monkeypatch.setattr(X, "_kernels", {})
    monkeypatch.setattr(device_checks, "_buffers", {0: np.zeros(2, np.uint64).view(E.DevArray)})
    monkeypatch.setattr(device_checks, "_pending", set())
    launches = []

    def compile_kernel(f, sig, const, num_warps=4, num_stages=3, aligned=()):
        fn = types.SimpleNamespace(ptr=len(launches) + 1000, name=f.__name__)
        return TL.kernel_of(fn, None, tuple(sig[n] for n in f.arg_names if sig[n] != "constexpr"), num_warps, 0, 0)
    monkeypatch.setattr(TL, "compile_kernel", compile_kernel)
    real_launch = TL.launch

    def launch(kernel, grid, *args):
        launches.append((kernel.function.name, tuple(grid), args))
        return real_launch(kernel, grid, *args)
    monkeypatch.setattr(TL, "launch", launch)
    for method in ("sum", "astype", "__ne__", "__truediv__", "mean", "copy"):
        def refuse(self, *a, _m=method, **k):
            raise AssertionError(f"a device array's {_m} ran in the fused cross-entropy")
        monkeypatch.setattr(E.DevArray, method, refuse, raising=False)
    try:
        yield launches, used
    finally:
        restore()


def _inputs():
    rng = np.random.default_rng(0)
    x = Tensor._make(rng.standard_normal((ROWS, CLASSES)).astype(np.float32).view(E.DevArray), canonical("cuda"))
    t = Tensor._make(rng.integers(0, CLASSES, ROWS).view(E.DevArray), canonical("cuda"))
    return x.requires_grad_(), t


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mean_and_sum_losses_are_kernel_launches_only(fake_cuda, reduction):
    launches, used = fake_cuda
    x, t = _inputs()
    loss = fl.nn.functional.cross_entropy(x, t, reduction=reduction, ignore_index=-7)
    assert used == []                   # no NumPy (CuPy) function: only the ndarray constructor
    fwd = [n for n, _, _ in launches]
    assert fwd == ["_ce_fwd", "_ce_reduce"]
    assert loss.shape == () and loss.dtype == fl.float32 and loss.device.type == "cuda"
    (_, grid, (xa, ta, rows, err, c, ignore, code)), (_, rgrid, (ra, ta2, out, n, ignore2)) = launches
    assert grid == (ROWS,) and rgrid == (1,)
    assert xa is x._data and ta is t._data and rows is ra and ta2 is t._data and out is loss._data
    assert (c, ignore, n, ignore2) == (CLASSES, -7, ROWS, -7)
    assert err is device_checks._buffers[0] and device_checks.pending()        # the bounds check is the kernel's
    assert device_checks._by_code[code] == (IndexError, "Target {} is out of bounds.")
    del launches[:]
    loss.backward()
    assert used == ["full"]             # the engine's incoming gradient (ones), nothing in the loss's backward
    bwd = [n for n, _, _ in launches]
    assert bwd == (["_ce_scale", "_ce_bwd"] if reduction == "mean" else ["_ce_bwd"])
    *_, (_, grid, (xa, ta, g, dx, c, ignore, g_stride)) = launches
    assert grid == (ROWS,) and xa is x._data and g_stride == 0 and dx is x.grad._data
    if reduction == "mean":
        (_, sgrid, (ta, g0, scale, n, ignore)) = launches[0]
        assert sgrid == (1,) and scale is g and (n, ignore) == (ROWS, -7)
