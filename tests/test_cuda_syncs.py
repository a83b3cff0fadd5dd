"""No host synchronisation in a training step on cuda, and the device-side checks that replace them.

The GPU tests (marked `cuda`) count device-to-host copies with PyTorch's profiler (bench/gpu_profile.py:
CUPTI sees CuPy's copies too) over steps of a small GPT (bench/gpu_models.py: embeddings, LayerNorm,
causal attention with dropout, GELU, tied head, cross-entropy, AdamW, bf16 autocast) and fail above
zero; a step that reads its loss must count one (the counter can fail). Out-of-range indices in
embedding, cross-entropy targets, advanced indexing, gather/scatter and index_select raise their
PyTorch error at the next synchronisation; the embedding gradient kernel is compared with PyTorch's. The check's cpu path
(immediate errors) runs everywhere."""
import numpy as np
import pytest

import flambeau
from flambeau._backends import device_checks


def test_check_range_raises_at_once_on_cpu():
    x = np.array([[0, 3], [5, -100]])
    device_checks.check_range(np, x, 0, 6, IndexError, "bad {}", skip=-100)
    with pytest.raises(IndexError, match="^Target 5 is out of bounds.$"):
        device_checks.check_range(np, x, 0, 5, IndexError, "Target {} is out of bounds.", skip=-100)
    with pytest.raises(RuntimeError, match="^v -100$"):
        device_checks.check_range(np, x, 0, 6, RuntimeError, "v {}")
    assert not device_checks.pending()


def test_cpu_errors_unchanged():
    w = flambeau.randn(5, 3)
    with pytest.raises(IndexError, match="index out of range in self"):
        flambeau.nn.functional.embedding(flambeau.tensor([1, 5]), w)
    with pytest.raises(IndexError, match="Target 7 is out of bounds."):
        flambeau.nn.functional.cross_entropy(flambeau.randn(2, 5), flambeau.tensor([1, 7]))
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 5"):
        w[flambeau.tensor([0, 9])]


# ---- on the GPU --------------------------------------------------------------------------------------
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA here (the profiler counts the copies)")
    return torch


def _small_gpt_step(read_loss=False):
    from bench import gpu_models
    flambeau.manual_seed(0)
    model = gpu_models.gpt(flambeau, vocab=96, block=64, d=64, layers=2, heads=4, dropout=0.1).to("cuda")
    opt = flambeau.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    rng = np.random.default_rng(0)
    x = flambeau.tensor(rng.integers(0, 96, (4, 64)), device="cuda")
    y = flambeau.tensor(rng.integers(0, 96, (4, 64)), device="cuda")
    losses = []

    def step():
        loss = gpu_models.train_step(flambeau, model, opt, x, y, flambeau.bfloat16)
        if read_loss:
            losses.append(loss.item())
        return loss
    return step, losses


@pytest.mark.cuda
def test_gpt_training_step_makes_no_host_syncs():
    _torch_cuda()
    from bench.gpu_profile import counts
    step, _ = _small_gpt_step()
    step()
    step()
    c = counts(step, steps=2, stacks=True)
    assert c["kernels"] > 100
    assert c["d2h"] == 0, c["d2h_sites"]


@pytest.mark.cuda
def test_nanogpt_style_step_makes_no_host_syncs():
    """nanoGPT's train.py loop on cuda: batches cut from a NumPy array (from_numpy, stack, pin_memory,
    non-blocking copies), a disabled GradScaler, clip_grad_norm_ (its norm and factor stay on the device:
    it read both on the host before), a fused AdamW step, lr set in every param group."""
    _torch_cuda()
    from bench import gpu_models
    from bench.gpu_profile import counts
    flambeau.manual_seed(0)
    model = gpu_models.gpt(flambeau, vocab=96, block=64, d=64, layers=2, heads=4, dropout=0.1).to("cuda")
    opt = flambeau.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    scaler = flambeau.amp.GradScaler("cuda", enabled=False)
    data = np.random.default_rng(0).integers(0, 96, 10_000).astype(np.uint16)

    def batch():
        ix = flambeau.randint(len(data) - 65, (4,))
        x = flambeau.stack([flambeau.from_numpy(data[i:i + 64].astype(np.int64)) for i in ix])
        y = flambeau.stack([flambeau.from_numpy(data[i + 1:i + 65].astype(np.int64)) for i in ix])
        return x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)

    def step():
        for group in opt.param_groups:
            group["lr"] = 1e-3
        x, y = batch()
        with flambeau.autocast(device_type="cuda", dtype=flambeau.bfloat16):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = flambeau.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return norm
    step()
    step()
    c = counts(step, steps=2, stacks=True)
    assert c["d2h"] == 0, c["d2h_sites"]
    assert 0 < float(step()) < float("inf")


@pytest.mark.cuda
def test_sync_counter_sees_a_loss_read():
    _torch_cuda()
    from bench.gpu_profile import counts
    step, losses = _small_gpt_step(read_loss=True)
    step()
    c = counts(step, steps=2)
    assert c["d2h"] >= 1 and np.isfinite(losses).all()


@pytest.mark.cuda
def test_out_of_range_indices_raise_at_the_next_sync():
    w = flambeau.randn(5, 3, device="cuda")
    flambeau.cuda.synchronize()
    out = flambeau.nn.functional.embedding(flambeau.tensor([1, 5], device="cuda"), w)     # no sync here
    assert device_checks.pending()
    with pytest.raises(IndexError, match="index out of range in self"):
        flambeau.cuda.synchronize()
    assert out.shape == (2, 3)
    out.cpu()                                                              # the error was reported once
    loss = flambeau.nn.functional.cross_entropy(flambeau.randn(2, 5, device="cuda"),
                                                flambeau.tensor([1, 7], device="cuda"))
    with pytest.raises(IndexError, match="Target 7 is out of bounds."):
        loss.item()
    ok = flambeau.nn.functional.cross_entropy(flambeau.randn(2, 5, device="cuda"),
                                              flambeau.tensor([1, -100], device="cuda"))
    assert np.isfinite(ok.item())                                         # ignore_index passes the check
    picked = w[flambeau.tensor([0, -9], device="cuda")]
    with pytest.raises(IndexError, match="index -9 is out of bounds for dimension 0 with size 5"):
        picked.cpu()
    gathered = flambeau.gather(w, 0, flambeau.tensor([[7, 0, 0]], device="cuda"))
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 0 with size 5"):
        gathered.tolist()
    selected = w.index_select(0, flambeau.tensor([0, 5], device="cuda"))
    with pytest.raises(IndexError, match="index out of range in self"):
        flambeau.cuda.synchronize()
    assert selected.shape == (2, 3) and not device_checks.pending()


@pytest.mark.cuda
@pytest.mark.parametrize("padding_idx,scale", [(None, False), (2, False), (None, True)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_embedding_backward_matches_pytorch(padding_idx, scale, dtype):
    torch = _torch_cuda()
    rng = np.random.default_rng(5)
    w = rng.standard_normal((11, 7)).astype(np.float32)
    idx = rng.integers(0, 11, (6, 9))
    g = rng.standard_normal((6, 9, 7)).astype(np.float32)
    grads = []
    for M in (flambeau, torch):
        wt = M.tensor(w, device="cuda").to(getattr(M, dtype)).requires_grad_(True)
        out = M.nn.functional.embedding(M.tensor(idx, device="cuda"), wt, padding_idx=padding_idx,
                                        scale_grad_by_freq=scale)
        out.backward(M.tensor(g, device="cuda").to(getattr(M, dtype)))
        assert wt.grad.dtype == getattr(M, dtype)
        grads.append(wt.grad.float().cpu().numpy())
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(grads[0], grads[1], rtol=tol, atol=tol)
