"""The per-op host fast paths of eager execution (issue 11 item 6, issue 12 item 5), each against
PyTorch on the inputs that take it and on the edges that must not:
- `autograd.graph.record` reads a plan made once per op (what each derivative parameter saves, from
  which argument), rebuilt when the op's `saved_names` change, and skips binding for positional calls;
- the autocast layer is skipped for ops without an autocast policy tag (`Op.autocast_tagged`);
- `reshape` of a contiguous array goes straight to `view`;
- the backward engine skips `_reduce_to` when a gradient already has its input's shape, dtype, device.
"""
import numpy as np
import pytest
import torch

import flambeau
from flambeau import _ops
from flambeau.autograd import graph
from tests.conftest import op_names_mode


def _pair(shape, seed=0, dtype=np.float32):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return flambeau.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _close(f, t, rtol=1.3e-6, atol=1e-5):
    if t is None:                  # an input the function does not use has no gradient in either
        assert f is None
        return
    assert str(f.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    np.testing.assert_allclose(f.detach().float().numpy(), t.detach().float().numpy(), rtol=rtol, atol=atol)


# ---- record: every kind of saved entry, positional and keyword calls -----------------------------
_RECORDED = {
    # argument tensors saved (mul), the result saved (exp), `<arg>_meta` (sum), a list of tensors (cat)
    "mul": lambda m, x, y: (x * y).sum(),
    "exp": lambda m, x, y: x.exp().sum(),
    "sum_dim_keyword": lambda m, x, y: x.sum(dim=1, keepdim=True).mul(y[:, :1]).sum(),
    "cat": lambda m, x, y: m.cat([x, y * 2], 1).pow(2).sum(),
    # pow by a number: `result` not needed (result_needed_for names a non-tensor), so not saved
    "pow_scalar": lambda m, x, y: x.pow(3).sum(),
    "pow_tensor": lambda m, x, y: x.abs().pow(y.abs()).sum(),
    # one output alone of several (`result1`/`result2`: layer norm's statistics)
    "layer_norm": lambda m, x, y: m.nn.functional.layer_norm(x, (4,), y[0], y[1]).pow(2).sum(),
    # linear by positional and keyword arguments (the binder fills defaults)
    "linear_positional": lambda m, x, y: m.nn.functional.linear(x, y, y[0]).sum(),
    "linear_keyword": lambda m, x, y: m.nn.functional.linear(x, weight=y).sum(),
    # a view's geometry (`self_geometry` of as_strided)
    "as_strided": lambda m, x, y: x.as_strided((2, 2), (1, 2), 1).exp().sum(),
    # `<arg>_meta` of an argument that is not the first (index_add's source)
    "index_add": lambda m, x, y: x.index_add(0, m.tensor([0, 2]), y[1:3] * 3).pow(2).sum(),
    # max over a dim: values and indices, indices saved
    "max_dim": lambda m, x, y: x.max(1).values.mul(y[:, 0]).sum(),
}


@pytest.mark.parametrize("name", sorted(_RECORDED))
def test_recorded_gradients_match_pytorch(name):
    fx, tx = _pair((4, 4), 0)
    fy, ty = _pair((4, 4), 1)
    fn = _RECORDED[name]
    fl, tl = fn(flambeau, fx, fy), fn(torch, tx, ty)
    _close(fl, tl, rtol=1e-5)
    fl.backward()
    tl.backward()
    _close(fx.grad, tx.grad, rtol=1e-5)
    _close(fy.grad, ty.grad, rtol=1e-5)


def test_record_plan_follows_a_replaced_derivative(monkeypatch):
    """An op whose derivative (and so its saved names) is replaced after it was first recorded gets a
    new plan: backward calls the new derivative with what it names."""
    op = _ops.OPS["mul.Tensor"]
    x = flambeau.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()                       # the plan for the original derivative exists now
    assert list(x.grad.numpy()) == [2.0, 4.0]
    seen = []

    def self_only(grad, self):
        seen.append(self)
        return grad * 10, None
    monkeypatch.setattr(op, "derivative", self_only)
    monkeypatch.setattr(op, "saved_names", ("self",))
    x.grad = None
    (x * flambeau.tensor([5.0, 5.0])).sum().backward()
    assert len(seen) == 1 and list(x.grad.numpy()) == [10.0, 10.0]


def test_record_saves_a_tensor_later_modified_in_place_and_reports_it():
    """The plan saves argument tensors with their version: an in-place change before backward is caught."""
    fx, tx = _pair((3,), 0)
    for m, x in ((flambeau, fx), (torch, tx)):
        w = x.detach().clone().requires_grad_()
        y = x * w
        w.detach().add_(1)                         # a detached alias shares the version counter
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_node_hooks_and_metadata_work_on_recorded_nodes():
    """Node hooks and metadata are made on first use (a recorded node stores none up front)."""
    calls = []
    for m in (flambeau, torch):
        x = m.ones(3, requires_grad=True)
        y = x * 2
        node = y.grad_fn
        assert node.metadata == {}
        node.metadata["tag"] = m.__name__
        h1 = node.register_prehook(lambda go, m=m: calls.append((m.__name__, "pre")))
        h2 = node.register_hook(lambda gi, go, m=m: calls.append((m.__name__, "post")))
        y.sum().backward(retain_graph=True)
        h1.remove()
        h2.remove()
        y.sum().backward()
        assert node.metadata["tag"] == m.__name__
        assert list(x.grad.numpy() if m is flambeau else x.grad.numpy()) == [4.0, 4.0, 4.0]
    assert calls == [("flambeau", "pre"), ("flambeau", "post"), ("torch", "pre"), ("torch", "post")]


def test_anomaly_mode_keeps_the_forward_traceback_on_recorded_nodes():
    with flambeau.autograd.detect_anomaly():
        y = flambeau.ones(2, requires_grad=True) * 3
    tb = "".join(y.grad_fn.metadata["traceback_"])
    assert "test_anomaly_mode_keeps_the_forward_traceback_on_recorded_nodes" in tb
    assert "graph.py" not in tb.splitlines()[-2]    # the stack ends at the caller, not inside record


# ---- autocast: ops without a policy skip the layer; ops with one are cast ------------------------
def _autocast_chain(m, x, w, b):
    h = x @ w                      # matmul: lower precision
    r = m.relu(h)                  # no policy: stays as it comes
    s = r + b                      # no policy: promotes bf16 + fp32 to fp32
    v = s.reshape(-1).view(4, 4)   # views: no policy
    return h, r, s, v, v.softmax(-1), m.nn.functional.linear(v, w)


def test_autocast_casts_tagged_ops_only_as_pytorch():
    fx, tx = _pair((4, 4), 0)
    fw, tw = _pair((4, 4), 1)
    fb, tb = _pair((4,), 2)
    with flambeau.autocast("cpu", dtype=flambeau.bfloat16):
        fo = _autocast_chain(flambeau, fx, fw, fb)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        to = _autocast_chain(torch, tx, tw, tb)
    for f, t in zip(fo, to):
        _close(f, t, rtol=1.6e-2, atol=1e-2)
    (fo[-1].float().sum() + fo[-2].sum()).backward()
    (to[-1].float().sum() + to[-2].sum()).backward()
    for f, t in ((fx, tx), (fw, tw), (fb, tb)):
        _close(f.grad, t.grad, rtol=3e-2, atol=3e-2)


def test_autocast_tags_mark_exactly_the_ops_with_a_policy():
    from flambeau.amp import autocast_mode
    for op in _ops.OPS.values():
        has_rule = any(autocast_mode._rule(op, d) is not None for d in ("cpu", "cuda"))
        assert op.autocast_tagged == has_rule, op.name


# ---- reshape of a contiguous array is a view; of a non-contiguous one a copy ---------------------
@pytest.mark.parametrize("make,shape", [(lambda x: x, (-1,)), (lambda x: x, (2, 8)), (lambda x: x[1:3], (8,)),
                                        (lambda x: x.t(), (-1,)), (lambda x: x[:, ::2], (8,)),
                                        (lambda x: x[:0], (0, 3)), (lambda x: x.expand(2, 4, 4), (32,))])
def test_reshape_views_or_copies_as_pytorch(make, shape):
    fx, tx = _pair((4, 4), 0)
    fs, ts = make(fx.detach()), make(tx.detach())
    fr, tr = fs.reshape(*shape), ts.reshape(*shape)
    _close(fr, tr)
    shares = tr.data_ptr() == ts.data_ptr() or tr.numel() == 0
    assert (fr.data_ptr() == fs.data_ptr()) == shares or tr.numel() == 0
    if tr.numel():
        fr.view(-1)[0] = 100.0
        tr.view(-1)[0] = 100.0
        _close(fs, ts)
        assert (float(fs.reshape(-1)[0]) == 100.0) == shares
    fr2, tr2 = make(fx).reshape(*shape), make(tx).reshape(*shape)
    (fr2 * fr2).sum().backward()
    (tr2 * tr2).sum().backward()
    _close(fx.grad, tx.grad)


# ---- the engine reduces gradients to their input's shape and dtype ------------------------------
def test_gradients_reduced_to_broadcast_inputs_and_their_dtypes_as_pytorch():
    a32, ta32 = _pair((3, 1), 0)
    b, tb = _pair((3, 4), 1)
    c = flambeau.ones(4, dtype=flambeau.bfloat16, requires_grad=True)        # broadcast and cast
    tc = torch.ones(4, dtype=torch.bfloat16, requires_grad=True)
    d = flambeau.ones(3, 4, dtype=flambeau.bfloat16, requires_grad=True)     # cast alone
    td = torch.ones(3, 4, dtype=torch.bfloat16, requires_grad=True)
    f = ((a32 * b) + c + d).sum()
    t = ((ta32 * tb) + tc + td).sum()
    f.backward()
    t.backward()
    for x, y in ((a32, ta32), (b, tb), (c, tc), (d, td)):
        _close(x.grad, y.grad, rtol=1e-5)
        assert tuple(x.grad.shape) == tuple(y.grad.shape)


def test_engine_refuses_a_node_returning_too_few_gradients():
    """The engine's inlined node call (no anomaly mode, no post hooks) keeps its count check, with the
    message of PyTorch's engine (validate_outputs)."""
    x, y = _pair((2,), 0)[0], _pair((2,), 1)[0]
    z = x * y
    z.grad_fn.apply = lambda grads: [grads[0]]           # a derivative that forgot one input
    with pytest.raises(RuntimeError, match=r"function MulBackward0 returned an incorrect number of gradients "
                                           r"\(expected 2, got 1\)"):
        z.backward(flambeau.ones(2))


# ---- Tensor.to(dtype): the positional fast path -------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int32"])
def test_to_dtype_as_pytorch(dtype):
    fx, tx = _pair((3, 4), 0)
    fy, ty = fx.to(getattr(flambeau, dtype)), tx.to(getattr(torch, dtype))
    assert (fy is fx) == (ty is tx)
    _close(fy, ty, rtol=1.6e-2)
    if ty.is_floating_point():
        (fy.float() * 3).sum().backward()
        (ty.float() * 3).sum().backward()
        _close(fx.grad, tx.grad)


# ---- in-place writes: on cuda a contiguous same-dtype result is one device-to-device copy ---------
_INPLACE = {
    "contiguous": lambda m, x, y: x.add_(y),
    "row_view": lambda m, x, y: x[1].mul_(y[0]),                  # contiguous with an offset into its base
    "column_view": lambda m, x, y: x[:, 1].sub_(y[:, 0]),         # strided: CuPy's copy kernel
    "transposed": lambda m, x, y: x.t().add_(y),
    "cast_into_float16": lambda m, x, y: x.half().add_(y),        # result float32 written into float16
    "out_arg": lambda m, x, y: m.mul(x, y, out=m.empty_like(x)),
    "zero_sized": lambda m, x, y: x[:0].add_(1),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("name", sorted(_INPLACE))
def test_inplace_writes_as_pytorch(name, device):
    a = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    fx, fy = flambeau.tensor(a, device=device), flambeau.tensor(b, device=device)
    tx, ty = torch.tensor(a, device=device), torch.tensor(b, device=device)
    fr, tr = _INPLACE[name](flambeau, fx, fy), _INPLACE[name](torch, tx, ty)
    np.testing.assert_allclose(fr.cpu().float().numpy(), tr.cpu().float().numpy(), rtol=1e-3)
    np.testing.assert_allclose(fx.cpu().numpy(), tx.cpu().numpy(), rtol=1e-6)
    assert fx._version[0] == tx._version


# ---- linear's derivative: no reshapes of 2-D operands -------------------------------------------
def test_linear_backward_of_2d_input_dispatches_no_view_and_matches_pytorch():
    fx, tx = _pair((5, 3), 0)
    fw, tw = _pair((4, 3), 1)
    fb, tb = _pair((4,), 2)
    fl = flambeau.nn.functional.linear(fx, fw, fb)
    tl = torch.nn.functional.linear(tx, tw, tb)
    g = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    with op_names_mode() as mode:
        fl.backward(flambeau.tensor(g))
    tl.backward(torch.tensor(g))
    assert "view" not in mode.names and "_unsafe_view" not in mode.names, mode.names
    for f, t in ((fx, tx), (fw, tw), (fb, tb)):
        _close(f.grad, t.grad, rtol=1e-5)


def test_convolution_geometry_remembered_per_shapes_and_parameters_as_pytorch():
    """The eager convolution remembers a validated call (`nn_conv._conv_call`: geometry, dtypes, layout):
    calls on the same shapes with each parameter changed in turn still give PyTorch's results, and an
    invalid call raises PyTorch's error every time."""
    from flambeau._ops import nn_conv
    nn_conv._CALLS.clear()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 9))
    w = rng.standard_normal((4, 2, 3, 3))
    calls = [dict(stride=1, padding=0, dilation=1, groups=2), dict(stride=2, padding=0, dilation=1, groups=2),
             dict(stride=1, padding=1, dilation=1, groups=2), dict(stride=1, padding=0, dilation=2, groups=2),
             dict(stride=[2, 1], padding=[1, 0], dilation=1, groups=2)]
    for kw in calls + calls:
        f = flambeau.nn.functional.conv2d(flambeau.tensor(x), flambeau.tensor(w), **kw)
        t = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), **kw)
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-10, atol=1e-12, err_msg=str(kw))
    wt = rng.standard_normal((4, 3, 3, 3))
    for kw in (dict(stride=2, output_padding=1, groups=1), dict(stride=2, output_padding=0, groups=1),
               dict(stride=2, output_padding=1, groups=1)):
        f = flambeau.nn.functional.conv_transpose2d(flambeau.tensor(x), flambeau.tensor(wt), **kw)
        t = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(wt), **kw)
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-10, atol=1e-12, err_msg=str(kw))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="expected weight to be divisible by 3 at dimension 0"):
            flambeau.nn.functional.conv2d(flambeau.tensor(x), flambeau.tensor(w), groups=3)
    assert len(nn_conv._CALLS) == 7               # 5 + 2 geometries; the invalid call is not kept


def test_remembered_convolution_calls_follow_the_operands_layout_and_dtype():
    """`nn_conv._CALLS` keys a call by its operands' strides and dtypes too: the same shapes channels-last
    give PyTorch's channels-last result, in float64 a float64 one, each its own entry."""
    from flambeau._ops import nn_conv
    nn_conv._CALLS.clear()
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 4, 9, 9)), rng.standard_normal((6, 4, 3, 3))
    for _ in range(2):
        for dt, tdt in ((flambeau.float32, torch.float32), (flambeau.float64, torch.float64)):
            for mf, tmf in ((flambeau.contiguous_format, torch.contiguous_format),
                            (flambeau.channels_last, torch.channels_last)):
                f = flambeau.nn.functional.conv2d(flambeau.tensor(x, dtype=dt).contiguous(memory_format=mf),
                                                  flambeau.tensor(w, dtype=dt), padding=1)
                t = torch.nn.functional.conv2d(torch.tensor(x, dtype=tdt).contiguous(memory_format=tmf),
                                               torch.tensor(w, dtype=tdt), padding=1)
                assert f.dtype == dt and f.stride() == t.stride(), (dt, mf, f.stride(), t.stride())
                np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-5, atol=1e-5)
    assert len(nn_conv._CALLS) == 4


def test_remembered_convolution_gradients_follow_the_layout_as_pytorch():
    """The convolution's derivative on the direct path (the adjoint's output padding remembered,
    `nn_conv._PADDINGS`) and the weight-gradient kernel's remembered calls (`_WEIGHT_GRAD_CALLS`, keyed by
    the operands' strides too): channels-last and contiguous operands of the same shapes, alternately,
    give PyTorch's gradients with PyTorch's strides."""
    from flambeau._ops import nn_conv
    nn_conv._PADDINGS.clear()
    nn_conv._WEIGHT_GRAD_CALLS.clear()
    rng = np.random.default_rng(5)
    x, w, g = rng.standard_normal((2, 4, 9, 9)), rng.standard_normal((6, 4, 3, 3)), rng.standard_normal((2, 6, 5, 5))
    for _ in range(2):
        for mf, tmf in ((flambeau.channels_last, torch.channels_last),
                        (flambeau.contiguous_format, torch.contiguous_format)):
            fx = flambeau.tensor(x).contiguous(memory_format=mf).requires_grad_()
            fw = flambeau.tensor(w).requires_grad_()
            flambeau.nn.functional.conv2d(fx, fw, stride=2, padding=1).backward(flambeau.tensor(g))
            tx = torch.tensor(x).contiguous(memory_format=tmf).requires_grad_()
            tw = torch.tensor(w).requires_grad_()
            torch.nn.functional.conv2d(tx, tw, stride=2, padding=1).backward(torch.tensor(g))
            assert fx.grad.stride() == tx.grad.stride() and fw.grad.stride() == tw.grad.stride()
            np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-10, atol=1e-12)
            # the weight-gradient kernel alone gives aten.convolution_backward's layout (the input's)
            _, tgw, _ = torch.ops.aten.convolution_backward(torch.tensor(g), tx.detach(), tw.detach(), None, (2, 2),
                                                            (1, 1), (1, 1), False, (0, 0), 1, (False, True, False))
            r = nn_conv._convolution_weight_grad.kernel(np, fx.detach()._data, g, (6, 4, 3, 3), (2, 2), (1, 1),
                                                        (1, 1), 1)
            assert r.strides == tuple(8 * s for s in tgw.stride())
            np.testing.assert_allclose(r, tgw.numpy(), rtol=1e-10, atol=1e-12)
    assert len(nn_conv._PADDINGS) == 1 and len(nn_conv._WEIGHT_GRAD_CALLS) == 2
