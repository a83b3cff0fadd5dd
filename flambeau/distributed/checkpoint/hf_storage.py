"""`HuggingFaceStorageWriter` / `HuggingFaceStorageReader` (PyTorch's `checkpoint.hf_storage`): names only.

transformers imports both at import time whenever `distributed.is_available()`; DCP here writes its own layout
(per-rank safetensors shards + JSON metadata, see filesystem.py), not the Hugging Face one, so constructing
either raises NotImplementedError naming the supported path.
"""
from __future__ import annotations

from .filesystem import FileSystemReader, FileSystemWriter

_UNSUPPORTED = ("distributed checkpoint: {cls} (the Hugging Face safetensors layout) is not supported; "
                "save with FileSystemWriter and convert with checkpoint.format_utils.dcp_to_torch_save, or "
                "use the model's save_pretrained")


class HuggingFaceStorageWriter(FileSystemWriter):
    """Refused on construction (see the module docstring)."""

    def __init__(self, path, fqn_to_index_mapping=None, thread_count: int = 1, save_distributed: bool = False,
                 enable_consolidation: bool = False, thread_count_consolidation: int = 1) -> None:
        raise NotImplementedError(_UNSUPPORTED.format(cls="HuggingFaceStorageWriter"))


class HuggingFaceStorageReader(FileSystemReader):
    """Refused on construction (see the module docstring)."""

    def __init__(self, path, thread_count: int = 1) -> None:
        raise NotImplementedError(_UNSUPPORTED.format(cls="HuggingFaceStorageReader"))
