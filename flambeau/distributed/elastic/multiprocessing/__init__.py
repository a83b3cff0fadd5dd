"""torch.distributed.elastic.multiprocessing: `errors.record`."""
from . import errors  # noqa: F401
