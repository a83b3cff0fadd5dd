"""Dispatcher-level tracing (`proxy_tensor.make_fx`) and symbolic shapes."""
from . import proxy_tensor, symbolic_shapes  # noqa: F401
