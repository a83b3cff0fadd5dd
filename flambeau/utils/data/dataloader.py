"""DataLoader: batches from a dataset, in the main process or in worker processes.

With `num_workers > 0`, each worker process (forked) receives batch indices on its own queue and
returns collated batches on a shared result queue; the main process yields them in order. A
worker's exception is re-raised in the main process with the worker's traceback in the message.
Workers stop when the iterator is exhausted or collected (unless `persistent_workers`).
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import sys
import traceback
from dataclasses import dataclass
import numpy as np

from .dataset import IterableDataset
from .sampler import SequentialSampler, RandomSampler, BatchSampler
from ._collate import default_collate, default_convert
from ... import cuda, random as frandom
from ..._tensor import Tensor
from ...random import default_generator


@dataclass
class WorkerInfo:
    id: int
    num_workers: int
    seed: int
    dataset: object


_worker_info = None


def get_worker_info():
    return _worker_info


class _ExceptionWrapper:
    def __init__(self, exc, where):
        self.exc_type = type(exc)
        self.msg = f"Caught {type(exc).__name__} {where}.\nOriginal " + "".join(traceback.format_exception(exc))

    def reraise(self):
        try:
            err = self.exc_type(self.msg)
        except Exception:
            raise RuntimeError(self.msg) from None
        raise err


def _worker_loop(dataset, index_q, result_q, collate_fn, auto_collation, drop_last, worker_id, num_workers,
                 seed, init_fn, is_iterable):
    global _worker_info
    frandom.manual_seed(seed)
    np.random.seed(seed % 2**32)
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    try:
        if init_fn is not None:
            init_fn(worker_id)
    except Exception as e:
        result_q.put((None, _ExceptionWrapper(e, f"in DataLoader worker process {worker_id}")))
        return
    it = iter(dataset) if is_iterable else None
    while True:
        try:
            task = index_q.get(timeout=5.0)
        except queue.Empty:
            continue
        if task is None:
            break
        idx, indices = task
        try:
            if is_iterable:
                batch = list(itertools.islice(it, indices)) if auto_collation else next(it)
                if auto_collation:
                    if not batch or (drop_last and len(batch) < indices):
                        raise StopIteration
                    data = collate_fn(batch)
                else:
                    data = collate_fn(batch)
            elif auto_collation:
                data = collate_fn([dataset[i] for i in indices])
            else:
                data = collate_fn(dataset[indices])
            result_q.put((idx, data))
        except StopIteration:
            result_q.put((idx, StopIteration()))
        except Exception as e:
            result_q.put((idx, _ExceptionWrapper(e, f"in DataLoader worker process {worker_id}")))


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.generator = generator
        self.multiprocessing_context = multiprocessing_context
        self._is_iterable = isinstance(dataset, IterableDataset)
        if self._is_iterable:
            if shuffle:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}")
            if sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler option")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if sampler is None and not self._is_iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._is_iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._auto_collation = batch_sampler is not None or (self._is_iterable and batch_size is not None)
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self._persistent = None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self):
        if self._is_iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return self._single()
        if self.persistent_workers:
            if self._persistent is None:
                self._persistent = _MultiWorker(self)
            self._persistent.reset()
            return self._persistent
        return _MultiWorker(self)

    def _single(self):
        if self._is_iterable:
            it = iter(self.dataset)
            if self._auto_collation:
                while True:
                    batch = list(itertools.islice(it, self.batch_size))
                    if not batch or (self.drop_last and len(batch) < self.batch_size):
                        return
                    yield self._pin(self.collate_fn(batch))
            else:
                for x in it:
                    yield self._pin(self.collate_fn(x))
            return
        for indices in self._index_sampler:
            if self._auto_collation:
                yield self._pin(self.collate_fn([self.dataset[i] for i in indices]))
            else:
                yield self._pin(self.collate_fn(self.dataset[indices]))

    def _pin(self, data):
        if not self.pin_memory:
            return data
        if not cuda.is_available():
            return data
        if isinstance(data, Tensor):
            return data.pin_memory()
        if isinstance(data, dict):
            return {k: self._pin(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return type(data)(self._pin(v) for v in data) if not hasattr(data, "_fields") else \
                type(data)(*(self._pin(v) for v in data))
        return data


class _MultiWorker:
    """Iterator over batches produced by worker processes, yielded in sampler order."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        ctx = loader.multiprocessing_context
        if ctx is None or isinstance(ctx, str):
            ctx = mp.get_context(ctx or ("fork" if sys.platform != "win32" else "spawn"))
        base_seed = int(default_generator._np.integers(0, 2**62))
        self.result_q = ctx.Queue()
        self.index_qs, self.workers = [], []
        n = loader.num_workers
        for wid in range(n):
            iq = ctx.Queue()
            w = ctx.Process(target=_worker_loop, daemon=True,
                            args=(loader.dataset, iq, self.result_q, loader.collate_fn, loader._auto_collation,
                                  loader.drop_last, wid, n, base_seed + wid, loader.worker_init_fn,
                                  loader._is_iterable))
            w.start()
            self.index_qs.append(iq)
            self.workers.append(w)
        self._shutdown = False
        self.reset(first=True)

    def reset(self, first=False):
        ld = self.loader
        self.sampler_iter = iter(ld._index_sampler) if not ld._is_iterable else None
        self.send_idx = 0
        self.rcvd_idx = 0
        self.buffer = {}
        self.exhausted_workers = set()
        self.task_worker = {}
        self.ended = False
        if not first and ld._is_iterable:
            raise RuntimeError("persistent_workers with an IterableDataset restart is not supported")
        for _ in range(ld.prefetch_factor * ld.num_workers):
            self._put()

    def _put(self):
        ld = self.loader
        if self.ended:
            return
        if ld._is_iterable:
            live = [w for w in range(ld.num_workers) if w not in self.exhausted_workers]
            if not live:
                self.ended = True
                return
            wid = live[self.send_idx % len(live)]
            task = ld.batch_size if ld._auto_collation else 1
        else:
            try:
                task = next(self.sampler_iter)
            except StopIteration:
                self.ended = True
                return
            wid = self.send_idx % ld.num_workers
        self.index_qs[wid].put((self.send_idx, task))
        self.task_worker[self.send_idx] = wid
        self.send_idx += 1

    def __iter__(self):
        return self

    def __next__(self):
        ld = self.loader
        while True:
            if self.rcvd_idx >= self.send_idx and self.ended:
                if not ld.persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if self.rcvd_idx in self.buffer:
                data = self.buffer.pop(self.rcvd_idx)
                self.rcvd_idx += 1
                if isinstance(data, StopIteration):
                    self.exhausted_workers.add(self.task_worker.get(self.rcvd_idx - 1))
                    self._put()
                    continue
                self._put()
                if isinstance(data, _ExceptionWrapper):
                    self._shutdown_workers()
                    data.reraise()
                return ld._pin(data)
            idx, data = self._get()
            if idx is None:
                self._shutdown_workers()
                data.reraise()
            self.buffer[idx] = data

    def _get(self):
        timeout = self.loader.timeout or None
        waited = 0.0
        while True:
            try:
                return self.result_q.get(timeout=1.0 if timeout is None else timeout)
            except queue.Empty:
                if timeout is not None:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
                dead = [w for w in self.workers if not w.is_alive()]
                waited += 1.0
                if dead:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader worker (pid(s) {', '.join(str(w.pid) for w in dead)}) "
                                       "exited unexpectedly") from None

    def _shutdown_workers(self):
        if self._shutdown:
            return
        self._shutdown = True
        for q in self.index_qs:
            try:
                q.put(None)
            except Exception:
                pass
        for w in self.workers:
            w.join(timeout=5)
            if w.is_alive():
                w.terminate()
                w.join(timeout=1)
        for q in self.index_qs + [self.result_q]:
            q.cancel_join_thread()
            q.close()

    def __del__(self):
        self._shutdown_workers()

    def __len__(self):
        return len(self.loader)
