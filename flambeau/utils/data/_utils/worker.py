"""What runs inside a DataLoader worker process: seeding, `get_worker_info`, fetching and the task loop.

A worker receives `(task index, sampler index)` pairs on its own queue and answers `(task index,
data)` on the shared result queue, where data is a batch, an `ExceptionWrapper` (re-raised by the
main process with the worker's traceback), or `IterableDatasetStopIteration` once its copy of an
iterable dataset is exhausted (later tasks are then ignored). `ResumeIteration` starts a new epoch
of a persistent worker: the fetcher, and so the dataset's iterator, is made afresh. `None` stops it.
"""
from __future__ import annotations

import queue
import random
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .... import random as frandom

POLL_INTERVAL_S = 5.0        # how often an idle worker wakes to check its queue


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker: its id, the number of workers, its seed and its copy of the
    dataset (an IterableDataset shards itself with these). In the main process: None."""
    return _worker_info


@dataclass(frozen=True)
class IterableDatasetStopIteration:
    worker_id: int


@dataclass(frozen=True)
class ResumeIteration:
    pass


class ExceptionWrapper:
    """An exception with its traceback, carried to another process and raised there again."""

    def __init__(self, exc: BaseException, where: str = "in background") -> None:
        self.exc_type = type(exc)
        self.exc_msg = "".join(traceback.format_exception(exc))
        self.where = where

    def reraise(self) -> None:
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        try:
            err = self.exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        raise err


class _MapFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn: Callable, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, index):
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        getitems = getattr(self.dataset, "__getitems__", None)
        data = getitems(index) if callable(getitems) else [self.dataset[i] for i in index]
        return self.collate_fn(data)


class _IterableFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn: Callable, drop_last: bool) -> None:
        self.it = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.it))
        data = []
        for _ in index:
            try:
                data.append(next(self.it))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)


def create_fetcher(is_iterable: bool, dataset, auto_collation: bool, collate_fn: Callable, drop_last: bool):
    cls = _IterableFetcher if is_iterable else _MapFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


def _numpy_seed(base_seed: int, worker_id: int) -> np.ndarray:
    """NumPy's legacy global seed for a worker: 128 bits mixed from the base seed and the worker id."""
    return np.random.SeedSequence([worker_id, base_seed % 2**64, base_seed // 2**64]).generate_state(4)


def worker_loop(is_iterable: bool, dataset, index_q, result_q, auto_collation: bool, collate_fn: Callable,
                drop_last: bool, base_seed: int, init_fn: Callable | None, worker_id: int, num_workers: int) -> None:
    """The body of worker `worker_id`: seed Python, NumPy and flambeau from `base_seed + worker_id`,
    run `init_fn`, then answer tasks until told to stop."""
    global _worker_info
    seed = base_seed + worker_id
    random.seed(seed)
    frandom.manual_seed(seed)
    np.random.seed(_numpy_seed(base_seed, worker_id))
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    where = f"in DataLoader worker process {worker_id}"
    init_error = None
    fetcher = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = create_fetcher(is_iterable, dataset, auto_collation, collate_fn, drop_last)
    except Exception as e:
        init_error = ExceptionWrapper(e, where)
    iteration_end = False
    while True:
        try:
            task = index_q.get(timeout=POLL_INTERVAL_S)
        except queue.Empty:
            continue
        except (KeyboardInterrupt, EOFError):
            return
        if isinstance(task, ResumeIteration):
            result_q.put((task, None))
            iteration_end = False
            fetcher = create_fetcher(is_iterable, dataset, auto_collation, collate_fn, drop_last)
            continue
        if task is None:
            break
        if iteration_end:
            continue
        idx, index = task
        if init_error is not None:
            data, init_error = init_error, None
        else:
            try:
                data = fetcher.fetch(index)
            except StopIteration as e:
                if not is_iterable:
                    data = ExceptionWrapper(e, where)
                else:
                    data = IterableDatasetStopIteration(worker_id)
                    iteration_end = True
            except Exception as e:
                data = ExceptionWrapper(e, where)
        result_q.put((idx, data))
