"""DataLoader: batches from a dataset, in the main process or in worker processes.

The loader draws indices from its index sampler (a BatchSampler when batching automatically; for an
IterableDataset, an endless sampler whose indices only count samples) and fetches them through the
fetchers of `_utils.worker`. With `num_workers > 0`, `_MultiProcessIter` keeps up to
`prefetch_factor * num_workers` tasks in flight, round-robin over the workers that have not run dry,
and yields results in task order. A worker's exception is raised again in the main process with the
worker's traceback. Workers stop at the end of an epoch, unless `persistent_workers`: then the same
processes serve the next epoch after a `ResumeIteration` (which also restarts an iterable dataset's
iterator in each worker). With `pin_memory` and a cuda device, batches are pinned as they are yielded.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import warnings
from typing import Any, Callable, Iterator

from .dataset import IterableDataset
from .sampler import Sampler, SequentialSampler, RandomSampler, BatchSampler
from ._utils.collate import default_collate, default_convert
from ._utils.pin_memory import pin_memory as _pin_memory
from ._utils.worker import (ExceptionWrapper, IterableDatasetStopIteration, ResumeIteration, WorkerInfo,  # noqa: F401
                            create_fetcher, get_worker_info, worker_loop)
from ... import cuda
from ..._ops.creation import empty
from ... import _dtype as D

DEFAULT_PREFETCH_FACTOR = 2
DEAD_WORKER_CHECK_S = 1.0       # how long the main process waits for a batch before checking its workers
WORKER_JOIN_S = 5.0
_FROZEN_AFTER_INIT = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
_NO_ACCELERATOR = "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used."


class _InfiniteConstantSampler(Sampler):
    """The index sampler of an IterableDataset: endless Nones (each one asks for the next sample)."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


def _check_options(num_workers: int, timeout: float, prefetch_factor: int | None, persistent_workers: bool,
                   multiprocessing_context) -> int | None:
    """PyTorch's argument checks (with its messages); returns the effective prefetch factor."""
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                         "to enable multiprocessing, otherwise set prefetch_factor to None.")
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = DEFAULT_PREFETCH_FACTOR
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if multiprocessing_context is not None:
        if num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading "
                             f"(num_workers > 0), but got num_workers={num_workers}")
        if isinstance(multiprocessing_context, str) and multiprocessing_context not in mp.get_all_start_methods():
            raise ValueError("multiprocessing_context option should specify a valid start method in "
                             f"{mp.get_all_start_methods()!r}, but got multiprocessing_context={multiprocessing_context!r}")
    return prefetch_factor


class DataLoader:
    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn: Callable | None = None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable | None = None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        self.prefetch_factor = _check_options(num_workers, timeout, prefetch_factor, persistent_workers,
                                              multiprocessing_context)
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self._is_iterable = isinstance(dataset, IterableDataset)
        if self._is_iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                                 f"but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if self._is_iterable:
                sampler = _InfiniteConstantSampler()
            else:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._iterator = None
        self._initialized = True

    def __setattr__(self, attr: str, val: Any) -> None:
        if self.__dict__.get("_initialized") and attr in _FROZEN_AFTER_INIT:
            raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(attr, val)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._is_iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if not self.persistent_workers:
            return _MultiProcessIter(self)
        if self._iterator is None:
            self._iterator = _MultiProcessIter(self)
        else:
            self._iterator.reset()
        return self._iterator


def _pins(loader: DataLoader) -> bool:
    """Whether batches are pinned: asked for and a cuda device present (else PyTorch's warning)."""
    if not loader.pin_memory:
        return False
    if loader.pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the device,"
                      f"ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=3)
    if not cuda.is_available():
        warnings.warn(_NO_ACCELERATOR, stacklevel=3)
        return False
    return True


class _SingleProcessIter:
    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.pin = _pins(loader)
        self.sampler_iter = iter(loader._index_sampler)
        self.fetcher = create_fetcher(loader._is_iterable, loader.dataset, loader._auto_collation,
                                      loader.collate_fn, loader.drop_last)

    def __iter__(self):
        return self

    def __next__(self):
        data = self.fetcher.fetch(next(self.sampler_iter))
        return _pin_memory(data) if self.pin else data

    def __len__(self) -> int:
        return len(self.loader)


class _MultiProcessIter:
    """Batches produced by worker processes, yielded in task order."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.pin = _pins(loader)
        ctx = loader.multiprocessing_context
        if ctx is None or isinstance(ctx, str):
            ctx = mp.get_context(ctx or ("fork" if sys.platform != "win32" else "spawn"))
        base_seed = int(empty((), dtype=D.int64).random_(generator=loader.generator).item())
        self.result_q = ctx.Queue()
        self.index_qs, self.workers = [], []
        self._shutdown = False
        for wid in range(loader.num_workers):
            iq = ctx.Queue()
            w = ctx.Process(target=worker_loop, daemon=True,
                            args=(loader._is_iterable, loader.dataset, iq, self.result_q, loader._auto_collation,
                                  loader.collate_fn, loader.drop_last, base_seed, loader.worker_init_fn, wid,
                                  loader.num_workers))
            w.start()
            self.index_qs.append(iq)
            self.workers.append(w)
        self.reset(first=True)

    def reset(self, first: bool = False) -> None:
        """Start an epoch: a fresh sampler iterator, all workers active, the first tasks sent. A
        persistent worker first acknowledges a ResumeIteration (results of an abandoned epoch before
        it are dropped)."""
        ld = self.loader
        self.sampler_iter = iter(ld._index_sampler)
        self.send_idx = self.rcvd_idx = 0
        self.task_info: dict[int, tuple] = {}       # task -> (worker,) or (worker, data) when early
        self.outstanding = 0
        self.active = [True] * ld.num_workers
        self.worker_cycle = 0
        if not first:
            for q in self.index_qs:
                q.put(ResumeIteration())
            acks = ld.num_workers
            while acks:
                idx, _ = self._get()
                acks -= isinstance(idx, ResumeIteration)
        for _ in range(ld.prefetch_factor * ld.num_workers):
            self._put()

    def _put(self) -> None:
        ld = self.loader
        if self.outstanding >= ld.prefetch_factor * ld.num_workers:
            return
        try:
            index = next(self.sampler_iter)
        except StopIteration:
            return
        for _ in range(ld.num_workers):
            wid = self.worker_cycle
            self.worker_cycle = (self.worker_cycle + 1) % ld.num_workers
            if self.active[wid]:
                break
        else:
            return
        self.index_qs[wid].put((self.send_idx, index))
        self.task_info[self.send_idx] = (wid,)
        self.outstanding += 1
        self.send_idx += 1

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            while self.rcvd_idx < self.send_idx:          # skip tasks of workers that ran dry
                info = self.task_info.get(self.rcvd_idx)
                if info is not None and (len(info) == 2 or self.active[info[0]]):
                    break
                self.task_info.pop(self.rcvd_idx, None)
                self.rcvd_idx += 1
            else:
                if not self.loader.persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if len(self.task_info[self.rcvd_idx]) == 2:
                data = self.task_info.pop(self.rcvd_idx)[1]
                self.rcvd_idx += 1
                return self._process(data)
            idx, data = self._get()
            self.outstanding -= 1
            if isinstance(data, IterableDatasetStopIteration):
                self.active[data.worker_id] = False
                self._put()
                continue
            if idx != self.rcvd_idx and self.loader.in_order:
                self.task_info[idx] += (data,)            # early: kept until its turn
                continue
            self.task_info.pop(idx)
            if idx == self.rcvd_idx:
                self.rcvd_idx += 1
            return self._process(data)

    def _process(self, data):
        self._put()
        if isinstance(data, ExceptionWrapper):
            self._shutdown_workers()
            data.reraise()
        return _pin_memory(data) if self.pin else data

    def _get(self):
        timeout = self.loader.timeout or None
        while True:
            try:
                return self.result_q.get(timeout=timeout or DEAD_WORKER_CHECK_S)
            except queue.Empty:
                if timeout is not None:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
                dead = [w for w in self.workers if not w.is_alive()]
                if dead:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader worker (pid(s) {', '.join(str(w.pid) for w in dead)}) "
                                       "exited unexpectedly") from None

    def _shutdown_workers(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        for q in self.index_qs:
            q.put(None)
        for w in self.workers:
            w.join(timeout=WORKER_JOIN_S)
            if w.is_alive():
                w.terminate()
                w.join(timeout=WORKER_JOIN_S)
        for q in self.index_qs + [self.result_q]:
            q.cancel_join_thread()
            q.close()

    def __del__(self) -> None:
        if hasattr(self, "workers"):
            self._shutdown_workers()

    def __len__(self) -> int:
        return len(self.loader)
