"""A compiled graph's convolution externs on cuda: argument getters built once (wrapper.make_extern) and
the planned cuDNN path (_inductor/extern_conv.py).

On cpu the cuda path runs against fakes: a NumPy array type that offers CuPy's `.data.ptr`, a fake
`cupy` module, and a cuDNN plan whose `execute` computes the convolution with PyTorch (float64 on the
arrays found at the pointers it is handed); the eager kernels (`_ops/nn_conv.py`, `cudnn.forward`,
`backward_data`, `backward_filter`) run as they are. Values are compared with PyTorch's convolutions.
The cuda tests at the end run the real thing on the GPU machine.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau import _backends
from flambeau import _dtype as D
from flambeau._backends import cudnn
from flambeau._inductor import extern_conv, wrapper
from flambeau._inductor.ir import InputBuffer, Layout
from flambeau._inductor.sizevars import SizeExpr
from flambeau._ops import nn_conv

_live: list = []                  # every fake device array made, so a pointer finds its array
executed: list = []               # the pointers (x, w, y) each fake plan execution was handed


class DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data.ptr` / `.data.device_id` (and its interface's name, which the
    wrapper's output check reads as "a device array")."""
    __cuda_array_interface__: dict = {}

    def __new__(cls, shape, dtype=float, memptr=None, strides=None):
        """CuPy's constructor: a new array, or one over `memptr` (a `cuda.alloc` block) with byte strides."""
        return np.ndarray.__new__(cls, shape, dtype, buffer=memptr, strides=strides)

    def __array_finalize__(self, obj):
        _live.append(self)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data, device_id=0)


def _dev(a) -> DevArray:
    out = np.empty(a.shape, a.dtype).view(DevArray)
    out[...] = a
    return out


def _find(ptr, shape):
    for a in reversed(_live):
        if a.ctypes.data == ptr and a.shape == tuple(shape):
            return np.asarray(a)
    n = int(np.prod(shape))
    for a in reversed(_live):         # a dense run inside a flat array (a view's memory, no view made)
        at, it = ptr - a.ctypes.data, a.itemsize
        if a.ndim == 1 and a.flags.c_contiguous and 0 <= at and at % it == 0 and at // it + n <= a.size:
            return np.asarray(a)[at // it:at // it + n].reshape(shape)
    raise AssertionError(f"no array at {ptr:#x} of shape {shape}")


class _FakePlan(cudnn._GraphPlan):
    """A plan whose execution is PyTorch's convolution (float64) on the arrays at its pointers."""

    def __init__(self, kind, xs, ws, ys, st, pad, dil, groups):
        self.kind, self.shapes, self.params = kind, (xs, ws, ys), (st, pad, dil, groups)
        self.ws, self.descs = 0, []

    def execute(self, h, ptrs, *where, **kw):
        executed.append(ptrs)
        (xs, ws, ys), (st, pad, dil, groups) = self.shapes, self.params
        x, w, y = (_find(p, s) for p, s in zip(ptrs, (xs, ws, ys)))
        t = lambda a: torch.from_numpy(np.array(a, np.float64))        # noqa: E731
        if self.kind == "forward":
            y[...] = torch.nn.functional.conv2d(t(x), t(w), None, st, pad, dil, groups).numpy()
        elif self.kind == "backward_data":
            x[...] = torch.nn.grad.conv2d_input(xs, t(w), t(y), st, pad, dil, groups).numpy()
        else:
            w[...] = torch.nn.grad.conv2d_weight(t(x), ws, t(y), st, pad, dil, groups).numpy()


@pytest.fixture
def fake_cuda(monkeypatch):
    """The eager cuda convolution path over the fakes; returns the list of plans made."""
    xp = types.SimpleNamespace(empty=lambda shape, dtype=np.float32: np.empty(shape, dtype).view(DevArray),
                               ascontiguousarray=lambda a: a if a.flags.c_contiguous else _dev(a), float32=np.float32,
                               uint8=np.uint8, ndarray=DevArray)
    xp.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                    alloc=lambda nbytes: np.empty(nbytes, np.uint8))
    monkeypatch.setitem(__import__("sys").modules, "cupy", xp)
    monkeypatch.setattr(_backends, "_cupy_namespace", [xp])
    plans = []

    def plan(kind, xs, ws, ys, st, pad, dil, groups, dtype, ptrs_fn, *layout):
        plans.append(kind)
        return _FakePlan(kind, xs, ws, ys, st, pad, dil, groups)
    monkeypatch.setattr(cudnn, "_plan", plan)
    monkeypatch.setattr(cudnn, "_calls", {})               # (calls remembered with these fakes stay here)
    monkeypatch.setattr(cudnn, "available", lambda: True)
    monkeypatch.setattr(cudnn, "_supported", lambda a, b: True)
    monkeypatch.setattr(cudnn, "_handle", lambda *a: None)
    monkeypatch.setattr(cudnn, "_device_id", lambda: 0)
    monkeypatch.setattr(cudnn, "_current_stream", lambda: 0)
    monkeypatch.setattr(cudnn, "_ALIGNMENT", 16)
    _live.clear()
    executed.clear()
    yield xp, plans
    _live.clear()
    executed.clear()


def _extern(op, args, xp):
    """make_extern of an extern node calling `op` on `args` (InputBuffers for the arrays)."""
    bufs = [a for a in args if isinstance(a, InputBuffer)]
    ek = types.SimpleNamespace(op=op, args=args, kwargs={}, layout=None, inputs=lambda: bufs, name="buf9")
    ek.layout = Layout((1,), D.float32)            # (a contiguous output: conform keeps cuDNN's array)
    return wrapper.make_extern(ek, xp)


def _buf(name, a):
    return InputBuffer(name, Layout(a.shape, D.float32))


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


CASES = [  # (op, kind, arrays, constants after the arrays, reference)
    ("forward", dict(stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=1)),
    ("forward_bias_groups", dict(stride=(1, 1), padding=(2, 2), dilation=(2, 2), groups=2)),
    ("transposed", dict(stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=1)),
    ("weight_grad", dict(stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=2)),
]


def _case(name, p):
    x, w, b = _rand(2, 4, 9, 9), _rand(6, 4 // p["groups"], 3, 3, seed=1), _rand(6, seed=2)
    st, pad, dil, g = p["stride"], p["padding"], p["dilation"], p["groups"]
    T = lambda a: torch.from_numpy(a).double()          # noqa: E731
    if name.startswith("forward"):
        bias = b if "bias" in name else None
        ref = torch.nn.functional.conv2d(T(x), T(w), None if bias is None else T(bias), st, pad, dil, g)
        arrays = [x, w] + ([bias] if bias is not None else [])
        make = lambda bufs: [bufs[0], bufs[1], bufs[2] if bias is not None else None, st, pad, dil, False,  # noqa: E731
                             (0, 0), g]
        return nn_conv.convolution, "forward", arrays, make, ref.numpy()
    if name == "transposed":
        gy = _rand(2, 6, 5, 5, seed=3)
        ref = torch.nn.grad.conv2d_input((2, 4, 9, 9), T(w), T(gy), st, pad, dil, g)
        make = lambda bufs: [bufs[0], bufs[1], None, st, pad, dil, True, [0, 0], g]        # noqa: E731
        return nn_conv.convolution, "backward_data", [gy, w], make, ref.numpy()
    gy = _rand(2, 6, 5, 5, seed=3)
    ref = torch.nn.grad.conv2d_weight(T(x), w.shape, T(gy), st, pad, dil, g)
    make = lambda bufs: [bufs[0], bufs[1], tuple(w.shape), st, pad, dil, g]                 # noqa: E731
    return nn_conv._convolution_weight_grad, "backward_filter", [x, gy], make, ref.numpy()


@pytest.mark.parametrize("name,p", CASES, ids=[c[0] for c in CASES])
def test_planned_convolution_runs_the_first_calls_plan_and_matches_pytorch(fake_cuda, monkeypatch, name, p):
    """The first call runs eagerly and keeps its cuDNN plan; later calls run that plan without the eager
    kernel (cudnn.forward/backward_* not called, no new plan) and give PyTorch's values, the bias added."""
    xp, plans = fake_cuda
    op, kind, arrays, make, ref = _case(name, p)
    bufs = [_buf(f"arg{i}", a) for i, a in enumerate(arrays)]
    fn, bases, symbolic = _extern(op, make(bufs), xp)
    dev = [_dev(a) for a in arrays]
    before = dict(extern_conv.stats)
    first = fn(*dev)
    np.testing.assert_allclose(np.asarray(first), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["planned"] == before["planned"] + 1 and plans == [kind]
    eager = []
    real = getattr(cudnn, kind)
    monkeypatch.setattr(cudnn, kind, lambda *a, **k: eager.append(1) or real(*a, **k))
    calls = cudnn.calls[kind]
    dev2 = [_dev(a * 0.5) for a in arrays]
    second = fn(*dev2)
    assert not eager and plans == [kind] and cudnn.calls[kind] == calls + 1
    assert extern_conv.stats["fast"] == before["fast"] + 1
    scale = 0.25 if not (name == "forward_bias_groups") else None
    if scale is not None:
        np.testing.assert_allclose(np.asarray(second), ref * scale, rtol=1e-5, atol=1e-5)
    else:                                   # (x/2 * w/2 + b/2)
        _, _, _, _, ref2 = _case(name, p)
        x, w, b = (torch.from_numpy(a).double() for a in arrays)
        ref2 = torch.nn.functional.conv2d(x / 2, w / 2, b / 2, p["stride"], p["padding"], p["dilation"], p["groups"])
        np.testing.assert_allclose(np.asarray(second), ref2.numpy(), rtol=1e-5, atol=1e-5)


def test_a_planned_channels_last_convolution_allocates_its_output_channels_last(fake_cuda, monkeypatch):
    """Channels-last operands (NHWC-packed): the first call's cuDNN output is channels-last, and the planned
    calls allocate theirs the same way, as one array over a `cuda.alloc` block with its byte strides (no
    NHWC array transposed), run the plan without the eager kernel, and give PyTorch's values."""
    xp, plans = fake_cuda
    op, kind, arrays, make, ref = _case("forward", CASES[0][1])
    x, w = arrays
    bufs = [_buf(f"arg{i}", a) for i, a in enumerate(arrays)]
    n, c, h, wd = ref.shape
    ek = types.SimpleNamespace(op=op, args=make(bufs), kwargs={}, inputs=lambda: bufs, name="buf9",
                               layout=Layout(ref.shape, D.float32, (c * h * wd, 1, wd * c, c)))
    fn, _, _ = wrapper.make_extern(ek, xp)
    first = fn(_channels_last(x), _channels_last(w))
    np.testing.assert_allclose(np.asarray(first), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["planned"] and first.strides[1] == first.itemsize
    eager = []
    real = cudnn.forward
    monkeypatch.setattr(cudnn, "forward", lambda *a, **k: eager.append(1) or real(*a, **k))
    before = dict(extern_conv.stats)
    operands = [(_channels_last(x * scale), _channels_last(w)) for scale in (0.5, 2.0)]
    monkeypatch.setattr(DevArray, "transpose", lambda *a: pytest.fail("a transposed output"))
    for scale, (xs, ws) in zip((0.5, 2.0), operands):
        got = fn(xs, ws)
        np.testing.assert_allclose(np.asarray(got), ref * scale, rtol=1e-5, atol=1e-5)
        assert got.strides == first.strides and got.shape == first.shape
    assert not eager and extern_conv.stats["fast"] == before["fast"] + 2 and plans == [kind]


def test_a_misaligned_operand_or_changed_flags_run_the_eager_kernel(fake_cuda, monkeypatch):
    """An operand 4 bytes past an aligned address (the plan promised 16) and a cuDNN flag changed since
    the plan: those calls run the eager kernel (which copies the operand aligned), still right."""
    xp, plans = fake_cuda
    op, kind, arrays, make, ref = _case("forward", CASES[0][1])
    fn, _, _ = _extern(op, make([_buf(f"arg{i}", a) for i, a in enumerate(arrays)]), xp)
    fn(*[_dev(a) for a in arrays])
    raw = np.empty(arrays[0].size + 1, np.float32).view(DevArray)
    x_off = raw[1:].reshape(arrays[0].shape)
    x_off[...] = arrays[0]
    assert x_off.data.ptr % 16
    before = dict(extern_conv.stats)
    got = fn(x_off, _dev(arrays[1]))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["eager"] == before["eager"] + 1 and extern_conv.stats["fast"] == before["fast"]
    monkeypatch.setattr(cudnn, "allow_tf32", not cudnn.allow_tf32)
    got = fn(*[_dev(a) for a in arrays])
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["eager"] == before["eager"] + 2 and extern_conv.stats["fast"] == before["fast"]


def test_a_first_call_that_copied_an_operand_is_not_planned(fake_cuda):
    """When cuDNN got a copy of an operand at the first call (misaligned: `_ready` copied it), there is
    no plan: every call runs the eager kernel."""
    xp, plans = fake_cuda
    op, kind, arrays, make, ref = _case("forward", CASES[0][1])
    fn, _, _ = _extern(op, make([_buf(f"arg{i}", a) for i, a in enumerate(arrays)]), xp)
    raw = np.empty(arrays[0].size + 1, np.float32).view(DevArray)
    x_off = raw[1:].reshape(arrays[0].shape)
    x_off[...] = arrays[0]
    before = dict(extern_conv.stats)
    fn(x_off, _dev(arrays[1]))
    got = fn(*[_dev(a) for a in arrays])
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["planned"] == before["planned"] and extern_conv.stats["eager"] == before["eager"] + 2


def _channels_last(a) -> DevArray:
    """A channels-last (NHWC-packed) device copy of NCHW array `a`."""
    out = np.empty((a.shape[0],) + a.shape[2:] + (a.shape[1],), a.dtype).view(DevArray).transpose(0, 3, 1, 2)
    out[...] = a
    return out


def test_eager_cudnn_calls_remember_their_layout_and_plan(fake_cuda, monkeypatch):
    """cudnn.forward / backward_data / backward_filter remember a call's layout, result shape and plan
    (`cudnn._calls`): the same call again makes no plan and skips the checks (`_supported` not called),
    with PyTorch's values each time. An operand in another layout (channels-last: an NHWC result), a
    changed flag, other parameters are other calls (their own plan); a misaligned operand (same layout)
    takes the full path, which copies it aligned, each time. Results are made by CuPy's ndarray constructor
    (`cupy.empty` is a Python function around it: one frame more a convolution)."""
    xp, plans = fake_cuda
    checked = []
    monkeypatch.setattr(cudnn, "_supported", lambda a, b: checked.append(1) or True)
    # results come from CuPy's ndarray constructor (`cupy.empty` is a Python function around it)
    monkeypatch.setattr(xp, "empty", lambda *a, **k: pytest.fail("cupy.empty called"))
    x, w, gy = _rand(2, 4, 9, 9), _rand(6, 4, 3, 3, seed=1), _rand(2, 6, 5, 5, seed=3)
    st, pad, dil = (2, 2), (1, 1), (1, 1)
    T = lambda a: torch.from_numpy(np.asarray(a)).double()          # noqa: E731
    ref = [torch.nn.functional.conv2d(T(x), T(w), None, st, pad, dil).numpy(),
           torch.nn.grad.conv2d_input(x.shape, T(w), T(gy), st, pad, dil).numpy(),
           torch.nn.grad.conv2d_weight(T(x), w.shape, T(gy), st, pad, dil).numpy()]

    def three(xd, wd, gyd):
        return [cudnn.forward(xd, wd, None, st, pad, dil, 1), cudnn.backward_data(gyd, wd, st, pad, dil, 1, (9, 9)),
                cudnn.backward_filter(xd, gyd, w.shape, st, pad, dil, 1)]
    xd, wd, gyd = _dev(x), _dev(w), _dev(gy)
    for _ in range(3):
        for got, want in zip(three(xd, wd, gyd), ref):
            assert got.flags.c_contiguous
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert plans == ["forward", "backward_data", "backward_filter"] and len(checked) == 3
    for _ in range(2):                                   # channels-last operands: NHWC results, their own plans
        for got, want in zip(three(_channels_last(x), _channels_last(w), _channels_last(gy)), ref):
            assert not got.flags.c_contiguous and got.strides[1] == got.itemsize
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert len(plans) == 6 and len(checked) == 6
    raw = np.empty(x.size + 1, np.float32).view(DevArray)
    x_off = raw[1:].reshape(x.shape)
    x_off[...] = x
    copies = cudnn.copies["forward"]
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(cudnn.forward(x_off, wd, None, st, pad, dil, 1)), ref[0], rtol=1e-5,
                                   atol=1e-5)
    assert cudnn.copies["forward"] == copies + 2 and len(checked) == 8
    monkeypatch.setattr(cudnn, "allow_tf32", not cudnn.allow_tf32)
    three(xd, wd, gyd)
    three(xd, wd, gyd)
    assert len(plans) == 9 + 2 and len(checked) == 11          # (the misaligned calls made plans too)
    for _ in range(2):
        got = cudnn.forward(xd, wd, None, st, (0, 0), dil, 1)
    np.testing.assert_allclose(np.asarray(got), torch.nn.functional.conv2d(T(x), T(w), None, st).numpy(), rtol=1e-5,
                               atol=1e-5)
    assert len(plans) == 12 and len(checked) == 12


def test_a_channels_last_result_is_one_array_over_its_own_block(fake_cuda):
    """cudnn._empty of a channels-last result makes one array (CuPy's constructor over a `cuda.alloc`
    block with the NHWC byte strides: `torch.empty(..., memory_format=torch.channels_last)`'s strides),
    not an NHWC array and its transposed view; NCHW results keep the plain constructor."""
    for shape, dt in (((2, 3, 4, 5), np.dtype(np.float32)), ((2, 3, 4, 5, 6), np.dtype(np.float16))):
        want = torch.empty(shape, dtype=getattr(torch, dt.name),
                           memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
        _live.clear()
        out = cudnn._empty(shape, dt, True)
        assert len(_live) == 1 and out is _live[0] and out.base.dtype == np.uint8
        assert out.shape == shape and out.dtype == dt and out.strides == tuple(s * dt.itemsize for s in want.stride())
        assert out.base.nbytes == want.numel() * dt.itemsize
    _live.clear()
    out = cudnn._empty((2, 3, 4, 5), np.dtype(np.float32), False)
    assert len(_live) == 1 and out.flags.c_contiguous


def test_eager_convolution_kernels_make_no_astype_calls_on_cuda(fake_cuda, monkeypatch):
    """The eager kernels of `convolution` (forward, transposed) and `_convolution_weight_grad` on cuda
    operands of one dtype call no `astype` (a no-op cast costs a CuPy call each: six a convolution's
    training step), and give PyTorch's values."""
    xp, plans = fake_cuda
    cast = []
    monkeypatch.setattr(DevArray, "astype", lambda self, *a, **k: cast.append(a) or np.ndarray.astype(self, *a, **k),
                        raising=False)
    x, w, gy = _rand(2, 4, 9, 9), _rand(6, 4, 3, 3, seed=1), _rand(2, 6, 5, 5, seed=3)
    st, pad, dil = (2, 2), (1, 1), (1, 1)
    T = lambda a: torch.from_numpy(np.asarray(a)).double()          # noqa: E731
    y = nn_conv.convolution.kernel(xp, _dev(x), _dev(w), None, st, pad, dil, False, (0, 0), 1)
    gx = nn_conv.convolution.kernel(xp, _dev(gy), _dev(w), None, st, pad, dil, True, (0, 0), 1)
    gw = nn_conv._convolution_weight_grad.kernel(xp, _dev(x), _dev(gy), w.shape, st, pad, dil, 1)
    assert cast == [] and plans == ["forward", "backward_data", "backward_filter"]
    for got, want in ((y, torch.nn.functional.conv2d(T(x), T(w), None, st, pad, dil)),
                      (gx, torch.nn.grad.conv2d_input(x.shape, T(w), T(gy), st, pad, dil)),
                      (gw, torch.nn.grad.conv2d_weight(T(x), w.shape, T(gy), st, pad, dil))):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_planned_convolution_reads_a_views_pointer_without_making_the_view(fake_cuda, monkeypatch):
    """An operand that is a view (here 4 elements into a larger buffer) is planned too: later calls hand
    cuDNN the buffer's pointer plus the view's byte offset without making the view (no _strided_device
    call), and the values are PyTorch's; a buffer whose view would be misaligned runs the eager kernel."""
    xp, plans = fake_cuda
    _, kind, (x, w), make, ref = _case("forward", CASES[0][1])
    pad = 4                                                   # elements: 16 bytes, aligned
    base = InputBuffer("arg0", Layout((x.size + pad,), D.float32))
    wbuf = _buf("arg1", w)
    ek = types.SimpleNamespace(op=nn_conv.convolution, args=make([wrapper.StridedView(
        base, Layout(x.shape, D.float32, offset=pad)), wbuf]), kwargs={}, inputs=lambda: [base, wbuf], name="buf9",
        layout=Layout((1,), D.float32))
    views = []

    def strided(b, lay):                                      # the wrapper's device view, on the fake arrays
        views.append(lay)
        it = b.itemsize
        return np.lib.stride_tricks.as_strided(np.asarray(b)[lay.offset:], lay.shape,
                                               tuple(st * it for st in lay.strides)).view(DevArray)
    monkeypatch.setattr(wrapper, "_strided_device", strided)
    fn, bases, _ = wrapper.make_extern(ek, xp)

    def flat(scale, at=pad):
        b = np.zeros(x.size + at, np.float32).view(DevArray)
        b[at:] = (x * scale).ravel()
        return b
    np.testing.assert_allclose(np.asarray(fn(flat(1.0), _dev(w))), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["planned"] and len(views) == 2     # (the eager call's and the planning's)
    before = dict(extern_conv.stats)
    b2 = flat(0.5)
    got = fn(b2, _dev(w))
    np.testing.assert_allclose(np.asarray(got), ref * 0.5, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["fast"] == before["fast"] + 1 and len(views) == 2 and plans == [kind]
    assert executed[-1][0] == b2.ctypes.data + 4 * pad and executed[-1][2] == got.ctypes.data
    raw = np.zeros(x.size + pad + 1, np.float32).view(DevArray)
    b3 = raw[1:]                                              # its view 20 bytes past an aligned address
    b3[pad:] = x.ravel()
    got = fn(b3, _dev(w))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert extern_conv.stats["fast"] == before["fast"] + 1 and extern_conv.stats["eager"] == before["eager"] + 1


def test_extern_arguments_are_built_once_constants_kept():
    """make_extern's getters: arrays placed where the buffers were, constants passed as they are (the
    same objects each call), nested tuples holding a buffer rebuilt; keyword arguments too."""
    got = []
    op = types.SimpleNamespace(name="probe", kernel=lambda xp, *a, **k: got.append((a, k)) or np.zeros(1, np.float32))
    a, b = InputBuffer("a", Layout((2,), D.float32)), InputBuffer("b", Layout((3,), D.float32))
    pads = [1, 2]
    args = [b, (3, a), pads, None, a]
    ek = types.SimpleNamespace(op=op, args=args, kwargs={"k": (a, 1), "c": 5}, layout=Layout((1,), D.float32),
                               inputs=lambda: [b, a], name="buf1")
    fn, bases, symbolic = wrapper.make_extern(ek, np)
    assert [x.name for x in bases] == ["b", "a"] and not symbolic
    xa, xb = np.ones(2, np.float32), np.ones(3, np.float32)
    fn(xb, xa)
    fn(xb, xa)
    for vals, kw in got:
        assert vals[0] is xb and vals[1] == (3, xa) and vals[1][1] is xa and vals[2] is pads and vals[3] is None
        assert vals[4] is xa and kw["k"][0] is xa and kw["k"][1] == 1 and kw["c"] == 5


# ---- cuDNN workspaces ------------------------------------------------------------------------------
class _RecordingLib:
    """The cuDNN backend calls a graph plan's `execute` makes, recorded; every call succeeds."""

    def __init__(self):
        self.packs, self.executed = 0, []

    def cudnnBackendCreateDescriptor(self, kind, out):
        self.packs += 1
        out._obj.value = 1000 + self.packs
        return 0

    def cudnnBackendSetAttribute(self, desc, attr, kind, n, values):
        if attr == cudnn.A.VARIANT_PACK_WORKSPACE:
            self.workspace = values[0]
        return 0

    def cudnnBackendFinalize(self, desc):
        return 0

    def cudnnBackendExecute(self, h, plan, pack):
        self.executed.append((pack.value, self.workspace))
        return 0

    def cudnnBackendDestroyDescriptor(self, desc):
        return 0


def test_convolutions_share_the_streams_workspace_and_reuse_their_variant_pack(monkeypatch):
    """A graph plan's execution takes its workspace from the current stream's (cuBLASLt's, made once per
    device and stream) when that is large enough: two calls on the same pointers allocate nothing and
    build one variant pack. A larger workspace is the stream's large one, kept: allocated at the first
    call that needs it and again only when a call needs more (so its pointer, and the variant pack,
    stay); `release_workspaces` drops it; benchmarking (`keep=False`) allocates one per call."""
    from flambeau._backends import cublaslt
    made = []

    class Arr:
        def __init__(self, n):
            made.append(n)
            self.nbytes = n
            self.data = types.SimpleNamespace(ptr=0x10000 * len(made))
    cupy = types.SimpleNamespace(empty=lambda n, dtype=None: Arr(n), uint8=np.uint8)
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7))
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    monkeypatch.setattr(cudnn, "_device_id", lambda: 0)
    monkeypatch.setattr(cudnn, "_current_stream", lambda: 7)
    monkeypatch.setattr(cublaslt, "_workspaces", {})
    monkeypatch.setattr(cudnn, "_large_workspaces", {})
    lib = _RecordingLib()
    plan = object.__new__(cudnn._GraphPlan)
    plan.lib, plan.plan, plan.uids, plan.descs, plan.ws = lib, None, (cudnn.ctypes.c_int64 * 3)(1, 2, 3), [], 4096
    monkeypatch.setattr(cudnn._GraphPlan, "__del__", lambda self: None)
    for _ in range(3):
        plan.execute(None, (0x100, 0x200, 0x300))
    assert made == [cublaslt.WORKSPACE_BYTES]                 # the stream's workspace, made once
    assert lib.packs == 1 and len({p for p, _ in lib.executed}) == 1
    assert lib.executed[0][1] == cublaslt._workspaces[(0, 7)].data.ptr
    big = cublaslt.WORKSPACE_BYTES + 1
    plan.ws = big
    for _ in range(3):
        plan.execute(None, (0x100, 0x200, 0x300))
    assert made[1:] == [big]                                  # the stream's large workspace, made once
    assert lib.packs == 2 and lib.executed[-1][1] == lib.executed[-2][1] == cudnn._large_workspaces[(0, 7)].data.ptr
    plan.ws = big - 1                                         # a smaller one: the same workspace, pack
    plan.execute(None, (0x100, 0x200, 0x300))
    assert made[1:] == [big] and lib.packs == 2
    plan.ws = big + 1                                         # a larger one: grown
    plan.execute(None, (0x100, 0x200, 0x300))
    plan.execute(None, (0x100, 0x200, 0x300))
    assert made[1:] == [big, big + 1] and lib.packs == 3
    plan.execute(None, (0x100, 0x200, 0x300), keep=False)    # benchmarking: one allocation a call, none kept
    plan.execute(None, (0x100, 0x200, 0x300), keep=False)
    assert made[1:] == [big, big + 1, big + 1, big + 1] and cudnn._large_workspaces[(0, 7)].nbytes == big + 1
    cudnn.release_workspaces()
    assert cudnn._large_workspaces == {}


# ---- on the GPU machine ----------------------------------------------------------------------------
def _conv_block():
    nn = fl.nn
    fl.manual_seed(0)
    return nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                         nn.Conv2d(16, 8, 1, bias=True)).cuda()


@pytest.mark.cuda
@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16_autocast"])
def test_compiled_conv_training_runs_planned_convolutions_on_cuda(amp, monkeypatch):
    """A compiled conv block's convolutions (forward, input and weight gradients) plan at their first
    call; the third step runs the plans (extern_conv.stats["fast"] grows, cudnn.forward/backward_data/
    backward_filter are not called) and gives eager's losses (and in float32 gradients). In float32 an
    input 4 bytes past an allocation's start runs the first convolution through the eager kernel, still
    right."""
    from flambeau._dynamo.testing import no_unexpected_fallbacks
    from tests.opdb import declared_eager_fallbacks
    x = fl.randn(4, 8, 16, 16).cuda()
    eager = []

    def spy():
        for kind in ("forward", "backward_data", "backward_filter"):
            monkeypatch.setattr(cudnn, kind, lambda *a, _r=getattr(cudnn, kind), **k: eager.append(1) or _r(*a, **k))

    def run(compiled, x, steps=3):
        fl.manual_seed(0)
        m = _conv_block()
        fwd = fl.compile(m) if compiled else m
        out = []
        for i in range(steps):
            if compiled and i == steps - 1:
                spy()
                before.update(extern_conv.stats)
            with fl.autocast(device_type="cuda", dtype=fl.bfloat16, enabled=amp):
                loss = fwd(x).float().square().mean()
            loss.backward()
            out.append((float(loss), [p.grad.float().cpu().numpy().copy() for p in m.parameters()]))
            m.zero_grad(set_to_none=True)
        return out, fwd
    before: dict = {}
    ref, _ = run(False, x)
    with no_unexpected_fallbacks(declared_eager_fallbacks()):
        got, fwd = run(True, x)
    assert not eager and extern_conv.stats["fast"] - before["fast"] >= 3
    for (lg, gg), (lr, gr) in zip(got, ref):
        np.testing.assert_allclose(lg, lr, rtol=2e-2 if amp else 1e-4)
        if not amp:
            for a, b in zip(gg, gr):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    monkeypatch.undo()
    if amp:
        return                  # (under autocast the graph's first op casts the input into a new buffer)
    raw = fl.empty(x.numel() + 1, device="cuda")
    x_off = raw[1:].view(x.shape)                       # 4 bytes past the allocation: off cuDNN's 16
    x_off.copy_(x)
    before = dict(extern_conv.stats)
    loss = fwd(x_off).float().square().mean()
    assert extern_conv.stats["eager"] > before["eager"]
    np.testing.assert_allclose(float(loss), ref[0][0], rtol=1e-4)


# ---- the Triton launcher's static path (a compiled graph on cuda without size symbols) ------------------
def test_static_launcher_writes_pointers_and_grids_as_the_general_path(monkeypatch):
    """A Launcher of a static graph on cuda (`_direct_call` for aligned pointers: one PointerBlock
    write per launch; `_static_call` for a misaligned one: grids and scratch worked out once, the
    values written straight into the parameter slots) hands the driver the same grid and parameters as
    the general path with sizes (`TL.launch` with converters): buffers, the error flag, the scratch
    array; a chain's second kernel too; an empty grid launches nothing."""
    import ctypes

    from flambeau._backends import triton_launch as TL
    from flambeau._device import device
    from flambeau._inductor import triton_runtime as rt
    from flambeau._inductor.codegen_triton import Launch

    class Arr:
        def __init__(self, ptr):
            self.data = types.SimpleNamespace(ptr=ptr)
    fn = types.SimpleNamespace(name="k", key="k")               # a generated module's KernelRef
    a, b = InputBuffer("a", Layout((10,), D.float32)), InputBuffer("b", Layout((10,), D.float32))

    def make(sizes, numel):
        second = Launch("k2", [a, b], sizes, numel, 4, error_flag=True)
        return Launch("k1", [a, b], sizes, numel, 4, workspace=[("ws0", D.float32, 8)], then=second)
    module = types.SimpleNamespace(kernel=lambda name: fn)
    launched = []

    def driver(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        k = kernels[f]
        types_ = TL.c_types(k.arg_types)
        addresses = (ctypes.c_void_p * len(types_)).from_address(params)
        launched.append((f, (gx, gy, gz), [t.from_address(p).value for t, p in zip(types_, addresses)]))
    monkeypatch.setattr(TL, "_driver", [driver, lambda: 0])
    kernels = {}

    def kernel(self, la, fn, aligned):
        sig = la.signature()
        k = TL.kernel_of(types.SimpleNamespace(ptr=len(kernels) + 1), None,
                         tuple(t for t in sig.values() if t != "constexpr"), 4, 0, 0)
        kernels[k.function.ptr] = k
        return k
    monkeypatch.setattr(rt.Launcher, "_kernel", kernel)
    monkeypatch.setattr(rt, "_cupy", lambda: types.SimpleNamespace(
        empty=lambda n, dt: Arr(0xA000)))
    cuda = device("cuda")
    static = rt.Launcher(module, make([], 10), cuda)
    general = rt.Launcher(module, make(["s0"], SizeExpr.symbol("s0")), cuda)
    err = Arr(0xE000)
    static(Arr(0x1000), Arr(0x2000), err)
    static(Arr(0x1010), Arr(0x2004), err)                      # a misaligned one: another kernel entry
    got_static = [(g, v) for _, g, v in launched]
    assert len(static._direct) == 2                            # the aligned call ran the direct launches
    launched.clear()
    general(Arr(0x1000), Arr(0x2000), 10, err)
    general(Arr(0x1010), Arr(0x2004), 10, err)
    got_general = [(g, [x for i, x in enumerate(v) if i != 2]) for _, g, v in launched]      # (minus s0)
    assert got_static == got_general
    assert got_static[0] == ((3, 1, 1), [0x1000, 0x2000, 0xA000, 0, 0])
    assert got_static[1] == ((3, 1, 1), [0x1000, 0x2000, 0xE000, 0, 0])
    assert got_static[3] == ((3, 1, 1), [0x1010, 0x2004, 0xE000, 0, 0])
    assert len(kernels) == 8                                    # 2 per alignment per launcher
    launched.clear()
    rt.Launcher(module, make([], 0), cuda)(Arr(0x1000), Arr(0x2000), err)
    assert launched == []


@pytest.mark.parametrize("case", ["buffers", "error_flag", "chain"])
def test_a_single_kernels_entry_launches_as_the_general_path(monkeypatch, case):
    """What the wrapper calls for a static launch on cuda (`Launcher.entry`: a function of the arrays made
    for their number) hands the driver the grid and parameters the general path with sizes does: at the
    first call (which prepares), later aligned calls (which skip `_direct_call`), a misaligned call and,
    for one kernel, a call from another thread (both through `_direct_call`); `chain`: two kernels, the
    first with a scratch array, the second with the error flag (`_chained`)."""
    error_flag = case != "buffers"
    import ctypes
    import threading

    from flambeau._backends import triton_launch as TL
    from flambeau._device import device
    from flambeau._inductor import triton_runtime as rt
    from flambeau._inductor.codegen_triton import Launch

    class Arr:
        def __init__(self, ptr):
            self.data = types.SimpleNamespace(ptr=ptr)
    fn = types.SimpleNamespace(name="k", key="k")
    a, b, c = (InputBuffer(n, Layout((10,), D.float32)) for n in "abc")
    module = types.SimpleNamespace(kernel=lambda name: fn)
    launched, kernels = [], {}

    def driver(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        k = kernels[f]
        types_ = TL.c_types(k.arg_types)
        addresses = (ctypes.c_void_p * len(types_)).from_address(params)
        launched.append(((gx, gy, gz), [t.from_address(p).value for t, p in zip(types_, addresses)]))
    monkeypatch.setattr(TL, "_driver", [driver, lambda: 0])

    def kernel(self, la, fn, aligned):
        k = TL.kernel_of(types.SimpleNamespace(ptr=len(kernels) + 1), None,
                         tuple(t for t in la.signature().values() if t != "constexpr"), 4, 0, 0)
        kernels[k.function.ptr] = k
        return k
    monkeypatch.setattr(rt.Launcher, "_kernel", kernel)
    general_calls = []
    real = rt.Launcher._direct_call
    monkeypatch.setattr(rt.Launcher, "_direct_call", lambda self, *a: general_calls.append(1) or real(self, *a))
    monkeypatch.setattr(rt, "_cupy", lambda: types.SimpleNamespace(empty=lambda n, dt: Arr(0xA000)))
    cuda = device("cuda")

    def make(sizes, numel):
        if case != "chain":
            return Launch("k1", [a, b, c], sizes, numel, 1024, error_flag=error_flag)
        second = Launch("k2", [a, b, c], sizes, numel, 1024, error_flag=True)
        return Launch("k1", [a, b, c], sizes, numel, 1024, workspace=[("ws0", D.float32, 8)], then=second)
    static = rt.Launcher(module, make([], 5000), cuda)
    general = rt.Launcher(module, make(["s0"], SizeExpr.symbol("s0")), cuda)
    call = static.entry()
    calls = [[Arr(0x1000), Arr(0x2000), Arr(0x3000)], [Arr(0x1100), Arr(0x2100), Arr(0x3100)],
             [Arr(0x1000), Arr(0x2004), Arr(0x3000)], [Arr(0x4000), Arr(0x5000), Arr(0x6000)]]
    err = [Arr(0xE000)] if error_flag else []
    call(*calls[0], *err)
    call(*calls[1], *err)
    assert len(general_calls) == 1                      # the second call: the entry's own launch
    call(*calls[2], *err)                               # misaligned
    t = threading.Thread(target=call, args=(*calls[3], *err))
    t.start()
    t.join()
    call(*calls[3], *err)
    assert len(general_calls) == (3 if case != "chain" else 2)      # (a chain makes a new thread's blocks itself)
    got = launched[:]
    launched.clear()
    for arrays in calls + calls[3:]:
        general(*arrays, 5000, *err)
    want = [(g, [x for i, x in enumerate(v) if i != 3]) for g, v in launched]       # (minus s0)
    assert got == want and len(got) == 5 * (2 if case == "chain" else 1)
    if case == "chain":
        assert got[0] == ((5, 1, 1), [0x1000, 0x2000, 0x3000, 0xA000, 0, 0])
        assert got[1] == ((5, 1, 1), [0x1000, 0x2000, 0x3000, 0xE000, 0, 0])
    else:
        assert got[0] == ((5, 1, 1), [0x1000, 0x2000, 0x3000] + ([0xE000] if error_flag else []) + [0, 0])


class _Mem:
    """A CuPy MemoryPointer over a NumPy buffer: `.ptr`, `+ bytes`."""

    def __init__(self, buf, off=0):
        self.buf, self.off, self.ptr = buf, off, buf.ctypes.data + off

    def __add__(self, n):
        return _Mem(self.buf, self.off + n)


class _CupyLike:
    """CuPy's constructor `ndarray(shape, dtype, memptr=None, strides=None)` over NumPy memory."""

    def __init__(self, shape, dtype, memptr=None, strides=None):
        if memptr is None:
            memptr = _Mem(np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize, np.uint8))
        self.data, self.dtype = memptr, np.dtype(dtype)
        self.a = np.ndarray(shape, dtype, memptr.buf, memptr.off, strides) if all(shape) else np.empty(shape, dtype)
        self.itemsize, self.shape, self.strides = self.dtype.itemsize, self.a.shape, self.a.strides


@pytest.mark.parametrize("shape,strides,offset", [((3, 4), (1, 3), 5), ((2, 5), (5, 1), 0), ((4, 0), (1, 1), 2)])
def test_device_view_is_the_layouts_view_of_the_base(shape, strides, offset):
    """wrapper.device_view (a compiled graph's view outputs on cuda, byte strides worked out once) makes the
    view NumPy's as_strided gives of the same memory; a base of another item size gives the same view as
    `_strided_device`."""
    buf = np.arange(40, dtype=np.float32)
    base = _CupyLike((40,), np.float32, _Mem(buf.view(np.uint8)))
    lay = Layout(shape, D.float32, strides, offset)
    v = wrapper.device_view(lay, 4)(base)
    ref = np.lib.stride_tricks.as_strided(buf[offset:], shape, tuple(4 * s for s in strides)) if all(shape) \
        else np.empty(shape, np.float32)
    assert v.shape == ref.shape and v.dtype == np.float32
    np.testing.assert_array_equal(v.a, ref)
    if all(shape):
        assert v.data.ptr == buf.ctypes.data + 4 * offset and v.strides == ref.strides
    wide = _CupyLike((20,), np.float64, _Mem(np.zeros(160, np.uint8)))
    w, s = wrapper.device_view(lay, 4)(wide), wrapper._strided_device(wide, lay)
    assert (w.shape, w.strides) == (s.shape, s.strides) and (w.data.ptr == s.data.ptr or not all(shape))


def test_unaliased_device_finds_inputs_sharing_an_allocation():
    """The cuda wrapper's in-place check (`wrapper.unaliased_device`, reading each array's `data.mem`):
    True only when the written inputs have allocations of their own, apart from each other and from every
    other input; the same answers as `wrapper.unaliased` (whose owner of a device array is `data.mem`)."""
    def arr(mem):
        return types.SimpleNamespace(data=types.SimpleNamespace(mem=mem, ptr=0))
    m = [object() for _ in range(5)]
    cases = [(((arr(m[0]), arr(m[1])), (arr(m[2]), arr(m[3]))), True),
             (((arr(m[0]), arr(m[0])), (arr(m[2]),)), False),             # two written inputs, one allocation
             (((arr(m[0]), arr(m[1])), (arr(m[2]), arr(m[1]))), False),    # another input on a written one's
             (((arr(m[4]),), ()), True)]
    for (written, others), want in cases:
        assert wrapper.unaliased_device(written, others) is want
        assert wrapper.unaliased(written, others) is want


def test_a_repeated_device_view_is_kept_for_its_base():
    """wrapper.device_view(repeated=True) (a view of a small graph input: a batch norm weight returned
    for the backward) hands out the same view while the base is the same array, and a new view, at the
    new base's memory, for another base; each is the layout's view of its base's memory."""
    lay = Layout((1, 4, 1, 1), D.float32, (4, 1, 1, 1), 0)
    fn = wrapper.device_view(lay, 4, repeated=True)
    bufs = [np.arange(4, dtype=np.float32) + 10 * i for i in range(2)]
    bases = [_CupyLike((4,), np.float32, _Mem(b.view(np.uint8))) for b in bufs]
    first = fn(bases[0])
    assert fn(bases[0]) is first
    other = fn(bases[1])
    assert other is not first and other.data.ptr == bufs[1].ctypes.data and other.shape == (1, 4, 1, 1)
    np.testing.assert_array_equal(other.a.ravel(), bufs[1])
    again = fn(bases[0])
    assert again is not other and again.data.ptr == bufs[0].ctypes.data
    np.testing.assert_array_equal(again.a.ravel(), bufs[0])
    plain = wrapper.device_view(lay, 4)
    assert plain(bases[0]) is not plain(bases[0])               # (not repeated: a view per call)


def test_run_pointers_binds_each_threads_handle_to_the_stream_once(monkeypatch):
    """cudnn.run_pointers (a planned convolution's call) runs the plan on this thread's handle of the device
    bound to the given stream: the handle made once per thread and device, cudnnSetStream called only
    when the stream changes; the pointers handed over in the plan's roles (x, w, y)."""
    import threading

    class Lib:
        def __init__(self):
            self.created, self.bound = 0, []

        def cudnnCreate(self, out):
            self.created += 1
            out._obj.value = 0x100 * self.created
            return 0

        def cudnnSetStream(self, h, stream):
            self.bound.append((h.value, stream))
            return 0
    lib = Lib()
    monkeypatch.setitem(cudnn._state, "lib", lib)
    monkeypatch.setattr(cudnn, "_local", threading.local())
    ran = []
    plan = types.SimpleNamespace(roles=cudnn._GraphPlan.roles.__get__(types.SimpleNamespace(kind="backward_data")),
                                 execute=lambda h, ptrs, dev, stream: ran.append((h.value, ptrs, dev, stream)))
    for stream in (7, 7, 9, 9):
        cudnn.run_pointers("backward_data", plan, 1, 2, 3, 0, stream)
    assert lib.created == 1 and lib.bound == [(0x100, 7), (0x100, 9)]
    assert ran == [(0x100, (3, 1, 2), 0, 7)] * 2 + [(0x100, (3, 1, 2), 0, 9)] * 2
    t = threading.Thread(target=cudnn.run_pointers, args=("backward_data", plan, 1, 2, 3, 0, 9))
    t.start()
    t.join()
    assert lib.created == 2 and lib.bound[-1] == (0x200, 9) and ran[-1][0] == 0x200


def test_arena_temporaries_reach_the_kernels_as_addresses(monkeypatch):
    """A static graph on cuda (fake CuPy, kernels not run: the driver records each launch's parameters)
    passes the arena temporaries that only direct Triton launches use as addresses (`_aptr + offset`,
    wrapper._raw_temporaries): the kernels get the same parameters as when each is an array view of the
    arena: the same offsets into it, the same inputs, the same outputs."""
    import ctypes

    from bench import compiled_host_calls as H
    from flambeau._backends import triton_launch as TL
    from flambeau._decomp import DecompositionMode
    from flambeau._device import device
    from flambeau._inductor import compile_fx, config
    from flambeau._inductor import triton_runtime as rt
    from flambeau._tensor import Tensor
    from flambeau.fx.experimental.proxy_tensor import make_fx
    F = fl.nn.functional
    xp = H._fake_cupy()
    arenas, kernels, launched = [], {}, []
    empty = xp.empty
    xp.empty = lambda shape, dtype=np.float32: arenas.append(empty(shape, dtype)) or arenas[-1]
    xp.ndarray = lambda shape, dtype, memptr=None: H._fake_cupy().ndarray(shape, dtype, memptr) if memptr is not None \
        else xp.empty(shape, dtype)
    monkeypatch.setitem(_backends._backends, "cuda", _backends.Backend("cuda", xp))

    def driver(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        n = len(kernels[f].arg_types)
        addresses = (ctypes.c_void_p * n).from_address(params)
        launched.append((f, [ctypes.c_uint64.from_address(p).value for p in addresses]))
    monkeypatch.setattr(TL, "_driver", [driver, lambda: 0])
    monkeypatch.setattr(TL, "available", lambda: True)

    def kernel(self, la, fn, aligned):
        k = TL.kernel_of(types.SimpleNamespace(ptr=hash(la.name) & 0xFFFF), None,
                         tuple(t for t in la.signature().values() if t != "constexpr"), 4, 0, 0)
        kernels[k.function.ptr] = k
        return k
    monkeypatch.setattr(rt.Launcher, "_kernel", kernel)
    monkeypatch.setattr(config, "backend", "triton")
    monkeypatch.setattr(config, "compile_threads", 1)
    monkeypatch.setattr(rt.triton.knobs.runtime, "interpret", False)      # (code for cuda: not run)

    def fn(x, w, b):
        with DecompositionMode():
            h = F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) * w + b
            return h.sum(-1), h.amax(0) + 1
    cuda = device("cuda")
    rng = np.random.default_rng(0)
    args = [Tensor._make(rng.standard_normal(s).astype(np.float32).view(H._DevArray), cuda)
            for s in ((64, 128), (128,), (128,))]
    inputs = {a._data.ctypes.data: f"in{i}" for i, a in enumerate(args)}

    def run():
        c = compile_fx(make_fx(fn, tracing_mode="fake")(*args), args)
        assert c.artifact is not None and c.artifact.backend == "triton", c.eager_reason
        out = []
        for _ in range(2):                           # (the first call prepares the launches)
            arenas.clear()
            launched.clear()
            c(*args)
            arena = next(a for a in arenas if a.dtype == np.uint8)
            base, names = arena.ctypes.data, {}
            norm = lambda p: inputs.get(p) or (("arena", p - base) if 0 <= p - base < arena.nbytes else  # noqa: E731
                                                names.setdefault(p, f"new{len(names)}"))
            out.append([(f, [norm(p) for p in ps]) for f, ps in launched])
        return c.artifact.wrapper_source, out
    src, got = run()
    assert "_aptr + " in src and got[0] == got[1], src
    monkeypatch.setattr(wrapper.WrapperCodegen, "_raw_temporaries", lambda self: None)
    src_views, want = run()
    assert "_aptr" not in src_views and "_nd(" in src_views
    assert got == want and any(isinstance(p, tuple) for _, ps in got[1] for p in ps)
