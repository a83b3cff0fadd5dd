"""torch.version: what this build is. `__version__` is the PyTorch API version flambeau follows
(its tests run against that PyTorch) with flambeau's own version as the local label, so version
checks in libraries (`torch.__version__ >= "2.4"`) ask about the API they will meet. No CUDA or
ROCm toolkit is compiled in (`cuda`, `hip` are None, as in a CPU build of PyTorch: flambeau reaches
the GPU through CuPy at run time, see `flambeau.cuda`)."""
from __future__ import annotations

from .torch_version import TorchVersion

PYTORCH_API_VERSION = "2.13.0"
FLAMBEAU_VERSION = "0.1.0"

__version__ = TorchVersion(f"{PYTORCH_API_VERSION}+flambeau.{FLAMBEAU_VERSION}")
cuda: str | None = None
hip: str | None = None
rocm: str | None = None
xpu: str | None = None
debug = False
git_version = "Unknown"
