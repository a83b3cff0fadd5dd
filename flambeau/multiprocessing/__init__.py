"""torch.multiprocessing: Python's `multiprocessing` (every name of it), PyTorch's `spawn` / `start_processes`
(`spawn.py`), and host tensors shared between processes (`_shared.py`: `Tensor.share_memory_()` moves a
tensor into a shared file mapping; such a tensor pickled for multiprocessing travels by the file's name).

Sharing strategies are PyTorch's names; flambeau's mapping is one kind ("file_system": a named file the
receiver opens), so both names are accepted and act alike.
"""
from __future__ import annotations

import multiprocessing
from multiprocessing import *  # noqa: F401,F403  -- torch.multiprocessing is a drop-in for it
from multiprocessing.reduction import ForkingPickler

import numpy as np

from .. import _dtype as D
from .._device import canonical
from .._tensor import Tensor
from ..nn.parameter import Buffer, Parameter
from ._shared import attach, describe, path_of, shared_copy
from .spawn import (ProcessContext, ProcessException, ProcessExitedException, ProcessRaisedException,  # noqa: F401
                    SpawnContext, spawn, start_processes)

__all__ = list(multiprocessing.__all__) + ["spawn", "start_processes", "ProcessContext", "SpawnContext",
                                           "ProcessException", "ProcessRaisedException", "ProcessExitedException",
                                           "get_all_sharing_strategies", "get_sharing_strategy",
                                           "set_sharing_strategy"]

_STRATEGIES = {"file_descriptor", "file_system"}
_strategy = ["file_descriptor"]


def get_all_sharing_strategies() -> set:
    return set(_STRATEGIES)


def get_sharing_strategy() -> str:
    return _strategy[0]


def set_sharing_strategy(new_strategy: str) -> None:
    if new_strategy not in _STRATEGIES:
        raise ValueError(f"invalid sharing strategy {new_strategy!r}: expected one of {sorted(_STRATEGIES)}")
    _strategy[0] = new_strategy


def _share_memory_(self) -> Tensor:
    """Move a cpu tensor's memory into a mapping other processes share: a forked child writes the pages this
    process reads, and pickled for multiprocessing the tensor travels by the mapping's name. A cuda or meta
    tensor is left as it is (PyTorch's: a no-op there)."""
    if self._device.type != "cpu" or self.is_shared():
        return self
    if self._base is not None:
        raise RuntimeError(f"share_memory_: this tensor (shape {list(self.shape)}) is a view of another one, whose "
                           "memory it would have to move; call share_memory_() on the tensor it views (or on a "
                           "clone of it) before taking views")
    self._data = shared_copy(np.ascontiguousarray(self._data))
    return self


def _is_shared(self) -> bool:
    if self._device.type == "cuda":
        return True
    return self._device.type == "cpu" and path_of(self._data) is not None


def _rebuild_shared(path, dtype, shape, strides, offset, dtype_name, requires_grad, parameter):
    t = Tensor._make(attach(path, dtype, shape, strides, offset), canonical("cpu"), D.BY_NAME[dtype_name])
    if parameter:
        return Parameter(t, requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _reduce(t):
    """A shared host tensor pickled for multiprocessing: the file and the view of it; any other by value."""
    if t._device.type == "cpu" and t.is_shared():
        return (_rebuild_shared, describe(t._data) + (t._dtype.name, t._requires_grad, isinstance(t, Parameter)))
    return t.__reduce_ex__(4)


Tensor.share_memory_ = _share_memory_
Tensor.is_shared = _is_shared
for _cls in (Tensor, Parameter, Buffer):
    ForkingPickler.register(_cls, _reduce)
