"""torch.distributed.elastic: the pieces scripts written for torchrun import (`multiprocessing.errors.record`)."""
from . import multiprocessing  # noqa: F401
