"""default_collate / default_convert: turn samples into a batch (or convert one sample), as PyTorch does.

`collate(batch, collate_fn_map=...)` walks nested structures (mappings keep their type, namedtuples
stay namedtuples, tuples become lists, other sequences keep their type where it can be rebuilt)
and hands the leaves to the first matching entry of `collate_fn_map`; users extend
`default_collate_fn_map` with their own types, as in PyTorch.
"""
from __future__ import annotations

import collections.abc
import copy
import re
from typing import Any, Callable

import numpy as np

from ...._dtype import float64
from ...._ops.creation import as_tensor, tensor
from ...._ops.shape import stack
from ...._tensor import Tensor

_NP_STR_OBJ = re.compile(r"[SaUO]")     # NumPy dtype codes of strings and objects: not collated
_ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def rebuild_mapping(like: collections.abc.Mapping, new: dict):
    """`new` in a mapping of `like`'s type: a copy of a mutable one updated, else the type called."""
    try:
        if isinstance(like, collections.abc.MutableMapping):
            clone = copy.copy(like)
            clone.update(new)
            return clone
        return type(like)(new)
    except TypeError:
        return new


def rebuild_sequence(like: collections.abc.Sequence, new: list):
    """`new` in a sequence of `like`'s type, or a list when that type cannot be rebuilt."""
    try:
        if isinstance(like, collections.abc.MutableSequence):
            clone = copy.copy(like)
            for i, v in enumerate(new):
                clone[i] = v
            return clone
        return type(like)(new)
    except TypeError:
        return new


def default_convert(data: Any) -> Any:
    """NumPy arrays and scalars (not strings) in `data` become tensors; its structure is kept."""
    t = type(data)
    if isinstance(data, Tensor):
        return data
    if t.__module__ == "numpy" and t.__name__ not in ("str_", "string_", "bytes_"):
        if isinstance(data, np.ndarray) and _NP_STR_OBJ.search(data.dtype.str):
            return data
        return as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return rebuild_mapping(data, {k: default_convert(data[k]) for k in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return t(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def collate(batch: list, *, collate_fn_map: dict | None = None) -> Any:
    """Collate `batch` (a list of samples of one structure) leaf by leaf through `collate_fn_map`."""
    elem = batch[0]
    t = type(elem)
    if collate_fn_map is not None:
        if t in collate_fn_map:
            return collate_fn_map[t](batch, collate_fn_map=collate_fn_map)
        for key, fn in collate_fn_map.items():
            if isinstance(elem, key):
                return fn(batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        return rebuild_mapping(elem, {k: collate([d[k] for d in batch], collate_fn_map=collate_fn_map) for k in elem})
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return t(*(collate(list(s), collate_fn_map=collate_fn_map) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        n = len(elem)
        if any(len(e) != n for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        cols = [collate(list(s), collate_fn_map=collate_fn_map) for s in zip(*batch)]
        return cols if isinstance(elem, tuple) else rebuild_sequence(elem, cols)
    raise TypeError(_ERR.format(t))


def collate_tensor_fn(batch: list, *, collate_fn_map: dict | None = None) -> Tensor:
    return stack(batch, 0)


def collate_numpy_array_fn(batch: list, *, collate_fn_map: dict | None = None) -> Any:
    if _NP_STR_OBJ.search(batch[0].dtype.str):
        raise TypeError(_ERR.format(batch[0].dtype))
    return collate([as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch: list, *, collate_fn_map: dict | None = None) -> Tensor:
    return as_tensor(np.array(batch))


def collate_float_fn(batch: list, *, collate_fn_map: dict | None = None) -> Tensor:
    return tensor(batch, dtype=float64)


def collate_int_fn(batch: list, *, collate_fn_map: dict | None = None) -> Tensor:
    return tensor(batch)


def collate_str_fn(batch: list, *, collate_fn_map: dict | None = None) -> list:
    return batch


default_collate_fn_map: dict[type | tuple[type, ...], Callable] = {
    Tensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def default_collate(batch: list) -> Any:
    """Stack tensors, arrays and numbers of a batch along a new first dimension, through nested
    mappings, namedtuples and sequences; strings stay lists."""
    return collate(batch, collate_fn_map=default_collate_fn_map)
