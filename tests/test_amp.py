"""Mixed precision vs PyTorch: autocast output dtypes per op (cpu, bfloat16), an MLP trained a step
under autocast, nested/disabled/decorator regions, state functions, custom_fwd/custom_bwd, and the
GradScaler's scale sequence, skipped steps, errors and state_dict."""
import pickle
import warnings

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau.utils._python_dispatch import TorchDispatchMode as FlMode
from torch.utils._python_dispatch import TorchDispatchMode as TorchMode

rng = np.random.default_rng(0)


def A(*s):
    return rng.standard_normal(s).astype(np.float32)


def P(*s):
    return rng.random(s).astype(np.float32) * 0.8 + 0.1


INPUTS = {"a34": A(3, 4), "b45": A(4, 5), "w54": A(5, 4), "c35": A(3, 5), "v4": A(4), "v3": A(3),
          "x2": A(2, 3, 4), "y2": A(2, 4, 5), "img": A(2, 3, 6, 6), "k": A(4, 3, 3, 3), "sig": A(1, 3, 8),
          "k1": A(2, 3, 3), "vol": A(1, 2, 4, 4, 4), "k3": A(2, 2, 2, 2, 2), "p35": P(3, 5), "t35": P(3, 5),
          "q": A(1, 2, 4, 8), "d34": A(3, 4)}
TARGET = np.array([1, 0, 4])

CASES = {
    "mm": lambda m, F, t: m.mm(t["a34"], t["b45"]),
    "matmul": lambda m, F, t: m.matmul(t["x2"], t["y2"]),
    "linear": lambda m, F, t: F.linear(t["a34"], t["w54"], t["v4"][:1].expand(5) * 0 + 1),
    "bmm": lambda m, F, t: m.bmm(t["x2"], t["y2"]),
    "addmm": lambda m, F, t: m.addmm(t["c35"], t["a34"], t["b45"]),
    "baddbmm": lambda m, F, t: m.baddbmm(t["c35"].expand(2, 3, 5), t["x2"], t["y2"]),
    "addbmm": lambda m, F, t: m.addbmm(t["c35"], t["x2"], t["y2"]),
    "einsum": lambda m, F, t: m.einsum("ij,jk->ik", t["a34"], t["b45"]),
    "conv1d": lambda m, F, t: F.conv1d(t["sig"], t["k1"]),
    "conv2d": lambda m, F, t: F.conv2d(t["img"], t["k"], padding=1),
    "conv3d": lambda m, F, t: F.conv3d(t["vol"], t["k3"]),
    "conv_transpose2d": lambda m, F, t: F.conv_transpose2d(t["img"], t["k"].transpose(0, 1)),
    "prelu": lambda m, F, t: F.prelu(t["a34"], t["v4"][:1]),
    "sdpa": lambda m, F, t: F.scaled_dot_product_attention(t["q"], t["q"], t["q"]),
    "mv": lambda m, F, t: m.mv(t["a34"], t["v4"]),
    "dot": lambda m, F, t: m.dot(t["v4"], t["v4"]),
    "softmax": lambda m, F, t: m.softmax(t["a34"], -1),
    "log_softmax": lambda m, F, t: F.log_softmax(t["a34"], -1),
    "softmax_dtype": lambda m, F, t: m.softmax(t["a34"], -1, dtype=m.float64),
    "sum": lambda m, F, t: t["a34"].sum(),
    "sum_dim": lambda m, F, t: t["a34"].sum(1),
    "prod": lambda m, F, t: t["a34"].prod(),
    "cumsum": lambda m, F, t: t["a34"].cumsum(0),
    "mean": lambda m, F, t: t["a34"].mean(),
    "exp": lambda m, F, t: t["a34"].exp(),
    "pow": lambda m, F, t: t["a34"].pow(2),
    "cross_entropy": lambda m, F, t: F.cross_entropy(t["c35"], m.tensor(TARGET, device=t["a34"].device)),
    "nll_loss": lambda m, F, t: F.nll_loss(t["c35"], m.tensor(TARGET, device=t["a34"].device)),
    "mse_loss": lambda m, F, t: F.mse_loss(t["c35"], t["p35"]),
    "l1_loss": lambda m, F, t: F.l1_loss(t["c35"], t["p35"]),
    "smooth_l1_loss": lambda m, F, t: F.smooth_l1_loss(t["c35"], t["p35"]),
    "huber_loss": lambda m, F, t: F.huber_loss(t["c35"], t["p35"]),
    "kl_div": lambda m, F, t: F.kl_div(t["c35"], t["p35"], reduction="batchmean"),
    "binary_cross_entropy": lambda m, F, t: F.binary_cross_entropy(t["p35"], t["t35"]),
    "soft_margin_loss": lambda m, F, t: F.soft_margin_loss(t["c35"], t["t35"]),
    "hinge_embedding_loss": lambda m, F, t: F.hinge_embedding_loss(t["c35"], t["t35"]),
    "margin_ranking_loss": lambda m, F, t: F.margin_ranking_loss(t["v3"], t["v3"] * 0.5, t["v3"].sign()),
    "poisson_nll_loss": lambda m, F, t: F.poisson_nll_loss(t["c35"], t["t35"]),
    "cdist": lambda m, F, t: m.cdist(t["a34"], t["a34"] + 1),
    "layer_norm": lambda m, F, t: F.layer_norm(t["a34"], (4,)),
    "group_norm": lambda m, F, t: F.group_norm(t["img"], 3),
    "batch_norm": lambda m, F, t: F.batch_norm(t["img"], None, None, training=True),
    "relu": lambda m, F, t: m.relu(t["a34"]),
    "gelu": lambda m, F, t: F.gelu(t["a34"]),
    "add": lambda m, F, t: t["a34"] + t["a34"],
    "mul": lambda m, F, t: t["a34"] * t["d34"],
    "cat": lambda m, F, t: m.cat([t["a34"], t["d34"]]),
    "stack": lambda m, F, t: m.stack([t["a34"], t["d34"]]),
    "index_copy": lambda m, F, t: t["a34"].index_copy(0, m.tensor([0, 2], device=t["a34"].device), t["d34"][:2]),
    "tensordot": lambda m, F, t: m.tensordot(t["a34"], t["b45"], 1),
    "max_pool2d": lambda m, F, t: F.max_pool2d(t["img"], 2),
    "max_pool3d": lambda m, F, t: F.max_pool3d(t["vol"], 2),
    "adaptive_max_pool3d": lambda m, F, t: F.adaptive_max_pool3d(t["vol"], 2),
    "addcmul": lambda m, F, t: m.addcmul(t["a34"], t["a34"], t["d34"]),
}


def _inputs(mod, kind):
    """kind: 'float32', 'bfloat16', or 'mixed' (every other input bfloat16)."""
    out = {}
    for i, (k, v) in enumerate(INPUTS.items()):
        dt = {"float32": mod.float32, "bfloat16": mod.bfloat16}.get(kind) or (mod.bfloat16 if i % 2 else mod.float32)
        out[k] = mod.tensor(v).to(dt)
    return out


def _run(mod, case, kind, device="cpu"):
    t = {k: v.to(device) for k, v in _inputs(mod, kind).items()}
    with mod.autocast(device, dtype=mod.bfloat16 if device == "cpu" else mod.float16):
        return CASES[case](mod, mod.nn.functional, t)


def _np(x):
    return np.asarray(x.detach().float().numpy() if isinstance(x, torch.Tensor) else x.detach().float().numpy())


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "mixed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_autocast_cpu_op_dtype_and_value(case, kind):
    _compare(case, kind, "cpu")


_CUDA_KNOWN: set = set()


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "mixed"])
@pytest.mark.parametrize("case", sorted(set(CASES) - _CUDA_KNOWN))
def test_autocast_cuda_op_dtype_and_value(case, kind):
    if not torch.cuda.is_available():
        pytest.skip("the reference PyTorch has no CUDA here")
    if kind == "bfloat16" and case in ("addcmul", "dot", "tensordot"):
        pytest.skip("PyTorch refuses bfloat16 inputs to float16 'promote' ops; we promote them")
    _compare(case, kind, "cuda")


def _compare(case, kind, device):
    try:
        ref = _run(torch, case, kind, device)
    except (RuntimeError, NotImplementedError):
        with pytest.raises((RuntimeError, NotImplementedError)):
            _run(fl, case, kind, device)
        return
    out = _run(fl, case, kind, device)
    assert str(out.dtype) == str(ref.dtype), (case, kind, out.dtype, ref.dtype)
    assert tuple(out.shape) == tuple(ref.shape)
    r = _np(ref.cpu())
    tol = 3e-2 if device == "cpu" else 1e-2
    np.testing.assert_allclose(_np(out.cpu()), r, rtol=tol, atol=tol * max(1.0, float(np.abs(r).max(initial=0))))


def test_required_op_list_lowers_like_pytorch():
    """The ops named in the brief, float32 inputs: which ones autocast to bfloat16 on cpu."""
    lowered = {c for c in ("mm", "matmul", "linear", "conv2d", "bmm", "addmm", "softmax", "log_softmax", "sum",
                           "cross_entropy", "mse_loss", "layer_norm", "relu", "add", "cat")
               if _run(fl, c, "float32").dtype is fl.bfloat16}
    assert lowered == {"mm", "matmul", "linear", "conv2d", "bmm", "addmm"}


def _mlp(nn):
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16),
                         nn.Linear(16, 4))


def _copy(tm, fm):
    fm.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})


@pytest.mark.parametrize("backward_inside", [False, True])
def test_mlp_forward_backward_under_autocast(backward_inside):
    torch.manual_seed(0)
    tm = _mlp(torch.nn)
    fm = _mlp(fl.nn)
    _copy(tm, fm)
    x = A(8, 6)
    y = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    res = []
    for mod, m in ((torch, tm), (fl, fm)):
        with mod.autocast("cpu"):
            h = m[1](m[0](mod.tensor(x)))
            assert h.dtype == mod.bfloat16
            logits = m(mod.tensor(x))
            loss = mod.nn.functional.cross_entropy(logits, mod.tensor(y))
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        res.append((logits, loss, [p.grad for p in m.parameters()]))
    (tl, tloss, tg), (fl_logits, floss, fg) = res
    assert str(fl_logits.dtype) == str(tl.dtype) == "torch.bfloat16"
    assert floss.dtype is fl.float32
    np.testing.assert_allclose(floss.item(), tloss.item(), rtol=1.6e-2, atol=1e-2)
    for a, b in zip(fg, tg):
        assert a.dtype is fl.float32
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=5e-2, atol=2e-2)


def test_weight_used_twice_gets_one_cached_cast_and_correct_grad():
    x, w = A(3, 4), A(5, 4)
    grads = []
    for mod in (torch, fl):
        tw = mod.tensor(w, requires_grad=True)
        with mod.autocast("cpu"):
            y1 = mod.nn.functional.linear(mod.tensor(x), tw)
            y2 = mod.nn.functional.linear(mod.tensor(x) * 2, tw)
            (y1.float().sum() + (y2.float() ** 2).sum()).backward()
        grads.append(_np(tw.grad))
    np.testing.assert_allclose(grads[1], grads[0], rtol=2e-2, atol=5e-2)


def test_dispatch_modes_see_the_casts():
    class TLog(TorchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._schema.name.split("::")[-1])
            return func(*args, **(kwargs or {}))

    class FLog(FlMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    logs = []
    for mod, Log in ((torch, TLog), (fl, FLog)):
        a, b = mod.tensor(A(3, 4)), mod.tensor(A(4, 2))
        with mod.autocast("cpu"), Log() as log:
            r = mod.mm(a, b)
        assert r.dtype == mod.bfloat16
        logs.append(log.names)
    assert logs[0] == logs[1] == ["_to_copy", "_to_copy", "mm"]


def test_other_devices_integers_and_float64_untouched():
    with fl.autocast("cpu"):
        m = fl.mm(fl.randn(3, 4, device="meta"), fl.randn(4, 2, device="meta"))
        assert m.dtype is fl.float32 and m.device.type == "meta"
        assert fl.mm(fl.randn(3, 4, dtype=fl.float64), fl.randn(4, 2, dtype=fl.float64)).dtype is fl.float64
        assert fl.cat([fl.arange(3), fl.arange(2)]).dtype is fl.int64
        assert fl.matmul(fl.ones(2, 2, dtype=fl.int64), fl.ones(2, 2, dtype=fl.int64)).dtype is fl.int64
    with torch.autocast("cpu"):
        assert torch.mm(torch.randn(3, 4, device="meta"), torch.randn(4, 2, device="meta")).dtype == torch.float32
        assert torch.mm(torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2).double()).dtype == torch.float64


def test_out_variant_is_not_autocast():
    a, b = fl.randn(3, 4), fl.randn(4, 2)
    out = fl.empty(3, 2)
    with fl.autocast("cpu"):
        fl.mm(a, b, out=out)
    assert out.dtype is fl.float32
    np.testing.assert_allclose(out.numpy(), (a.numpy() @ b.numpy()), rtol=1e-5, atol=1e-5)


# ---- regions and state --------------------------------------------------------------------------
def test_defaults_and_state_functions():
    for mod in (torch, fl):
        assert mod.get_autocast_dtype("cpu") == mod.bfloat16
        assert mod.get_autocast_dtype("cuda") == mod.float16
        assert not mod.is_autocast_enabled("cpu") and not mod.is_autocast_enabled()
        with mod.autocast("cpu"):
            assert mod.is_autocast_enabled("cpu") and not mod.is_autocast_enabled("cuda")
            assert mod.is_autocast_cpu_enabled()
        assert not mod.is_autocast_enabled("cpu")
        with mod.autocast("cpu", dtype=mod.float16):
            assert mod.get_autocast_dtype("cpu") == mod.float16
            assert mod.mm(mod.ones(2, 2), mod.ones(2, 2)).dtype == mod.float16
        assert mod.get_autocast_dtype("cpu") == mod.bfloat16
        mod.set_autocast_enabled("cpu", True)
        try:
            assert mod.mm(mod.ones(2, 2), mod.ones(2, 2)).dtype == mod.bfloat16
        finally:
            mod.set_autocast_enabled("cpu", False)
        assert mod.mm(mod.ones(2, 2), mod.ones(2, 2)).dtype == mod.float32
        assert mod.amp.is_autocast_available("cpu") and mod.amp.is_autocast_available("cuda")


def test_nested_and_disabled_regions():
    for mod in (torch, fl):
        a = mod.ones(2, 2)
        with mod.autocast("cpu"):
            assert mod.mm(a, a).dtype == mod.bfloat16
            with mod.autocast("cpu", enabled=False):
                assert not mod.is_autocast_enabled("cpu")
                assert mod.mm(a, a).dtype == mod.float32
                assert mod.mm(a.bfloat16(), a.bfloat16()).dtype == mod.bfloat16
                with mod.autocast("cpu", dtype=mod.float16):
                    assert mod.mm(a, a).dtype == mod.float16
                assert mod.mm(a, a).dtype == mod.float32
            assert mod.is_autocast_enabled("cpu")
            assert mod.mm(a, a).dtype == mod.bfloat16
        assert mod.mm(a, a).dtype == mod.float32


def test_exception_inside_region_restores_state():
    for mod in (torch, fl):
        with pytest.raises(KeyError):
            with mod.autocast("cpu"):
                raise KeyError("x")
        assert not mod.is_autocast_enabled("cpu")


def test_decorator_form():
    for mod in (torch, fl):
        @mod.autocast("cpu")
        def f(a, b):
            assert mod.is_autocast_enabled("cpu")
            return mod.mm(a, b)

        @mod.amp.autocast("cpu", enabled=False)
        def g(a, b):
            return mod.mm(a, b)

        a = mod.ones(2, 3)
        assert f(a, a.t()).dtype == mod.bfloat16
        assert not mod.is_autocast_enabled("cpu")
        with mod.autocast("cpu"):
            assert g(a, a.t()).dtype == mod.float32
            assert f(a, a.t()).dtype == mod.bfloat16
            assert mod.is_autocast_enabled("cpu")


def test_constructor_checks_and_warnings():
    for mod in (torch, fl):
        with pytest.raises(ValueError, match="device_type"):
            mod.autocast(mod.device("cpu"))
        with pytest.warns(UserWarning, match="target dtype is not supported"):
            ac = mod.autocast("cpu", dtype=mod.float32)
        with ac:
            assert not mod.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="unsupported autocast device_type"):
        fl.autocast("meta")


def test_deprecated_aliases():
    for mod in (torch, fl):
        with pytest.warns(FutureWarning, match="torch.cpu.amp.autocast"):
            ac = mod.cpu.amp.autocast()
        with ac:
            assert mod.mm(mod.ones(2, 2), mod.ones(2, 2)).dtype == mod.bfloat16
        with pytest.warns(FutureWarning, match="torch.cpu.amp.GradScaler"):
            s = mod.cpu.amp.GradScaler(init_scale=8.0)
        assert s.get_scale() == 8.0 and s.is_enabled()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert isinstance(mod.cuda.amp.GradScaler(), mod.amp.GradScaler)
            assert isinstance(mod.cuda.amp.autocast(), mod.amp.autocast)


def test_custom_fwd_bwd():
    res = []
    for mod in (torch, fl):
        seen = []

        class MyMM(mod.autograd.Function):
            @staticmethod
            @mod.amp.custom_fwd(device_type="cpu", cast_inputs=mod.float32)
            def forward(ctx, a, b):
                seen.append((a.dtype, mod.is_autocast_enabled("cpu")))
                ctx.save_for_backward(a, b)
                return a.mm(b)

            @staticmethod
            @mod.amp.custom_bwd(device_type="cpu")
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                seen.append((g.dtype, mod.is_autocast_enabled("cpu")))
                return g.mm(b.t()), a.t().mm(g)

        a = mod.tensor(A(3, 4)).bfloat16().requires_grad_()
        b = mod.tensor(A(4, 2), requires_grad=True)
        with mod.autocast("cpu"):
            out = MyMM.apply(a, b)
        out.sum().backward()
        res.append(([(str(d), e) for d, e in seen], str(out.dtype), str(a.grad.dtype), str(b.grad.dtype)))
    assert res[0] == res[1]


# ---- GradScaler ---------------------------------------------------------------------------------
def _train(mod, inf_steps, steps=12, **kw):
    """A tiny SGD loop; injects an inf into a gradient at `inf_steps`; returns scales, trackers, params."""
    w = mod.tensor(np.array([1.0, -2.0, 0.5], dtype=np.float32), requires_grad=True)
    opt = mod.optim.SGD([w], lr=0.1)
    scaler = mod.amp.GradScaler("cpu", **kw)
    x = mod.tensor(np.array([0.5, 1.5, -1.0], dtype=np.float32))
    scales, trackers, params = [], [], []
    for i in range(steps):
        opt.zero_grad()
        loss = ((w * x).sum() - 1.0) ** 2
        scaler.scale(loss).backward()
        if i in inf_steps:
            with mod.no_grad():
                w.grad[1] = float("inf") if i % 2 else float("nan")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
        params.append(w.detach().numpy().copy())
    return scales, trackers, np.array(params), scaler


def test_grad_scaler_sequence_matches_pytorch():
    kw = dict(init_scale=2.0 ** 10, growth_factor=3.0, backoff_factor=0.25, growth_interval=3)
    t = _train(torch, {1, 2, 7}, **kw)
    f = _train(fl, {1, 2, 7}, **kw)
    assert f[0] == t[0]
    assert f[1] == t[1]
    np.testing.assert_allclose(f[2], t[2], rtol=1e-6, atol=1e-6)
    assert f[3].state_dict() == t[3].state_dict()


def test_grad_scaler_growth_overflow_and_default_params():
    t = _train(torch, set(), steps=5, init_scale=3.0e38, growth_interval=2)
    f = _train(fl, set(), steps=5, init_scale=3.0e38, growth_interval=2)
    assert f[0] == t[0] and f[1] == t[1]
    assert fl.amp.GradScaler("cpu").state_dict() == torch.amp.GradScaler("cpu").state_dict()


def test_grad_scaler_scale_outputs():
    for mod in (torch, fl):
        s = mod.amp.GradScaler("cpu", init_scale=4.0)
        out = s.scale([mod.ones(2), (mod.ones(1) * 2, mod.ones(3))])
        assert type(out) is list and type(out[1]) is tuple
        assert out[1][0].tolist() == [8.0] and out[0].dtype == mod.float32
        assert s.scale(mod.ones(2, dtype=mod.float16)).dtype == mod.float16
        with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
            s.scale(3)
        d = mod.amp.GradScaler("cpu", enabled=False)
        x = mod.ones(2)
        assert d.scale(x) is x and d.get_scale() == 1.0 and d.state_dict() == {} and not d.is_enabled()


def test_grad_scaler_errors():
    for mod in (torch, fl):
        w = mod.ones(2, requires_grad=True)
        opt = mod.optim.SGD([w], lr=0.1)
        s = mod.amp.GradScaler("cpu")
        with pytest.raises(AssertionError, match="did not use scaler.scale"):
            s.step(opt)
        s.scale((w * 2).sum()).backward()
        s.unscale_(opt)
        np.testing.assert_allclose(_np(w.grad), [2.0, 2.0])
        with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called on this optimizer since "
                                               r"the last update\(\)\."):
            s.unscale_(opt)
        s.step(opt)
        with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)\."):
            s.unscale_(opt)
        with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update\(\)\."):
            s.step(opt)
        with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
            s.step(opt, closure=lambda: None)
        s.update()
        with pytest.raises(AssertionError, match="growth factor must be > 1.0"):
            mod.amp.GradScaler("cpu", growth_factor=1.0)
        with pytest.raises(RuntimeError, match="source state dict is empty"):
            s.load_state_dict({})
        h = mod.ones(2, dtype=mod.float16, requires_grad=True)
        s.scale(h.float().sum()).backward()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            s.unscale_(mod.optim.SGD([h], lr=0.1))


def test_grad_scaler_update_new_scale_and_state_dict_round_trip():
    kw = dict(init_scale=16.0, growth_interval=2)
    _, _, _, ts = _train(torch, {3}, steps=6, **kw)
    _, _, _, fs = _train(fl, {3}, steps=6, **kw)
    sd = fs.state_dict()
    assert sd == ts.state_dict()
    g = fl.amp.GradScaler("cpu")
    g.load_state_dict(sd)
    assert g.state_dict() == sd and g.get_scale() == sd["scale"]
    g2 = pickle.loads(pickle.dumps(fs))
    assert g2.state_dict() == sd
    fs.update(5.0)
    ts.update(5.0)
    assert fs.get_scale() == ts.get_scale() == 5.0
    fs.update(fl.tensor(7.0))
    ts.update(torch.tensor(7.0))
    assert fs.get_scale() == ts.get_scale() == 7.0
    for s in (fs, ts):
        s.set_growth_factor(4.0)
        s.set_backoff_factor(0.125)
        s.set_growth_interval(9)
    assert fs.state_dict() == ts.state_dict()
    assert (fs.get_growth_factor(), fs.get_backoff_factor(), fs.get_growth_interval()) == (4.0, 0.125, 9)


@pytest.mark.cuda
def test_cuda_autocast_and_scaler():
    a = fl.randn(8, 8, device="cuda")
    w = fl.randn(8, 8, device="cuda", requires_grad=True)
    with fl.autocast("cuda"):
        h = fl.mm(a, w)
        assert h.dtype is fl.float16
        assert fl.softmax(h, -1).dtype is fl.float32
        assert h.exp().dtype is fl.float32
        assert fl.nn.functional.layer_norm(h, (8,)).dtype is fl.float32
        assert fl.cat([h, a]).dtype is fl.float32
        assert fl.mm(a.cpu(), a.cpu()).dtype is fl.float32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            fl.nn.functional.binary_cross_entropy(fl.sigmoid(h), fl.ones(8, 8, device="cuda"))
        loss = h.float().pow(2).mean()
    opt = fl.optim.SGD([w], lr=0.01)
    s = fl.amp.GradScaler("cuda", init_scale=8.0)
    s.scale(loss).backward()
    s.step(opt)
    s.update()
    assert w.grad.dtype is fl.float32 and s.get_scale() == 8.0
