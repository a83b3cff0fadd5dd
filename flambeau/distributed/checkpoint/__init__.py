"""torch.distributed.checkpoint (DCP): sharded, reshardable checkpoints of model and optimizer state.

`save(state_dict, checkpoint_id=folder)` has every rank write its own pieces (safetensors, one file per rank)
and the coordinator commit `metadata.json` last and atomically; `load(state_dict, checkpoint_id=folder)` fills
a state dict in place, each rank reading just the saved pieces that overlap what it holds, whatever world
size or sharding wrote them. `async_save` returns a `concurrent.futures.Future`. `state_dict` gives model and
optimizer state dicts keyed by parameter names (`get_state_dict`/`set_state_dict`); `format_utils` converts
to and from a single-file checkpoint. Layout: metadata.py (the JSON contract), _traverse.py (flattening,
local pieces), filesystem.py (files), state_dict_saver.py, state_dict_loader.py, utils.py (agreement).
"""
from __future__ import annotations

from ._traverse import LocalChunk
from .filesystem import FileSystemReader, FileSystemWriter
from .metadata import (BytesStorageMetadata, CheckpointException, ChunkStorageMetadata, Metadata,
                       TensorProperties, TensorStorageMetadata)
from .state_dict_loader import load, load_state_dict
from .state_dict_saver import async_save, save

__all__ = ["save", "load", "async_save", "load_state_dict", "FileSystemWriter", "FileSystemReader", "Metadata",
           "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
           "CheckpointException", "LocalChunk"]
