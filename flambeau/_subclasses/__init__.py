"""Tensor subclasses used by the compiler stack (fake tensors).

Layer 8 (tracing, with `fx`) of tests/test_layers.py's order: imports the library and below.
"""
from .fake_tensor import FakeTensor, FakeTensorMode  # noqa: F401
