"""`flambeau.ao`: architecture optimisation; its `quantization` package (PyTorch's `torch.ao`)."""
from . import quantization, nn  # noqa: F401,E402
