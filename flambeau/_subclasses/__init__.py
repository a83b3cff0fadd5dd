"""Tensor subclasses used by the compiler stack (fake tensors)."""
from .fake_tensor import FakeTensor, FakeTensorMode  # noqa: F401
