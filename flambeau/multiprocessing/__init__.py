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


def _rebuild_shared(path, dtype, shape, strides, offset, dtype_name, requires_grad, parameter):
    from .. import _dtype as D
    from .._device import canonical
    from .._tensor import Tensor
    from ._shared import attach
    t = Tensor._make(attach(path, dtype, shape, strides, offset), canonical("cpu"), D.BY_NAME[dtype_name])
    if parameter:
        from ..nn.parameter import Parameter
        return Parameter(t, requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _reduce(t):
    """A shared host tensor pickled for multiprocessing: the file and the view of it; any other by value."""
    from ..nn.parameter import Parameter
    from ._shared import describe
    if t._device.type == "cpu" and t.is_shared():
        return (_rebuild_shared, describe(t._data) + (t._dtype.name, t._requires_grad, isinstance(t, Parameter)))
    return t.__reduce_ex__(4)


def _register() -> None:
    from .._tensor import Tensor
    from ..nn.parameter import Buffer, Parameter
    for cls in (Tensor, Parameter, Buffer):
        ForkingPickler.register(cls, _reduce)


_register()
