"""The caching allocator of compiled CPU graphs (flambeau/_backends/cpu_allocator.py, .cpp): NumPy's
allocation policy set around compiled calls only. The arrays a compiled graph makes come from it
(NumPy's handler name says so) and everything else keeps NumPy's default; freed blocks are reused
by size; reused blocks asked for zeros are zero; resizing keeps data; the limit bounds what is kept;
compiled results match PyTorch's; two threads share the cache safely.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import flambeau
from flambeau._backends import cpu_allocator

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:         # NumPy 1.x
    from numpy.core.multiarray import get_handler_name

pytestmark = pytest.mark.skipif(cpu_allocator._load() is None, reason="no C++ compiler or NumPy without allocation handlers")
BIG = 100_000               # float64 elements: 800 KB, above the cache's smallest block


@pytest.fixture
def cache():
    """The cache set for this test's context, emptied before and after."""
    cpu_allocator.release()
    token = cpu_allocator.using_cache()
    yield
    cpu_allocator.restore(token)
    cpu_allocator.release()


def test_freed_blocks_are_reused_by_size(cache):
    a = np.empty(BIG)
    first = a.ctypes.data
    assert get_handler_name(a) == "flambeau_cpu_cache"
    del a
    assert cpu_allocator.kept_bytes() >= BIG * 8
    b = np.empty(BIG - 10)          # the same rounded size
    assert b.ctypes.data == first
    assert cpu_allocator.kept_bytes() == 0


def test_reused_blocks_asked_for_zeros_are_zero(cache):
    a = np.full(BIG, 7.0)
    del a
    z = np.zeros(BIG)
    assert cpu_allocator.kept_bytes() == 0           # it took the freed block
    assert not z.any()


def test_resized_arrays_keep_their_data_and_return_to_the_cache(cache):
    a = np.arange(BIG, dtype=np.float64)
    a.resize(3 * BIG, refcheck=False)
    np.testing.assert_array_equal(a[:BIG], np.arange(BIG))
    assert not a[BIG:].any()
    kept = cpu_allocator.kept_bytes()           # the temporaries of the checks above
    del a
    assert cpu_allocator.kept_bytes() >= kept + 3 * BIG * 8
    b = np.empty(3 * BIG)
    assert cpu_allocator.kept_bytes() == kept and b.size == 3 * BIG


def test_the_limit_bounds_what_is_kept(cache):
    cpu_allocator.set_limit(0)
    try:
        del_me = np.empty(BIG)
        del del_me
        assert cpu_allocator.kept_bytes() == 0
    finally:
        cpu_allocator.set_limit(cpu_allocator.DEFAULT_LIMIT)


def _mlp(m):
    m.manual_seed(0)
    return m.nn.Sequential(m.nn.Linear(256, 512), m.nn.GELU(), m.nn.Linear(512, 256))


def test_compiled_graphs_allocate_from_the_cache_and_match_pytorch():
    """Outputs of compiled calls carry the cache's handler, eager arrays and the caller's context keep
    NumPy's default; forward and backward agree with PyTorch's from the same weights."""
    model, ref = _mlp(flambeau), _mlp(torch)
    ref.load_state_dict({k: torch.from_numpy(v.detach().numpy().copy()) for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((128, 256)).astype(np.float32)
    fn = flambeau.compile(model)
    for _ in range(3):                      # later calls reuse the blocks of earlier ones
        model.zero_grad()
        out = fn(flambeau.tensor(x))
        out.square().sum().backward()
    assert get_handler_name(out.detach().numpy()) == "flambeau_cpu_cache"
    assert get_handler_name(model[0].weight.grad.numpy()) == "flambeau_cpu_cache"
    assert get_handler_name(np.empty(BIG)) == get_handler_name() == "default_allocator"
    assert get_handler_name((flambeau.tensor(x) * 2).numpy()) == "default_allocator"
    tout = ref(torch.tensor(x))
    tout.square().sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model[0].weight.grad.numpy(), ref[0].weight.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_two_threads_allocating_from_the_cache_keep_their_data():
    """Each thread sets the cache in its own context; blocks taken and returned concurrently never
    hand one thread's live array to the other."""
    errors = []

    def work(i):
        token = cpu_allocator.using_cache()
        try:
            for n in range(200):
                a = np.full(BIG + 1000 * (n % 3), float(i))
                b = np.zeros(BIG)
                if get_handler_name(a) != "flambeau_cpu_cache" or (a != i).any() or b.any():
                    errors.append((i, n))
                del a, b
        finally:
            cpu_allocator.restore(token)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


_OUTLIVES_MODULE_STATE = r"""
import ctypes, gc, sys, warnings
import numpy as np
from flambeau._backends import cpu_allocator
token = cpu_allocator.using_cache()
arr = np.ones(1 << 20)
cpu_allocator.restore(token)
cpu_allocator._state.clear()      # what interpreter exit does to the module's objects before arr dies
gc.collect()
junk = [ctypes.create_string_buffer(b"overwritten") for _ in range(20000)]    # reuse their memory
with warnings.catch_warnings():
    warnings.simplefilter("error")
    del arr
print("freed")
"""


def test_arrays_outliving_the_module_state_are_freed_through_their_handler():
    """An array keeps the handler's capsule, and NumPy finds the handler by the capsule's name when the
    array dies, which may be at interpreter exit after the module's objects are gone: the name must not
    live in one of them (it did: NumPy then failed to free the array, and reading the freed name can
    crash the process)."""
    r = subprocess.run([sys.executable, "-c", _OUTLIVES_MODULE_STATE], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "freed", r.stderr
    assert "PyDataMem_UserFREE" not in r.stderr, r.stderr


def test_threads_loading_the_allocator_at_once_share_one_handler(monkeypatch):
    """The first compiled calls of several threads at once load the allocator once: one handler
    capsule for all, the library built once (before bebcaa7 moved the capsule's name into the
    library, a second capsule freed the first one's name under live arrays: NumPy's
    'PyCapsule_GetPointer called with incorrect name' at their free)."""
    made = []
    real = cpu_allocator._make

    def slow_make():
        made.append(1)
        time.sleep(0.2)                 # the other thread asks meanwhile
        return real()
    monkeypatch.setattr(cpu_allocator, "_make", slow_make)
    monkeypatch.setattr(cpu_allocator, "_state", {})
    start = threading.Barrier(2)
    handlers = []

    def load():
        start.wait(10)
        handlers.append(cpu_allocator._load())
    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(handlers) == 2 and handlers[0] is handlers[1]
