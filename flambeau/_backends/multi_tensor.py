"""The address table of a multi-tensor kernel (PyTorch's multi-tensor apply): one launch over many tensors.

The tensors are cut into chunks of `chunk` elements and each program of the grid handles one chunk of one
tensor. A program finds its tensor through an int64 table in device memory: `rows` rows of one address
per tensor (e.g. parameter, gradient, moments; or source, destination), the element counts, then per
chunk its tensor index and its chunk index within the tensor. The table depends only on the addresses
and counts, so it is uploaded once and reused while the caching allocator hands the tensors the same
memory step after step (`device_table`'s cache).

Used by the fused Adam step (`triton_adam`) and the batched copies of DDP's gradient buckets
(`triton_copy_many`).
"""
from __future__ import annotations

import numpy as np

TABLE_CACHE_LIMIT = 16          # tables kept per user (keyed by addresses and counts)
CUDA_MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyKind (driver_types.h)
_COPY_MANY: list = []           # [the triton_copy_many module, or None without Triton], looked up once


def table(addresses, numels: list, chunk: int) -> np.ndarray:
    """The int64 table: the address rows (a sequence of rows, each one address per tensor), the element
    counts, then per chunk its tensor index and its chunk index within the tensor (see `offsets`)."""
    counts = np.maximum(1, -(-np.asarray(numels, dtype=np.int64) // chunk))
    chunk_t = np.repeat(np.arange(len(numels), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts              # each tensor's first chunk
    chunk_i = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    return np.concatenate([np.asarray(addresses, dtype=np.int64).reshape(-1), np.asarray(numels, dtype=np.int64),
                           chunk_t, chunk_i])


def chunk_count(host_table: np.ndarray, n_tensors: int, rows: int) -> int:
    """The number of chunks (programs) a table of `rows` address rows describes."""
    return (len(host_table) - (rows + 1) * n_tensors) // 2


def offsets(n_tensors: int, n_chunks: int, rows: int) -> tuple:
    """Element offsets of (addresses, numels, chunk tensor, chunk index) in a table."""
    return 0, rows * n_tensors, (rows + 1) * n_tensors, (rows + 1) * n_tensors + n_chunks


def device_table(cupy, cache: dict, key, addresses, numels, chunk: int, rows: int,
                 limit: int = TABLE_CACHE_LIMIT) -> tuple:
    """(CuPy int64 table, chunk count) for `key`, made by the `cupy` module on a miss; `cache` keeps the
    last `limit` tables (the oldest is dropped first). A miss stages the table in pinned host memory and
    copies it with cudaMemcpyAsync on the current stream: an upload from pageable memory (`cupy.asarray`)
    waits for the stream's queued work, and a compiled DDP backward, whose gradients do not come back at
    the same addresses every step, missed several times a step (each a synchronisation in the middle of the
    overlapped all-reduces). The pinned buffer stays with the table in the cache (the copy may still be
    in flight when this returns)."""
    hit = cache.get(key)
    if hit is None:
        host = table(addresses, numels, chunk)
        if len(cache) >= limit:
            cache.pop(next(iter(cache)))
        hit = cache[key] = (*upload(cupy, host), chunk_count(host, len(numels), rows))
    return hit[0], hit[2]


def upload(cupy, host: np.ndarray) -> tuple:
    """(a CuPy copy of int64 array `host`, the pinned staging buffer to keep with it): the copy runs with
    cudaMemcpyAsync on the current stream (see `device_table`), so the buffer must outlive it."""
    pinned = cupy.cuda.alloc_pinned_memory(host.nbytes)
    np.frombuffer(pinned, dtype=np.int64, count=host.size)[...] = host
    dev = cupy.empty(host.size, dtype=np.int64)
    cupy.cuda.runtime.memcpyAsync(dev.data.ptr, pinned.ptr, host.nbytes, CUDA_MEMCPY_HOST_TO_DEVICE,
                                  cupy.cuda.get_current_stream().ptr)
    return dev, pinned


def copy_many_for(device):
    """The `triton_copy_many` module when `device` is a cuda device and Triton imports, else None: the
    batched copies of DDP's buckets and FSDP2's gathered parameters."""
    if device.type != "cuda":
        return None
    if not _COPY_MANY:
        try:
            from . import triton_copy_many  # deferred: Triton, present only where cuda is used
        except ImportError:
            triton_copy_many = None
        _COPY_MANY.append(triton_copy_many)
    return _COPY_MANY[0]
