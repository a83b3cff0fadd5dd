"""`torch.nn.modules.upsampling`: Upsample, UpsamplingNearest2d, UpsamplingBilinear2d
at PyTorch's module path (defined in `misc`)."""
from .misc import Upsample, UpsamplingNearest2d, UpsamplingBilinear2d

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]
