"""The Triton backend on the GPU (marked `cuda`: the GPU machine runs these, CI skips them).

Every op-database entry compiled on cuda tensors (flambeau.compile's default backend there is
Triton), called and compared with flambeau's eager result on cuda at the op database's compile
tolerances, with nothing running eagerly inside the compiled code beyond what the entry declares;
the kernels are built by `triton.compile` for the device and launched through CuPy. Then a
dynamic graph serving several sizes and a bfloat16 chain.
"""
from __future__ import annotations

import numpy as np
import pytest

import flambeau as fl
from flambeau._dynamo.testing import no_unexpected_fallbacks
from tests.conftest import spy_compile_fx
from tests.opdb import (all_opinfos, assert_outputs_match, compile_dtype, declared_eager_fallbacks, eager_samples,
                        expected_fallbacks, flat_tensors, materialize)

pytestmark = pytest.mark.cuda
OPINFOS = all_opinfos()
F = fl.nn.functional


# Entries whose function builds cpu tensors (index tensors, as PyTorch allows with cuda tensors): the
# graph spans two devices and runs eagerly, recorded as a whole-graph fallback.
MIXED_DEVICES = {"setitem_adv": "index tensor made on cpu", "setitem_mask": "mask made on cpu",
                 "setitem_mixed": "index tensor made on cpu",
                 "onednn.qlinear_pointwise.tensor": "scale and zero-point tensors made on cpu",
                 "onednn.qlinear_pointwise.binary_tensor": "scale and zero-point tensors made on cpu",
                 "onednn.qconv2d_pointwise.tensor": "scale and zero-point tensors made on cpu",
                 "onednn.qconv2d_pointwise.binary_tensor": "scale and zero-point tensors made on cpu"}


def _move(x, device):
    if isinstance(x, fl.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        items = [_move(y, device) for y in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


@pytest.mark.parametrize("info", OPINFOS, ids=[i.name for i in OPINFOS])
def test_opdb_compiled_with_triton_on_cuda(info):
    if "compile" in info.skip:
        pytest.skip(info.skip["compile"])
    if not any(info.samples(d) for d in info.dtypes):
        pytest.skip("an entry of error samples only")
    dt = compile_dtype(fl, info, 2)
    assert dt is not None
    fn = info.resolve(fl)
    ran = refused = 0
    allowed = expected_fallbacks(info, None)
    if info.name in MIXED_DEVICES:
        allowed["whole graph"] = MIXED_DEVICES[info.name]
    with no_unexpected_fallbacks(allowed):
        for i, s, _ in eager_samples(fl, info, dt, 2):
            args, kwargs, _ = materialize(fl, s, dt, 100 + i, False)
            gargs, gkw = _move(args, "cuda"), {k: _move(v, "cuda") for k, v in kwargs.items()}
            if not flat_tensors(fl, (gargs, list(gkw.values()))):
                gkw["device"] = "cuda"
            pargs, pkw, _ = materialize(fl, s, dt, 100 + i, False)     # fresh: ops update their inputs in place
            pkw = {k: _move(v, "cuda") for k, v in pkw.items()}
            if "device" in gkw:
                pkw["device"] = "cuda"
            fl._dynamo.reset()
            try:
                eager = fn(*_move(pargs, "cuda"), **pkw)
            except Exception as e:     # refused on cuda only (as PyTorch's cuda kernel): compiled too
                with pytest.raises(type(e)):
                    fl.compile(lambda *a, **k: fn(*a, **k))(*gargs, **gkw)
                refused += 1
                continue
            res = fl.compile(lambda *a, **k: fn(*a, **k))(*gargs, **gkw)
            assert [t.device for t in flat_tensors(fl, res)] == [t.device for t in flat_tensors(fl, eager)], \
                f"{info.name}: output devices"
            assert_outputs_match(fl, info, _move(eager, "cpu"), _move(res, "cpu"), f"sample {i} ({dt}) on cuda")
            ran += 1
    assert ran or refused    # a cpu-only op (oneDNN's) is refused on cuda eagerly and compiled, as test_ops checks


def test_dynamic_graph_serves_every_size_on_cuda():
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)).sum(-1)
    cf = fl.compile(f, dynamic=True)
    with no_unexpected_fallbacks({}):
        for n, m in ((5, 8), (64, 768), (3, 5000)):
            x, w, b = fl.randn(n, m), fl.randn(m), fl.randn(m)
            got = cf(x.cuda(), w.cuda(), b.cuda()).cpu().numpy()
            np.testing.assert_allclose(got, f(x, w, b).numpy(), rtol=1e-4, atol=1e-3)


def test_bfloat16_chain_on_cuda():
    def f(x):
        h = F.silu(x) * 2
        return F.softmax(h, -1), h.sum(0)
    x = fl.randn(64, 1000)
    with no_unexpected_fallbacks({}):
        got = fl.compile(f)(x.cuda().to(fl.bfloat16))
    want = f(x.to(fl.bfloat16))
    for g, w in zip(got, want):
        assert g.dtype == fl.bfloat16
        np.testing.assert_allclose(g.cpu().float().numpy(), w.float().numpy(), rtol=2e-2, atol=2e-2)


def _train_grads(build, batch, compiled: bool, amp: bool, steps: int = 2):
    """Losses, and gradients of every parameter after `steps` AdamW steps on cuda (bf16 autocast
    when `amp`)."""
    fl.manual_seed(0)
    model = build().cuda()
    opt = fl.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = fl.compile(model) if compiled else model
    x, y = (t.cuda() for t in batch)
    losses = []
    for i in range(steps):
        with fl.autocast(device_type="cuda", dtype=fl.bfloat16, enabled=amp):
            loss = fwd(x, y)
        loss.backward()
        if i < steps - 1:
            opt.step()
            opt.zero_grad()
        losses.append(float(loss))
    return losses, {n: p.grad.float().cpu().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_compiled_training_matches_eager_on_cuda(name):
    """bench/gpu_models' MLP and a GPT-2 layer at full width (vocab 512, T 128): in float32 every
    parameter's gradient after a step, compiled (Triton kernels, cuBLASLt and attention externs) vs
    eager; under bf16 autocast the losses (gradients differ there by bf16 rounding: eager rounds
    every op's result, the fused kernels only their stores)."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import gpu_models
    if name == "mlp":
        build = lambda: gpu_models.mlp(fl, width=64, depth=3)            # noqa: E731
        batch = (fl.randn(16, 64), fl.randint(0, 64, (16,)))
    else:
        build = lambda: gpu_models.gpt(fl, vocab=512, block=128, layers=1)   # noqa: E731
        batch = (fl.randint(0, 512, (2, 128)), fl.randint(0, 512, (2, 128)))
    le, ge = _train_grads(build, batch, False, amp=False)
    with no_unexpected_fallbacks(declared_eager_fallbacks()):
        lc, gc = _train_grads(build, batch, True, amp=False)
    bad = []
    for n in ge:
        err = float(np.abs(gc[n] - ge[n]).max())
        scale = float(np.abs(ge[n]).max()) + 1e-6
        if not err <= 2e-3 * scale + 1e-6:
            bad.append(f"{n}: max err {err:.3g} of {scale:.3g}")
    assert not bad, f"losses eager {le} compiled {lc}; gradients off: " + "; ".join(bad)
    np.testing.assert_allclose(lc, le, rtol=1e-4)
    le, _ = _train_grads(build, batch, False, amp=True)
    with no_unexpected_fallbacks(declared_eager_fallbacks()):
        lc, _ = _train_grads(build, batch, True, amp=True)
    np.testing.assert_allclose(lc, le, rtol=1e-2)


def test_compiled_products_run_through_cublaslt():
    """mm, bmm and addmm inside a compiled graph on cuda (bf16, a transposed weight as GPT-2's lm_head,
    odd n) run as the eager products do, through cuBLASLt (`cublaslt.calls` counts its launches),
    and agree with eager."""
    from flambeau._backends import cublaslt

    def f(x, w, a, b, bias):
        return x @ w.t(), fl.bmm(a, b), fl.addmm(bias, x, w.t()[:, :64])
    x, w = fl.randn(256, 96).cuda().bfloat16(), fl.randn(1001, 96).cuda().bfloat16()
    a, b = fl.randn(3, 32, 48).cuda().bfloat16(), fl.randn(3, 48, 40).cuda().bfloat16()
    bias = fl.randn(64).cuda().bfloat16()
    cf = fl.compile(f)
    with no_unexpected_fallbacks({}):
        cf(x, w, a, b, bias)
        before = cublaslt.calls["gemm"]
        got = cf(x, w, a, b, bias)
    assert cublaslt.calls["gemm"] - before == 3
    for g, e in zip(got, f(x, w, a, b, bias)):
        np.testing.assert_allclose(g.float().cpu().numpy(), e.float().cpu().numpy(), rtol=2e-2, atol=2e-2)


def test_large_reductions_split_on_cuda():
    """Full and few-output reductions of large tensors split into parts on the GPU (two kernels
    each), against float64 on the host."""
    from flambeau._inductor import triton_runtime
    x = fl.randn(4096, 1000)
    f = lambda a: (a.sum(), a.amax(), a.argmin(), a.sum(0), a.t().reshape(2, -1).sum(1), (a * a).mean())  # noqa: E731
    before = triton_runtime.stats["launches"]
    with no_unexpected_fallbacks({}):
        got = fl.compile(f)(x.cuda())
    assert triton_runtime.stats["launches"] - before >= 12
    xd = x.double()
    want = (xd.sum(), xd.amax(), x.argmin(), xd.sum(0), xd.t().reshape(2, -1).sum(1), (xd * xd).mean())
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.cpu().double().numpy(), e.numpy(), rtol=1e-4, atol=1e-2)


def test_batchnorm_training_splits_its_channel_sums_on_cuda(monkeypatch):
    """BatchNorm + ReLU in training at a ResNet-50 stem size (64 channels, 32 x 56 x 56 elements each):
    the forward's mean and variance and the backward's per-channel sums split over the GPU
    (triton_schedule.py; each sum was one of 64 programs), values and gradients against float64 eager."""
    from flambeau._inductor import triton_runtime
    rng = np.random.default_rng(0)
    x, gy = (rng.standard_normal((32, 64, 56, 56)).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(64).astype(np.float32) for _ in range(2))

    def fn(x, w, b):
        return F.relu(F.batch_norm(x, None, None, w, b, training=True))
    made = spy_compile_fx(monkeypatch, [])
    args = [fl.tensor(v, device="cuda", requires_grad=True) for v in (x, w, b)]
    before = triton_runtime.stats["launches"]
    with no_unexpected_fallbacks({}):
        out = fl.compile(fn)(*args)
        out.backward(fl.tensor(gy, device="cuda"))
    assert triton_runtime.stats["launches"] - before >= 6
    assert len(made) == 2 and all("_final(" in g.source for g in made), "the channel sums were not split"
    assert "ws1_v" in made[1].source, "the backward's sums were not split together"
    ref = [fl.tensor(v.astype(np.float64), requires_grad=True) for v in (x, w, b)]
    want = fn(*ref)
    want.backward(fl.tensor(gy.astype(np.float64)))
    np.testing.assert_allclose(out.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-3, atol=1e-3)
    for g, e in zip(args, ref):
        np.testing.assert_allclose(g.grad.cpu().double().numpy(), e.grad.numpy(), rtol=1e-3, atol=2e-2)


def test_lm_head_products_padded_at_their_producers_on_cuda(monkeypatch):
    """GPT-2's lm_head and loss (vocabulary 50257) under bf16 autocast, compiled: the three products run
    on operands padded to 50264 where they are made (pad_mm.py), no padded copy in cuBLASLt; loss and
    gradients against eager on cuda."""
    from flambeau._backends import cublaslt
    made = spy_compile_fx(monkeypatch, [])
    rng = np.random.default_rng(1)
    h = rng.standard_normal((2048, 768)).astype(np.float32)
    w = (rng.standard_normal((50257, 768)) * 0.02).astype(np.float32)
    t = rng.integers(0, 50257, 2048)

    def fn(h, w, t):
        with fl.autocast(device_type="cuda", dtype=fl.bfloat16):
            return F.cross_entropy(h @ w.t(), t)
    results = []
    for f in (fn, fl.compile(fn)):
        fh, fw = (fl.tensor(v, device="cuda", requires_grad=True) for v in (h, w))
        padded = cublaslt.calls["padded"]
        loss = f(fh, fw, fl.tensor(t, device="cuda"))
        loss.backward()
        results.append((loss.item(), fh.grad.cpu().numpy(), fw.grad.cpu().numpy(), cublaslt.calls["padded"] - padded))
    (le, he, we, pe), (lc, hc, wc, pc) = results
    assert pe > 0 and pc == 0, (pe, pc)          # eager pads copies; compiled, none
    shapes = [[tuple(e.layout.shape) for e in g.artifact.externs] for g in made]
    # the weight's gradient is produced as (50264, 768), the layout its consumer (the padded weight's
    # slice) reads, rather than as a (768, 50264) product transposed afterwards
    assert shapes == [[(2048, 50264)], [(2048, 768), (50264, 768)]], shapes
    np.testing.assert_allclose(lc, le, rtol=1e-3)
    np.testing.assert_allclose(hc, he, rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(wc, we, rtol=2e-2, atol=2e-3)


def test_compiled_index_error_raises_at_the_next_sync():
    """A compiled graph's out-of-range index on cuda is raised at the next synchronisation (the graph
    never reads its error flag on the host), once, and the flag is clear afterwards."""
    from flambeau._backends import device_checks
    f = fl.compile(lambda x, i: x[i] * 2)
    x = fl.randn(5, 3).cuda()
    np.testing.assert_allclose(f(x, fl.tensor([0, 4]).cuda()).cpu().numpy(), (x.cpu()[fl.tensor([0, 4])] * 2).numpy())
    out = f(x, fl.tensor([0, 5]).cuda())
    assert device_checks.pending() and out.shape == (2, 3)
    with pytest.raises(IndexError, match="index out of range"):
        fl.cuda.synchronize()
    assert f(x, fl.tensor([1]).cuda()).cpu().shape == (1, 3)


def test_attention_outputs_are_taken_in_place_on_cuda():
    """A compiled GPT-2 layer's training step under bf16 autocast copies no extern output: the fused
    attention's out and gradients come back in the (B, T, H, E) layouts their meta gives
    (`wrapper.stats`; each layer copied its out, dq, dk and dv before), and the loss equals eager's."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import gpu_models
    from flambeau._inductor import wrapper
    build = lambda: gpu_models.gpt(fl, vocab=512, block=128, layers=2)   # noqa: E731
    batch = (fl.randint(0, 512, (2, 128)), fl.randint(0, 512, (2, 128)))
    le, _ = _train_grads(build, batch, False, amp=True)
    before = wrapper.stats["extern_output_copies"]
    with no_unexpected_fallbacks(declared_eager_fallbacks()):
        lc, _ = _train_grads(build, batch, True, amp=True)
    assert wrapper.stats["extern_output_copies"] == before
    np.testing.assert_allclose(lc, le, rtol=1e-2)


def test_compiled_products_are_planned_once_on_cuda(monkeypatch):
    """A compiled graph's mm/bmm find their cuBLASLt plan at the first call (extern_gemm.py); later
    calls go straight to cublasLtMatmul, never through the eager `cublaslt.gemm`, and equal eager's
    results (transposed and batched operands, a view at an offset). An operand off the 256-byte
    alignment the plan assumes runs the eager product, still right."""
    from flambeau._backends import cublaslt

    def f(x, w, a, b):
        return x @ w.t(), fl.bmm(a, b.transpose(1, 2)), x[:, 32:] @ w[:, 32:].t()
    x, w = fl.randn(256, 96).cuda().bfloat16(), fl.randn(512, 96).cuda().bfloat16()
    a, b = fl.randn(3, 32, 64).cuda().bfloat16(), fl.randn(3, 40, 64).cuda().bfloat16()
    cf = fl.compile(f)
    with no_unexpected_fallbacks({}):
        cf(x, w, a, b)
        eager_calls = []
        real = cublaslt.gemm
        monkeypatch.setattr(cublaslt, "gemm", lambda *p, **k: eager_calls.append(1) or real(*p, **k))
        before = cublaslt.calls["gemm"]
        got = cf(x, w, a, b)
        assert cublaslt.calls["gemm"] - before == 3 and not eager_calls
        xo = fl.randn(257 * 96).cuda().bfloat16()[96:].view(256, 96)       # 192 bytes past an allocation
        got_off = cf(xo, w, a, b)
    assert len(eager_calls) == 2            # x's two products; bmm's operands are aligned
    for g, e in zip(list(got) + list(got_off), list(f(x, w, a, b)) + list(f(xo, w, a, b))):
        np.testing.assert_allclose(g.float().cpu().numpy(), e.float().cpu().numpy(), rtol=2e-2, atol=2e-2)
