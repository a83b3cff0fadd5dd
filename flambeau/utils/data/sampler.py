"""Samplers: the order in which a DataLoader visits indices, and how it groups them in batches.

Random samplers draw through flambeau's random ops with the user's `generator` (or, without one,
a fresh generator seeded from the default one, so `flambeau.manual_seed` fixes the order), lazily:
with replacement, `_DRAW_CHUNK` indices at a time as PyTorch does, so an endless sampler
(`num_samples=int(1e10)`) costs nothing up front.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Sequence

from ... import _dtype as D
from ..._ops.creation import as_tensor, empty
from ..._ops.random_ops import randint, randperm
from ...random import Generator

_DRAW_CHUNK = 32          # indices drawn per call when sampling with replacement (PyTorch's chunk)


def _fresh_generator() -> Generator:
    """A generator seeded from the default one: each epoch of an unseeded sampler differs, and
    `manual_seed` makes the sequence of epochs reproducible (PyTorch's RandomSampler does the same)."""
    seed = int(empty((), dtype=D.int64).random_().item())
    return Generator().manual_seed(seed)


class Sampler:
    def __init__(self, data_source=None) -> None:
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        g = self.generator if self.generator is not None else _fresh_generator()
        if self.replacement:
            for _ in range(self.num_samples // _DRAW_CHUNK):
                yield from randint(high=n, size=(_DRAW_CHUNK,), dtype=D.int64, generator=g).tolist()
            yield from randint(high=n, size=(self.num_samples % _DRAW_CHUNK,), dtype=D.int64, generator=g).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=g).tolist()
        yield from randperm(n, generator=g).tolist()[: self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    def __init__(self, indices: Sequence[int], generator: Generator | None = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: Generator | None = None) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        w = as_tensor(weights, dtype=D.float64)
        if w.dim() != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}")
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        yield from self.weights.multinomial(self.num_samples, self.replacement, generator=self.generator).tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list]:
        it = iter(self.sampler)
        while batch := list(itertools.islice(it, self.batch_size)):
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
