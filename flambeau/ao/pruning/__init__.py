"""`flambeau.ao.pruning`: PyTorch's `torch.ao.pruning` sparsifiers for 2:4 (and other block) pruning:
`WeightNormSparsifier` with `prepare(model, config)`, `step()` and `squash_mask()` (`sparsifier.py`)."""
from __future__ import annotations

from .sparsifier import BaseSparsifier, FakeSparsity, WeightNormSparsifier

__all__ = ["BaseSparsifier", "FakeSparsity", "WeightNormSparsifier"]
