"""torch.distributed._tensor.device_mesh: the device mesh's old home (`flambeau.distributed.device_mesh`)."""
from __future__ import annotations

from ..device_mesh import DeviceMesh, init_device_mesh  # noqa: F401

__all__ = ["DeviceMesh", "init_device_mesh"]
