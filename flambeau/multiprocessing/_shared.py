"""Host tensors in memory other processes map too (`Tensor.share_memory_()`, `Module.share_memory()`): the
array moves into a file mapping (MAP_SHARED, under /dev/shm), so a forked child writes the very pages its
parent reads, and a shared tensor pickled for multiprocessing (a spawned child's arguments, a queue) travels
as the file's name and is mapped again there (hogwild training: children step one model in place).

The process that shared the array owns the file and removes it when the array dies or the process exits;
children map it at unpickling, while the parent still holds the tensor. A tensor that is not shared still
pickles by value (a copy): PyTorch moves every tensor sent through its queues into shared memory; here only
the ones shared on purpose are, which keeps short-lived batches out of the file system."""
from __future__ import annotations

import mmap
import os
import tempfile
import weakref

import numpy as np

_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_paths: dict = {}           # id(mmap) -> the file it maps, for every mapping alive in this process


def _release(key: int, path: str, owner_pid: int) -> None:
    _paths.pop(key, None)
    if os.getpid() == owner_pid:        # the sharing process removes the file (a forked child does not)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _mapping(path: str, nbytes: int, owner: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        if owner:
            os.ftruncate(fd, max(nbytes, 1))
        mm = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED)
    finally:
        os.close(fd)
    _paths[id(mm)] = path
    weakref.finalize(mm, _release, id(mm), path, os.getpid() if owner else -1)
    return mm


def shared_copy(arr: np.ndarray) -> np.ndarray:
    """`arr`'s values in a new C-contiguous array backed by a shared file mapping."""
    fd, path = tempfile.mkstemp(prefix="flambeau-shm-", dir=_DIR)
    os.close(fd)
    mm = _mapping(path, arr.nbytes, owner=True)
    out = np.frombuffer(mm, dtype=arr.dtype, count=arr.size).reshape(arr.shape)
    out[...] = arr
    return out


def _base_mmap(arr):
    """The object at the bottom of an array's chain of bases (an mmap for a shared array)."""
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    while isinstance(base, memoryview):
        base = base.obj
    return base


def path_of(arr) -> str | None:
    """The file a host array's memory maps, or None when it is private memory."""
    base = _base_mmap(arr)
    return _paths.get(id(base)) if isinstance(base, mmap.mmap) else None


def describe(arr: np.ndarray) -> tuple:
    """(path, dtype, shape, strides, byte offset) from which `attach` maps `arr` again in another process."""
    mm = _base_mmap(arr)
    start = np.frombuffer(mm, dtype=np.uint8).__array_interface__["data"][0]
    offset = arr.__array_interface__["data"][0] - start
    return _paths[id(mm)], arr.dtype, arr.shape, arr.strides, offset


def attach(path: str, dtype, shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    size = os.path.getsize(path)
    mm = _mapping(path, size, owner=False)
    return np.ndarray(shape, dtype=dtype, buffer=mm, offset=offset, strides=strides)
