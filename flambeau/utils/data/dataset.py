"""Datasets: map-style (`__getitem__`/`__len__`) and iterable, plus the standard combinators.

A map-style dataset may also define `__getitems__(indices)`, which the DataLoader then calls once
per batch instead of `__getitem__` per sample (PyTorch's batched fetch); `Subset` and
`StackDataset` pass it through to the datasets they wrap.
"""
from __future__ import annotations

import bisect
import itertools
import math
import warnings
from typing import Iterable, Sequence

from ..._ops.random_ops import randperm
from ...random import Generator, default_generator


class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    def __iter__(self):
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    def __init__(self, *tensors) -> None:
        if any(tensors[0].size(0) != t.size(0) for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].size(0)


def _items(dataset, indices: list) -> list:
    """`dataset`'s samples at `indices`, through its `__getitems__` when it has one."""
    getitems = getattr(dataset, "__getitems__", None)
    if not callable(getitems):
        return [dataset[i] for i in indices]
    items = getitems(indices)
    if len(items) != len(indices):
        raise ValueError(f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}")
    return items


class StackDataset(Dataset):
    def __init__(self, *args, **kwargs) -> None:
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) like "
                             "input/output, but both types are given.")
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        parts = list(args or kwargs.values())
        self._length = len(parts[0])
        if any(self._length != len(d) for d in parts):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args or kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices: list) -> list:
        if isinstance(self.datasets, dict):
            cols = {k: _items(d, indices) for k, d in self.datasets.items()}
            return [{k: c[i] for k, c in cols.items()} for i in range(len(indices))]
        cols = [_items(d, indices) for d in self.datasets]
        return [tuple(c[i] for c in cols) for i in range(len(indices))]

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset):
    def __init__(self, datasets: Iterable) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        sample_idx = idx if d == 0 else idx - self.cumulative_sizes[d - 1]
        return self.datasets[d][sample_idx]


class ChainDataset(IterableDataset):
    def __init__(self, datasets: Iterable) -> None:
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            total += len(d)
        return total


class Subset(Dataset):
    def __init__(self, dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list) -> list:
        return _items(self.dataset, [self.indices[i] for i in indices])

    def __len__(self) -> int:
        return len(self.indices)


def _fraction_lengths(n: int, fractions: Sequence[float]) -> list[int]:
    """Split sizes for fractions summing to 1: floors, then the remainder one by one round-robin."""
    sizes = []
    for i, frac in enumerate(fractions):
        if frac < 0 or frac > 1:
            raise ValueError(f"Fraction at index {i} is not between 0 and 1")
        sizes.append(int(math.floor(n * frac)))
    for i in range(n - sum(sizes)):
        sizes[i % len(sizes)] += 1
    for i, s in enumerate(sizes):
        if s == 0:
            warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.")
    return sizes


def random_split(dataset, lengths: Sequence[int | float], generator: Generator | None = default_generator) -> list[Subset]:
    """Split into non-overlapping random subsets of the given lengths, or of fractions summing to 1."""
    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        lengths = _fraction_lengths(n, lengths)
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    perm = randperm(sum(lengths), generator=generator).tolist()
    return [Subset(dataset, perm[end - ln:end]) for end, ln in zip(itertools.accumulate(lengths), lengths)]
