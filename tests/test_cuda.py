"""flambeau.cuda: device queries, transfers, streams/events, memory statistics, seeding, errors.
Runs only where CuPy sees a GPU (marked `cuda`); values are compared with PyTorch on the same GPU
where that is meaningful."""
import numpy as np
import pytest

import flambeau

pytestmark = pytest.mark.cuda


def test_queries_and_transfers():
    assert flambeau.cuda.is_available() and flambeau.cuda.device_count() >= 1
    x = flambeau.arange(6.0).reshape(2, 3)
    g = x.cuda()
    assert g.device == flambeau.device("cuda", 0) and g.is_cuda and not x.is_cuda
    assert str(g.device) == "cuda:0"
    assert (g.cpu().numpy() == x.numpy()).all()
    assert x.to("cuda").to(flambeau.float64).device.type == "cuda"
    h = flambeau.ones(3, device="cuda")
    assert h.device.type == "cuda" and h.sum().item() == 3.0
    with pytest.raises(TypeError, match="cpu"):
        g.numpy()


def test_mixing_devices_raises_like_pytorch():
    a = flambeau.ones(3, device="cuda")
    b = flambeau.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + b
    assert (a + flambeau.tensor(2.0)).device.type == "cuda"       # 0-dim cpu tensors may join


def test_autograd_on_cuda_matches_cpu():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    grads = []
    for dev in ("cpu", "cuda"):
        x = flambeau.tensor(w, device=dev, requires_grad=True)
        y = (x.relu() @ x.t()).softmax(-1).sum()
        y.backward()
        grads.append(x.grad.cpu().numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_memory_statistics_track_allocations():
    flambeau.cuda.synchronize()
    base = flambeau.cuda.memory_allocated()
    flambeau.cuda.reset_peak_memory_stats()
    t = flambeau.empty(1 << 20, device="cuda")          # 4 MiB
    assert flambeau.cuda.memory_allocated() >= base + 4 * 2**20
    peak = flambeau.cuda.max_memory_allocated()
    del t
    assert flambeau.cuda.memory_allocated() < peak
    assert flambeau.cuda.max_memory_allocated() >= peak


def test_streams_and_events_time_work():
    s = flambeau.cuda.Stream()
    start, end = flambeau.cuda.Event(enable_timing=True), flambeau.cuda.Event(enable_timing=True)
    with flambeau.cuda.stream(s):
        start.record(s)
        x = flambeau.randn(512, 512, device="cuda")
        y = x @ x
        end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    s.synchronize()
    assert s.query()
    assert y.shape == (512, 512)


def test_seeding_is_reproducible():
    flambeau.cuda.manual_seed(7)
    a = flambeau.rand(5, device="cuda").cpu().numpy()
    flambeau.cuda.manual_seed(7)
    b = flambeau.rand(5, device="cuda").cpu().numpy()
    assert (a == b).all()


def test_pin_memory():
    x = flambeau.ones(4).pin_memory()
    assert x.is_pinned() and x.device.type == "cpu"
    assert x.cuda(non_blocking=True).sum().item() == 4.0


def test_module_and_optimizer_on_cuda():
    m = flambeau.nn.Linear(4, 2).cuda()
    assert all(p.device.type == "cuda" for p in m.parameters())
    opt = flambeau.optim.AdamW(m.parameters(), lr=0.1)
    loss = m(flambeau.randn(8, 4, device="cuda")).pow(2).mean()
    loss.backward()
    opt.step()
    assert all(p.grad.device.type == "cuda" for p in m.parameters())


@pytest.mark.parametrize("shape", [(4096, 1024), (3, 7), (2, 5000), (2, 3, 65), (1, 1)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_fused_softmax_kernel_matches_torch(shape, log, dtype, monkeypatch):
    import torch
    from flambeau._backends import cuda_kernels
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    served = []
    real = cuda_kernels.softmax_lastdim
    monkeypatch.setattr(cuda_kernels, "softmax_lastdim", lambda a, lg: served.append(real(a, lg)) or served[-1])
    t = flambeau.tensor(x, device="cuda")
    got = (t.log_softmax(-1) if log else t.softmax(-1)).cpu().numpy()
    ref = torch.from_numpy(x.astype(np.float32) if dtype == "float16" else x)
    want = (ref.log_softmax(-1) if log else ref.softmax(-1)).to(getattr(torch, dtype))
    tol = 2e-3 if dtype == "float16" else 1e-5
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=tol, atol=tol)
    assert served and served[-1] is not None                  # the fused kernel computed it
