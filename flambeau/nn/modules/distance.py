"""`torch.nn.modules.distance`: PairwiseDistance, CosineSimilarity
at PyTorch's module path (defined in `misc`)."""
from .misc import PairwiseDistance, CosineSimilarity

__all__ = ["PairwiseDistance", "CosineSimilarity"]
