"""`torch.nn.modules.instancenorm`: InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
at PyTorch's module path (defined in `batchnorm`)."""
from .batchnorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]
