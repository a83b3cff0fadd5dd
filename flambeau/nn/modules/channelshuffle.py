"""`torch.nn.modules.channelshuffle`: ChannelShuffle at PyTorch's module path (defined in `misc`)."""
from .misc import ChannelShuffle

__all__ = ["ChannelShuffle"]
