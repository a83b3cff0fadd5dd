"""Max pooling on cuda as Triton kernels (flambeau/_backends/triton_max_pool.py): one launch forward
(values and PyTorch's flat indices), one launch backward (`_max_pool_backward`: a gather over the
windows covering each input element, float32 sums).

On the CPU: the kernels under Triton's interpreter against PyTorch on the CPU
(tests/scripts/triton_max_pool_interp.py: 1-d/2-d/3-d, padding, dilation, ceil_mode, contiguous,
channels-last and sliced inputs, NaN/-inf/ties, float32/float64/bfloat16/float16; then flambeau's
F.max_pool*d forward and backward routed through them as on cuda, with NumPy standing in for CuPy:
one launch each way), their sm_90
compile is in tests/scripts/triton_sm90_compile.py (test_inductor_triton.py), and vmap of the new
backward op through its batching rule against torch.func. On the GPU (marked `cuda`): values,
indices and gradients through flambeau's ops against PyTorch on cuda with the kernels spied on, the
kernel count of one forward and one backward (PyTorch's profiler), and a compiled function running
them as its externs."""
import importlib.util
import warnings

import numpy as np
import pytest
import torch

import flambeau
from tests.conftest import run_interpreted_script
from tests.test_norm_fused import _spy


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernels_under_the_interpreter():
    out = run_interpreted_script("triton_max_pool_interp.py")
    assert out.count(" ok") == 18, out


def test_backward_op_batches_by_its_rule_as_torch_func():
    """Per-example gradients (vmap of grad) and batched cotangents (vmap of a vjp) of max pooling run
    `_max_pool_backward`'s batching rule (the loop fallback's performance warning is an error here)
    and equal torch.func's."""
    x = np.random.default_rng(0).standard_normal((4, 2, 3, 7, 6))
    ct = np.random.default_rng(1).standard_normal((5, 2, 3, 4, 3))
    got, want = [], []
    for lib, out in ((flambeau, got), (torch, want)):
        F = lib.nn.functional
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out.append(lib.func.vmap(lib.func.grad(lambda t: F.max_pool2d(t, 3, 2, 1).pow(2).sum()))(lib.tensor(x)))
            _, vjp = lib.func.vjp(lambda t: F.max_pool2d(t, 2, ceil_mode=True), lib.tensor(x[0]))
            out.append(lib.func.vmap(vjp)(lib.tensor(ct))[0])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


# (spatial dims, input shape, kernel, stride, padding, dilation, ceil_mode, layout)
CASES = [
    (2, (8, 16, 56, 56), 3, 2, 1, 1, False, "contiguous"),      # ResNet-50's stem pool at batch 8, 16 channels
    (2, (8, 16, 56, 56), 3, 2, 1, 1, False, "channels_last"),
    (2, (4, 5, 17, 19), (3, 2), (2, 1), 1, (1, 2), True, "contiguous"),
    (2, (3, 9, 9), 2, None, 0, 1, True, "sliced"),
    (1, (4, 6, 37), 4, 3, 2, 1, True, "contiguous"),
    (3, (2, 3, 9, 10, 11), (2, 3, 3), (2, 1, 2), 1, 1, True, "channels_last"),
]
ULP = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def _pooled(lib, x, dy, case, dtype):
    """(values, indices, input gradient) of max pooling `x` on cuda, the output's gradient `dy`."""
    nd, _shape, k, s, p, d, ceil, layout = case
    t = lib.tensor(x, device="cuda").to(getattr(lib, dtype))
    if layout == "sliced":
        t = t[..., ::2]
    if layout == "channels_last":
        t = t.contiguous(memory_format=lib.channels_last if nd == 2 else lib.channels_last_3d)
    t = t.detach().requires_grad_()
    y, i = getattr(lib.nn.functional, f"max_pool{nd}d")(t, k, s, p, d, ceil, return_indices=True)
    y.backward(lib.tensor(dy, device="cuda").to(y.dtype))
    return [v.detach().float().cpu().numpy() if v.dtype != lib.int64 else v.cpu().numpy() for v in (y, i, t.grad)]


def _inputs(case):
    nd, shape = case[0], list(case[1])
    if case[-1] == "sliced":
        shape[-1] *= 2
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(-4, 4, shape).astype(np.float32)             # ties
    x.flat[rng.choice(x.size, x.size // 50, replace=False)] = np.nan
    x.flat[rng.choice(x.size, x.size // 50, replace=False)] = -np.inf
    return x, rng


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-{'x'.join(map(str, c[1]))}-{c[-1]}")
def test_max_pool_matches_torch_on_cuda(case, dtype, monkeypatch):
    """Values and indices equal PyTorch's cuda ones (ties keep the first position, the last NaN wins);
    the input gradient equals the float64 sum at the indices rounded once (to a unit in the last
    place), and PyTorch's cuda gradient bit for bit in 1-d/2-d (ATen gathers in the same order in
    float32; its 3-d backward is an atomic scatter in the storage type)."""
    from flambeau._backends import triton_max_pool
    calls = _spy(monkeypatch, triton_max_pool, ["forward", "backward"])
    x, rng = _inputs(case)
    nd, k, st, p, d, ceil = case[0], *case[2:7]
    tx = torch.tensor(x)[..., ::2] if case[-1] == "sliced" else torch.tensor(x)
    out_shape = getattr(torch.nn.functional, f"max_pool{nd}d")(tx, k, st, p, d, ceil).shape
    dy = rng.standard_normal(tuple(out_shape)).astype(np.float32)
    want = _pooled(torch, x, dy, case, dtype)
    got = _pooled(flambeau, x, dy, case, dtype)
    assert calls == ["forward", "backward"]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    planes = got[2].reshape(got[2].shape[:got[2].ndim - nd] + (-1,))
    exact = np.zeros(planes.shape, np.float64)
    dy_r = torch.tensor(dy).to(getattr(torch, dtype)).double().numpy().reshape(planes.shape[:-1] + (-1,))
    idx = got[1].reshape(dy_r.shape)
    for lead in np.ndindex(*planes.shape[:-1]):
        np.add.at(exact[lead], idx[lead], dy_r[lead])
    np.testing.assert_allclose(planes, exact, rtol=ULP[dtype], atol=4 * ULP[dtype] * np.abs(dy_r).max())
    if nd < 3:
        np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.cuda
def test_one_kernel_each_way_on_cuda():
    """PyTorch's profiler counts every kernel of the process: one max pooling of ResNet-50's stem
    (bfloat16, 3x3 stride 2 padding 1) launches one kernel forward and one backward."""
    from bench.gpu_profile import counts
    F = flambeau.nn.functional
    x = flambeau.randn(4, 64, 112, 112, device="cuda").to(flambeau.bfloat16).requires_grad_()
    y = F.max_pool2d(x, 3, 2, 1)
    dy = flambeau.randn(tuple(y.shape), device="cuda").to(flambeau.bfloat16)
    forward = counts(lambda: F.max_pool2d(x, 3, 2, 1), steps=3)
    backward = counts(lambda: flambeau.autograd.grad(y, x, dy, retain_graph=True), steps=3)
    assert forward["kernels"] == 1 and backward["kernels"] == 1, (forward, backward)


def _compiled_pool(t):
    return (flambeau.nn.functional.max_pool2d(t.relu(), 3, 2, 1) * 2).float().square().sum()


def test_compiled_backward_calls_the_backward_op(monkeypatch):
    """The compiled backward graph runs max pooling's gradient as `_max_pool_backward` (the extern
    that takes the Triton kernel on cuda), not as a scatter; its gradient equals PyTorch's."""
    from tests.conftest import spy_compile_fx
    made = spy_compile_fx(monkeypatch, [])
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    t = flambeau.tensor(x, requires_grad=True)
    flambeau.compile(_compiled_pool)(t).backward()
    r = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.max_pool2d(r.relu(), 3, 2, 1) * 2).square().sum().backward()
    assert len(made) == 2 and "_max_pool_backward" in made[1].gm.code, made[1].gm.code
    np.testing.assert_array_equal(t.grad.numpy(), r.grad.numpy())


@pytest.mark.cuda
def test_compiled_max_pool_runs_the_triton_kernels_on_cuda(monkeypatch):
    """A compiled function's max pooling forward and backward are externs running the same kernels,
    nothing runs eagerly; values and gradient agree with eager flambeau's."""
    from flambeau._backends import triton_max_pool
    from flambeau._dynamo.testing import no_unexpected_fallbacks
    from tests.conftest import spy_compile_fx
    calls = _spy(monkeypatch, triton_max_pool, ["forward", "backward"])
    made = spy_compile_fx(monkeypatch, [])
    x = flambeau.randn(4, 8, 30, 30, device="cuda").to(flambeau.bfloat16)
    out = []
    with no_unexpected_fallbacks({}):
        for fn in (_compiled_pool, flambeau.compile(_compiled_pool)):
            t = x.detach().requires_grad_()
            loss = fn(t)
            loss.backward()
            out.append((loss.item(), t.grad.float().cpu().numpy()))
    assert len(made) == 2
    assert calls.count("forward") == 2 and calls.count("backward") == 2, calls
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-4)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-2, atol=1e-2)
