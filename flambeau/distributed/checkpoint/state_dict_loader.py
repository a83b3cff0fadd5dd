"""`load` of a distributed checkpoint, in place (PyTorch's `torch.distributed.checkpoint.state_dict_loader`).

Every rank flattens the state dict it wants filled, reads the metadata, and for each tensor leaf fills the
region it holds (the whole tensor for a plain tensor, its shard for a DTensor or a `LocalChunk`) from the
saved chunks that overlap it, reading only the overlapping part of each: this is what lets a checkpoint
saved at one world size or sharding load at another. Plain values are replaced in their containers. The
ranks' outcomes are all-gathered, so a failure anywhere raises `CheckpointException` everywhere.
"""
from __future__ import annotations

import numpy as np

from ..._ops.creation import from_numpy
from ..._tensor import Size
from ...autograd.grad_mode import no_grad
from ._traverse import TensorPiece, flatten_state_dict, restore_value, tensor_piece
from .filesystem import FileSystemReader
from .metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata
from .state_dict_saver import _check_planner
from .utils import DistWrapper


def _reader(checkpoint_id, storage_reader):
    if storage_reader is None:
        if checkpoint_id is None:
            raise RuntimeError("distributed checkpoint load: give checkpoint_id (a folder) or storage_reader")
        return FileSystemReader(checkpoint_id)
    storage_reader.reset(checkpoint_id)
    return storage_reader


def _overlap(piece: TensorPiece, offsets: tuple, sizes: tuple) -> tuple | None:
    """(slices in the chunk, slices in the piece) of their common region, or None when they are disjoint."""
    in_chunk, in_piece = [], []
    for po, ps, co, cs in zip(piece.offsets, piece.sizes, offsets, sizes):
        lo, hi = max(po, co), min(po + ps, co + cs)
        if hi <= lo:
            return None
        in_chunk.append(slice(lo - co, hi - co))
        in_piece.append(slice(lo - po, hi - po))
    return tuple(in_chunk), tuple(in_piece)


def _fill(reader: FileSystemReader, key: str, entry: TensorStorageMetadata, piece: TensorPiece) -> None:
    if tuple(entry.size) != tuple(piece.size):
        raise ValueError(f"Size mismatch between saved {Size(entry.size)} and current: {Size(piece.size)} for {key}")
    need = int(np.prod(piece.sizes, dtype=np.int64))
    covered = 0
    with no_grad():
        for chunk in entry.chunks:
            common = _overlap(piece, chunk.offsets, chunk.sizes)
            if common is None:
                continue
            in_chunk, in_piece = common
            data = np.array(reader.read_chunk(chunk.file, chunk.name, in_chunk))
            covered += data.size
            source = from_numpy(data)
            if piece.local.dim() == 0:
                piece.local.copy_(source.reshape(()))
            else:
                piece.local[in_piece].copy_(source)
    if covered != need:
        raise RuntimeError(f"distributed checkpoint load: the saved chunks of '{key}' cover {covered} of the "
                           f"{need} elements this rank holds (offsets {list(piece.offsets)}, sizes "
                           f"{list(piece.sizes)}); the checkpoint is incomplete")


def _load_local(state_dict: dict, metadata: Metadata, reader: FileSystemReader) -> None:
    leaves = flatten_state_dict(state_dict)
    missing = [k for k in leaves if k not in metadata.state_dict_metadata]
    if missing:
        raise RuntimeError(f"Missing key in checkpoint state_dict: {', '.join(missing)}.")
    for key, leaf in leaves.items():
        entry = metadata.state_dict_metadata[key]
        piece = tensor_piece(leaf.value)
        if piece is not None:
            if not isinstance(entry, TensorStorageMetadata):
                raise ValueError(f"distributed checkpoint load: '{key}' is a tensor here but the checkpoint "
                                 f"saved a plain value ({entry.value!r})")
            _fill(reader, key, entry, piece)
        elif isinstance(entry, BytesStorageMetadata):
            if leaf.container is None:
                raise ValueError(f"distributed checkpoint load: '{key}' sits in a tuple and cannot be replaced")
            leaf.container[leaf.slot] = restore_value(entry.value, leaf.value)
        else:
            raise ValueError(f"distributed checkpoint load: '{key}' is a plain value ({leaf.value!r}) here but the "
                             f"checkpoint saved a tensor of shape {list(entry.size)}; pass a tensor to load into")


def load(state_dict: dict, *, checkpoint_id=None, storage_reader=None, planner=None, process_group=None,
         no_dist: bool = False) -> None:
    """Fill `state_dict` in place from the checkpoint (tensors copied into, values replaced)."""
    _check_planner(planner)
    reader = _reader(checkpoint_id, storage_reader)
    dist = DistWrapper(process_group, no_dist)

    def read_step():
        if not isinstance(state_dict, dict):
            raise TypeError(f"distributed checkpoint load: state_dict must be a dict, got "
                            f"{type(state_dict).__name__}")
        _load_local(state_dict, reader.read_metadata(), reader)
    dist.all_gather("read", read_step)


def load_state_dict(state_dict: dict, storage_reader, process_group=None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner=None) -> None:
    """The older spelling of `load` (PyTorch keeps it, deprecated)."""
    load(state_dict, storage_reader=storage_reader, process_group=process_group, no_dist=no_dist, planner=planner)
