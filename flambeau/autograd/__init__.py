"""flambeau.autograd: reverse-mode (engine, graph, Function), grad modes, anomaly mode,
gradcheck and forward-mode AD (`forward_ad`)."""
from .engine import backward, grad  # noqa: F401
from .grad_mode import (no_grad, enable_grad, set_grad_enabled, inference_mode,  # noqa: F401
                        is_grad_enabled, set_detect_anomaly, detect_anomaly, is_anomaly_enabled)
from .function import Function, FunctionCtx, once_differentiable, InplaceFunction  # noqa: F401
from . import graph  # noqa: F401
from .graph import Node  # noqa: F401

Variable = None  # set by flambeau/__init__ to Tensor (legacy alias)


def __getattr__(name):
    if name in ("gradcheck", "gradgradcheck"):
        from . import gradcheck as gc
        return getattr(gc, name)
    if name == "forward_ad":
        from . import forward_ad
        return forward_ad
    if name == "functional":
        from . import functional
        return functional
    raise AttributeError(f"module 'flambeau.autograd' has no attribute '{name}'")
