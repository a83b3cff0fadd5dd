"""DataLoader worker processes against PyTorch's: sharded IterableDatasets, order of batches,
persistent workers, prefetching, worker_init_fn, get_worker_info and seeding, pin_memory, errors."""
import collections
import os
import random
import time

import numpy as np
import pytest
import torch

import flambeau
from flambeau.utils import data as fd
from torch.utils import data as td

from tests.test_data import _same_error

SLOW_SAMPLE_S = 3.0           # a sample slower than the loader's timeout below
LOADER_TIMEOUT_S = 1
HANG_S = 60                  # a loader that waits this long for a batch is stuck: fail instead of hanging


def _lib(mod):
    return td if mod is torch else fd


def _sharded(mod, n, uneven=False):
    """An IterableDataset that splits range(n) between workers through get_worker_info; with
    `uneven`, worker 0 gets only two samples, so it runs dry first."""
    lib = _lib(mod)

    class Sharded(lib.IterableDataset):
        def __iter__(self):
            info = lib.get_worker_info()
            if info is None:
                return iter(range(n))
            if uneven and info.num_workers > 1:
                return iter(range(2) if info.id == 0 else range(2, n)[info.id - 1::info.num_workers - 1])
            return iter(range(info.id, n, info.num_workers))

        def __len__(self):
            return n
    return Sharded()


def _batches(loader):
    return [b.tolist() if hasattr(b, "tolist") else b for b in loader]


@pytest.mark.parametrize("workers,bs,drop_last,uneven", [(2, 4, False, False), (3, 2, True, False),
                                                        (2, None, False, False), (3, 2, False, True)])
def test_sharded_iterable_dataset_matches_torch_batch_for_batch(workers, bs, drop_last, uneven):
    got = {mod: _batches(_lib(mod).DataLoader(_sharded(mod, 13, uneven), batch_size=bs, num_workers=workers,
                                              drop_last=drop_last, timeout=HANG_S)) for mod in (torch, flambeau)}
    assert got[flambeau] == got[torch]
    assert len(fd.DataLoader(_sharded(flambeau, 13), batch_size=bs, drop_last=drop_last)) == \
        len(td.DataLoader(_sharded(torch, 13), batch_size=bs, drop_last=drop_last))


def _map_ds(mod):
    return _lib(mod).TensorDataset(mod.arange(11))


@pytest.mark.parametrize("prefetch", [1, 3])
def test_map_dataset_with_workers_matches_torch(prefetch):
    got = {mod: [b[0].tolist() for b in _lib(mod).DataLoader(_map_ds(mod), batch_size=3, num_workers=2,
                                                               prefetch_factor=prefetch)]
           for mod in (torch, flambeau)}
    assert got[flambeau] == got[torch]
    unordered = [b[0].tolist() for b in fd.DataLoader(_map_ds(flambeau), batch_size=3, num_workers=2,
                                                      prefetch_factor=prefetch, in_order=False)]
    assert sorted(unordered) == sorted(got[torch])
    it = iter(fd.DataLoader(_map_ds(flambeau), batch_size=1, num_workers=2, prefetch_factor=prefetch))
    assert it.send_idx == 2 * prefetch            # tasks in flight before the first batch is asked for
    next(it)
    assert it.send_idx == 2 * prefetch + 1
    it._shutdown_workers()


class _Pid(fd.IterableDataset):
    def __iter__(self):
        info = fd.get_worker_info()
        return iter([(os.getpid(), info.id, i) for i in range(3)])


def test_persistent_workers_restart_an_iterable_dataset_in_the_same_processes():
    loader = fd.DataLoader(_Pid(), batch_size=None, num_workers=2, persistent_workers=True, timeout=HANG_S)
    first, second = list(loader), list(loader)
    assert [(w, i) for _, w, i in first] == [(w, i) for _, w, i in second] == \
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert {p for p, _, _ in first} == {p for p, _, _ in second} and os.getpid() not in {p for p, _, _ in first}
    for _ in zip(range(2), loader):               # an epoch left early does not leak into the next
        pass
    assert [(w, i) for _, w, i in loader] == [(w, i) for _, w, i in first]
    loader._iterator._shutdown_workers()
    fresh = fd.DataLoader(_Pid(), batch_size=None, num_workers=2)
    assert {p for p, _, _ in fresh}.isdisjoint({p for p, _, _ in fresh})


def test_persistent_map_workers_serve_several_epochs_like_torch():
    def epochs(mod):
        dl = _lib(mod).DataLoader(_map_ds(mod), batch_size=4, num_workers=2, persistent_workers=True, timeout=HANG_S)
        out = [[b[0].tolist() for b in dl] for _ in range(2)]
        out.append([b[0].tolist() for _, b in zip(range(1), dl)])
        out.append([b[0].tolist() for b in dl])
        return out
    assert epochs(flambeau) == epochs(torch)


class _Seeds(fd.Dataset):
    """Each sample reports the worker's info and a draw of each random library in the worker."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = fd.get_worker_info()
        return {"id": info.id, "n": info.num_workers, "seed": info.seed, "py": random.random(),
                "np": float(np.random.rand()), "fl": float(flambeau.rand(())), "tag": _INIT.get(info.id)}


_INIT = {}


def _init(worker_id):
    _INIT[worker_id] = f"init {worker_id} of {fd.get_worker_info().num_workers}"


def test_worker_info_init_fn_and_seeding():
    def run(seed):
        dl = fd.DataLoader(_Seeds(), batch_size=None, num_workers=2, worker_init_fn=_init,
                           generator=flambeau.Generator().manual_seed(seed))
        return list(dl)
    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c                      # the loader's generator fixes every worker seed
    assert [s["id"] for s in a] == [0, 1, 0, 1] and {s["n"] for s in a} == {2}
    assert [s["tag"] for s in a] == ["init 0 of 2", "init 1 of 2"] * 2
    assert a[1]["seed"] == a[0]["seed"] + 1       # PyTorch's rule: base seed + worker id
    for lib in ("py", "np", "fl"):
        assert a[0][lib] != a[1][lib]             # workers draw different streams
    assert fd.get_worker_info() is None
    with pytest.raises(AttributeError):
        fd.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None).id = 1


class _Bad(fd.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("bad sample 5")
        return i


def test_worker_exception_surfaces_with_traceback():
    dl = fd.DataLoader(_Bad(), batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match="(?s)Caught ValueError in DataLoader worker process 0.*bad sample 5"):
        list(dl)


def _failing_init(worker_id):
    raise KeyError(f"no config for worker {worker_id}")


def test_worker_init_fn_exception_surfaces():
    dl = fd.DataLoader(range(4), num_workers=2, worker_init_fn=_failing_init)
    with pytest.raises(KeyError, match="(?s)in DataLoader worker process 0.*no config for worker 0"):
        list(dl)


class _Slow(fd.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        time.sleep(SLOW_SAMPLE_S)
        return i


def test_timeout_raises_like_torch():
    with pytest.raises(RuntimeError, match=f"DataLoader timed out after {LOADER_TIMEOUT_S} seconds"):
        list(fd.DataLoader(_Slow(), num_workers=1, timeout=LOADER_TIMEOUT_S))


class _Pinnable:
    def __init__(self):
        self.pinned = False

    def pin_memory(self):
        out = _Pinnable()
        out.pinned = True
        return out


def _pinned_picture(x):
    if isinstance(x, _Pinnable):
        return ("P", x.pinned)
    if isinstance(x, dict):
        return {k: _pinned_picture(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_pinned_picture(v) for v in x])
    return x


def test_pin_memory_walks_batches_like_torch():
    P = collections.namedtuple("P", "a b")
    batch = {"x": (_Pinnable(), [_Pinnable(), "s"]), "n": P(_Pinnable(), 3)}
    ours = fd._utils.pin_memory.pin_memory(batch)
    ref = td._utils.pin_memory.pin_memory(batch)
    assert _pinned_picture(ours) == _pinned_picture(ref) and isinstance(ours["n"], P)


@pytest.mark.skipif(flambeau.cuda.is_available(), reason="the warning is for machines without an accelerator")
def test_pin_memory_without_accelerator_warns_like_torch():
    with pytest.warns(UserWarning, match="no accelerator is found") as ref:
        list(td.DataLoader(range(3), pin_memory=True))
    with pytest.warns(UserWarning) as got:
        out = [b.tolist() for b in fd.DataLoader(range(3), pin_memory=True)]
    assert out == [[0], [1], [2]]
    assert str(got[0].message) == str(ref[0].message)


@pytest.mark.cuda
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_pins_batches_on_cuda(workers):
    ds = fd.TensorDataset(flambeau.arange(6.0), flambeau.arange(6))
    batches = list(fd.DataLoader(ds, batch_size=4, num_workers=workers, pin_memory=True))
    assert all(t.is_pinned() for b in batches for t in b)
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]


def test_loader_option_errors_match_torch():
    ds = list(range(4))
    for kw in ({"num_workers": -1}, {"timeout": -1}, {"prefetch_factor": 2}, {"num_workers": 1, "prefetch_factor": -1},
               {"persistent_workers": True}, {"shuffle": True, "sampler": [0, 1]},
               {"batch_sampler": [[0]], "batch_size": 2}, {"batch_size": None, "drop_last": True},
               {"multiprocessing_context": "fork"}, {"num_workers": 1, "multiprocessing_context": "nope"}):
        _same_error(lambda: fd.DataLoader(ds, **kw), lambda: td.DataLoader(ds, **kw))
    _same_error(lambda: fd.DataLoader(_sharded(flambeau, 3), shuffle=True),
                lambda: td.DataLoader(_sharded(torch, 3), shuffle=True))
    ours, ref = fd.DataLoader(ds), td.DataLoader(ds)

    def set_bs(dl):
        dl.batch_size = 3
    _same_error(lambda: set_bs(ours), lambda: set_bs(ref))
