"""A distributed checkpoint in a folder: one safetensors file per rank and save, and `metadata.json` last.

`FileSystemWriter` writes a rank's chunks to `__<rank>_<save id>.safetensors` (temporary name, fsync, rename)
and, on the coordinator, the metadata the same way once every rank's file is complete; only then are the
shard files of earlier saves removed. Shard names carry the save id, so until the metadata's rename the
folder still holds the previous checkpoint intact: a save killed at any point leaves it loadable.

`FileSystemReader` reads the metadata (clear errors when it is missing or corrupt) and, from a shard, just
the region of a chunk that a load needs (the file is mapped, not read whole).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import time

import numpy as np
import safetensors

from ... import _dtype as D
from ..._atomic import write_atomic
from ...serialization import _ST_FROM, _safetensors_write
from .metadata import METADATA_FILE, Metadata

SHARD_PATTERN = re.compile(r"^__(\d+)_([0-9a-f]+)\.safetensors$")
_HEADER_LEN = struct.Struct("<Q")
POLL_S = 0.05                           # how often a waiting coordinator looks for the other ranks' files


def shard_file(rank: int, save_id: str) -> str:
    return f"__{rank}_{save_id}.safetensors"


class FileSystemWriter:
    """Writes a checkpoint into the folder `path` (created if needed). PyTorch's options are accepted;
    every rank writes one file (`single_file_per_rank`), fsynced when `sync_files`."""

    def __init__(self, path, single_file_per_rank: bool = True, sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True) -> None:
        self.path = os.fspath(path)
        self.sync_files, self.overwrite = sync_files, overwrite

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def set_up_storage_writer(self, is_coordinator: bool) -> None:
        os.makedirs(self.path, exist_ok=True)
        if not self.overwrite and os.path.exists(os.path.join(self.path, METADATA_FILE)):
            raise RuntimeError(f"distributed checkpoint save: {self.path} already holds a checkpoint and "
                               "overwrite=False")

    def write_data(self, rank: int, save_id: str, arrays: dict) -> str:
        """Write `arrays` (tensor name -> contiguous NumPy array) as this rank's shard; returns its file name."""
        name = shard_file(rank, save_id)
        _safetensors_write(arrays, {"rank": str(rank), "save_id": save_id}, os.path.join(self.path, name))
        return name

    def wait_for_files(self, names: list, timeout_s: float) -> None:
        """Block until every named shard exists (other ranks rename theirs into place when complete)."""
        deadline = time.monotonic() + timeout_s
        missing = list(names)
        while missing:
            missing = [n for n in missing if not os.path.exists(os.path.join(self.path, n))]
            if missing and time.monotonic() > deadline:
                raise TimeoutError(f"distributed checkpoint save: shard files {missing} did not appear in "
                                   f"{self.path} within {timeout_s:.0f} s")
            if missing:
                time.sleep(POLL_S)

    def finish(self, metadata: Metadata) -> None:
        """Commit: write the metadata atomically, then remove shard files no checkpoint refers to any more."""
        write_atomic(os.path.join(self.path, METADATA_FILE), metadata.to_json().encode())
        for name in os.listdir(self.path):
            m = SHARD_PATTERN.match(name)
            if m and m.group(2) != metadata.save_id:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, name))


class FileSystemReader:
    """Reads a checkpoint folder written by `FileSystemWriter`."""

    def __init__(self, path) -> None:
        self.path = os.fspath(path)
        self._maps: dict = {}

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._maps = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def read_metadata(self) -> Metadata:
        where = os.path.join(self.path, METADATA_FILE)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"distributed checkpoint: no checkpoint folder at {self.path}")
        try:
            with open(where, "rb") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"distributed checkpoint: {where} is missing; the folder holds no committed "
                                    "checkpoint (a save that never finished writes no metadata)") from None
        return Metadata.from_json(text.decode("utf-8", errors="replace"), where)

    def _tensors(self, file: str) -> dict:
        """name -> (array over the mapped file) of a shard, validated by `safetensors` first."""
        if file not in self._maps:
            where = os.path.join(self.path, file)
            if os.path.basename(file) != file or not os.path.exists(where):
                raise FileNotFoundError(f"distributed checkpoint: shard file {where} named by the metadata is "
                                        "missing")
            try:
                with safetensors.safe_open(where, framework="np"):
                    pass
            except safetensors.SafetensorError as e:
                raise ValueError(f"distributed checkpoint: shard file {where} is corrupt ({e})") from None
            mapped = np.memmap(where, np.uint8, mode="r")
            (n,) = _HEADER_LEN.unpack(mapped[:_HEADER_LEN.size].tobytes())
            header = json.loads(mapped[_HEADER_LEN.size:_HEADER_LEN.size + n].tobytes())
            header.pop("__metadata__", None)
            start = _HEADER_LEN.size + n
            arrays = {}
            for name, info in header.items():
                dt = D.BY_NAME[_ST_FROM[info["dtype"]]]
                begin, end = info["data_offsets"]
                raw = mapped[start + begin:start + end]
                if raw.ctypes.data % dt.itemsize:
                    raw = np.array(raw)
                arrays[name] = raw.view(dt.np).reshape(info["shape"])
            self._maps[file] = arrays
        return self._maps[file]

    def read_chunk(self, file: str, name: str, region: tuple) -> np.ndarray:
        """The part `region` (slices relative to the chunk) of the chunk `name` stored in shard `file`."""
        arrays = self._tensors(file)
        if name not in arrays:
            raise ValueError(f"distributed checkpoint: shard file {file} has no tensor '{name}' (metadata and "
                             "shards disagree)")
        return arrays[name][region]

