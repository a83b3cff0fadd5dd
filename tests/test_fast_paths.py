"""The eager fast paths that bench/cpu_models.py made (a script's get_batch, small products), each
against PyTorch on the inputs that take the fast path and on its edges that must not."""
import numpy as np
import pytest
import torch

import flambeau


def _pair(a, **kw):
    return flambeau.tensor(a, **kw), torch.tensor(a, **kw)


def _same(f, t):
    assert f.dtype.__repr__().split(".")[-1] == str(t.dtype).split(".")[-1]
    assert tuple(f.shape) == tuple(t.shape)
    np.testing.assert_array_equal(f.detach().numpy(), t.detach().numpy())


# ---- stack: one cat and a view when the new dimension is not the last ---------------------------
@pytest.mark.parametrize("shape,dim", [((8,), 0), ((2, 3), 0), ((2, 3), 1), ((2, 3), -2), ((2, 3), -1),
                                       ((2, 3), 2), ((), 0), ((0,), 0), ((2, 0), 1)])
def test_stack_matches_pytorch(shape, dim):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    fs = [flambeau.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    f, t = flambeau.stack(fs, dim), torch.stack(ts, dim)
    _same(f, t)
    assert f._base is None and (t.numel() == 0 or f.stride() == t.stride())
    g = rng.standard_normal(tuple(t.shape)).astype(np.float32)
    f.backward(flambeau.tensor(g))
    t.backward(torch.tensor(g))
    for a, b in zip(fs, ts):
        _same(a.grad, b.grad)


def test_stack_result_takes_inplace_ops_with_grad():
    fs = [flambeau.ones(3, requires_grad=True) for _ in range(2)]
    ts = [torch.ones(3, requires_grad=True) for _ in range(2)]
    f, t = flambeau.stack([fs[0], fs[1]]), torch.stack([ts[0], ts[1]])
    f.mul_(2)
    t.mul_(2)
    f.sum().backward()
    t.sum().backward()
    _same(fs[0].grad, ts[0].grad)


def test_stack_promotes_and_checks_shapes_as_pytorch():
    _same(flambeau.stack([flambeau.ones(2), flambeau.ones(2, dtype=flambeau.int64)]),
          torch.stack([torch.ones(2), torch.ones(2, dtype=torch.int64)]))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        flambeau.stack([flambeau.ones(2), flambeau.ones(3)])
    out = flambeau.empty(0)
    flambeau.stack([flambeau.ones(2), flambeau.zeros(2)], 0, out=out)
    _same(out, torch.stack([torch.ones(2), torch.zeros(2)]))


def test_stack_of_views_whose_base_took_a_grad_in_place_records_them_as_pytorch():
    """A view in the list (the dispatcher's list scan) whose base was later modified in place by a
    tensor that requires grad is regenerated and carries gradient to it, as PyTorch's."""
    grads = []
    for m in (flambeau, torch):
        w = m.ones(4, requires_grad=True)
        a = m.zeros(4)
        v = a[:2]
        a.add_(w * 3)
        out = m.stack([v, v]).sum() * 2 + v.sum()
        out.backward()
        grads.append(w.grad.numpy().copy())
    np.testing.assert_array_equal(*grads)


def test_cat_of_alike_arrays_matches_pytorch():
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 9, size=(3, 2)) for _ in range(5)]
    for dim in (0, 1, -1):
        _same(flambeau.cat([flambeau.tensor(a) for a in arrays], dim), torch.cat([torch.tensor(a) for a in arrays], dim))
    with pytest.raises(IndexError):
        flambeau.cat([flambeau.tensor(a) for a in arrays], 2)


# ---- get_batch: slices bounded by 0-dim tensors, a tensor plus a Python int ---------------------
def test_get_batch_slices_match_pytorch():
    data = np.arange(100, dtype=np.int64) * 3
    fd, td = _pair(data)
    fi, ti = _pair(np.array([5, 0, 91]))
    fx = flambeau.stack([fd[i:i + 8] for i in fi])
    tx = torch.stack([td[i:i + 8] for i in ti])
    _same(fx, tx)
    _same(fd[fi[0]:], td[ti[0]:])
    _same(fd[:fi[0]], td[:ti[0]])
    _same(fd[fi[0]:fi[1] + 50:2], td[ti[0]:ti[1] + 50:2])
    _same(fd[flambeau.tensor(-5, dtype=flambeau.int32):], td[torch.tensor(-5, dtype=torch.int32):])


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), -1)])
def test_unbind_pieces_are_views_as_pytorch(shape, dim):
    """`for i in ix` (unbind): each piece, 0-dim ones included, is a view sharing the tensor's memory,
    base and version counter; values, strides, gradients and the in-place check as PyTorch's."""
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    fw, tw = _pair(a, requires_grad=True)
    fb, tb = fw * 1, tw * 1
    fp, tp = fb.unbind(dim), tb.unbind(dim)
    assert len(fp) == len(tp)
    for f, t in zip(fp, tp):
        _same(f, t)
        assert f.stride() == t.stride() and f.storage_offset() == t.storage_offset()
        assert f._base is fb and t._base is tb
    if len(tp) >= 2:
        (fp[0] * 2 + fp[-1] * 3).sum().backward()
        (tp[0] * 2 + tp[-1] * 3).sum().backward()
        _same(fw.grad, tw.grad)
        fy, ty = (fb.unbind(dim)[0] ** 2).sum(), (tb.unbind(dim)[0] ** 2).sum()
        fb.add_(1)
        tb.add_(1)
        for y in (fy, ty):
            with pytest.raises(RuntimeError, match="modified inplace|modified by an inplace operation"):
                y.backward()
    fx, tx = _pair(a)
    for f, t in zip(fx.unbind(dim), tx.unbind(dim)):
        f.mul_(-1)
        t.mul_(-1)
    _same(fx, tx)
    for m, x in ((flambeau, fx), (torch, tx)):
        with m.no_grad():
            pieces = x.unbind(dim)
        assert all(p._base is x for p in pieces)


def test_slices_and_int_keys_reach_modes_and_tracing_as_pytorch():
    """`x[a:b]` and `x[k]` skip `Op.__call__` (`_registry.call`) only where it would go straight to
    `call_functional`: a dispatch mode still sees slice/select (as PyTorch's sees them), so does the FX
    hook; gradients as PyTorch's."""
    from tests.conftest import op_names_mode
    from flambeau.utils._python_dispatch import TorchDispatchMode as FlambeauMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))
    assert issubclass(type(op_names_mode()), FlambeauMode)
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    for m, mode in ((flambeau, op_names_mode()), (torch, Names())):
        x = m.tensor(a, requires_grad=True)
        i = m.tensor(1)
        with mode:
            y = x[1:5:2].sum() + x[i:i + 2].sum() * 2 + x[3].sum() * 3 + x[-1].sum()
        names = [n.split(".")[0] for n in mode.names]
        assert names.count("slice") == 2 and names.count("select") == 2, (m.__name__, names)
        y.backward()
        if m is flambeau:
            fgrad = x.grad.numpy().copy()
        else:
            np.testing.assert_array_equal(fgrad, x.grad.numpy())
    from flambeau._ops import _registry
    seen = []
    previous = _registry.set_fx_hook(lambda op, args, kwargs: seen.append(str(getattr(op, "name", "")).split(".")[0]) or NotImplemented)
    try:
        x = flambeau.tensor(a)
        x[1:3], x[x.new_tensor(1):], x[0]
    finally:
        _registry.set_fx_hook(previous)
    assert seen.count("slice") == 2 and seen.count("select") == 1, seen


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32"])
@pytest.mark.parametrize("scalar", [3, -7, 0.5, 2 ** 31 - 1, 2 ** 31, 2 ** 40])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_tensor_with_python_number_matches_pytorch(dtype, scalar, op):
    a = (np.arange(-3, 5).reshape(2, 4) * 1000003).astype(dtype)
    for f, t in ((flambeau.tensor(a), torch.tensor(a)), (flambeau.tensor(a[0, 1]), torch.tensor(a[0, 1])),
                 (flambeau.tensor(a).t(), torch.tensor(a).t())):
        fr, tr = getattr(flambeau, op)(f, scalar), getattr(torch, op)(t, scalar)
        assert str(fr.dtype).split(".")[-1] == str(tr.dtype).split(".")[-1]
        assert tuple(fr.stride()) == tuple(tr.stride())
        np.testing.assert_allclose(fr.numpy(), tr.numpy(), rtol=1.3e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32"])
def test_zero_dim_tensor_with_python_number_takes_numpy_scalar_arithmetic(dtype, monkeypatch):
    """`i + block` on a 0-dim tensor: NumPy's scalar operator instead of the ufunc (counted), with the
    ufunc's results: values, dtypes, int32 wrap-around, inf and nan from division, 0-dim views."""
    from flambeau._ops import _helpers
    calls = []
    for ufunc, fn in list(_helpers._SCALAR_OPS.items()):
        monkeypatch.setitem(_helpers._SCALAR_OPS, ufunc, lambda a, b, fn=fn: calls.append(fn) or fn(a, b))
    scalars = [3, -7, 0, 2 ** 31 - 1] + ([0.5, -0.0, 1e30] if dtype.startswith("float") else [])
    values = np.array([5, -3, 0, 2 ** 30 + 7], dtype=dtype)
    for i in range(values.size):
        fv, tv = _pair(values)
        for f, t in ((fv[i], tv[i]), (fv.unbind(0)[i], tv.unbind(0)[i])):
            for s in scalars:
                for op in ("add", "sub", "mul", "div"):
                    fr, tr = getattr(flambeau, op)(f, s), getattr(torch, op)(t, s)
                    assert str(fr.dtype).split(".")[-1] == str(tr.dtype).split(".")[-1]
                    assert fr.shape == () and fr._base is None
                    np.testing.assert_allclose(fr.numpy(), tr.numpy(), rtol=1.3e-6)
            _same(f + 8, t + 8)
            _same(8 * f, 8 * t)
    assert len(calls) >= values.size * 2 * len(scalars) * (4 if dtype.startswith("float") else 3)
    r = flambeau.tensor(np.array(7, dtype=dtype)) + 1
    r += 2                                   # the result owns its memory
    assert r.item() == 10


# ---- compiled C++ kernels take their arrays as objects ------------------------------------------
def test_array_data_offset_reads_numpy_data_pointers():
    import ctypes
    from flambeau._inductor import codegen_cpp
    off = codegen_cpp.array_data_offset()
    assert off == codegen_cpp.DATA_OFFSET
    base = np.zeros((5, 7), np.float64)
    for a in (base, base[2:, 3:], base.T[::2], np.empty(0, np.int64), np.array(1.0, np.float32)):
        assert ctypes.c_void_p.from_address(id(a) + off).value == a.ctypes.data


def test_compiled_kernels_on_offset_views_match_pytorch():
    from flambeau._inductor import codegen_cpp
    if codegen_cpp.DATA_OFFSET is None:
        pytest.skip("array objects' data offset unknown here: kernels take .ctypes.data")
    rng = np.random.default_rng(3)
    big = rng.standard_normal((9, 12)).astype(np.float32)
    idx = rng.integers(0, 3, size=6)

    def fn(x, y, i, m):
        return (x * 2 + y.sum(0)).relu() + m.gather(0, i.view(1, -1).expand(3, -1))[:, :1], (x - 1).exp()
    args = (big[1:4, 2:8], big[4:9, 3:9], idx, big[::3, 6:])
    got = flambeau.compile(fn, fullgraph=True)(*[flambeau.from_numpy(np.ascontiguousarray(a)) if k == 0 else
                                                 flambeau.from_numpy(a) for k, a in enumerate(args)])
    want = fn(*[torch.from_numpy(np.ascontiguousarray(a)) if k == 0 else torch.from_numpy(a) for k, a in enumerate(args)])
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(g.numpy()), w)


# ---- compiled matrix products planned once for their layouts --------------------------------------
def test_compiled_products_of_views_run_planned_and_match_pytorch(monkeypatch):
    """Transposed, sliced and offset operands (a graph input at an offset, a weight's transpose, a
    batch of heads read through strides) go to the planned GEMM; values and gradients as PyTorch's."""
    from flambeau._backends import cpu_kernels
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    if cpu_kernels.gemm_plan(((64, 64), (64, 1), 0), ((64, 64), (64, 1), 0)) is None:
        pytest.skip("no planned GEMM here (no AVX-512 kernel or array data offset)")
    planned_calls = []
    real_plan = cpu_kernels.gemm_plan

    def counting_plan(a_layout, b_layout):
        fn = real_plan(a_layout, b_layout)
        return None if fn is None else lambda a, b: planned_calls.append(1) or fn(a, b)
    monkeypatch.setattr(cpu_kernels, "gemm_plan", counting_plan)
    rng = np.random.default_rng(4)
    big = rng.standard_normal((70, 90)).astype(np.float32)
    w = (0.2 * rng.standard_normal((48, 40))).astype(np.float32)

    def fn(x, w):
        h = (x[3:, 5:45] @ w.t()).relu()                      # offset rows/cols of an input, transposed weight
        q = h.view(-1, 4, 12).transpose(0, 1)                 # a batch of 4 "heads" of 12, strided
        s = q @ q.transpose(1, 2)
        return (s.softmax(-1) @ q).sum() + h.square().mean()
    results = {}
    for lib in (flambeau, torch):
        xs = lib.from_numpy(big).requires_grad_(), lib.from_numpy(w).requires_grad_()
        f = flambeau.compile(fn, fullgraph=True) if lib is flambeau else fn
        out = f(*xs)
        out.backward()
        results[lib.__name__] = [out.detach().numpy()] + [t.grad.numpy() for t in xs]
    assert len(planned_calls) >= 6           # forward and backward products
    for g, w_ in zip(results["flambeau"], results["torch"]):
        np.testing.assert_allclose(g, w_, rtol=2e-4, atol=2e-4)


# ---- cross-entropy over 2-D float32 logits: one C++ pass per row each way (cpu_kernels.ce_*) ----
def _taken(calls, name, result):
    if result is not None:
        calls.append(name)
    return result


def _ce_pair(logits, targets, **kw):
    out = []
    for m in (flambeau, torch):
        x = m.tensor(logits, requires_grad=True)
        loss = m.nn.functional.cross_entropy(x, m.tensor(targets), **kw)
        loss.backward(m.ones_like(loss))
        out.append((loss.detach().numpy(), x.grad.numpy()))
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_rows_kernel_matches_pytorch(reduction, monkeypatch):
    from flambeau._backends import cpu_kernels
    if not cpu_kernels.available():
        pytest.skip("no C++ compiler / AVX-512 here: the NumPy path serves")
    calls = []
    for name in ("ce_forward", "ce_backward"):
        real = getattr(cpu_kernels, name)
        monkeypatch.setattr(cpu_kernels, name, lambda *a, real=real, name=name: _taken(calls, name, real(*a)))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 65)).astype(np.float32) * 4
    x[3, 5] = -np.inf                          # a masked class
    x[4] = -np.inf                             # a row of -inf: nan loss, as PyTorch's
    x[7, 2] = np.nan
    x[8] *= 1e6                                # far apart logits
    t = rng.integers(0, 65, size=37)
    t[9:12] = -100                             # ignored rows
    t[12], t[13] = 0, 64                       # the first and last class
    (fl, fg), (tl, tg) = _ce_pair(x, t, reduction=reduction)
    np.testing.assert_allclose(fl, tl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fg, tg, rtol=1e-5, atol=1e-6)
    assert calls == ["ce_forward", "ce_backward"]
    (fl, fg), (tl, tg) = _ce_pair(x[:1, :1].copy() * 0 + 3, t[:1] * 0, reduction=reduction)     # one class
    np.testing.assert_array_equal(fl, tl)
    np.testing.assert_array_equal(fg, tg)
    (fl, fg), (tl, tg) = _ce_pair(x[9:12], t[9:12], reduction=reduction)        # every target ignored
    np.testing.assert_array_equal(fl, tl)
    np.testing.assert_array_equal(fg, tg)
    # a +inf logit: the row's loss and gradient are nan, as PyTorch's, on the kernel and the NumPy path
    x[6, 1] = np.inf
    fast, ref = _ce_pair(x, t, reduction=reduction)
    monkeypatch.setattr(cpu_kernels, "_ce_operands", lambda x, t: False)
    general = _ce_pair(x, t, reduction=reduction)[0]
    for a, b, r in zip(fast, general, ref):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, r, rtol=1e-5, atol=1e-6)
    assert calls == ["ce_forward", "ce_backward"] * 4      # the finite, one-class, all-ignored and +inf cases
    for m, exc in ((flambeau, IndexError), (torch, IndexError)):
        bad = t.copy()
        bad[0] = 65
        with pytest.raises(exc, match="out of bounds"):
            m.nn.functional.cross_entropy(m.tensor(x), m.tensor(bad), reduction=reduction)


def test_cross_entropy_rows_kernel_declines_what_it_does_not_compute(monkeypatch):
    """Class weights, label smoothing, float64 and K-dim inputs keep the NumPy path (not counted), as PyTorch."""
    from flambeau._backends import cpu_kernels
    calls = []
    for name in ("ce_forward", "ce_backward"):
        real = getattr(cpu_kernels, name)
        monkeypatch.setattr(cpu_kernels, name, lambda *a, real=real, name=name: _taken(calls, name, real(*a)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = rng.integers(0, 5, size=6)
    w = rng.random(5).astype(np.float32)
    for logits, targets, kw in ((x, t, dict(weight=w)), (x, t, dict(label_smoothing=0.1)),
                                (x.astype(np.float64), t, {}), (x.reshape(2, 5, 3), t.reshape(2, 3), {})):
        out = []
        for m in (flambeau, torch):
            xt = m.tensor(logits, requires_grad=True)
            kwm = {k: m.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
            loss = m.nn.functional.cross_entropy(xt, m.tensor(targets), **kwm)
            loss.backward()
            out.append((loss.detach().numpy(), xt.grad.numpy()))
        np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
        np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5, atol=1e-7)
    assert calls == []
