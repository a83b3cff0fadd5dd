"""Random operators: statistics on large samples, seeding, generators, and factories on 'meta'."""
import math

import pickle

import numpy as np
import pytest
import torch as real_torch

import flambeau as torch

N = 200_000


def stats(t):
    a = t.double()._host()
    return float(a.mean()), float(a.std())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rand_randn_moments(dtype):
    torch.manual_seed(0)
    m, s = stats(torch.rand(N, dtype=dtype))
    assert abs(m - 0.5) < 0.01 and abs(s - math.sqrt(1 / 12)) < 0.01
    r = torch.rand(N, dtype=dtype)
    assert float(r.min()) >= 0 and float(r.max()) < 1
    m, s = stats(torch.randn(N, dtype=dtype))
    assert abs(m) < 0.01 and abs(s - 1) < 0.01


def test_in_place_fills_moments():
    torch.manual_seed(1)
    x = torch.empty(N)
    m, s = stats(x.uniform_(2, 4))
    assert abs(m - 3) < 0.01 and abs(s - 2 / math.sqrt(12)) < 0.01
    m, s = stats(x.normal_(5, 2))
    assert abs(m - 5) < 0.03 and abs(s - 2) < 0.03
    m, s = stats(x.exponential_(2.0))
    assert abs(m - 0.5) < 0.01 and abs(s - 0.5) < 0.01
    m, s = stats(x.geometric_(0.25))
    assert abs(m - 4) < 0.05 and float(x.min()) >= 1 and np.all(x._host() == np.round(x._host()))
    m, _ = stats(x.log_normal_(0.0, 0.5))
    assert abs(m - math.exp(0.125)) < 0.01
    med = float(np.median(x.cauchy_(1.0, 2.0)._host()))
    assert abs(med - 1) < 0.05
    x.random_(3, 7)
    assert set(np.unique(x._host()).tolist()) == {3.0, 4.0, 5.0, 6.0}
    m, _ = stats(x.bernoulli_(0.3))
    assert abs(m - 0.3) < 0.01


def test_normal_forms():
    torch.manual_seed(2)
    t = torch.normal(torch.full((N,), 3.0), torch.full((N,), 0.5))
    m, s = stats(t)
    assert abs(m - 3) < 0.01 and abs(s - 0.5) < 0.01
    m, s = stats(torch.normal(-1.0, 2.0, (N,)))
    assert abs(m + 1) < 0.03 and abs(s - 2) < 0.03
    m, s = stats(torch.normal(torch.zeros(N), 2.0))
    assert abs(s - 2) < 0.03
    with pytest.raises(RuntimeError):
        torch.normal(torch.zeros(3), -torch.ones(3))


def test_randint_bounds_and_uniformity():
    torch.manual_seed(3)
    r = torch.randint(-2, 3, (N,))
    assert r.dtype == torch.int64
    counts = np.bincount(r._host() + 2)
    assert len(counts) == 5 and np.all(np.abs(counts / N - 0.2) < 0.01)
    assert torch.randint(5, (3, 2)).shape == (3, 2)
    assert torch.randint_like(torch.zeros(4), 10).dtype == torch.float32


def test_randperm_is_permutation():
    torch.manual_seed(4)
    for n in (0, 1, 17, 1000):
        p = torch.randperm(n)
        assert p.dtype == torch.int64
        assert sorted(p.tolist()) == list(range(n))


def test_multinomial():
    torch.manual_seed(5)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    s = torch.multinomial(p, N, replacement=True)
    freq = np.bincount(s._host(), minlength=4) / N
    assert np.allclose(freq, [0.1, 0.0, 0.6, 0.3], atol=0.01)
    rows = torch.rand(50, 20) + 0.01
    w = torch.multinomial(rows, 20)
    for row in w.tolist():
        assert sorted(row) == list(range(20))
    w = torch.multinomial(p, 3)
    assert len(set(w.tolist())) == 3 and 1 not in w.tolist()
    first = torch.stack([torch.multinomial(p, 1) for _ in range(2000)]) if hasattr(torch, "stack") else None
    if first is not None:
        assert abs(float((first == 2).double().mean()) - 0.6) < 0.05
    with pytest.raises(RuntimeError):
        torch.multinomial(p, 4)


def test_bernoulli_and_poisson():
    torch.manual_seed(6)
    p = torch.full((N,), 0.25)
    m, _ = stats(torch.bernoulli(p))
    assert abs(m - 0.25) < 0.01
    m, s = stats(torch.poisson(torch.full((N,), 4.0)))
    assert abs(m - 4) < 0.03 and abs(s - 2) < 0.03


def test_manual_seed_reproducible():
    def draw():
        return [torch.rand(5), torch.randn(5), torch.randint(0, 100, (5,)), torch.randperm(7),
                torch.empty(5).normal_(), torch.multinomial(torch.ones(10), 4)]
    torch.manual_seed(1234)
    a = draw()
    torch.manual_seed(1234)
    b = draw()
    for x, y in zip(a, b):
        assert x.tolist() == y.tolist()
    torch.manual_seed(4321)
    c = draw()
    assert a[0].tolist() != c[0].tolist()


def test_rng_state_round_trip():
    torch.manual_seed(9)
    state = torch.get_rng_state()
    a = torch.rand(4)
    torch.set_rng_state(state)
    assert torch.rand(4).tolist() == a.tolist()


def test_generator_independence():
    g1 = torch.Generator().manual_seed(7)
    g2 = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    a = torch.rand(6, generator=g1)
    torch.rand(100)                         # the default generator does not disturb g2
    b = torch.rand(6, generator=g2)
    assert a.tolist() == b.tolist()
    torch.manual_seed(0)
    x = torch.rand(3)
    torch.manual_seed(0)
    torch.randn(10, generator=g1)           # drawing from g1 leaves the default stream alone
    assert torch.rand(3).tolist() == x.tolist()
    for f in (lambda g: torch.randn(3, generator=g), lambda g: torch.randint(0, 9, (3,), generator=g),
              lambda g: torch.randperm(5, generator=g), lambda g: torch.empty(3).uniform_(generator=g),
              lambda g: torch.bernoulli(torch.full((3,), 0.5), generator=g),
              lambda g: torch.multinomial(torch.ones(4), 2, generator=g),
              lambda g: torch.normal(torch.zeros(3), torch.ones(3), generator=g)):
        assert f(torch.Generator().manual_seed(3)).tolist() == f(torch.Generator().manual_seed(3)).tolist()
    with pytest.raises(TypeError):
        torch.rand(2, generator=3)


def test_factories_on_meta():
    for t, shape, dt in [(torch.rand(2, 3, device="meta"), (2, 3), torch.float32),
                         (torch.randn(4, device="meta", dtype=torch.float64), (4,), torch.float64),
                         (torch.randint(0, 5, (2,), device="meta"), (2,), torch.int64),
                         (torch.randperm(6, device="meta"), (6,), torch.int64),
                         (torch.arange(0, 10, 3, device="meta"), (4,), torch.int64),
                         (torch.linspace(0, 1, 7, device="meta"), (7,), torch.float32),
                         (torch.logspace(0, 1, 3, device="meta"), (3,), torch.float32),
                         (torch.eye(2, 5, device="meta"), (2, 5), torch.float32),
                         (torch.zeros(size=(1, 2), device="meta"), (1, 2), torch.float32),
                         (torch.empty_strided((2, 3), (1, 2), device="meta"), (2, 3), torch.float32)]:
        assert t.device.type == "meta" and tuple(t.shape) == shape and t.dtype == dt


# ---- RNG state: uint8 tensors as PyTorch's, no pickle; cuda generators; fork_rng ----------------------
@pytest.fixture
def no_pickle(monkeypatch):
    """Any pickle.loads / Unpickler while the test runs fails it."""
    def refuse(*a, **k):
        raise AssertionError("pickle used to restore an RNG state")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def test_rng_state_is_a_byte_tensor_restored_without_pickle(no_pickle):
    torch.manual_seed(11)
    state = torch.get_rng_state()
    assert state.dtype == torch.uint8 and state.dim() == 1 and state.device.type == "cpu"
    a = torch.randn(5)
    torch.set_rng_state(state)
    assert torch.randn(5).tolist() == a.tolist()
    g = torch.Generator().manual_seed(5)
    torch.rand(3, generator=g)
    gs = g.get_state()
    b = torch.rand(4, generator=g)
    h = torch.Generator().set_state(gs)
    assert torch.rand(4, generator=h).tolist() == b.tolist() and h.initial_seed() == 5


@pytest.mark.parametrize("bad", ["short", "float", "list"])
def test_bad_rng_state_raises_like_torch(bad):
    def make(mod):
        return {"short": mod.zeros(10, dtype=mod.uint8), "float": mod.zeros(56), "list": [1, 2]}[bad]
    with pytest.raises(Exception) as theirs:
        real_torch.set_rng_state(make(real_torch))
    with pytest.raises(theirs.type):
        torch.set_rng_state(make(torch))
    with pytest.raises(theirs.type):
        torch.Generator().set_state(make(torch))


@pytest.mark.parametrize("fmt", ["flambeau", "pt"])
def test_rng_state_in_weights_only_checkpoint(tmp_path, fmt, monkeypatch):
    torch.manual_seed(3)
    torch.cuda.manual_seed(8)
    p = tmp_path / "ck.pt"
    torch.save({"rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state_all() + [torch.cuda.get_rng_state(0)]},
               p, format=fmt)
    want = torch.rand(6).tolist()
    cuda_want = torch.cuda.get_rng_state(0).tolist()
    torch.manual_seed(1)
    torch.cuda.manual_seed(1)
    ck = torch.load(p, weights_only=True)
    monkeypatch.setattr(pickle, "loads", lambda *a: pytest.fail("pickle used"))
    torch.set_rng_state(ck["rng"])
    torch.cuda.set_rng_state(ck["cuda_rng"][-1], 0)
    assert torch.rand(6).tolist() == want
    assert torch.cuda.get_rng_state(0).tolist() == cuda_want


def test_fork_rng_restores_cpu_and_cuda_generators():
    torch.manual_seed(0)
    torch.cuda.manual_seed(21)
    cuda_before = torch.cuda.get_rng_state("cuda:0").tolist()
    cpu_state = torch.get_rng_state()
    expected = torch.rand(3).tolist()
    torch.set_rng_state(cpu_state)
    with torch.random.fork_rng(devices=[0]):
        torch.rand(100)
        torch.cuda.manual_seed(99)
        assert torch.cuda.get_rng_state(0).tolist() != cuda_before
    assert torch.rand(3).tolist() == expected
    assert torch.cuda.get_rng_state(0).tolist() == cuda_before
    assert torch.cuda.get_rng_state_all() == [] if torch.cuda.device_count() == 0 else True
    with torch.random.fork_rng():              # devices default to every cuda device (none here)
        torch.rand(10)
    torch.set_rng_state(cpu_state)
    with torch.random.fork_rng(enabled=False):
        torch.rand(3)
    assert torch.rand(3).tolist() != expected


@pytest.mark.cuda
def test_cuda_rng_state_replays_cuda_draws():
    torch.cuda.manual_seed(4)
    torch.randn(8, device="cuda")
    state = torch.cuda.get_rng_state()
    a = torch.randn(1000, device="cuda").cpu().tolist()
    torch.cuda.set_rng_state(state)
    assert torch.randn(1000, device="cuda").cpu().tolist() == a
    torch.cuda.set_rng_state(state)
    with torch.random.fork_rng():
        torch.randn(50, device="cuda")
    assert torch.randn(1000, device="cuda").cpu().tolist() == a


# ---- cuda generators' draws are fixed by their host state (PyTorch: Philox seed + offset) -------------
class _FakeCupyRandom:
    """The part of `cupy.random` a cuda generator uses, drawing with NumPy, so the logic runs on cpu."""
    Generator = np.random.Generator
    Philox4x3210 = np.random.Philox
    default_rng = np.random.default_rng


class _FakeCupy:
    random = _FakeCupyRandom


def _cuda_draw(gen, n=6):
    return gen.xp_generator(_FakeCupy).random(n).tolist()


def test_taking_a_cuda_state_leaves_later_draws_unchanged():
    """PyTorch: get_rng_state has no effect on the stream; set_rng_state replays what followed it,
    also in a generator that never drew (another process loading a checkpoint)."""
    from flambeau.random import Generator
    g = Generator("cuda").manual_seed(4)
    _cuda_draw(g)
    want = [_cuda_draw(g) for _ in range(3)]
    g.manual_seed(4)
    _cuda_draw(g)
    state = g.get_state()
    got = [_cuda_draw(g) for _ in range(3)]
    assert got == want
    g.set_state(state)
    assert [_cuda_draw(g) for _ in range(3)] == want
    assert [_cuda_draw(Generator("cuda").set_state(state)) for _ in range(1)] == want[:1]


@pytest.fixture
def two_cuda_devices(monkeypatch):
    """flambeau.cuda reports two devices (their generators are host-side, so cpu suffices)."""
    import flambeau._backends
    import flambeau.random as R
    monkeypatch.setattr(flambeau._backends, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(R, "_fork_rng_warned", False)
    monkeypatch.setattr(R, "_cuda_generators", {})


def test_fork_rng_forks_every_visible_cuda_device_and_warns_once(two_cuda_devices):
    import flambeau.cuda
    from flambeau.random import generator_for
    gens = [generator_for(torch.device("cuda", i)) for i in range(2)]
    torch.cuda.manual_seed_all(7)
    before = [torch.cuda.get_rng_state(i).tolist() for i in range(2)]
    _cuda_draw(gens[1])
    want = _cuda_draw(gens[1])
    torch.cuda.manual_seed_all(7)
    _cuda_draw(gens[1])
    with pytest.warns(UserWarning, match=r"reports that you have 2 available devices.*'devices' keyword"):
        with torch.random.fork_rng():
            torch.cuda.manual_seed_all(99)
            _cuda_draw(gens[0])
            _cuda_draw(gens[1])
    assert _cuda_draw(gens[1]) == want                      # the draws after the fork are as without it
    torch.cuda.manual_seed_all(7)
    with torch.random.fork_rng(devices=iter([1])):          # an iterator, read once; no warning
        torch.cuda.manual_seed_all(99)
    assert torch.cuda.get_rng_state(0).tolist() != before[0]
    assert torch.cuda.get_rng_state(1).tolist() == before[1]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # warned once per process, as PyTorch
        with torch.random.fork_rng():
            pass
        with torch.random.fork_rng(enabled=False):
            torch.cuda.manual_seed(5)
        with torch.random.fork_rng(device_type="meta"):
            torch.cuda.manual_seed(5)
    assert flambeau.cuda.get_rng_state(0).tolist() == torch.cuda.get_rng_state(0).tolist()


def test_fork_rng_device_type_errors_like_torch():
    with pytest.raises(RuntimeError):
        with real_torch.random.fork_rng(device_type="xyz"):
            pass
    with pytest.raises(RuntimeError, match="xyz"):
        with torch.random.fork_rng(device_type="xyz"):
            pass


@pytest.mark.cuda
def test_fork_rng_on_cuda_leaves_later_cuda_draws_unchanged():
    """As PyTorch on cuda: the draws after a fork_rng block equal those without it, on a real GPU."""
    def run(fork):
        torch.cuda.manual_seed(4)
        torch.randn(8, device="cuda")
        if fork:
            with torch.random.fork_rng(devices=[0]):
                torch.randn(50, device="cuda")
                torch.rand(10, device="cuda")
            torch.cuda.get_rng_state(0)
        return torch.randn(1000, device="cuda").cpu().tolist()
    assert run(True) == run(False)
    if real_torch.cuda.is_available():                    # the reference has the same property on cuda
        real_torch.cuda.manual_seed(4)
        real_torch.randn(8, device="cuda")
        a = real_torch.randn(1000, device="cuda")
        real_torch.cuda.manual_seed(4)
        real_torch.randn(8, device="cuda")
        with real_torch.random.fork_rng(devices=[0]):
            real_torch.randn(50, device="cuda")
        assert real_torch.equal(a, real_torch.randn(1000, device="cuda"))
