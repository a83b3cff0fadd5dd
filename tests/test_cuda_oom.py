"""A cuda allocation that CuPy's pool cannot make (flambeau/_backends `install_cuda_allocator`; CuPy's pool
has released its cached blocks and run the garbage collector before it fails) raises
`flambeau.OutOfMemoryError` (`flambeau.cuda.OutOfMemoryError`, a RuntimeError, as PyTorch's), saying how
much was asked, what the device and the pool hold and what to do: never CuPy's bare error. Checked on CPU
with a stand-in for CuPy's pool and allocator hook."""
from __future__ import annotations

import sys
import types

import pytest

import flambeau
from flambeau import _backends


class _OOM(Exception):
    pass


class _Pool:
    def __init__(self, fail_times: int):
        self.fail_times, self.freed_blocks, self.tries = fail_times, 0, 0

    def malloc(self, size):
        self.tries += 1
        if self.tries <= self.fail_times:
            raise _OOM(f"Out of memory allocating {size:,} bytes")
        return ("ptr", size)

    def used_bytes(self):
        return 3 * 2 ** 30

    def total_bytes(self):
        return 5 * 2 ** 30

    def free_all_blocks(self):
        self.freed_blocks += 1


@pytest.fixture
def fake_cupy(monkeypatch):
    """A CuPy stand-in whose `set_allocator` hands back flambeau's allocator: (pool holder, allocator)."""
    holder = {}
    cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(OutOfMemoryError=_OOM),
        device=types.SimpleNamespace(get_device_id=lambda: 0),
        runtime=types.SimpleNamespace(getDevice=lambda: 0, memGetInfo=lambda: (512 * 2 ** 20, 80 * 2 ** 30)),
        set_allocator=lambda fn: holder.__setitem__("malloc", fn))
    cupy = types.SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: holder["pool"])
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_backends, "_allocator_installed", [])
    monkeypatch.setattr(_backends, "peak_bytes", {})

    def install(fail_times):
        holder["pool"] = _Pool(fail_times)
        _backends._allocator_installed.clear()
        _backends.install_cuda_allocator()
        return holder["pool"], holder["malloc"]
    return install


def test_an_allocation_that_succeeds_returns_the_pools_pointer_and_records_the_peak(fake_cupy):
    pool, malloc = fake_cupy(fail_times=0)
    assert malloc(2 ** 20) == ("ptr", 2 ** 20)
    assert _backends.peak_bytes[0] == pool.used_bytes()


def test_a_failed_allocation_raises_pytorchs_out_of_memory_error(fake_cupy):
    pool, malloc = fake_cupy(fail_times=1)
    with pytest.raises(flambeau.OutOfMemoryError) as info:
        malloc(2 ** 31)
    e = info.value
    assert isinstance(e, RuntimeError) and flambeau.cuda.OutOfMemoryError is flambeau.OutOfMemoryError
    msg = str(e)
    assert msg.startswith("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                          "80.00 GiB of which 512.00 MiB is free."), msg
    assert "3.00 GiB is allocated by flambeau, and 2.00 GiB is reserved by flambeau but unallocated" in msg
    assert "empty_cache" in msg and isinstance(e.__cause__, _OOM)
    assert pool.tries == 1


def test_empty_cache_collects_cyclic_garbage_before_releasing_the_pool(fake_cupy, monkeypatch):
    """The raised collector threshold lets a dropped cycle live longer: `flambeau.cuda.empty_cache()` collects
    it before the pool releases its blocks (a cycle holding device arrays frees them there)."""
    import gc
    import weakref
    pool, _ = fake_cupy(fail_times=0)
    monkeypatch.setattr(flambeau.cuda, "is_available", lambda: True)
    order = []
    pool.free_all_blocks = lambda: order.append("released")

    class Holder:
        pass
    a, b = Holder(), Holder()
    a.other, b.other = b, a
    weakref.finalize(a, order.append, "collected")
    gc.disable()                        # (only empty_cache's collection may find it)
    try:
        del a, b
        flambeau.cuda.empty_cache()
    finally:
        gc.enable()
    assert order == ["collected", "released"], order


@pytest.mark.parametrize("size, text", [(512, "512 bytes"), (3 * 2 ** 10, "3.00 KiB"), (20 * 2 ** 20, "20.00 MiB")])
def test_small_sizes_are_worded_as_pytorch_words_them(fake_cupy, size, text):
    _, malloc = fake_cupy(fail_times=1)
    with pytest.raises(flambeau.OutOfMemoryError, match=f"Tried to allocate {text}\\."):
        malloc(size)


@pytest.mark.cuda
def test_a_real_allocation_larger_than_the_card_raises_and_leaves_the_device_usable():
    """On a GPU: a tensor of 1 TiB raises flambeau.OutOfMemoryError, caught as PyTorch's would be (where the
    machine's torch has cuda, its error is the same kind: a RuntimeError subclass named OutOfMemoryError),
    and the next ordinary allocation works and holds the right values."""
    with pytest.raises(flambeau.OutOfMemoryError, match="CUDA out of memory. Tried to allocate 1024.00 GiB"):
        flambeau.empty(2 ** 40, dtype=flambeau.uint8, device="cuda")
    x = flambeau.arange(1000, device="cuda", dtype=flambeau.float32)
    assert float(x.sum().cpu()) == 499500.0
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        with pytest.raises(torch.cuda.OutOfMemoryError) as info:
            torch.empty(2 ** 40, dtype=torch.uint8, device="cuda")
        assert type(info.value).__name__ == "OutOfMemoryError" and isinstance(info.value, RuntimeError)
