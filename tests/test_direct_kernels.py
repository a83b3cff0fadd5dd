"""Derivatives that run op kernels on arrays directly (`_ops._helpers.direct_device` / `direct_call`),
skipping the dispatcher when nothing would see the dispatched calls: a backward without create_graph,
no dispatch mode, no FX hook, dense tensors without tangents on one device.

The linear layer's backward is the first such derivative (six dispatched reshape/transpose/product/
sum calls per layer otherwise). Its gradients must equal, bit for bit, those of the dispatched path
(the same kernels run), and PyTorch's; the ops it skips must not reach the dispatcher; anything that
observes dispatch (create_graph, a dispatch mode, forward-mode tangents) takes the dispatched path.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

import flambeau
from flambeau import _dispatch
from flambeau._ops import linear as linear_mod
from tests.conftest import op_names_mode

_SHAPES = {"2d": ((5, 3), (4, 3), (4,)), "3d": ((2, 5, 3), (4, 3), (4,)), "3d_nobias": ((2, 5, 3), (4, 3), None)}
_DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}
_TOL = {"float32": dict(rtol=1.3e-6, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12),
        "bfloat16": dict(rtol=1.6e-2, atol=1e-5)}


def _cases():
    for shape, dt in itertools.product(_SHAPES, _DTYPES):
        n = 3 if _SHAPES[shape][2] is not None else 2
        for need in itertools.product((False, True), repeat=n):
            if any(need):
                yield pytest.param(shape, dt, need, id=f"{shape}-{dt}-{''.join('g' if x else '-' for x in need)}")


def _grads(m, arrays, need, device, grad):
    ts = [None if a is None else m.tensor(a, device=device).requires_grad_(n) for a, n in zip(arrays, need + (False,))]
    out = m.nn.functional.linear(*ts)
    out.backward(m.tensor(grad, device=device))
    return [None if t is None or t.grad is None else t.grad for t in ts]


class _Names:
    """The ops that reach the dispatcher's autograd/kernel layer while it is active."""

    def __init__(self):
        self.names = []

    def __enter__(self):
        real = self.real = _dispatch.call_functional

        def counting(op, args, kwargs, record=True):
            self.names.append(op.name)
            return real(op, args, kwargs, record)
        _dispatch.call_functional = counting
        return self

    def __exit__(self, *exc):
        _dispatch.call_functional = self.real


def _run_case(shape, dt, need, device):
    rng = np.random.default_rng(0)
    arrays = [None if s is None else rng.standard_normal(s).astype(np.float32).astype(_DTYPES[dt])
              for s in _SHAPES[shape]]
    out_shape = _SHAPES[shape][0][:-1] + (_SHAPES[shape][1][0],)
    grad = rng.standard_normal(out_shape).astype(np.float32).astype(_DTYPES[dt])
    with _Names() as fast:
        got = _grads(flambeau, arrays, need, device, grad)
    orig = linear_mod.direct_device
    linear_mod.direct_device = lambda *ts: None         # the dispatched derivative
    try:
        with _Names() as slow:
            ref = _grads(flambeau, arrays, need, device, grad)
    finally:
        linear_mod.direct_device = orig
    return arrays, grad, got, ref, fast.names, slow.names


@pytest.mark.parametrize("shape,dt,need", list(_cases()))
def test_linear_backward_on_arrays_equals_the_dispatched_derivative_and_pytorch(shape, dt, need):
    arrays, grad, got, ref, fast, slow = _run_case(shape, dt, need, "cpu")
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if g is not None:
            assert g.dtype == r.dtype and g.shape == r.shape
            np.testing.assert_array_equal(g.float().numpy(), r.float().numpy())     # the same kernels ran
    # no product, transpose, reshape or sum reached the dispatcher in backward (the forward's linear did)
    assert [n for n in fast if n != "linear"] == [], fast
    assert any(n in ("matmul", "sum.dim_IntList") for n in slow), slow
    tdt = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[dt]
    ts = [None if a is None else torch.tensor(a.astype(np.float64), dtype=tdt).requires_grad_(n)
          for a, n in zip(arrays, need + (False,))]
    torch.nn.functional.linear(*ts).backward(torch.tensor(grad.astype(np.float64), dtype=tdt))
    for g, t in zip(got, ts):
        if t is not None and t.grad is not None:
            np.testing.assert_allclose(g.float().numpy(), t.grad.float().numpy(), **_TOL[dt])


def test_create_graph_takes_the_dispatched_path_and_second_derivatives_match_pytorch():
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), rng.standard_normal(2)
    res = {}
    for m in (flambeau, torch):
        X, W, B = (m.tensor(a, requires_grad=True) for a in (x, w, b))
        out = (m.nn.functional.linear(X, W, B) ** 2).sum()
        gx, gw = m.autograd.grad(out, (X, W), create_graph=True)
        (gx.sum() + (gw ** 2).sum()).backward()
        res[m.__name__] = [t.detach().numpy() for t in (gx, gw, X.grad, W.grad, B.grad)]
    for f, t in zip(res["flambeau"], res["torch"]):
        np.testing.assert_allclose(f, t, rtol=1e-10, atol=1e-12)


def test_a_dispatch_mode_sees_every_op_of_the_derivative():
    x = flambeau.randn(2, 5, 3, requires_grad=True)
    w = flambeau.randn(4, 3, requires_grad=True)
    b = flambeau.randn(4, requires_grad=True)
    out = flambeau.nn.functional.linear(x, w, b)
    with op_names_mode() as mode:
        out.backward(flambeau.ones_like(out))
    assert mode.names.count("matmul") == 2 and any(n.startswith("sum") for n in mode.names), mode.names


def test_direct_device_declines_what_dispatch_must_see():
    from flambeau._ops._helpers import direct_device
    a, b = flambeau.randn(2, 2), flambeau.randn(2, 2)
    assert direct_device(a, b) is None                      # grad mode on: calls may be recorded
    with flambeau.no_grad():
        assert direct_device(a, None, b) is a._device
        assert direct_device(a, flambeau.randn(2, 2, device="meta")) is None
        assert direct_device(flambeau.randn(2, 2, device="meta")) is None
        assert direct_device(a, np.ones((2, 2))) is None
        with op_names_mode():
            assert direct_device(a, b) is None
    import flambeau.autograd.forward_ad as fwAD
    with fwAD.dual_level(), flambeau.no_grad():
        d = fwAD.make_dual(a, flambeau.ones_like(a))
        assert direct_device(d, b) is None


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dt,need", [c for c in _cases() if "bfloat16" in c.id or "float32" in c.id])
def test_linear_backward_on_cuda_arrays_equals_the_dispatched_derivative_and_pytorch(shape, dt, need):
    arrays, grad, got, ref, fast, slow = _run_case(shape, dt, need, "cuda")
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if g is not None:
            np.testing.assert_array_equal(g.float().cpu().numpy(), r.float().cpu().numpy())
    assert [n for n in fast if n != "linear"] == [], fast
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt]
    ts = [None if a is None else torch.tensor(a.astype(np.float32), dtype=tdt, device="cuda").requires_grad_(n)
          for a, n in zip(arrays, need + (False,))]
    torch.nn.functional.linear(*ts).backward(torch.tensor(grad.astype(np.float32), dtype=tdt, device="cuda"))
    for g, t in zip(got, ts):
        if t is not None and t.grad is not None:
            np.testing.assert_allclose(g.float().cpu().numpy(), t.grad.float().cpu().numpy(),
                                       **(_TOL[dt] if dt == "bfloat16" else dict(rtol=1e-4, atol=1e-4)))


def test_cast_backward_on_arrays_equals_the_dispatched_derivative_and_pytorch():
    """Autocast's casts (bf16 copies of fp32 weights and activations) get their gradient cast back by the
    kernel on the array: the same values and dtypes as the dispatched `_to_copy`, and PyTorch's."""
    from flambeau._ops import views as views_mod
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((6, 8)), rng.standard_normal((5, 8)), rng.standard_normal(5)

    def run(m, names=None):
        X, W, B = (m.tensor(a, dtype=m.float32, requires_grad=True) for a in (x, w, b))
        with m.autocast("cpu", dtype=m.bfloat16):
            out = m.nn.functional.linear(X, W, B)
        loss = (out.float() ** 2).sum()
        if names is None:
            loss.backward()
        else:
            with names:
                loss.backward()
        return [t.grad for t in (X, W, B)]
    fast = _Names()
    got = run(flambeau, fast)
    orig = views_mod.direct_device
    views_mod.direct_device = lambda *ts: None
    try:
        slow = _Names()
        ref = run(flambeau, slow)
    finally:
        views_mod.direct_device = orig
    assert "_to_copy" not in fast.names and "_to_copy" in slow.names, (fast.names, slow.names)
    want = run(torch)
    for g, r, t in zip(got, ref, want):
        assert g.dtype == r.dtype == flambeau.float32
        np.testing.assert_array_equal(g.numpy(), r.numpy())
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1.6e-2, atol=1e-2)


def _fast_and_dispatched(run, *modules):
    """`run(names)` with the array paths on, then with `direct_device` declining in `modules`."""
    fast = _Names()
    got = run(flambeau, fast)
    saved = [m.direct_device for m in modules]
    for m in modules:
        m.direct_device = lambda *ts: None
    try:
        slow = _Names()
        ref = run(flambeau, slow)
    finally:
        for m, f in zip(modules, saved):
            m.direct_device = f
    return got, ref, fast.names, slow.names


def _same_grads(got, ref, want, tol):
    for g, r, t in zip(got, ref, want):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g.float().numpy(), r.float().numpy())
        np.testing.assert_allclose(g.float().numpy(), t.float().numpy(), **tol)


def test_view_and_transpose_backward_on_arrays_equal_the_dispatched_derivatives_and_pytorch():
    """A non-contiguous gradient reaching a view (the attention's head split) is copied by the reshape."""
    from flambeau._ops import views as views_mod
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 2, 4, 6))

    def run(m, names=None):
        X = m.tensor(x, requires_grad=True)
        y = X.view(2, 6, 2, 4).transpose(1, 2).transpose(2, 3)          # (2, 2, 4, 6)
        loss = (y * m.tensor(w)).sum()
        with names or _Names():
            loss.backward()
        return [X.grad]
    got, ref, fast, slow = _fast_and_dispatched(run, views_mod)
    assert not {"view", "transpose.int", "clone"} & set(fast), fast
    assert {"view", "transpose.int"} <= set(slow), slow
    _same_grads(got, ref, run(torch), dict(rtol=1e-12, atol=1e-12))


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_engine_sums_reduces_and_casts_gradients_on_arrays_as_dispatched_and_pytorch(dt):
    """The engine's own work: two gradients of one tensor summed, a broadcast input's gradient summed
    down to its shape, a gradient cast to its input's dtype (fp32 + bf16 -> fp32 output)."""
    from flambeau.autograd import engine
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((3, 1), (2, 3, 4), (4,)))

    def run(m, names=None):
        tdt = getattr(m, dt)
        A = m.tensor(a, requires_grad=True)
        B = m.tensor(b, dtype=tdt, requires_grad=True)
        C = m.tensor(c, requires_grad=True)
        y = (A + B) * C + A.exp()                 # A: broadcast sum + cast back from B's promotion
        loss = (y * y).sum()
        with names or _Names():
            loss.backward()
        return [A.grad, B.grad, C.grad]
    got, ref, fast, slow = _fast_and_dispatched(run, engine)
    assert not {"add.Tensor", "sum.dim_IntList", "view", "_to_copy"} & set(fast), fast
    assert {"add.Tensor", "sum.dim_IntList"} <= set(slow), slow
    _same_grads(got, ref, run(torch), _TOL[dt] if dt == "bfloat16" else dict(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("how", ["sum_all", "sum_dims", "sum_keepdim", "mean_dim", "mean_all"])
def test_reduction_backward_on_arrays_equals_the_dispatched_derivative_and_pytorch(how):
    """sum/mean's gradient broadcast back to the input (`reduction.expand_reduced`) by the unsqueeze and
    expand kernels on the arrays, not dispatched views."""
    from flambeau._ops import reduction as reduction_mod
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4, 5))
    w = {"sum_dims": (4,), "sum_keepdim": (3, 1, 5), "mean_dim": (3, 4)}
    w = rng.standard_normal(w[how]) if how in w else None

    def run(m, names=None):
        X = m.tensor(x, requires_grad=True)
        y = {"sum_all": lambda: X.sum(), "sum_dims": lambda: X.sum((0, 2)), "sum_keepdim": lambda: X.sum(1, keepdim=True),
             "mean_dim": lambda: X.mean(-1), "mean_all": lambda: X.mean()}[how]()
        loss = y if w is None else (y * m.tensor(w)).sum()
        with names or _Names():
            loss.backward()
        return [X.grad]
    got, ref, fast, slow = _fast_and_dispatched(run, reduction_mod)
    assert not {"unsqueeze", "expand"} & set(fast), fast
    assert "expand" in slow, slow
    _same_grads(got, ref, run(torch), dict(rtol=1e-12, atol=1e-12))


# ---- the convolution's backward ----------------------------------------------------------------------
_CONV_CASES = {  # x shape, w shape, bias, kwargs, transposed
    "3x3_stride2": ((2, 4, 9, 9), (6, 4, 3, 3), False, dict(stride=2, padding=1), False),
    "1x1_bias": ((2, 4, 5, 5), (6, 4, 1, 1), True, {}, False),
    "groups_dilation": ((2, 4, 9, 9), (6, 2, 3, 3), False, dict(padding=2, dilation=2, groups=2), False),
    "transposed": ((2, 4, 5, 5), (4, 3, 3, 3), True, dict(stride=2, padding=1, output_padding=1), True),
}


def _conv_grads(m, arrays, case, channels_last=False, device="cpu", dtype="float64"):
    xs, ws, has_b, kw, transposed = _CONV_CASES[case]
    x, w, b, g = arrays
    dt = getattr(m, dtype)
    ts = [m.tensor(a, device=device).to(dt).requires_grad_() for a in (x, w) + ((b,) if has_b else ())]
    if channels_last:
        ts[0] = ts[0].detach().contiguous(memory_format=m.channels_last).requires_grad_()
    fn = m.nn.functional.conv_transpose2d if transposed else m.nn.functional.conv2d
    out = fn(ts[0], ts[1], ts[2] if has_b else None, **kw)
    out.backward(m.tensor(g, device=device).to(dt))
    return [t.grad for t in ts]


def _conv_case(case, channels_last, device="cpu", dtype="float64"):
    """(flambeau's gradients, the dispatched derivative's, PyTorch's, ops dispatched in each flambeau run)."""
    from flambeau._ops import nn_conv
    xs, ws, has_b, kw, transposed = _CONV_CASES[case]
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[1] if transposed else ws[0])
    with torch.no_grad():
        fn = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        g = rng.standard_normal(tuple(fn(torch.tensor(x), torch.tensor(w), None, **kw).shape))
    arrays = (x, w, b, g)
    with _Names() as fast:
        got = _conv_grads(flambeau, arrays, case, channels_last, device, dtype)
    orig = nn_conv.direct_device
    nn_conv.direct_device = lambda *ts: None         # the dispatched derivative
    try:
        with _Names() as slow:
            ref = _conv_grads(flambeau, arrays, case, channels_last, device, dtype)
    finally:
        nn_conv.direct_device = orig
    return got, ref, _conv_grads(torch, arrays, case, channels_last, device, dtype), fast.names, slow.names


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("case", list(_CONV_CASES))
def test_conv_backward_on_arrays_equals_the_dispatched_derivative_and_pytorch(case, channels_last):
    """The convolution's derivative runs its input- and weight-gradient kernels on the arrays in a backward
    without create_graph: no `convolution` or `_convolution_weight_grad` reaches the dispatcher there, and
    the gradients (values and layouts) equal the dispatched derivative's, bit for bit, and PyTorch's (the
    strides of dims of size 1 aside)."""
    got, ref, want, fast, slow = _conv_case(case, channels_last)
    assert fast.count("convolution") == 1 and "_convolution_weight_grad" not in fast, fast     # (the forward's)
    assert slow.count("convolution") == 2 and "_convolution_weight_grad" in slow, slow
    for f, r, t in zip(got, ref, want):
        assert f.stride() == r.stride()
        assert [s for s, n in zip(f.stride(), f.shape) if n != 1] == [s for s, n in zip(t.stride(), t.shape) if n != 1]
        np.testing.assert_array_equal(f.numpy(), r.numpy())
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("case", list(_CONV_CASES))
def test_conv_backward_on_cuda_arrays_equals_the_dispatched_derivative_and_pytorch(case, channels_last, dtype,
                                                                                    monkeypatch):
    from flambeau.backends import cudnn
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)      # exact float32, as flambeau's here
    with cudnn.flags(deterministic=True):
        got, ref, want, fast, slow = _conv_case(case, channels_last, "cuda", dtype)
    assert fast.count("convolution") == 1 and "_convolution_weight_grad" not in fast, fast
    for f, r, t in zip(got, ref, want):
        assert f.stride() == r.stride() and f.dtype == r.dtype
        np.testing.assert_array_equal(f.float().cpu().numpy(), r.float().cpu().numpy())
        np.testing.assert_allclose(f.float().cpu().numpy(), t.float().cpu().numpy(),
                                   **(dict(rtol=3e-2, atol=5e-2) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-4)))


def test_conv_double_backward_takes_the_dispatched_path_and_matches_pytorch():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    res = {}
    for m in (flambeau, torch):
        X, W = m.tensor(x, requires_grad=True), m.tensor(w, requires_grad=True)
        out = (m.nn.functional.conv2d(X, W, padding=1) ** 2).sum()
        gx, gw = m.autograd.grad(out, (X, W), create_graph=True)
        (gx.square().sum() + gw.square().sum()).backward()
        res[m.__name__] = [t.detach().numpy() for t in (gx, gw, X.grad, W.grad)]
    for f, t in zip(res["flambeau"], res["torch"]):
        np.testing.assert_allclose(f, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_on_arrays_equals_the_dispatched_derivative_and_pytorch(dt, affine):
    """BatchNorm's derivative runs native_batch_norm_backward's kernel on the arrays (no dispatch: one per
    BatchNorm layer a step), with the dispatched path's gradients bit for bit and PyTorch's values; the
    statistics' gradient term (a use of the saved mean) still flows."""
    from flambeau._ops import norm_loss
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((4, 3, 5, 5)), rng.standard_normal((4, 3, 5, 5))

    def run(m, names=None):
        bn = m.nn.BatchNorm2d(3, affine=affine)
        X = m.tensor(x, dtype=getattr(m, dt), requires_grad=True)
        if dt == "bfloat16":
            bn = bn.to(m.bfloat16)
        y = bn(X)
        with names or _Names():
            y.backward(m.tensor(g, dtype=getattr(m, dt)))
        return [X.grad] + ([bn.weight.grad, bn.bias.grad] if affine else [])
    got, ref, fast, slow = _fast_and_dispatched(run, norm_loss)
    assert "native_batch_norm_backward" not in fast and "native_batch_norm_backward" in slow, (fast, slow)
    _same_grads(got, ref, run(torch), dict(rtol=1.6e-2, atol=1e-3) if dt == "bfloat16" else dict(rtol=1e-5, atol=1e-5))


def test_batch_norm_module_reads_its_parameters_and_buffers_from_their_stores(monkeypatch):
    """BatchNorm's forward reads weight, bias and the running buffers from `_parameters`/`_buffers`, not
    through Module.__getattr__ (the fallback of a failed lookup, ~0.9 us a name): none of those names
    reaches it; a weight moved out of `_parameters` (weight_norm) is still found as PyTorch finds it."""
    from flambeau.nn.modules.module import Module
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)

    def run(m, norm):
        bn = m.nn.BatchNorm2d(3)
        with (m.no_grad()):
            bn.weight.copy_(m.tensor([0.5, 2.0, -1.0])), bn.bias.copy_(m.tensor([0.1, 0.2, 0.3]))
        if norm:
            bn = m.nn.utils.weight_norm(bn, name="weight", dim=0)
        xt = m.tensor(x)
        seen.clear()
        y = bn(xt)
        names = set(seen)
        return (y, bn.running_mean, bn.running_var, bn.num_batches_tracked), names
    real, seen = Module.__getattr__, []
    monkeypatch.setattr(Module, "__getattr__", lambda self, name: seen.append(name) or real(self, name))
    for norm in (False, True):
        got, names = run(flambeau, norm)
        assert not {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"} & names, names
        for g, t in zip(got, run(torch, norm)[0]):
            np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
