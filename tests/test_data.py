"""utils.data against PyTorch: batching, shuffling reproducibility, samplers, collate, workers."""
import collections

import numpy as np
import pytest
import torch

import flambeau
from flambeau.utils import data as fd
from torch.utils import data as td


def _ds(mod):
    return (td if mod is torch else fd).TensorDataset(mod.tensor(np.arange(10, dtype=np.float32)),
                                                      mod.tensor(np.arange(10)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential_batches_match_torch(workers, drop_last):
    ours = [b[1].tolist() for b in fd.DataLoader(_ds(flambeau), batch_size=3, num_workers=workers, drop_last=drop_last)]
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


def test_default_collate_matches_torch():
    batch = [{"a": np.ones(2, dtype=np.float32) * i, "b": i, "c": float(i), "s": "x", "t": (i, [i, i])} for i in range(3)]
    ours = fd.default_collate(batch)
    ref = td.default_collate(batch)
    for k in ("a", "b", "c"):
        assert str(ours[k].dtype)[6:] == str(ref[k].dtype)[6:]
        np.testing.assert_array_equal(ours[k].numpy(), ref[k].numpy())
    assert ours["s"] == ref["s"]
    assert [x.tolist() for x in ours["t"][1]] == [x.tolist() for x in ref["t"][1]]
    P = collections.namedtuple("P", "x y")
    out = fd.default_collate([P(1, 2.0), P(3, 4.0)])
    assert isinstance(out, P) and out.x.tolist() == [1, 3]
    with pytest.raises(RuntimeError, match="equal size"):
        fd.default_collate([[1, 2], [1]])


def test_samplers_match_torch():
    assert list(fd.BatchSampler(fd.SequentialSampler(range(10)), 4, False)) == \
        list(td.BatchSampler(td.SequentialSampler(range(10)), 4, False))
    ws = list(fd.WeightedRandomSampler([0, 0, 1, 0], 5))
    assert ws == [2] * 5
    ours = [list(fd.DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    ref = [list(td.DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert ours == ref
    with pytest.raises(ValueError):
        fd.BatchSampler(range(3), 0, False)


def test_random_split_and_concat():
    parts = fd.random_split(range(10), [0.3, 0.7], generator=flambeau.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(list(parts[0]) + list(parts[1])) == list(range(10))
    c = fd.ConcatDataset([range(3), range(5)])
    assert len(c) == 8 and c[4] == 1 and c[-1] == 4


class _Bad(fd.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("bad sample 5")
        return i


def test_worker_exception_surfaces_with_traceback():
    dl = fd.DataLoader(_Bad(), batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match="(?s)Caught ValueError in DataLoader worker process.*bad sample 5"):
        list(dl)


class _Iter(fd.IterableDataset):
    def __iter__(self):
        info = fd.get_worker_info()
        n = 1 if info is None else info.num_workers
        w = 0 if info is None else info.id
        return iter(range(w, 12, n))


def test_iterable_dataset_with_workers():
    out = sorted(i for b in fd.DataLoader(_Iter(), batch_size=4, num_workers=2) for i in b.tolist())
    assert out == list(range(12))


def test_persistent_workers_and_init_fn():
    seen = []
    dl = fd.DataLoader(_ds(flambeau), batch_size=5, num_workers=2, persistent_workers=True,
                       worker_init_fn=lambda wid: None)
    for _ in range(2):
        seen.append([b[1].tolist() for b in dl])
    assert seen[0] == seen[1] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    dl._persistent._shutdown_workers()
