"""flambeau's own float32 CPU kernels (flambeau/_backends/cpu_kernels.cpp): GEMM, implicit-GEMM conv2d and softmax,
against a float64 reference and PyTorch."""
import numpy as np
import pytest
import torch

import flambeau
from flambeau._backends import cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no AVX-512 / C++ compiler: NumPy's BLAS is used")


def _ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _check(got, a, b):
    ref = _ref(a, b)
    assert got.shape == ref.shape and got.dtype == np.float32
    # float32 accumulation over K terms: error bound relative to sum |a||b|
    bound = 1e-5 * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64)) + 1e-6
    assert np.all(np.abs(got - ref) <= bound * max(1, a.shape[-1] ** 0.5))


SHAPES = [(64, 256, 256), (1, 1000, 1), (13, 7, 33), (12, 96, 32), (97, 300, 65), (256, 64, 256),
          (300, 513, 70), (5, 2048, 3), (64, 576, 896), (2, 3000, 40)]


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("parallel", [False, True])
def test_gemm_shapes_layouts(M, K, N, ta, tb, parallel, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MACS", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(M * 1000 + K * 10 + N)
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    a, b = (a.T if ta else a), (b.T if tb else b)
    _check(cpu_kernels.matmul(a, b), a, b)


def test_gemm_strided_negative_and_out(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    rng = np.random.default_rng(0)
    big = rng.standard_normal((80, 90)).astype(np.float32)
    a = big[::2, 5:70:3]            # (40, 22), non-unit strides both ways
    b = rng.standard_normal((22, 50)).astype(np.float32)[::-1]     # negative row stride
    _check(cpu_kernels.matmul(a, b), a, b)
    out = np.full((40, 100), 7.0, np.float32)
    view = out[:, 10:60]            # row stride 100: written in place, the rest untouched
    r = cpu_kernels.matmul(a, b, out=view)
    assert r is view
    _check(view, a, b)
    assert np.all(out[:, :10] == 7.0) and np.all(out[:, 60:] == 7.0)


def test_gemm_batched_broadcast(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 17, 29)).astype(np.float32)
    b = rng.standard_normal((29, 31)).astype(np.float32)
    _check(cpu_kernels.matmul(a, b), a, b)
    w = rng.standard_normal((4, 31, 29)).astype(np.float32)
    _check(cpu_kernels.matmul(a, w.swapaxes(-1, -2)), a, w.swapaxes(-1, -2))
    c = rng.standard_normal((3, 1, 29, 8)).astype(np.float32)
    _check(cpu_kernels.matmul(a, c), a, c)
    # a batch layout that is not one stride (a permuted batch) falls back item by item
    p = np.ascontiguousarray(a.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    _check(cpu_kernels.matmul(p, c), p, c)


def test_gemm_empty_and_zero_k(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    a = np.ones((3, 0), np.float32)
    b = np.ones((0, 4), np.float32)
    np.testing.assert_array_equal(cpu_kernels.matmul(a, b), np.zeros((3, 4), np.float32))
    out = np.full((3, 4), 5.0, np.float32)
    cpu_kernels.matmul(a, b, out=out)
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))
    assert cpu_kernels.matmul(np.ones((0, 5), np.float32), np.ones((5, 4), np.float32)).shape == (0, 4)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1)])
def test_batches_of_small_products_match_torch(ta, tb):
    """Attention's per-head products (below SMALL_ITEM_MACS each: NumPy's BLAS), any layout."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 4, 16, 32) if ta else (8, 4, 32, 16)).astype(np.float32)
    b = rng.standard_normal((8, 4, 32, 16) if tb else (8, 4, 16, 32)).astype(np.float32)
    a, b = (a.swapaxes(-1, -2) if ta else a), (b.swapaxes(-1, -2) if tb else b)
    _check(cpu_kernels.matmul(a, b), a, b)
    got = flambeau.matmul(flambeau.from_numpy(a), flambeau.from_numpy(b)).numpy()
    torch.testing.assert_close(torch.from_numpy(got), torch.matmul(torch.from_numpy(a), torch.from_numpy(b)),
                               rtol=1e-5, atol=1e-5)


def test_nonfloat32_goes_to_numpy():
    a = np.arange(12.0).reshape(3, 4)
    b = np.arange(8.0).reshape(4, 2)
    r = cpu_kernels.matmul(a, b)
    assert r.dtype == np.float64
    np.testing.assert_array_equal(r, a @ b)


@pytest.mark.parametrize("shape", [((64, 256), (256, 256)), ((16, 64, 48), (48, 64)), ((2, 8, 96, 40), (2, 8, 40, 96))])
def test_flambeau_ops_use_it_and_match_torch(shape):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(shape[0]).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    got = flambeau.matmul(flambeau.from_numpy(a), flambeau.from_numpy(b)).numpy()
    torch.testing.assert_close(torch.from_numpy(got), torch.matmul(torch.from_numpy(a), torch.from_numpy(b)),
                               rtol=1e-5, atol=1e-4)


def test_linear_and_conv_match_torch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    got = flambeau.nn.functional.conv2d(flambeau.from_numpy(x), flambeau.from_numpy(w), flambeau.from_numpy(bias),
                                        padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias), padding=1)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-4)
    xl = rng.standard_normal((64, 256)).astype(np.float32)
    wl = rng.standard_normal((300, 256)).astype(np.float32)
    got = flambeau.nn.functional.linear(flambeau.from_numpy(xl), flambeau.from_numpy(wl)).numpy()
    torch.testing.assert_close(torch.from_numpy(got), torch.nn.functional.linear(torch.from_numpy(xl), torch.from_numpy(wl)),
                               rtol=1e-4, atol=1e-4)


def test_out_overlapping_an_operand_is_still_right(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 40)).astype(np.float32)
    b = rng.standard_normal((40, 40)).astype(np.float32)
    want = _ref(a, b)
    cpu_kernels.matmul(a, b, out=a)
    np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-4)


def test_forked_child_runs_products_single_threaded(monkeypatch):
    import multiprocessing as mp
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    cpu_kernels.matmul(a, a)              # the parent's OpenMP team exists now
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(float(np.abs(cpu_kernels.matmul(a, a) - _ref(a, a)).max())))
    p.start()
    err = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and err < 1e-3


def _operand(rng, shape, strides, offset):
    """(base array, view): the view of `shape`/element `strides` at element `offset` of the base."""
    span = offset + 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    base = rng.standard_normal(span).astype(np.float32)
    return base, np.lib.stride_tricks.as_strided(base[offset:], shape, tuple(4 * st for st in strides))


PLANNED = [  # (a shape, strides, offset), (b shape, strides, offset): the compiled small GPT's layouts and others
    (((256, 64), (64, 1), 0), ((64, 192), (1, 64), 0)),
    (((64, 256), (1, 64), 0), ((256, 256), (256, 1), 0)),
    (((256, 64), (64, 1), 0), ((64, 65), (1, 64), 0)),
    (((97, 300), (1, 97), 5), ((300, 70), (70, 1), 3)),           # transposed A, both at an offset
    (((8, 128, 64), (64, 512, 1), 64), ((8, 64, 96), (6144, 1, 64), 0)),   # a batch of heads in a (T, B*H) layout
    (((4, 200, 50), (0, 50, 1), 0), ((4, 50, 130), (6500, 130, 1), 7)),    # an expanded (stride 0) batch
]


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("a_layout,b_layout", PLANNED)
def test_planned_gemm_matches_float64(a_layout, b_layout, parallel, monkeypatch):
    """gemm_plan reads each operand at its layout's offset and strides from the array it is handed."""
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MACS", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(len(a_layout[0]) * 100 + a_layout[0][-1])
    (a_base, a), (b_base, b) = _operand(rng, *a_layout), _operand(rng, *b_layout)
    fn = cpu_kernels.gemm_plan(a_layout, b_layout)
    got = fn(a_base, b_base)
    assert got.flags.c_contiguous
    _check(got, a, b)
    _check(fn(a_base, b_base), a, b)          # the plan serves every call


def test_gemm_plan_declines_what_matmul_gives_to_numpy():
    small = (((8, 8), (8, 1), 0), ((8, 8), (8, 1), 0))
    outer = (((300, 1), (1, 1), 0), ((1, 300), (300, 1), 0))     # inner size 1: PyTorch's signed zeros
    mixed = (((4, 64, 64), (4096, 64, 1), 0), ((64, 64), (64, 1), 0))
    assert all(cpu_kernels.gemm_plan(*x) is None for x in (small, outer, mixed))
    assert cpu_kernels.gemm_plan(((512, 512), (512, 1), 0), ((512, 512), (512, 1), 0)) is not None


def test_planned_gemm_in_a_forked_child_runs_single_threaded():
    import multiprocessing as mp
    rng = np.random.default_rng(6)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    layout = ((512, 512), (512, 1), 0)
    fn = cpu_kernels.gemm_plan(layout, layout)
    assert fn.plan[cpu_kernels.PLAN_THREADS] == cpu_kernels._threads(512 ** 3)
    fn(a, a)                              # the parent's OpenMP team exists now
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(float(np.abs(fn(a, a) - _ref(a, a)).max())))
    p.start()
    err = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and err < 1e-2


@pytest.mark.parametrize("N,C,H,W,O,k,stride,padding,dilation,bias", [
    (2, 64, 56, 56, 64, 3, 1, 1, 1, True),     # the benchmark's shape, smaller batch
    (3, 5, 9, 7, 13, 3, 1, 0, 1, False),      # output rows narrower than a panel: many runs per panel
    (2, 7, 17, 23, 30, 5, 2, 2, 1, True),      # stride 2
    (1, 6, 20, 20, 9, 3, 1, 2, 2, True),       # dilation, padding wider than the dilation needs
    (2, 40, 12, 12, 16, (3, 1), (1, 2), (1, 0), 1, False),   # rectangular kernel, mixed strides
    (2, 33, 10, 11, 25, 3, 1, "same", 1, True),   # K = 297: two k-blocks
    (1, 4, 8, 8, 3, 4, 1, "same", 1, False),       # even kernel: asymmetric 'same' padding
])
def test_implicit_gemm_conv2d_matches_torch(N, C, H, W, O, k, stride, padding, dilation, bias):
    rng = np.random.default_rng(N * 100 + C)
    ks = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((O, C) + ks).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if bias else None
    calls = []
    orig = cpu_kernels.conv2d

    def spy(*a, **kw):
        r = orig(*a, **kw)
        calls.append(r is not None)
        return r
    import flambeau._ops.nn_conv as nn_conv
    nn_conv.cpu_kernels.conv2d = spy
    try:
        got = flambeau.nn.functional.conv2d(flambeau.from_numpy(x), flambeau.from_numpy(w),
                                            None if b is None else flambeau.from_numpy(b),
                                            stride=stride, padding=padding, dilation=dilation).numpy()
    finally:
        nn_conv.cpu_kernels.conv2d = orig
    assert calls == [True]          # the implicit-GEMM kernel computed it
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b),
                                      stride=stride, padding=padding, dilation=dilation)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("shape", [(4096, 1024), (3, 1), (5, 17), (2, 3, 1000), (1, 70000)])
@pytest.mark.parametrize("log", [False, True])
def test_fused_softmax_matches_torch(shape, log):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    x.reshape(-1)[::7] = -np.inf                  # masked entries, as attention masks make them
    x.reshape(-1)[0] = 80.0                        # exp would overflow without the max shift
    assert cpu_kernels.softmax_lastdim(x, log) is not None
    t = flambeau.from_numpy(x)
    got = (t.log_softmax(-1) if log else t.softmax(-1)).numpy()
    ref = torch.from_numpy(x)
    want = ref.log_softmax(-1) if log else ref.softmax(-1)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,wd", [("AdamW", 0.01), ("Adam", 0.0), ("Adam", 0.1), ("AdamW", 0.0)])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adam_step_is_bitwise_the_numpy_rule_and_close_to_torch(name, wd, amsgrad):
    rng = np.random.default_rng(7)
    init = [rng.standard_normal((300, 70)).astype(np.float32), rng.standard_normal(33).astype(np.float32)]
    fused = [flambeau.tensor(a.copy(), requires_grad=True) for a in init]
    plain = [flambeau.tensor(a.copy(), requires_grad=True) for a in init]
    ref = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    calls = []
    of = getattr(flambeau.optim, name)(fused, lr=1e-2, weight_decay=wd, amsgrad=amsgrad)
    real = of._fused_cpu
    of._fused_cpu = lambda *a: calls.append(real(*a)) or calls[-1]
    op = getattr(flambeau.optim, name)(plain, lr=1e-2, weight_decay=wd, amsgrad=amsgrad)
    op._fused_cpu = lambda *a: False          # the NumPy update rule
    ot = getattr(torch.optim, name)(ref, lr=1e-2, weight_decay=wd, amsgrad=amsgrad)
    for _ in range(6):
        for a, b, c in zip(fused, plain, ref):
            g = rng.standard_normal(a.shape).astype(np.float32)
            a.grad, b.grad, c.grad = flambeau.tensor(g), flambeau.tensor(g.copy()), torch.tensor(g.copy())
        of.step(), op.step(), ot.step()
    assert calls and all(calls)                  # the C++ step ran every time
    for a, b, c in zip(fused, plain, ref):
        x, y = a.detach().numpy(), b.detach().numpy()
        assert np.array_equal(x, y), f"fused vs NumPy rule: {int((x != y).sum())} differ, max {np.abs(x - y).max()}"
        torch.testing.assert_close(torch.from_numpy(x), c.detach(), rtol=1e-5, atol=1e-5)


BF16_SHAPES = [(64, 256, 256, 0, 0, None), (97, 301, 65, 1, 0, None), (13, 7, 33, 0, 1, None),
               (130, 513, 70, 1, 1, None), (48, 64, 96, 0, 0, 5), (33, 80, 40, 0, 1, 3)]


@pytest.mark.skipif(not cpu_kernels.bf16_native(), reason="no AVX-512 BF16: bfloat16 products compute in float32")
@pytest.mark.parametrize("M,K,N,ta,tb,batch", BF16_SHAPES)
@pytest.mark.parametrize("parallel", [False, True])
def test_bfloat16_gemm_vs_pytorch_and_float64(M, K, N, ta, tb, batch, parallel, monkeypatch):
    """bfloat16 products on AVX-512 BF16 dot products (odd K: a zero-padded pair), float accumulation,
    rounded once: within PyTorch's bfloat16 tolerance of torch.matmul and no farther from the float64
    product than PyTorch's own."""
    import ml_dtypes
    monkeypatch.setattr(cpu_kernels, "MIN_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "SMALL_ITEM_MACS", 0)
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MACS", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(M + K + N)
    lead = (batch,) if batch else ()
    a = rng.standard_normal(lead + ((K, M) if ta else (M, K))).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(lead + ((N, K) if tb else (K, N))).astype(ml_dtypes.bfloat16)
    a, b = (np.swapaxes(a, -1, -2) if ta else a), (np.swapaxes(b, -1, -2) if tb else b)
    got = cpu_kernels.matmul_bf16(a, b)
    assert got is not None and got.dtype == a.dtype
    ta_, tb_ = (torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16) for x in (a, b))
    want = torch.matmul(ta_, tb_)
    g = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16)
    torch.testing.assert_close(g, want)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    err = lambda x: np.abs(x.float().numpy().astype(np.float64) - exact).max()      # noqa: E731
    assert err(g) <= 1.01 * err(want) + 1e-6


@pytest.mark.skipif(not cpu_kernels.bf16_native(), reason="no AVX-512 BF16")
def test_flambeau_bfloat16_mm_uses_the_bf16_kernel(monkeypatch):
    calls = []
    orig = cpu_kernels.matmul_bf16
    monkeypatch.setattr(cpu_kernels, "matmul_bf16", lambda a, b, bias=None: calls.append(1) or orig(a, b, bias))
    x = flambeau.randn(128, 256).to(flambeau.bfloat16)
    w = flambeau.randn(256, 192).to(flambeau.bfloat16)
    got = x @ w
    assert calls and got.dtype == flambeau.bfloat16
    want = torch.from_numpy(x.float().numpy()).bfloat16() @ torch.from_numpy(w.float().numpy()).bfloat16()
    torch.testing.assert_close(torch.from_numpy(got.float().numpy()), want.float(), rtol=1.6e-2, atol=1e-5)


@pytest.mark.skipif(not cpu_kernels.bf16_native(), reason="no AVX-512 BF16")
@pytest.mark.parametrize("with_bias", [False, True])
def test_flambeau_bfloat16_linear_uses_the_bf16_kernel(with_bias, monkeypatch):
    """Eager bf16 `linear` (3-d input, the bias added to the float sums before the one rounding) runs
    on the BF16 dot products, within PyTorch's bf16 tolerance of torch's bf16 linear and no farther
    from the float64 result than it."""
    calls = []
    orig = cpu_kernels.matmul_bf16
    monkeypatch.setattr(cpu_kernels, "matmul_bf16", lambda a, b, bias=None: calls.append(1) or orig(a, b, bias))
    rng = np.random.default_rng(4)
    xs, ws, bs = rng.standard_normal((4, 32, 256)), rng.standard_normal((192, 256)), rng.standard_normal(192) * 4
    bf = lambda a: flambeau.tensor(a.astype(np.float32)).to(flambeau.bfloat16)          # noqa: E731
    tbf = lambda a: torch.tensor(a.astype(np.float32)).bfloat16()                       # noqa: E731
    got = flambeau.nn.functional.linear(bf(xs), bf(ws), bf(bs) if with_bias else None)
    assert calls and got.dtype == flambeau.bfloat16
    want = torch.nn.functional.linear(tbf(xs), tbf(ws), tbf(bs) if with_bias else None)
    g = torch.from_numpy(got.float().numpy())
    torch.testing.assert_close(g, want.float(), rtol=1.6e-2, atol=1e-5)
    exact = torch.nn.functional.linear(tbf(xs).double(), tbf(ws).double(), tbf(bs).double() if with_bias else None)
    assert (g.double() - exact).abs().max() <= 1.01 * (want.double() - exact).abs().max() + 1e-6


# ---- LayerNorm rows (cpu_kernels.layer_norm / layer_norm_backward behind native_layer_norm on CPU) ----
def _counting(monkeypatch, calls):
    for name in ("layer_norm", "layer_norm_backward"):
        real = getattr(cpu_kernels, name)

        def wrapped(*a, real=real, name=name):
            r = real(*a)
            if r is not None:
                calls.append(name)
            return r
        monkeypatch.setattr(cpu_kernels, name, wrapped)


LN_CASES = [((64, 256), (256,)), ((4096, 384), (384,)), ((7, 13), (13,)), ((3, 5, 7), (5, 7)), ((2, 1), (1,)),
            ((9, 33), (33,))]


@pytest.mark.parametrize("shape,ns", LN_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parallel", [False, True])
def test_layer_norm_rows_kernel_matches_pytorch(shape, ns, affine, dtype, parallel, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MACS", 0 if parallel else 1 << 62)
    calls = []
    _counting(monkeypatch, calls)
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    x.reshape(-1, int(np.prod(ns)))[0] = 1.5                   # a constant row: variance 0, rstd = 1/sqrt(eps)
    w = rng.standard_normal(ns).astype(dtype) if affine in ("both", "weight") else None
    b = rng.standard_normal(ns).astype(dtype) if affine in ("both", "bias") else None
    gy = rng.standard_normal(shape).astype(dtype)
    res = {}
    for m in (flambeau, torch):
        xt = m.tensor(x, requires_grad=True)
        wt = None if w is None else m.tensor(w, requires_grad=True)
        bt = None if b is None else m.tensor(b, requires_grad=True)
        y, mean, rstd = m.native_layer_norm(xt, ns, wt, bt, 1e-5)
        y.backward(m.tensor(gy))
        res[m.__name__] = [y.detach().numpy(), mean.detach().numpy(), rstd.detach().numpy(), xt.grad.numpy()] + \
            [t.grad.numpy() for t in (wt, bt) if t is not None]
    assert calls == ["layer_norm", "layer_norm_backward"]          # the C++ rows ran, both ways
    names = ["y", "mean", "rstd", "dx"] + [n for n, t in (("dw", w), ("db", b)) if t is not None]
    for n, got, want in zip(names, res["flambeau"], res["torch"]):
        assert got.shape == want.shape and got.dtype == want.dtype, n
        if n in ("dw", "db"):       # column sums over up to 4096 rows, each side in its own order; ATen's
            # xhat = x*rstd - mean*rstd carries ~eps*|x|*rstd (large on constant rows, where ours is exact)
            r = res["torch"][2].reshape(-1, 1).astype(np.float64)
            scale = (np.abs(gy).reshape(-1, want.size) * (1 + np.abs(x).reshape(-1, want.size) * r)).sum(0)
            scale = scale.reshape(want.shape)
            tol = (2e-6 if dtype == np.float32 else 1e-13) * scale
            assert np.all(np.abs(got - want) <= tol + 1e-6 * (dtype == np.float32)), n
        elif n == "dx":
            # constant rows (every row of a 1-wide norm): ATen's a*g + b*x + c cancels with rstd = 316
            # (~1e-3 off); ours is centred, so those rows are checked against float64 (xhat = 0 there:
            # dx = rstd * (g - mean(g)), g = dy * w), the others against PyTorch
            cols = int(np.prod(ns))
            flat, tflat = got.reshape(-1, cols), want.reshape(-1, cols)
            const = np.all(x.reshape(-1, cols) == x.reshape(-1, cols)[:, :1], axis=1)
            g0 = gy.reshape(-1, cols)[const].astype(np.float64) * (1 if w is None else w.reshape(-1))
            ref0 = (g0 - g0.mean(axis=1, keepdims=True)) / np.sqrt(np.float64(dtype(1e-5)))
            np.testing.assert_allclose(flat[const], ref0, rtol=1e-5, atol=1e-5 * np.abs(ref0).max() + 1e-9)
            torch.testing.assert_close(torch.from_numpy(flat[~const]), torch.from_numpy(tflat[~const]), msg=n)
        else:
            torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), msg=n)


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True), (True, False, True), (False, False, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_backward_output_mask_matches_aten(mask, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((130, 77)).astype(dtype)
    w = rng.standard_normal(77).astype(dtype)
    b = rng.standard_normal(77).astype(dtype)
    gy = rng.standard_normal(x.shape).astype(dtype)
    y, mean, rstd = torch.ops.aten.native_layer_norm(torch.from_numpy(x), [77], torch.from_numpy(w),
                                                     torch.from_numpy(b), 1e-5)
    want = torch.ops.aten.native_layer_norm_backward(torch.from_numpy(gy), torch.from_numpy(x), [77], mean, rstd,
                                                     torch.from_numpy(w), torch.from_numpy(b), list(mask))
    got = cpu_kernels.layer_norm_backward(gy, x, 77, mean.numpy(), rstd.numpy(), w, mask)
    assert got is not None
    for on, g, t in zip(mask, got, want):
        assert (g is None) == (not on) and (t is None) == (not on)
        if on:
            torch.testing.assert_close(torch.from_numpy(g), t, rtol=1e-5 if dtype == np.float32 else 1e-7, atol=1e-5)


def test_layer_norm_rows_kernel_declines_what_it_does_not_take(monkeypatch):
    calls = []
    _counting(monkeypatch, calls)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((24, 16)).astype(np.float32)
    w = rng.standard_normal(24).astype(np.float32)
    for m in (flambeau, torch):      # a transposed input: the NumPy path, still PyTorch's values
        xt = m.tensor(x, requires_grad=True)
        wt = m.tensor(w, requires_grad=True)
        y = m.nn.functional.layer_norm(xt.t(), (24,), wt)
        y.backward(m.ones_like(y))
        if m is flambeau:
            got = (y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy())
        else:
            for g, t in zip(got, (y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy())):
                torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(t), rtol=1e-5, atol=1e-5)
    assert calls == []
    assert cpu_kernels.layer_norm(x.astype(np.float16), 16, None, None, 1e-5) is None
    assert cpu_kernels.layer_norm(x, 16, w[:16].astype(np.float64), None, 1e-5) is None
