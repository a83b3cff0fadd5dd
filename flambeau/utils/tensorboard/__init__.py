"""flambeau.utils.tensorboard: `SummaryWriter` on the `tensorboard` package's event-file writer.

Importing it without `tensorboard` installed fails as PyTorch's does (the import of `tensorboard`
itself raises); a version older than 1.15 raises PyTorch's ImportError.
"""
import re

import tensorboard

_MIN_VERSION = (1, 15)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


if not hasattr(tensorboard, "__version__") or _release(tensorboard.__version__) < _MIN_VERSION:
    raise ImportError("TensorBoard logging requires TensorBoard version 1.15 or above")

del tensorboard

from .writer import FileWriter, SummaryWriter  # noqa: E402
from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402

__all__ = ["FileWriter", "RecordWriter", "SummaryWriter"]
