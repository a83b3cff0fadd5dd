"""flambeau.utils.data: datasets, samplers, collation and the (multi-process) DataLoader."""
from .dataset import (Dataset, IterableDataset, TensorDataset, ConcatDataset, ChainDataset,  # noqa: F401
                      Subset, StackDataset, random_split)
from .sampler import (Sampler, SequentialSampler, RandomSampler, SubsetRandomSampler,  # noqa: F401
                      WeightedRandomSampler, BatchSampler)
from .distributed import DistributedSampler  # noqa: F401
from ._utils.collate import default_collate, default_convert  # noqa: F401
from ._utils.worker import WorkerInfo, get_worker_info  # noqa: F401
from .dataloader import DataLoader  # noqa: F401
from . import _utils  # noqa: F401
