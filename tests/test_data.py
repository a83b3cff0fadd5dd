"""utils.data against PyTorch: batching, samplers (lazy, generator-driven), datasets, random_split, collate.

DataLoader worker processes are tested in tests/test_data_workers.py.
"""
import collections
import itertools
import tracemalloc

import numpy as np
import pytest
import torch

import flambeau
from flambeau.utils import data as fd
from torch.utils import data as td

LAZY_PEAK_BYTES = 1 << 20     # a lazy sampler's first draws stay far below one eager draw of 10**7 indices


def _lib(mod):
    return td if mod is torch else fd


def _ds(mod):
    return _lib(mod).TensorDataset(mod.tensor(np.arange(10, dtype=np.float32)), mod.tensor(np.arange(10)))


def _same_error(ours, theirs):
    """`ours()` raises what `theirs()` raises: the same type and message."""
    with pytest.raises(Exception) as ref:
        theirs()
    with pytest.raises(ref.type) as got:
        ours()
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential_batches_match_torch(drop_last):
    ours = [b[1].tolist() for b in fd.DataLoader(_ds(flambeau), batch_size=3, drop_last=drop_last)]
    ref = [b[1].tolist() for b in td.DataLoader(_ds(torch), batch_size=3, drop_last=drop_last)]
    assert ours == ref
    assert len(fd.DataLoader(_ds(flambeau), batch_size=3, drop_last=drop_last)) == len(ref)


def test_shuffle_is_a_permutation_and_reproducible():
    def epoch(seed):
        g = flambeau.Generator().manual_seed(seed)
        return [i for b in fd.DataLoader(_ds(flambeau), batch_size=4, shuffle=True, generator=g) for i in b[1].tolist()]
    a, b, c = epoch(1), epoch(1), epoch(2)
    assert sorted(a) == list(range(10)) and a == b and a != c
    flambeau.manual_seed(5)
    x = [i for b in fd.DataLoader(_ds(flambeau), batch_size=4, shuffle=True) for i in b[1].tolist()]
    flambeau.manual_seed(5)
    y = [i for b in fd.DataLoader(_ds(flambeau), batch_size=4, shuffle=True) for i in b[1].tolist()]
    assert x == y


def test_random_sampler_with_replacement_draws_lazily():
    """The endless-loader idiom: nothing is drawn up front (PyTorch draws 32 at a time)."""
    tracemalloc.start()
    try:
        first = list(itertools.islice(fd.RandomSampler(range(10), replacement=True, num_samples=10**7), 100))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < LAZY_PEAK_BYTES and len(first) == 100 and set(first) <= set(range(10))
    endless = fd.RandomSampler(range(10), replacement=True, num_samples=int(1e10))
    assert len(endless) == int(1e10) == len(td.RandomSampler(range(10), replacement=True, num_samples=int(1e10)))
    assert set(itertools.islice(endless, 1000)) == set(range(10))


@pytest.mark.parametrize("mod", [torch, flambeau])
def test_random_sampler_follows_pytorchs_recipe_from_the_generator(mod):
    """With replacement: chunks of randint(high=n, size=(32,)) from the generator; without: one
    randperm(n) per pass over the data, the last one cut. The same recipe holds on PyTorch."""
    lib = _lib(mod)
    s = lib.RandomSampler(range(7), replacement=True, num_samples=40, generator=mod.Generator().manual_seed(3))
    g = mod.Generator().manual_seed(3)
    expect = mod.randint(high=7, size=(32,), generator=g).tolist() + mod.randint(high=7, size=(8,), generator=g).tolist()
    assert list(s) == expect
    s = lib.RandomSampler(range(5), num_samples=12, generator=mod.Generator().manual_seed(4))
    g = mod.Generator().manual_seed(4)
    expect = sum((mod.randperm(5, generator=g).tolist() for _ in range(3)), [])[:12]
    got = list(s)
    assert got == expect and sorted(got[:5]) == sorted(got[5:10]) == list(range(5)) and len(set(got[10:])) == 2
    g = mod.Generator().manual_seed(9)
    s = lib.RandomSampler(range(20), generator=g)
    assert list(s) != list(s)                         # the generator goes on from epoch to epoch


def test_unseeded_sampler_is_reproducible_after_manual_seed():
    flambeau.manual_seed(11)
    a = list(fd.RandomSampler(range(50)))
    flambeau.manual_seed(11)
    b, c = list(fd.RandomSampler(range(50))), list(fd.RandomSampler(range(50)))
    assert a == b != c and sorted(a) == list(range(50))


def test_sampler_errors_match_torch():
    _same_error(lambda: fd.RandomSampler(range(3), replacement=1), lambda: td.RandomSampler(range(3), replacement=1))
    _same_error(lambda: fd.RandomSampler(range(3), num_samples=0), lambda: td.RandomSampler(range(3), num_samples=0))
    _same_error(lambda: fd.WeightedRandomSampler([1, 2], 3, replacement="x"),
                lambda: td.WeightedRandomSampler([1, 2], 3, replacement="x"))
    _same_error(lambda: fd.WeightedRandomSampler([[1, 2]], 3), lambda: td.WeightedRandomSampler([[1, 2]], 3))
    _same_error(lambda: fd.WeightedRandomSampler([1, 2], True), lambda: td.WeightedRandomSampler([1, 2], True))
    _same_error(lambda: fd.BatchSampler(range(3), 0, False), lambda: td.BatchSampler(range(3), 0, False))
    _same_error(lambda: fd.BatchSampler(range(3), 2, 1), lambda: td.BatchSampler(range(3), 2, 1))


def test_weighted_sampler_distribution_and_without_replacement():
    w = [0.1, 0.2, 0.3, 0.4]
    draws = list(fd.WeightedRandomSampler(w, 40000, generator=flambeau.Generator().manual_seed(0)))
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 40000, w, atol=0.01)
    assert list(fd.WeightedRandomSampler([0, 0, 1, 0], 5)) == list(td.WeightedRandomSampler([0, 0, 1, 0], 5))
    once = list(fd.WeightedRandomSampler(w, 4, replacement=False))
    assert sorted(once) == [0, 1, 2, 3]
    ids = [10, 20, 30]
    sub = list(fd.SubsetRandomSampler(ids, generator=flambeau.Generator().manual_seed(1)))
    assert sorted(sub) == ids and len(fd.SubsetRandomSampler(ids)) == 3


@pytest.mark.parametrize("n,bs", [(10, 3), (9, 3), (1, 4), (0, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_torch(n, bs, drop_last):
    ours = fd.BatchSampler(fd.SequentialSampler(range(n)), bs, drop_last)
    ref = td.BatchSampler(td.SequentialSampler(range(n)), bs, drop_last)
    assert list(ours) == list(ref) and len(ours) == len(ref)


@pytest.mark.parametrize("n", [10, 11])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_shards_like_torch(n, drop_last):
    ours = [list(fd.DistributedSampler(range(n), num_replicas=3, rank=r, shuffle=False, drop_last=drop_last))
            for r in range(3)]
    ref = [list(td.DistributedSampler(range(n), num_replicas=3, rank=r, shuffle=False, drop_last=drop_last))
           for r in range(3)]
    assert ours == ref
    shuffled = [fd.DistributedSampler(range(n), num_replicas=3, rank=r, seed=7, drop_last=drop_last) for r in range(3)]
    first = [list(s) for s in shuffled]
    assert [len(x) for x in first] == [len(x) for x in ref]
    assert first == [list(s) for s in shuffled]                 # same seed and epoch: same shards
    assert set(sum(first, [])) <= set(range(n)) and len(set(sum(first, []))) == min(n, sum(map(len, first)))
    for s in shuffled:
        s.set_epoch(1)
    assert [list(s) for s in shuffled] != first
    _same_error(lambda: fd.DistributedSampler(range(4), num_replicas=2, rank=2),
                lambda: td.DistributedSampler(range(4), num_replicas=2, rank=2))


@pytest.mark.parametrize("available", [True, False])
def test_distributed_sampler_without_a_process_group_like_torch(monkeypatch, available):
    """Without num_replicas/rank the sampler asks torch.distributed: with the package available (as both are)
    and no group, and where it is not (PyTorch built without it), both raise the same error."""
    monkeypatch.setattr(torch.distributed, "is_available", lambda: available)
    monkeypatch.setattr(flambeau.distributed, "is_available", lambda: available)
    _same_error(lambda: fd.DistributedSampler(range(4)), lambda: td.DistributedSampler(range(4)))
    _same_error(lambda: fd.DistributedSampler(range(4), rank=0), lambda: td.DistributedSampler(range(4), rank=0))
    assert len(fd.DistributedSampler(range(5), num_replicas=2, rank=1)) == 3


@pytest.mark.parametrize("n,fracs", [(10, [0.3, 0.7]), (11, [0.3, 0.3, 0.4]), (7, [0.5, 0.5]), (3, [0.1, 0.9])])
def test_random_split_fractions_match_torch(n, fracs):
    ours = fd.random_split(range(n), fracs, generator=flambeau.Generator().manual_seed(0))
    ref = td.random_split(range(n), fracs, generator=torch.Generator().manual_seed(0))
    assert [len(p) for p in ours] == [len(p) for p in ref]
    assert sorted(i for p in ours for i in p) == list(range(n))
    assert all(isinstance(p, fd.Subset) for p in ours)
    a = [list(p) for p in fd.random_split(range(n), fracs, generator=flambeau.Generator().manual_seed(0))]
    assert a == [list(p) for p in ours]


def test_random_split_errors_and_warnings_match_torch():
    _same_error(lambda: fd.random_split(range(10), [3, 3]), lambda: td.random_split(range(10), [3, 3]))
    _same_error(lambda: fd.random_split(range(10), [1.5, -0.5]), lambda: td.random_split(range(10), [1.5, -0.5]))
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        td.random_split(range(1), [0.1, 0.9])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        fd.random_split(range(1), [0.1, 0.9])


class _Batched:
    """A map-style dataset with `__getitems__`: the DataLoader fetches each batch in one call."""

    def __init__(self):
        self.calls = []

    def __len__(self):
        return 6

    def __getitem__(self, i):
        raise AssertionError("per-sample __getitem__ used although __getitems__ exists")

    def __getitems__(self, idx):
        self.calls.append(list(idx))
        return [i * 10 for i in idx]


@pytest.mark.parametrize("mod", [torch, flambeau])
def test_getitems_is_used_through_subset_and_stack(mod):
    lib, ds = _lib(mod), _Batched()
    sub = lib.Subset(ds, [5, 4, 3, 2])
    assert [b.tolist() for b in lib.DataLoader(sub, batch_size=3)] == [[50, 40, 30], [20]]
    assert ds.calls == [[5, 4, 3], [2]]
    st = lib.StackDataset(a=sub, b=range(4))
    assert st.__getitems__([0, 1]) == [{"a": 50, "b": 0}, {"a": 40, "b": 1}]
    assert lib.StackDataset(sub, range(4)).__getitems__([1]) == [(40, 1)]


def test_dataset_combinators_match_torch():
    c = fd.ConcatDataset([range(3), range(5)])
    r = td.ConcatDataset([range(3), range(5)])
    assert len(c) == len(r) and [c[i] for i in range(-8, 8)] == [r[i] for i in range(-8, 8)]
    _same_error(lambda: fd.ConcatDataset([]), lambda: td.ConcatDataset([]))
    _same_error(lambda: c[-9], lambda: r[-9])
    _same_error(lambda: list(fd.ChainDataset([range(3)])), lambda: list(td.ChainDataset([range(3)])))
    _same_error(lambda: fd.StackDataset(range(2), range(3)), lambda: td.StackDataset(range(2), range(3)))
    _same_error(lambda: fd.StackDataset(range(2), b=range(2)), lambda: td.StackDataset(range(2), b=range(2)))
    _same_error(lambda: fd.StackDataset(), lambda: td.StackDataset())
    assert fd.StackDataset(range(2), range(10, 12))[1] == td.StackDataset(range(2), range(10, 12))[1]


# ---- collate ----------------------------------------------------------------------------------

class _MyList(list):
    pass


P = collections.namedtuple("P", "x y")


def _plain(x):
    """A comparable picture of a collated batch: tensors as (dtype, values), containers by type name."""
    if isinstance(x, (torch.Tensor, flambeau.Tensor)):
        return ("tensor", str(x.dtype).replace("torch.", ""), x.tolist())
    if isinstance(x, collections.abc.Mapping):
        return (type(x).__name__, {k: _plain(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_plain(v) for v in x])
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.tolist())
    return (type(x).__name__, x)


def _samples():
    return [collections.OrderedDict(
        a=np.ones(2, dtype=np.float32) * i, b=i, c=float(i), s="x", by=b"y", t=(i, [i, i]),
        n=P(np.int16(i), np.float64(i)), l=_MyList([True, False]), z=np.array(i, dtype=np.int32),
        nb=np.bool_(i % 2), dd=collections.defaultdict(list, k=i)) for i in range(3)]


def test_default_collate_of_nested_structures_matches_torch():
    assert _plain(fd.default_collate(_samples())) == _plain(td.default_collate(_samples()))
    assert _plain(fd.default_collate([(1, 2.0), (3, 4.0)])) == _plain(td.default_collate([(1, 2.0), (3, 4.0)]))
    t = [flambeau.ones(2, 3) * i for i in range(4)]
    assert _plain(fd.default_collate(t)) == _plain(td.default_collate([torch.ones(2, 3) * i for i in range(4)]))


def test_default_collate_errors_match_torch():
    _same_error(lambda: fd.default_collate([[1, 2], [1]]), lambda: td.default_collate([[1, 2], [1]]))
    _same_error(lambda: fd.default_collate([object()]), lambda: td.default_collate([object()]))
    bad = [np.array(["a"]), np.array(["b"])]
    _same_error(lambda: fd.default_collate(bad), lambda: td.default_collate(bad))


def test_collate_fn_map_extends_default_collate():
    class Pt:
        def __init__(self, v):
            self.v = v

    def collate_pt(batch, *, collate_fn_map=None):
        return sum(p.v for p in batch)
    fmap = {**fd._utils.collate.default_collate_fn_map, Pt: collate_pt}
    out = fd._utils.collate.collate([{"p": Pt(1), "x": 1}, {"p": Pt(2), "x": 2}], collate_fn_map=fmap)
    assert out["p"] == 3 and out["x"].tolist() == [1, 2]


def test_default_convert_matches_torch():
    sample = {"a": np.arange(3), "s": np.array(["u"]), "t": (np.float32(1.5), "k"), "n": P(np.int64(2), 3),
              "l": _MyList([np.zeros(1)])}
    assert _plain(fd.default_convert(sample)) == _plain(td.default_convert(sample))
    assert _plain(fd.DataLoader([sample], batch_size=None).__iter__().__next__()) == \
        _plain(next(iter(td.DataLoader([sample], batch_size=None))))
