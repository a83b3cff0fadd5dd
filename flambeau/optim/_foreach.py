"""Multi-tensor ("foreach") support for optimizers and gradient clipping.

The update rules in `flambeau.optim` are written once, over arrays of the device's namespace, and
run in two ways: per parameter (the reference for-loop path), or once per (device, dtype) group on
flat arrays. In the flat path the parameters and gradients of a group are gathered into one
contiguous array, the optimizer's state lives permanently in one flat array per state name (each
parameter's state tensor is a view into it), and per-parameter scalars (step counts) are expanded
with `repeat`. A step is then a handful of vectorised operations whatever the number of tensors."""
from __future__ import annotations

import numpy as np

from .._tensor import Tensor
from .. import _backends


def xp_of(t: Tensor):
    return _backends.get(t.device.type).xp or np


def group_by_device_dtype(indices, tensors):
    """Split positions `indices` into lists sharing (device, dtype) of `tensors[i]`."""
    groups: dict = {}
    for i in indices:
        t = tensors[i]
        groups.setdefault((str(t.device), t.dtype), []).append(i)
    return list(groups.values())


def gather(xp, arrays):
    """One contiguous 1-D array holding every array's elements, in order."""
    if len(arrays) == 1:
        return arrays[0].reshape(-1).copy()
    return xp.concatenate([a.reshape(-1) for a in arrays])


def scatter(flat, tensors) -> None:
    """Write consecutive slices of `flat` back into each tensor's memory (in place)."""
    off = 0
    for t in tensors:
        n = t._data.size          # local elements (a DTensor steps its shard)
        t._data[...] = flat[off:off + n].reshape(t._data.shape)
        t._version[0] += 1
        off += n


def sizes(tensors):
    return np.asarray([t._data.size for t in tensors], dtype=np.int64)


def expand(xp, per_tensor, counts):
    """Per-tensor values (1-D) repeated to one value per element of the flat arrays."""
    return xp.repeat(xp.asarray(per_tensor), xp.asarray(counts))


class FlatState:
    """Flat arrays backing one state name for a fixed list of state tensors.

    `get(xp, state_tensors)` returns a flat array whose consecutive slices are the storage of the given
    tensors; the tensors are re-pointed at those slices, so in-place updates of the flat array are
    their updates. The array is rebuilt only when the list of tensors (or their storage) changed."""

    def __init__(self):
        self.flat = None
        self.key = None

    def get(self, xp, tensors):
        key = tuple(id(t) for t in tensors)
        if self.key == key and all(t._data.base is self.flat for t in tensors):
            return self.flat
        self.flat = gather(xp, [t._data for t in tensors])
        off = 0
        for t in tensors:
            n = t._data.size          # local elements (a DTensor steps its shard)
            t._data = self.flat[off:off + n].reshape(t._data.shape)
            off += n
        self.key = key
        return self.flat
