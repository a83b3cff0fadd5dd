"""Converting between a distributed checkpoint folder and a single-file checkpoint (PyTorch's
`torch.distributed.checkpoint.format_utils`): `dcp_to_torch_save` assembles every tensor whole from its
chunks, rebuilds the nested state dict from the recorded key paths and writes it as PyTorch's `.pt` zip; `torch_save_to_dcp` splits a
`flambeau.save`/`torch.save` file into a one-rank checkpoint folder.
"""
from __future__ import annotations

import os

from ... import _dtype as D
from ..._ops.creation import zeros
from ...serialization import load as load_file
from ...serialization import save as save_file
from ._traverse import unflatten
from .filesystem import FileSystemReader
from .metadata import TensorStorageMetadata
from .state_dict_loader import _load_local
from .state_dict_saver import save


def _full_state_dict(dcp_checkpoint_dir) -> dict:
    reader = FileSystemReader(dcp_checkpoint_dir)
    metadata = reader.read_metadata()
    flat = {}
    for key, entry in metadata.state_dict_metadata.items():
        flat[key] = zeros(entry.size, dtype=D.BY_NAME[entry.properties.dtype]) \
            if isinstance(entry, TensorStorageMetadata) else None
    _load_local(flat, metadata, reader)
    return unflatten(flat, metadata.paths)


def dcp_to_torch_save(dcp_checkpoint_dir: str | os.PathLike, torch_save_path: str | os.PathLike) -> None:
    """Write the whole checkpoint in `dcp_checkpoint_dir` as one file in PyTorch's `.pt` zip format (what
    `torch.save` writes: `torch.load` and `flambeau.load` read it)."""
    save_file(_full_state_dict(dcp_checkpoint_dir), torch_save_path, format="pt")


def torch_save_to_dcp(torch_save_path: str | os.PathLike, dcp_checkpoint_dir: str | os.PathLike) -> None:
    """Write the state dict in a single checkpoint file as a distributed checkpoint folder (one rank)."""
    state_dict = load_file(torch_save_path, weights_only=True)
    if not isinstance(state_dict, dict):
        raise TypeError(f"torch_save_to_dcp: {torch_save_path} holds a {type(state_dict).__name__}, not a state dict")
    save(state_dict, checkpoint_id=dcp_checkpoint_dir, no_dist=True)


__all__ = ["dcp_to_torch_save", "torch_save_to_dcp"]
