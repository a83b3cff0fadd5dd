"""Session 15's cuts of the host cost of an eager cuda training step (issue 11), on CPU: against
PyTorch on cpu tensors, and on the fake cuda device of `bench/eager_host_calls.py` (a fake CuPy
namespace whose arrays are NumPy arrays, a recording cuLaunchKernel) for the cuda branches.

- `Tensor.to(dtype)` (autocast's cast of weights and activations) runs `_to_copy`'s kernel and records
  its node without the dispatcher's frames when nothing would see the call (`views._cast_to`); a
  dispatch mode, a forward-mode tangent or a view whose base changed in place still dispatch.
"""
import numpy as np
import pytest
import torch

import flambeau as fl
from bench import eager_host_calls as E
from flambeau import _backends, _dispatch
from flambeau._backends import triton_launch as TL
from flambeau.utils._python_dispatch import TorchDispatchMode as FlMode
from tests.conftest import op_names_mode


@pytest.fixture
def fake_cuda():
    xp, restore = E.install()
    launches = []
    TL._driver[:] = [lambda *a: launches.append(a), lambda: 0]
    try:
        yield launches
    finally:
        restore()


def _x(shape=(3, 5), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- Tensor.to(dtype) ---------------------------------------------------------------------------------
_CASTS = {
    "leaf": lambda m, x: x.to(m.bfloat16),
    "activation": lambda m, x: (x * 2).to(m.float16),
    "view": lambda m, x: x[1:].to(m.bfloat16),
    "stale_view": lambda m, x: _stale_view(m, x).to(m.bfloat16),
    "view_gains_grad": lambda m, x: _view_gains_grad(m, x).to(m.bfloat16),
    "widen": lambda m, x: x.to(m.bfloat16).to(m.float64),
    "to_int": lambda m, x: (x * 3).to(m.int32).to(m.float32) * x,
    "no_grad": lambda m, x: _no_grad(m, x),
    "overflow": lambda m, x: (x * 1e30).to(m.float16).float() * 0 + x,      # inf silently, as PyTorch
}


def _stale_view(m, x):
    y = x * 1
    v = y[:2]
    y.mul_(3)                        # v's base changed in place after v's node was recorded
    return v


def _view_gains_grad(m, x):
    b = m.zeros(3, 5)
    v = b[1:]
    b.add_(x)                        # v requires grad from here on, through its base
    return v


def _no_grad(m, x):
    with m.no_grad():
        c = x.to(m.float16)
    assert not c.requires_grad and c.grad_fn is None
    return c.float() + x


@pytest.mark.parametrize("name", sorted(_CASTS))
def test_to_dtype_values_and_gradients_as_pytorch(name):
    a = _x()
    g = _x(seed=1)
    out = {}
    for m in (fl, torch):
        x = m.tensor(a, requires_grad=True)
        y = _CASTS[name](m, x)
        y.float().mul(m.tensor(g)[:y.shape[0]]).sum().backward()
        out[m.__name__] = (y, x.grad)
    (fy, fg), (ty, tg) = out["flambeau"], out["torch"]
    assert str(fy.dtype).split(".")[-1] == str(ty.dtype).split(".")[-1]
    assert (fy.grad_fn is None) == (ty.grad_fn is None)
    if ty.grad_fn is not None:
        assert fy.grad_fn.name() == ty.grad_fn.name()
    np.testing.assert_array_equal(fy.detach().float().numpy(), ty.detach().float().numpy())
    np.testing.assert_allclose(fg.numpy(), tg.numpy(), rtol=1.3e-6, atol=1e-5)


def test_to_dtype_skips_the_dispatcher_unless_a_mode_watches(monkeypatch):
    x = fl.tensor(_x(), requires_grad=True)
    real = _dispatch.call_functional
    calls = []
    monkeypatch.setattr(_dispatch, "call_functional", lambda op, *a, **k: calls.append(op.name) or real(op, *a, **k))
    y = x.to(fl.bfloat16)
    assert calls == [] and y.grad_fn.name() == "ToCopyBackward0"
    with op_names_mode() as mode:
        x.to(fl.float16)
    assert mode.names == ["_to_copy"]


def test_to_dtype_records_its_node_without_the_general_recorder(monkeypatch):
    """A cast of a leaf, of an activation and of an up-to-date view records its node in `graph.record_cast`
    (the edges and metadata `record` would make); a view whose base changed in place since goes to `record`,
    which refreshes the view first. Gradients as PyTorch's."""
    from flambeau.autograd import graph
    general = []
    real = graph.record
    monkeypatch.setattr(graph, "record", lambda op, *a, **k: general.append(op.name) or real(op, *a, **k))
    a, g = _x(), _x(seed=1)
    grads = []
    for m in (fl, torch):
        x = m.tensor(a, requires_grad=True)
        h = x * 2
        casts = [x.to(m.bfloat16), h.to(m.float16), h[1:].to(m.bfloat16)]
        if m is fl:
            assert "_to_copy" not in general, general   # the casts took record_cast
            leaf, act, view = (c.grad_fn for c in casts)
            assert leaf._next_nodes[0] is graph.accumulator(x) and leaf._next_nrs == (0,)
            assert act._next_nodes == (h.grad_fn,) and act._in_meta == (h.grad_fn._out_meta[0],)
            assert act._saved["self_meta"].dtype is fl.float32 and tuple(view._saved["self_meta"].shape) == (2, 5)
            assert act._out_meta[0][1] is fl.float16
        v = h[1:]
        h.mul_(1)                                       # v's base changed in place: its node is refreshed
        casts.append(v.to(m.bfloat16))
        if m is fl:
            assert general[-1] == "_to_copy", general
        sum(c.float().mul(m.tensor(g)[:c.shape[0]]).sum() for c in casts).backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1.3e-6, atol=1e-5)


def test_shared_output_metadata_names_each_outputs_own_device(fake_cuda):
    """Output metadata is shared per (shape, dtype) and checked for its device: outputs of one shape and dtype on
    cpu and on (fake) cuda, alternately, each keep their own device (a zero gradient is made there)."""
    devices = []
    for _ in range(2):
        for x in (fl.ones(2, 3, requires_grad=True), E.cuda_tensor((2, 3), requires_grad=True)):
            devices.append((x * 2).grad_fn._out_meta[0][2])
    assert [d.type for d in devices] == ["cpu", "cuda"] * 2


def test_to_dtype_propagates_a_forward_tangent_as_pytorch():
    a, t = _x(), _x(seed=2)
    res = {}
    for m in (fl, torch):
        fwAD = m.autograd.forward_ad
        with fwAD.dual_level():
            d = fwAD.make_dual(m.tensor(a), m.tensor(t))
            res[m.__name__] = fwAD.unpack_dual(d.to(m.float64)).tangent.numpy()
    np.testing.assert_array_equal(res["flambeau"], res["torch"])


class _Through(FlMode):
    """A dispatch mode that changes nothing: with it active every op takes the dispatcher's path."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_autocast_layer_step_bit_for_bit_as_the_dispatched_casts(device):
    """A bfloat16 autocast linear + layer norm step: output and every gradient the same bits with the
    casts taken directly and through the dispatcher (a pass-through mode), and close to PyTorch."""
    rng = np.random.default_rng(5)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 6, 16), (12, 16), (12,)))
    runs = {}
    for name, mod, ctx in (("direct", fl, None), ("dispatched", fl, _Through), ("torch", torch, None)):
        dev = device if mod is fl or device == "cpu" else "cuda"
        xt, wt, bt = (mod.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
        with mod.autocast(device, dtype=mod.bfloat16):
            if ctx is not None:
                with ctx():
                    y = mod.nn.functional.layer_norm(mod.nn.functional.linear(xt, wt, bt), (12,))
            else:
                y = mod.nn.functional.layer_norm(mod.nn.functional.linear(xt, wt, bt), (12,))
        (y.float() ** 2).sum().backward()
        runs[name] = [t.detach().float().cpu().numpy() for t in (y, xt.grad, wt.grad, bt.grad)]
    for a, d, t in zip(runs["direct"], runs["dispatched"], runs["torch"]):
        np.testing.assert_array_equal(a, d)
        np.testing.assert_allclose(a, t, rtol=5e-2, atol=5e-2)


def test_to_dtype_on_cuda_launches_one_cast_and_records_its_node(fake_cuda):
    x = E.cuda_tensor((4, 6), requires_grad=True)
    act = x * 2
    y = act.to(fl.bfloat16)
    assert len(fake_cuda) == 1 and y.dtype is fl.bfloat16 and type(y._data) is E.DevArray
    assert y.device is x.device and y.grad_fn.name() == "ToCopyBackward0"
    assert y.grad_fn.next_functions[0][0] is act.grad_fn
    # the node's derivative casts back on the same device: a second launch, float32 again
    with fl.no_grad():
        (gx,) = y.grad_fn.apply([E.cuda_tensor((4, 6), E.BF16, seed=3)])
    assert len(fake_cuda) == 2 and gx.dtype is fl.float32 and gx.device is x.device


def test_cuda_casts_call_the_cast_kernel_without_to_copys_frames(fake_cuda, monkeypatch):
    """On cuda, `Tensor.to(dtype)` (autocast's cast) and the cast's derivative call `cuda_cast.cast`
    directly (the first thing `_to_copy`'s kernel would do), not `_to_copy`'s kernel; each launches one
    cast into the dtype asked for. Fails when either goes back through `_to_copy.kernel`."""
    from flambeau._ops import views
    kernel_calls = []
    real = views._to_copy.kernel
    monkeypatch.setattr(views._to_copy, "kernel", lambda *a, **k: kernel_calls.append(1) or real(*a, **k))
    x = E.cuda_tensor((4, 6), requires_grad=True)
    y = (x * 2).to(fl.bfloat16)
    with fl.no_grad():
        (gx,) = y.grad_fn.apply([E.cuda_tensor((4, 6), E.BF16, seed=3)])
    assert kernel_calls == [] and len(fake_cuda) == 2
    assert y.dtype is fl.bfloat16 and y._data.dtype == E.BF16 and gx.dtype is fl.float32
    assert gx._data.dtype == np.float32 and type(gx._data) is E.DevArray and gx.device is x.device
    z = (x * 2).to(fl.int32)                    # not a cast cuda_cast takes: _to_copy's kernel (CuPy's copy)
    assert kernel_calls == [1] and z.dtype is fl.int32


# ---- matmul's output shape: x @ W directly ----------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (4, 1)), ((1, 4), (4, 6)),
                                   ((3, 4), (5, 6)), ((2, 3, 4), (3, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                   ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (1, 4, 5)), ((0, 4), (4, 3))])
def test_matmul_shapes_and_errors_as_pytorch(sa, sb):
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    try:
        want = tuple(torch.matmul(torch.tensor(a), torch.tensor(b)).shape)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=str(e).split("(")[0].strip()):
            fl.matmul(fl.tensor(a), fl.tensor(b))
        return
    assert tuple(fl.matmul(fl.tensor(a), fl.tensor(b)).shape) == want
    assert tuple(fl.matmul(fl.empty(sa, device="meta"), fl.empty(sb, device="meta")).shape) == want


# ---- cuBLASLt products: its output array itself, no reshape view on top ----------------------------
@pytest.fixture
def fake_cublaslt(fake_cuda, monkeypatch):
    from flambeau._backends import cublaslt as L
    for name in ("_handles", "_workspaces", "_plans", "_plan_cache", "_misaligned_cache", "_layouts"):
        monkeypatch.setattr(L, name, {})
    monkeypatch.setattr(L, "WORKSPACE_BYTES", 256)
    monkeypatch.setattr(L, "calls", dict.fromkeys(L.calls, 0))
    restore = E.fake_cublaslt()
    yield L
    restore()


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_linear_and_its_gradients_take_the_cublaslt_output_as_it_is(fake_cublaslt, lead):
    x = E.cuda_tensor(lead + (16,), requires_grad=True)
    w, b = E.cuda_tensor((8, 16), requires_grad=True, seed=1), E.cuda_tensor((8,), requires_grad=True, seed=2)
    y = fl.nn.functional.linear(x, w, b)
    assert tuple(y.shape) == lead + (8,) and fake_cublaslt.calls["gemm"] == 1
    assert y._data.base is None                   # gemm's array, not a view of it
    with fl.no_grad():
        gx, gw, gb = y.grad_fn.apply([E.cuda_tensor(lead + (8,), seed=3)])
    assert fake_cublaslt.calls["gemm"] == 3
    assert tuple(gx.shape) == lead + (16,) and gx._data.base is None
    assert tuple(gw.shape) == (8, 16) and gw._data.base is None
    z = fl.matmul(x, w.mT)
    assert tuple(z.shape) == lead + (8,) and z._data.base is None and fake_cublaslt.calls["gemm"] == 4


def test_linear_bias_gradient_on_cuda_is_the_column_sums_array(fake_cublaslt, monkeypatch):
    """A cuda linear layer's bias gradient is the Triton column sum of the (rows, out) gradient, its array as it
    is (`reduction.cuda_rows_sum`: no dispatch of `sum`'s arguments); where the column sum declines, `sum`'s
    kernel computes it (NumPy's here), and both are the sum PyTorch gives."""
    from flambeau import _backends as B
    from flambeau._ops import reduction as R
    calls = []

    def column_sum(x, rows, out_dtype):
        calls.append((x.shape, rows, out_dtype))
        return np.asarray(x, np.float64).sum(0).astype(out_dtype).view(E.DevArray)
    accept = [True]
    fake = type("TS", (), {"supported": staticmethod(lambda x, rows, out: accept[0] and x.flags.c_contiguous),
                           "column_sum": staticmethod(column_sum)})
    monkeypatch.setattr(R, "_triton_sum", [fake])
    monkeypatch.setattr(R.triton_launch, "available", lambda: True)
    monkeypatch.setattr(B, "_cupy_namespace", [B.array_namespaces["cuda"]])
    entered, real = [], R._cuda_column_sum              # `sum`'s cuda kernel, entered through dispatch's frames
    monkeypatch.setattr(R, "_cuda_column_sum", lambda *a: entered.append(a[1]) or real(*a))
    x = E.cuda_tensor((2, 3, 16), requires_grad=True)
    w, b = E.cuda_tensor((8, 16), requires_grad=True, seed=1), E.cuda_tensor((8,), requires_grad=True, seed=2)
    g = E.cuda_tensor((2, 3, 8), seed=3)
    want = torch.tensor(np.asarray(g._data)).sum((0, 1)).numpy()
    for taken in (True, False):
        accept[0] = taken
        y = fl.nn.functional.linear(x, w, b)
        with fl.no_grad():
            gb = y.grad_fn.apply([g])[2]
        assert tuple(gb.shape) == (8,) and gb.dtype is fl.float32
        np.testing.assert_allclose(np.asarray(gb._data), want, rtol=1.3e-6, atol=1e-5)
        assert calls == [((6, 8), 6, np.dtype(np.float32))]
        assert entered == ([] if taken else [0])


# ---- LayerNorm's fused backward: parameter gradients are the rows of its sums, as they are ---------
class _Rows:
    """The fused backward's (2, cols) sums as the kernel reads them: row 0 (weight), row 1 (bias)."""

    def __init__(self, w, b):
        self.rows = (w, b)

    def __getitem__(self, i):
        return self.rows[i]


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_layer_norm_backward_takes_the_fused_sums_rows_as_parameter_gradients(monkeypatch, param_dtype):
    from flambeau._ops import norm_loss
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)
    gw_row, gb_row = (g * x).sum((0, 1)), g.sum((0, 1))
    gx = np.empty_like(x)
    fused = type("Fused", (), {"backward": staticmethod(lambda *a: (gx, _Rows(gw_row, gb_row)))})
    monkeypatch.setattr(norm_loss, "_cuda_norm", lambda xp, x, ndims, *others: fused)
    pdt = np.dtype(getattr(fl, param_dtype).np)
    w, b = np.ones(8, pdt), np.zeros(8, pdt)
    mean, rstd = np.zeros((2, 3, 1), np.float32), np.ones((2, 3, 1), np.float32)
    rx, rw, rb = norm_loss.native_layer_norm_backward.kernel(np, g, x, (8,), mean, rstd, w, b)
    assert rx is gx
    if param_dtype == "float32":
        assert rw is gw_row and rb is gb_row
    else:
        ref = torch.tensor(np.stack([gw_row, gb_row])).to(torch.bfloat16).float().numpy()
        assert rw.dtype == pdt and rb.dtype == pdt
        np.testing.assert_array_equal(np.stack([rw, rb]).astype(np.float32), ref)


# ---- BatchNorm's num_batches_tracked += 1 -------------------------------------------------------------
def test_batch_norm_counts_a_cuda_batch_with_one_in_place_kernel(fake_cuda, monkeypatch):
    """A training BatchNorm's num_batches_tracked += 1 on cuda is one int64 add kernel writing over the
    counter itself (`_count_batch`: no dispatched add_, no new array, no copy back), the version counter
    bumped as by add_; with a dispatch mode on (graph capture, fake tensors) add_ is dispatched as before.
    On cpu the count after training steps is PyTorch's."""
    from flambeau._backends import cuda_binary
    from flambeau.nn.modules import batchnorm
    ran = []

    def launch(f, n, args):                          # the kernel: z = x + s, recorded
        ran.append((f, args))
        args[2][...] = args[0] + args[1]
    monkeypatch.setattr(cuda_binary, "_launch", launch)
    monkeypatch.setattr(cuda_binary, "_function", lambda cupy, name, dt, kind, dev: (name, dt.name, kind))
    counter = E.cuda_tensor((), np.int64)
    counter._data[...] = 5
    version = counter._version[0]
    copies = []
    monkeypatch.setattr(_dispatch, "_copy_same_dtype", lambda dst, src: copies.append(dst) or dst.__setitem__(..., src))
    with fl.no_grad():
        assert batchnorm._count_batch(counter)
    (f, (a, b, out, n)), = ran
    assert f == ("add", "int64", "ts") and a is counter._data and out is a and b == 1 and n == 1
    assert int(counter._data) == 6 and counter._version[0] == version + 1 and not copies
    mode = op_names_mode()
    with fl.no_grad(), mode:
        assert not batchnorm._count_batch(counter)
        counter.add_(1)
    assert "add_" in mode.names and int(counter._data) == 7 and counter._version[0] == version + 2
    assert len(ran) == 1 and copies == [counter._data]          # the functional add's result, copied back

    seen = []
    real = batchnorm._count_batch
    monkeypatch.setattr(batchnorm, "_count_batch", lambda t: seen.append(t) or real(t))
    x = _x((4, 3, 5, 5))
    counts = []
    for m in (fl, torch):
        bn = m.nn.BatchNorm2d(3)
        for _ in range(3):
            bn(m.tensor(x))
        bn.eval()(m.tensor(x))
        counts.append(int(bn.num_batches_tracked))
    assert counts == [3, 3] and len(seen) == 3          # (cpu: False, add_ taken)


# ---- the fused activation kernels' lookup ------------------------------------------------------------
def test_relu_on_cuda_takes_the_fused_kernel_each_way(fake_cuda, monkeypatch):
    """ReLU of a cuda bfloat16 activation runs triton_pointwise's kernel forward and backward (one launch
    each, of kind RELU: `activation._fused_pointwise` found the module and it took the arrays), the same
    on a second call; an int64 tensor (not a kernel dtype) takes the general path. The kernels' values
    are checked under Triton's interpreter (tests/scripts/triton_pointwise_interp.py)."""
    from flambeau._backends import triton_launch as TL, triton_pointwise as TP
    launched = []
    monkeypatch.setattr(TL, "_available", [True])
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, const, **kw: (fn.__name__, const["KIND"]))
    monkeypatch.setattr(TL, "launch", lambda k, grid, *a: launched.append(k) or a[-2].__setitem__(..., 0))
    monkeypatch.setattr(TP, "cupy", _backends.array_namespaces["cuda"])
    monkeypatch.setattr(TP, "_kernels", {})
    for _ in range(2):
        launched.clear()
        x = E.cuda_tensor((4, 6), E.BF16, requires_grad=True)
        fl.nn.functional.relu(x).backward(E.cuda_tensor((4, 6), E.BF16, seed=1))     # a dense gradient
        assert launched == [("_act_fwd", TP.RELU), ("_act_bwd", TP.RELU)]
    launched.clear()
    with fl.no_grad():
        fl.nn.functional.relu(E.cuda_tensor((4, 6), np.int64))
    assert launched == []
