"""cuDNN convolutions (flambeau._backends.cudnn): forward, input and weight gradients on the GPU
against flambeau's CPU kernels and against PyTorch on the same GPU, the flags (enabled, allow_tf32,
deterministic, benchmark), and that the cuDNN path is the one taken. Runs only where CuPy sees a
GPU (marked `cuda`), and needs libcudnn there."""
import numpy as np
import pytest

import flambeau
from flambeau._backends import cudnn

pytestmark = pytest.mark.cuda

CASES = [  # fn, x shape, w shape, bias, kwargs
    ("conv2d", (2, 3, 9, 8), (4, 3, 3, 3), True, dict(padding=1)),
    ("conv2d", (2, 4, 11, 10), (6, 2, 3, 2), True, dict(stride=(2, 1), padding=(1, 2), groups=2)),
    ("conv2d", (1, 3, 12, 12), (5, 3, 3, 3), False, dict(dilation=2, padding=2, stride=2)),
    ("conv2d", (3, 8, 10, 10), (8, 1, 3, 3), True, dict(padding=1, groups=8)),
    ("conv2d", (2, 16, 7, 7), (8, 16, 1, 1), False, {}),
    ("conv1d", (2, 4, 17), (6, 2, 3), True, dict(stride=2, padding=1, groups=2, dilation=2)),
    ("conv3d", (1, 2, 5, 6, 5), (3, 2, 2, 3, 2), True, dict(stride=(1, 2, 1), padding=1)),
    ("conv_transpose2d", (2, 4, 5, 4), (4, 3, 3, 2), True, dict(stride=(2, 3), padding=1, output_padding=(1, 0))),
]


@pytest.fixture(autouse=True)
def _needs_cudnn():
    if not cudnn.is_available():
        pytest.skip(f"libcudnn not found: {cudnn.load_error()}")
    saved = (cudnn.enabled, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark)
    yield
    cudnn.enabled, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved


def _data(xs, ws, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    return x, w


def _run(m, fn, x, w, b, kw, device, out_grad_seed=1):
    """Forward and backward of `fn` in module `m` (flambeau or torch): (y, dx, dw, db) as NumPy."""
    xt = m.tensor(x, device=device, requires_grad=True)
    wt = m.tensor(w, device=device, requires_grad=True)
    bt = None if b is None else m.tensor(b, device=device, requires_grad=True)
    y = getattr(m.nn.functional, fn)(xt, wt, bt, **kw)
    g = np.random.default_rng(out_grad_seed).standard_normal(tuple(y.shape)).astype(x.dtype)
    y.backward(m.tensor(g, device=device))
    out = [y.detach(), xt.grad, wt.grad] + ([] if bt is None else [bt.grad])
    return [t.cpu().numpy() for t in out]


def _case_bias(fn, ws, kw, bias):
    """Transposed convolutions have weight (C_in, C_out/groups, *k) and groups*C_out output channels."""
    if not bias:
        return None
    n = ws[1] * kw.get("groups", 1) if fn.startswith("conv_transpose") else ws[0]
    return np.random.default_rng(2).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("fn,xs,ws,bias,kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_cpu_and_torch(fn, xs, ws, bias, kw):
    x, w = _data(xs, ws)
    b = _case_bias(fn, ws, kw, bias)
    before = dict(cudnn.calls)
    gpu = _run(flambeau, fn, x, w, b, kw, "cuda")
    taken = {k: cudnn.calls[k] - before[k] for k in before}
    cpu = _run(flambeau, fn, x, w, b, kw, "cpu")
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4)
    # a transposed convolution's forward is cuDNN's backward-data and its input gradient a forward;
    # 1×1 stride-1 unpadded convolutions are plain GEMMs and go to cuBLAS instead (nn_conv._plain_gemm)
    n = 0 if all(k == 1 for k in ws[2:]) and not kw else 1
    assert taken == {"forward": n, "backward_data": n, "backward_filter": n}
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False        # PyTorch's default TF32 is ~1e-3 off
        try:
            ref = _run(torch, fn, x, w, b, kw, "cuda")
        finally:
            torch.backends.cudnn.allow_tf32 = saved
        for g, r in zip(gpu, ref):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


def test_float64_and_noncontiguous_input():
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 9))
    w = np.random.default_rng(4).standard_normal((4, 3, 3, 3))
    before = cudnn.calls["forward"]
    xg = flambeau.tensor(x, device="cuda").transpose(2, 3)          # non-contiguous
    y = flambeau.nn.functional.conv2d(xg, flambeau.tensor(w, device="cuda"), padding=1)
    assert y.dtype == flambeau.float64 and cudnn.calls["forward"] == before + 1
    ref = flambeau.nn.functional.conv2d(flambeau.tensor(x).transpose(2, 3), flambeau.tensor(w), padding=1)
    np.testing.assert_allclose(y.cpu().numpy(), ref.numpy(), rtol=1e-10, atol=1e-10)


def test_half_inputs():
    x, w = _data((2, 8, 10, 10), (8, 8, 3, 3))
    y = flambeau.nn.functional.conv2d(flambeau.tensor(x, device="cuda").half(),
                                      flambeau.tensor(w, device="cuda").half(), padding=1)
    ref = flambeau.nn.functional.conv2d(flambeau.tensor(x).half(), flambeau.tensor(w).half(), padding=1)
    assert y.dtype == flambeau.float16
    np.testing.assert_allclose(y.cpu().float().numpy(), ref.float().numpy(), rtol=2e-3, atol=2e-3)


def test_flags():
    x, w = _data((2, 16, 12, 12), (16, 16, 3, 3))
    xg, wg = flambeau.tensor(x, device="cuda"), flambeau.tensor(w, device="cuda")
    ref = flambeau.nn.functional.conv2d(flambeau.tensor(x), flambeau.tensor(w), padding=1).numpy()
    cudnn.enabled = False
    before = cudnn.calls["forward"]
    y = flambeau.nn.functional.conv2d(xg, wg, padding=1)
    assert cudnn.calls["forward"] == before and not cudnn.available()
    np.testing.assert_allclose(y.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
    cudnn.enabled = True
    for flag in ("allow_tf32", "deterministic", "benchmark"):
        setattr(cudnn, flag, True)
        y = flambeau.nn.functional.conv2d(xg, wg, padding=1)
        tol = 1e-2 if flag == "allow_tf32" else 1e-4
        np.testing.assert_allclose(y.cpu().numpy(), ref, rtol=tol, atol=tol)
        setattr(cudnn, flag, False)
    assert cudnn.calls["forward"] == before + 3
    assert flambeau.backends.cudnn is cudnn and isinstance(cudnn.version(), int)
    with cudnn.flags(enabled=False, allow_tf32=True):
        assert cudnn.enabled is False and cudnn.allow_tf32 is True
    assert cudnn.enabled is True and cudnn.allow_tf32 is False


def test_tf32_is_the_default_like_pytorch():
    import subprocess
    import sys
    code = "import flambeau, torch; print(flambeau.backends.cudnn.allow_tf32, torch.backends.cudnn.allow_tf32)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_double_backward():
    x, w = _data((2, 3, 6, 6), (4, 3, 3, 3))
    outs = []
    for dev in ("cuda", "cpu"):
        xt = flambeau.tensor(x, device=dev, requires_grad=True)
        wt = flambeau.tensor(w, device=dev, requires_grad=True)
        y = flambeau.nn.functional.conv2d(xt, wt, stride=2, padding=1)
        (gx,) = flambeau.autograd.grad(y.square().sum(), xt, create_graph=True)
        gx.sum().backward()
        outs.append((gx.detach().cpu().numpy(), wt.grad.cpu().numpy()))
    for g, c in zip(*outs):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c[0])
def test_graph_api_and_legacy_api_agree(case):
    name, xs, ws, _, kw = case
    x, w = _data(xs, ws)
    results = {}
    for graph in (True, False):
        cudnn.use_graph_api = graph
        try:
            xt = flambeau.tensor(x, device="cuda", requires_grad=True)
            wt = flambeau.tensor(w, device="cuda", requires_grad=True)
            fn = getattr(flambeau.nn.functional, name)
            y = fn(xt, wt, **kw)
            y.square().sum().backward()
            results[graph] = [t.detach().cpu().numpy() for t in (y, xt.grad, wt.grad)]
            kinds = {type(p).__name__ for k, p in cudnn._plans.items() if k[-1] is graph and p is not None}
            assert kinds == ({"_GraphPlan"} if graph else {"_Plan"}), (kinds, cudnn._state["plan_error"])
        finally:
            cudnn.use_graph_api = True
    for a, b in zip(results[True], results[False]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


BF16_CASES = [  # x shape, w shape, kwargs: ResNet's three kinds of convolution
    ((4, 16, 14, 14), (32, 16, 3, 3), dict(padding=1)),
    ((4, 32, 14, 14), (16, 32, 1, 1), {}),
    ((4, 16, 14, 14), (32, 16, 1, 1), dict(stride=2)),
]


@pytest.mark.parametrize("xs,ws,kw", BF16_CASES, ids=["3x3", "1x1", "1x1-stride2"])
def test_bfloat16_runs_in_cudnn_without_casts(xs, ws, kw, monkeypatch):
    """bfloat16 convolutions (as under autocast) go to cuDNN in bfloat16, 1x1 ones included (no
    float32 copies), and agree with PyTorch's bfloat16 cuDNN convolutions forward and backward."""
    torch = pytest.importorskip("torch")
    x, w = _data(xs, ws)
    seen = []
    real = cudnn._plan
    monkeypatch.setattr(cudnn, "_plan", lambda kind, *a: seen.append((kind, a[7])) or real(kind, *a))
    monkeypatch.setattr(cudnn, "_calls", {})          # (a call remembered from an earlier test makes no plan)
    res = []
    for m in (torch, flambeau):
        xt = m.tensor(x, device="cuda").to(m.bfloat16).requires_grad_()
        wt = m.tensor(w, device="cuda").to(m.bfloat16).requires_grad_()
        y = m.nn.functional.conv2d(xt, wt, **kw)
        y.backward(m.tensor(np.random.default_rng(5).standard_normal(tuple(y.shape)), device="cuda").to(m.bfloat16))
        assert y.dtype == m.bfloat16 and xt.grad.dtype == wt.grad.dtype == m.bfloat16
        res.append([t.detach().float().cpu().numpy() for t in (y, xt.grad, wt.grad)])
    assert sorted(seen) == [("backward_data", "bfloat16"), ("backward_filter", "bfloat16"), ("forward", "bfloat16")]
    for f, t in zip(res[1], res[0]):
        np.testing.assert_allclose(f, t, rtol=2e-2, atol=1e-2 * np.abs(t).max())
