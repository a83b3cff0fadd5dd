"""`save` and `async_save` of a distributed checkpoint (PyTorch's `torch.distributed.checkpoint.state_dict_saver`).

A save runs in three agreed steps (utils.DistWrapper): *plan* — every rank flattens its state dict and
describes its chunks; the plans are all-gathered and every rank computes the same global plan: chunks held
by several ranks (plain tensors, replicated DTensor shards) are written once, by the holder with the fewest
bytes to write so far, and the metadata is fixed in advance (file names carry rank and save id); *write* —
each rank writes its own shard file, in parallel; *finish* — once all shards are complete, the coordinator
writes the metadata atomically (the commit point) and drops older shard files.

`async_save` does the plan and copies the chunks to host memory before returning, then writes in a thread;
the coordinator's thread waits for the other ranks' shard files to appear before committing, and every
rank's future completes once the metadata names this save.
"""
from __future__ import annotations

import concurrent.futures
import os
import time
import uuid

import numpy as np

from ... import _dtype as D
from ..._tensor import Tensor
from ...serialization import _contiguous
from ._traverse import flatten_state_dict, tensor_piece
from .filesystem import POLL_S, FileSystemReader, FileSystemWriter, shard_file
from .metadata import (METADATA_FILE, BytesStorageMetadata, ChunkStorageMetadata, Metadata, TensorProperties,
                       TensorStorageMetadata)
from .utils import DistWrapper

ASYNC_COMMIT_TIMEOUT_S = 1800.0        # how long an async save waits for the other ranks (PyTorch's pg timeout)


def _writer(checkpoint_id, storage_writer):
    if storage_writer is None:
        if checkpoint_id is None:
            raise RuntimeError("distributed checkpoint save: give checkpoint_id (a folder) or storage_writer")
        return FileSystemWriter(checkpoint_id)
    storage_writer.reset(checkpoint_id)
    return storage_writer


def _check_planner(planner) -> None:
    if planner is not None:
        raise NotImplementedError("distributed checkpoint: custom planners are not supported; "
                                  "leave planner=None (the default planner's behaviour is built in)")


def _local_plan(state_dict: dict, save_id: str) -> dict:
    """This rank's description of what it holds: tensor chunks, JSON values, key paths."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"distributed checkpoint save: state_dict must be a dict, got {type(state_dict).__name__}")
    leaves = flatten_state_dict(state_dict)
    items = {}
    for key, leaf in leaves.items():
        piece = tensor_piece(leaf.value)
        if piece is None:
            items[key] = {"value": leaf.value}
        else:
            items[key] = {"dtype": piece.local.dtype.name, "size": list(piece.size),
                          "offsets": list(piece.offsets), "sizes": list(piece.sizes)}
    return {"items": items, "paths": {k: leaf.path for k, leaf in leaves.items()}, "save_id": save_id}


def _volume(sizes) -> int:
    return int(np.prod(sizes, dtype=np.int64)) if len(sizes) else 1


def _overlaps(a: dict, b: dict) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in
               zip(a["offsets"], a["sizes"], b["offsets"], b["sizes"]))


def global_plan(plans: list) -> tuple:
    """(Metadata, keys each rank writes) from all ranks' local plans; the same on every rank."""
    save_id = plans[0]["save_id"]
    entries: dict = {}
    holders: dict = {}                    # key -> {(offsets, sizes): [ranks]}
    paths: dict = {}
    for rank, plan in enumerate(plans):
        for key, item in plan["items"].items():
            paths.setdefault(key, plan["paths"][key])
            seen = entries.setdefault(key, item)
            if ("value" in seen) != ("value" in item):
                raise ValueError(f"distributed checkpoint save: '{key}' is a tensor on some ranks and a plain "
                                 "value on others")
            if "value" in item:
                continue
            if (seen["dtype"], seen["size"]) != (item["dtype"], item["size"]):
                raise ValueError(f"distributed checkpoint save: '{key}' is {seen['dtype']} {seen['size']} on one "
                                 f"rank and {item['dtype']} {item['size']} on rank {rank}")
            if _volume(item["sizes"]):
                holders.setdefault(key, {}).setdefault((tuple(item["offsets"]), tuple(item["sizes"])),
                                                       []).append(rank)
    assigned = [0] * len(plans)
    writes: list = [[] for _ in plans]
    metadata = {}
    for key, first in entries.items():
        if "value" in first:
            metadata[key] = BytesStorageMetadata(first["value"])
            continue
        chunks = []
        itemsize = D.BY_NAME[first["dtype"]].itemsize
        for (offsets, sizes), ranks in sorted(holders.get(key, {}).items()):
            writer = min(ranks, key=lambda r: (assigned[r], r))
            assigned[writer] += _volume(sizes) * itemsize
            writes[writer].append(key)
            chunks.append(ChunkStorageMetadata(offsets, sizes, shard_file(writer, save_id), key))
        _check_cover(key, first["size"], chunks)
        metadata[key] = TensorStorageMetadata(TensorProperties(first["dtype"]), tuple(first["size"]), chunks)
    return Metadata(metadata, paths, len(plans), save_id), writes


def _check_cover(key: str, size: list, chunks: list) -> None:
    as_dicts = [{"offsets": c.offsets, "sizes": c.sizes} for c in chunks]
    for i, a in enumerate(as_dicts):
        for b in as_dicts[i + 1:]:
            if _overlaps(a, b):
                raise ValueError(f"distributed checkpoint save: the pieces of '{key}' at offsets "
                                 f"{list(a['offsets'])} and {list(b['offsets'])} overlap")
    covered = sum(_volume(c.sizes) for c in chunks)
    if covered != _volume(size):
        raise ValueError(f"distributed checkpoint save: the ranks' pieces of '{key}' cover {covered} of its "
                         f"{_volume(size)} elements (global shape {list(size)})")


def _stage(state_dict: dict, keys: list, copy: bool) -> dict:
    """key -> contiguous host array of this rank's chunk (copied when the save outlives the call)."""
    leaves = flatten_state_dict(state_dict)
    out = {}
    for key in keys:
        local = tensor_piece(leaves[key].value).local
        if not isinstance(local, Tensor):
            raise TypeError(f"distributed checkpoint save: the local piece of '{key}' is not a tensor")
        arr = _contiguous(local)
        out[key] = np.array(arr, copy=True) if copy else arr
    return out


def _plan(dist: DistWrapper, state_dict: dict) -> tuple:
    proposed = uuid.uuid4().hex[:12]
    plans = dist.all_gather("plan", lambda: _local_plan(state_dict, proposed))
    return global_plan(plans)


def save(state_dict: dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
         no_dist: bool = False) -> Metadata:
    """Save `state_dict` (every rank calls it with its own pieces) as a checkpoint; returns its Metadata."""
    _check_planner(planner)
    writer = _writer(checkpoint_id, storage_writer)
    dist = DistWrapper(process_group, no_dist)
    dist.all_gather("setup", lambda: writer.set_up_storage_writer(dist.is_coordinator))
    metadata, writes = _plan(dist, state_dict)
    mine = writes[dist.rank]

    def write_step():
        if mine:
            writer.write_data(dist.rank, metadata.save_id, _stage(state_dict, mine, copy=False))
    dist.all_gather("write", write_step)
    dist.all_gather("finish", lambda: writer.finish(metadata) if dist.is_coordinator else None)
    return metadata


def async_save(state_dict: dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
               no_dist: bool = False) -> concurrent.futures.Future:
    """Plan and copy the chunks now, write them in a thread; the Future's result is the Metadata once the
    checkpoint is committed (the state dict may change as soon as this returns)."""
    _check_planner(planner)
    writer = _writer(checkpoint_id, storage_writer)
    dist = DistWrapper(process_group, no_dist)
    dist.all_gather("setup", lambda: writer.set_up_storage_writer(dist.is_coordinator))
    metadata, writes = _plan(dist, state_dict)
    rank = dist.rank
    staged = _stage_agreed(dist, state_dict, writes[rank])
    others = sorted({shard_file(r, metadata.save_id) for r, keys in enumerate(writes) if keys and r != rank})

    def write_and_commit() -> Metadata:
        if staged:
            writer.write_data(rank, metadata.save_id, staged)
        if dist.is_coordinator:
            writer.wait_for_files(others, ASYNC_COMMIT_TIMEOUT_S)
            writer.finish(metadata)
        else:
            _wait_for_commit(writer.path, metadata.save_id, ASYNC_COMMIT_TIMEOUT_S)
        return metadata

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="flambeau-async-save")
    future = pool.submit(write_and_commit)
    pool.shutdown(wait=False)
    return future


def _stage_agreed(dist: DistWrapper, state_dict: dict, keys: list) -> dict:
    """Stage this rank's chunks; every rank learns whether all could (no thread starts after a failure)."""
    box = {}

    def stage():
        box["arrays"] = _stage(state_dict, keys, copy=True)
    dist.all_gather("stage", stage)
    return box["arrays"]


def _wait_for_commit(path: str, save_id: str, timeout_s: float) -> None:
    reader = FileSystemReader(path)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if reader.read_metadata().save_id == save_id:
                return
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"distributed checkpoint async_save: {os.path.join(path, METADATA_FILE)} did not "
                               f"name save {save_id} within {timeout_s:.0f} s (the coordinator did not commit)")
        time.sleep(POLL_S)
