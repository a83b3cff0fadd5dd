"""`torch.nn.modules.pixelshuffle`: PixelShuffle, PixelUnshuffle
at PyTorch's module path (defined in `misc`)."""
from .misc import PixelShuffle, PixelUnshuffle

__all__ = ["PixelShuffle", "PixelUnshuffle"]
