"""Flattening a nested state dict into dotted keys, and the pieces of a tensor this rank holds.

PyTorch's DCP flattens `{"model": {"w": t}, "optim": {...}}` into "model.w", ...: dicts are always walked (an
empty one leaves nothing), lists and tuples when they hold a tensor or a dict somewhere; anything else is a
leaf value stored as JSON. Each leaf keeps
its container so `load` can write values back in place, and its path so a nested dict can be rebuilt.

A tensor leaf is one chunk of a global tensor: a plain tensor is the whole of it (replicated on every rank
that holds the key), a DTensor is its local shard at the offset its placements give, and a `LocalChunk`
names its piece explicitly (global shape and offsets), for shardings made by hand.
"""
from __future__ import annotations

import dataclasses
import json
import math

from ..._tensor import Tensor
from ..tensor._utils import compute_local_shape_and_global_offset

PATH_KEY, PATH_INT_KEY, PATH_INDEX = "key", "int", "idx"     # dict key (str), dict key (int), list index


@dataclasses.dataclass
class LocalChunk:
    """This rank's piece `tensor` of a global tensor of shape `global_shape`, starting at `offsets`."""
    tensor: Tensor
    global_shape: tuple
    offsets: tuple

    def __post_init__(self) -> None:
        self.global_shape, self.offsets = tuple(self.global_shape), tuple(self.offsets)
        shape = tuple(self.tensor.shape)
        if not (len(shape) == len(self.global_shape) == len(self.offsets)) or any(
                o < 0 or o + s > g for o, s, g in zip(self.offsets, shape, self.global_shape)):
            raise ValueError(f"LocalChunk: a piece of shape {list(shape)} at offsets {list(self.offsets)} "
                             f"does not fit in the global shape {list(self.global_shape)}")


@dataclasses.dataclass
class TensorPiece:
    """The local tensor of a leaf and where it sits in the global tensor."""
    local: Tensor
    size: tuple
    offsets: tuple

    @property
    def sizes(self) -> tuple:
        return tuple(self.local.shape)

    def region(self) -> tuple:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))


@dataclasses.dataclass
class Leaf:
    """One flattened entry: its value, its container and key there (None for tuples), and its path."""
    value: object
    container: object
    slot: object
    path: list


def _is_dtensor(x) -> bool:
    return hasattr(x, "to_local") and hasattr(x, "placements") and hasattr(x, "device_mesh")


def tensor_piece(value) -> TensorPiece | None:
    """The piece this rank holds when `value` is a tensor leaf, else None."""
    if isinstance(value, LocalChunk):
        return TensorPiece(value.tensor, value.global_shape, value.offsets)
    if _is_dtensor(value):
        size = tuple(value.shape)
        _, offsets = compute_local_shape_and_global_offset(size, value.device_mesh, value.placements)
        return TensorPiece(value.to_local(), size, tuple(offsets))
    if isinstance(value, Tensor):
        return TensorPiece(value, tuple(value.shape), (0,) * value.dim())
    return None


def _is_leaf_sequence(value) -> bool:
    """Whether a list or tuple is stored whole: PyTorch's rule, a list holding no tensor, no dict and only
    such lists (a tuple likewise here, when it holds no tensor)."""
    for entry in value:
        if isinstance(entry, dict) or tensor_piece(entry) is not None:
            return False
        if isinstance(entry, (list, tuple)) and not _is_leaf_sequence(entry):
            return False
    return True


def _path_item(container, slot) -> tuple:
    if isinstance(container, dict):
        return (PATH_KEY, slot) if isinstance(slot, str) else (PATH_INT_KEY, slot)
    return (PATH_INDEX, slot)


def flatten_state_dict(state_dict: dict) -> dict:
    """flat key -> Leaf, in traversal order; TypeError for keys or values a checkpoint cannot hold."""
    out: dict = {}

    def visit(value, container, slot, path):
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"distributed checkpoint: state dict key {k!r} at "
                                    f"'{_join(path)}' is not a str or int")
                visit(v, value, k, path + [_path_item(value, k)])
            return
        if isinstance(value, (list, tuple)) and not _is_leaf_sequence(value):
            for i, v in enumerate(value):
                visit(v, value if isinstance(value, list) else None, i, path + [(PATH_INDEX, i)])
            return
        key = _join(path)
        if key in out:
            raise ValueError(f"distributed checkpoint: two entries of the state dict flatten to the key '{key}'")
        if tensor_piece(value) is None:
            _check_json(key, value)
        out[key] = Leaf(value, container, slot, path)

    for k, v in state_dict.items():
        if not isinstance(k, str):
            raise TypeError(f"distributed checkpoint: top-level state dict keys must be str, got {k!r}")
        visit(v, state_dict, k, [(PATH_KEY, k)])
    return out


def _join(path: list) -> str:
    return ".".join(str(v) for _, v in path)


def _check_json(key: str, value) -> None:
    try:
        back = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        back = None
    if not _same_json(back, value):
        raise TypeError(f"distributed checkpoint: the value at '{key}' of type {type(value).__name__} is neither "
                        "a tensor nor a JSON value (None, bool, int, float, str, lists and str-keyed dicts of them)")


def _same_json(back, value) -> bool:
    if isinstance(value, (list, tuple)):
        return isinstance(back, list) and len(back) == len(value) and all(map(_same_json, back, value))
    if isinstance(value, dict):
        return isinstance(back, dict) and all(isinstance(k, str) for k in value) and back.keys() == value.keys() \
            and all(_same_json(back[k], v) for k, v in value.items())
    if isinstance(value, float) and math.isnan(value):
        return isinstance(back, float) and math.isnan(back)
    return type(back) is type(value) and back == value


def restore_value(saved, target):
    """A value read from JSON shaped like `target`: tuples stay tuples."""
    if isinstance(target, tuple) and isinstance(saved, list):
        return tuple(restore_value(s, t) for s, t in zip(saved, target)) if len(saved) == len(target) \
            else tuple(saved)
    return saved


def unflatten(flat: dict, paths: dict) -> dict:
    """Rebuild the nested state dict from flat values and their recorded paths."""
    root: dict = {}
    for key, value in flat.items():
        path = paths.get(key) or [(PATH_KEY, key)]
        node = root
        for (kind, slot), (next_kind, _) in zip(path, path[1:]):
            node = _child(node, kind, slot, [] if next_kind == PATH_INDEX else {})
        kind, slot = path[-1]
        _child(node, kind, slot, value)
    return root


def _child(node, kind, slot, fresh):
    if kind == PATH_INDEX:
        while len(node) <= slot:
            node.append(None)
        if node[slot] is None:
            node[slot] = fresh
        return node[slot]
    return node.setdefault(slot, fresh)
