"""CUDA graphs of compiled graphs (`flambeau._inductor.cudagraphs`, mode="reduce-overhead").

On cpu the recording/replay bookkeeping runs against `FakeGraphs`, a graph backend for cpu graphs
whose "capture" runs the compiled code once and whose launch runs it again and copies the results
into the captured output arrays (the fixed addresses a real replay writes): warm-up, recording,
replays, static inputs read in place, other inputs copied, outputs overwritten by a later replay
raising PyTorch's error, a new shape recording a new graph, fallbacks with their reasons. The
tests marked cuda capture real CUDA graphs through CuPy (run on the GPU machine).
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._counters import FALLBACKS, counters
from flambeau._inductor import config as iconfig
from flambeau._inductor import cudagraphs

cuda = pytest.mark.cuda


def _address(a: np.ndarray) -> tuple:
    lo, hi = FakeGraphs.span(a)
    return lo, a.shape, a.strides, a.dtype, max(hi - lo, a.itemsize)


def _at(address: tuple) -> np.ndarray:
    """The array at an address (a graph knows memory by address: it keeps nothing alive)."""
    ptr, shape, strides, dtype, nbytes = address
    raw = np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), np.uint8)
    return np.lib.stride_tricks.as_strided(raw[:dtype.itemsize].view(dtype), shape, strides)


class FakeGraph:
    """Replays by running the compiled code on the captured inputs' memory and copying the results
    into the captured outputs' memory; like a CUDA graph it holds addresses, not arrays."""

    def __init__(self, fn, outs):
        self.run = fn.func
        self.args = [("t", _address(a._data), a._device, a._dtype) if isinstance(a, fl.Tensor) else ("v", a)
                     for a in fn.args]
        self.outs = [_address(o._data) if isinstance(o, fl.Tensor) else None for o in outs]

    def launch(self):
        FakeGraphs.launches += 1
        args = [fl.Tensor._make(_at(a[1]), a[2], a[3]) if a[0] == "t" else a[1] for a in self.args]
        new = self.run(*args)
        for old, n in zip(self.outs, new if isinstance(new, (tuple, list)) else (new,)):
            if old is not None:
                np.copyto(_at(old), n._data)


class FakeGraphs:
    """A GraphBackend for cpu graphs (see module docstring)."""
    launches = 0

    def __init__(self, device):
        self.allocs = None

    @contextlib.contextmanager
    def allocating(self, allocs):
        self.allocs = allocs
        yield
        self.allocs = None

    def capture(self, fn, allocs):
        out = fn()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        allocs += [self.span(o._data) for o in outs if isinstance(o, fl.Tensor)]
        return FakeGraph(fn, [o for o in outs]), out

    def launch(self, graph):
        graph.launch()

    def copy(self, dst, src):
        np.copyto(dst, src)

    def empty_like(self, a):
        b = np.empty_like(a)
        if self.allocs is not None:
            self.allocs.append(self.span(b))
        return b

    @staticmethod
    def ptr(a):
        return a.__array_interface__["data"][0]

    @staticmethod
    def span(a):
        lo = a.__array_interface__["data"][0]
        return lo, lo + (sum((n - 1) * st for n, st in zip(a.shape, a.strides)) + a.itemsize if a.size else 1)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(cudagraphs.graph_backends, "cpu", FakeGraphs)
    monkeypatch.setattr(cudagraphs, "_trees", {})
    monkeypatch.setattr(cudagraphs, "stats", {"recordings": 0, "replays": 0, "eager_calls": 0})
    FakeGraphs.launches = 0
    fl.compiler.reset()
    yield cudagraphs.stats
    fl.compiler.reset()


def _fallbacks():
    return {k: v for k, v in counters[FALLBACKS].items() if k.startswith(cudagraphs.CUDA_GRAPH)}


def test_modes_set_the_inductor_options():
    seen = []
    real = fl._inductor.compile_fx

    def spy(gm, ex, **kw):
        seen.append((iconfig.triton_cudagraphs, iconfig.max_autotune))
        return real(gm, ex, **kw)
    import flambeau._inductor as ind
    old, ind.compile_fx = ind.compile_fx, spy
    try:
        for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            fl.compile(lambda x: x.sin() + 1, mode=mode)(fl.randn(3))
            fl.compiler.reset()
    finally:
        ind.compile_fx = old
    assert seen == [(False, False), (True, False), (True, True), (False, True)]
    assert (iconfig.triton_cudagraphs, iconfig.max_autotune) == (False, False)


def test_cpu_graph_says_why_it_gets_no_cuda_graph():
    before = dict(_fallbacks())
    f = fl.compile(lambda x: x.relu() * 2, mode="reduce-overhead")
    for _ in range(3):
        assert f(fl.tensor([-1.0, 2.0])).tolist() == [0.0, 4.0]
    new = {k: v - before.get(k, 0) for k, v in _fallbacks().items() if v != before.get(k, 0)}
    assert new == {"CUDA graph: graphs on cpu are not CUDA graphs": 1}


def test_warmup_then_record_then_replay(fake):
    w = fl.randn(8, 8)

    def f(x):
        return (x @ w).relu() + 1
    c = fl.compile(f, mode="reduce-overhead")
    xs = [fl.randn(4, 8) for _ in range(5)]
    outs = [c(x).clone() for x in xs]
    for x, o in zip(xs, outs):
        torch.testing.assert_close(torch.from_numpy(o.numpy()), torch.from_numpy(f(x).numpy()))
    assert fake == {"recordings": 1, "replays": 3, "eager_calls": 0}
    assert FakeGraphs.launches == 4          # the recording's launch and 3 replays


def test_overwritten_output_raises_like_pytorch(fake):
    c = fl.compile(lambda x: x * 2, mode="reduce-overhead")
    x = fl.randn(6)
    c(x)
    c(x)                                     # recorded
    a = c(x)                                 # replay
    assert a.tolist() == (x * 2).tolist()
    b = c(x + 1)                             # replay: a's memory holds b now
    with pytest.raises(RuntimeError, match="accessing tensor output of CUDAGraphs that has been overwritten "
                                           "by a subsequent run"):
        a.tolist()
    assert b.tolist() == ((x + 1) * 2).tolist()


def test_new_shape_records_a_new_graph(fake):
    c = fl.compile(lambda x: x.sin() * 3, mode="reduce-overhead", dynamic=False)
    for n in (4, 4, 4, 7, 7, 7, 4):
        x = fl.randn(n)
        torch.testing.assert_close(torch.from_numpy(c(x).numpy()), torch.from_numpy((x.sin() * 3).numpy()))
    assert fake["recordings"] == 2 and fake["replays"] == 3


def test_inputs_are_copied_and_parameters_read_in_place(fake):
    lin = fl.nn.Linear(5, 3)
    c = fl.compile(lin, mode="reduce-overhead")
    x = fl.randn(2, 5)
    c(x)
    c(x)
    (graphed,) = [g for t in cudagraphs._trees.values() for g in t.recordings]
    kinds = sorted(k for k, _ in graphed.inputs)
    assert kinds == ["copy", "static", "static"], graphed.inputs
    with fl.no_grad():
        lin.weight.mul_(2)                   # in place: the replay reads the new weights
    y = fl.randn(2, 5)
    torch.testing.assert_close(torch.from_numpy(c(y).detach().numpy()), torch.from_numpy(lin(y).detach().numpy()))
    assert fake["replays"] == 1


def test_training_steps_replay_forward_and_backward(fake):
    fl.manual_seed(0)
    torch.manual_seed(0)
    net = fl.nn.Sequential(fl.nn.Linear(6, 16), fl.nn.ReLU(), fl.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    with torch.no_grad():
        for p, q in zip(net.parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy()).double())
    opt = fl.optim.SGD(net.parameters(), lr=0.1)
    topt = torch.optim.SGD(ref.parameters(), lr=0.1)
    c = fl.compile(net, mode="reduce-overhead")
    rng = np.random.default_rng(0)
    for _ in range(5):
        xs, ys = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8)
        loss = fl.nn.functional.cross_entropy(c(fl.tensor(xs)), fl.tensor(ys))
        loss.backward()
        opt.step()
        opt.zero_grad()
        tl = torch.nn.functional.cross_entropy(ref(torch.from_numpy(xs).double()), torch.from_numpy(ys))
        tl.backward()
        topt.step()
        topt.zero_grad()
        assert abs(loss.item() - tl.item()) < 1e-4
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(torch.from_numpy(p.detach().numpy()).double(), q.detach(), rtol=1e-4, atol=1e-5)
    assert fake["recordings"] == 2 and fake["replays"] == 6 and fake["eager_calls"] == 0, fake


def test_kept_grad_runs_without_the_graph(fake):
    lin = fl.nn.Linear(4, 2)
    c = fl.compile(lin, mode="reduce-overhead")
    x = fl.randn(3, 4)
    c(x).sum().backward()                    # warm-up: .grad made eagerly
    lin.zero_grad(set_to_none=True)
    c(x).sum().backward()                    # recorded: .grad is the backward graph's output memory
    c(x).sum().backward()                    # accumulates: the replay would overwrite that .grad
    torch.testing.assert_close(torch.from_numpy(lin.weight.grad.numpy()),
                               torch.from_numpy(2 * x.sum(0).expand(2, 4).numpy().copy()))
    assert any("still referenced" in k for k in _fallbacks())


def test_random_ops_fall_back_with_a_reason_and_input_mutations_replay(fake):
    before = dict(_fallbacks())
    r = fl.compile(lambda x: fl.nn.functional.dropout(x, 0.5, training=True), mode="reduce-overhead")
    for _ in range(3):
        r(fl.ones(100))

    new = [k for k, v in _fallbacks().items() if v != before.get(k, 0)]
    assert len(new) == 1 and "random ops ['rand']" in new[0], new
    assert fake["recordings"] == 0

    def bump(x):                             # AOT autograd writes the input after the graph: it replays
        x.add_(1)
        return x * 2
    m = fl.compile(bump, mode="reduce-overhead")
    x = fl.zeros(3)
    for _ in range(4):
        m(x)
    assert x.tolist() == [4.0, 4.0, 4.0] and fake["recordings"] == 1 and fake["replays"] == 2


def test_intervals():
    iv = cudagraphs.Intervals([(10, 20), (15, 30), (40, 50)])
    assert iv.overlaps(29, 35) and not iv.overlaps(30, 40) and iv.overlaps(0, 11) and not iv.overlaps(0, 10)
    assert iv.contains(12, 30) and not iv.contains(25, 41) and iv.contains(40, 50)


# ---- on the GPU ---------------------------------------------------------------------------------------
def _mlp(m):
    return m.nn.Sequential(m.nn.Linear(64, 128), m.nn.ReLU(), m.nn.Linear(128, 128), m.nn.ReLU(),
                           m.nn.Linear(128, 10))


@cuda
def test_mlp_reduce_overhead_on_cuda_matches_eager_and_replays_one_launch():
    from flambeau._inductor import triton_runtime
    fl.compiler.reset()
    fl.manual_seed(0)
    net = _mlp(fl).to("cuda")
    c = fl.compile(net, mode="reduce-overhead")
    before = dict(cudagraphs.stats)
    with fl.no_grad():
        for _ in range(3):
            x = fl.randn(32, 64, device="cuda")
            y = c(x)
        launches = triton_runtime.stats["launches"]
        x = fl.randn(32, 64, device="cuda")
        y = c(x)
        assert triton_runtime.stats["launches"] == launches      # a replay launches no kernel by itself
        torch.testing.assert_close(torch.from_numpy(y.cpu().numpy()), torch.from_numpy(net(x).cpu().numpy()),
                                   rtol=1e-5, atol=1e-5)
    assert cudagraphs.stats["recordings"] - before["recordings"] == 1
    assert cudagraphs.stats["replays"] - before["replays"] == 2


@cuda
def test_training_with_reduce_overhead_on_cuda_matches_eager():
    fl.compiler.reset()
    fl.manual_seed(0)
    a, b = _mlp(fl).to("cuda"), _mlp(fl).to("cuda")
    b.load_state_dict(a.state_dict())
    ca = fl.compile(a, mode="reduce-overhead")
    oa, ob = fl.optim.AdamW(a.parameters(), lr=1e-3), fl.optim.AdamW(b.parameters(), lr=1e-3)
    before = dict(cudagraphs.stats)
    for step in range(6):
        x, t = fl.randn(32, 64, device="cuda"), fl.randint(0, 10, (32,), device="cuda")
        for net, opt in ((ca, oa), (b, ob)):
            loss = fl.nn.functional.cross_entropy(net(x), t)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if net is ca:
                la = loss.item()
        assert abs(la - loss.item()) < 1e-4 * max(1.0, abs(la)), (step, la, loss.item())
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(torch.from_numpy(p.detach().cpu().numpy()),
                                   torch.from_numpy(q.detach().cpu().numpy()), rtol=1e-4, atol=1e-5)
    assert cudagraphs.stats["recordings"] - before["recordings"] == 2
    assert cudagraphs.stats["replays"] - before["replays"] == 8
    assert cudagraphs.stats["eager_calls"] == before["eager_calls"]


@cuda
def test_new_shape_and_overwritten_output_on_cuda():
    fl.compiler.reset()
    c = fl.compile(lambda x: x.sin() * 2 + 1, mode="reduce-overhead", dynamic=False)
    before = dict(cudagraphs.stats)
    for n in (16, 16, 16, 33, 33, 33):
        x = fl.randn(n, device="cuda")
        torch.testing.assert_close(torch.from_numpy(c(x).cpu().numpy()),
                                   torch.from_numpy((x.sin() * 2 + 1).cpu().numpy()))
    assert cudagraphs.stats["recordings"] - before["recordings"] == 2
    a = c(fl.randn(16, device="cuda"))
    c(fl.randn(16, device="cuda"))
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        a.cpu()


@cuda
def test_host_sync_in_graph_falls_back_with_the_reason():
    fl.compiler.reset()
    before = dict(_fallbacks())

    def f(x):
        return x * x.sum().item()
    c = fl.compile(f, mode="reduce-overhead")
    x = fl.randn(8, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(torch.from_numpy(c(x).cpu().numpy()), torch.from_numpy(f(x).cpu().numpy()))
    new = [k for k, v in _fallbacks().items() if v != before.get(k, 0)]
    assert new == [] or all("capture failed" in k for k in new), new


@cuda
def test_user_cuda_graph_api():
    x = fl.zeros(1000, device="cuda")
    g = fl.cuda.CUDAGraph()
    with fl.cuda.graph(g):
        y = x * 2 + 1
    x.copy_(fl.arange(1000, dtype=fl.float32, device="cuda"))
    g.replay()
    assert y.cpu().tolist() == [2.0 * i + 1 for i in range(1000)]
    assert not fl.cuda.is_current_stream_capturing()
