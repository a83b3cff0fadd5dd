"""`torch.nn.modules.fold`: Fold, Unfold at PyTorch's module path (defined in `misc`)."""
from .misc import Fold, Unfold

__all__ = ["Fold", "Unfold"]
