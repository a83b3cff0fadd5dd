"""The DataLoader's machinery, at PyTorch's paths: collation, pinning, the worker process."""
from . import collate, pin_memory, worker  # noqa: F401
