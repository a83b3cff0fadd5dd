"""flambeau.autograd: reverse-mode (engine, graph, Function), grad modes, anomaly mode,
gradcheck and forward-mode AD (`forward_ad`).

Layer 6 of tests/test_layers.py's order: above the operators, below the library; the dispatcher
reaches it through the registration it owns (`_dispatch.register_autograd`).
"""
from .engine import backward, grad  # noqa: F401
from .grad_mode import (no_grad, enable_grad, set_grad_enabled, inference_mode,  # noqa: F401
                        is_grad_enabled, set_detect_anomaly, detect_anomaly, is_anomaly_enabled)
from .function import Function, FunctionCtx, once_differentiable, InplaceFunction  # noqa: F401
from . import graph  # noqa: F401
from . import engine as _engine
from .graph import Node  # noqa: F401

from . import forward_ad, functional  # noqa: F401,E402
from .gradcheck import gradcheck, gradgradcheck, GradcheckError  # noqa: F401,E402
from .. import _dispatch  # noqa: E402
from .._tensor import Tensor as Variable  # noqa: F401,E402  (the legacy alias)

_dispatch.register_autograd(graph, forward_ad)


def _tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
    backward(self, gradient, retain_graph, create_graph, inputs=inputs)


def _tensor_register_hook(self, hook):
    return graph.register_tensor_hook(self, hook)


def _tensor_register_post_accumulate_grad_hook(self, hook):
    return graph.register_post_accumulate_hook(self, hook)


def _tensor_retain_grad(self) -> None:
    graph.retain_grad(self)


# Tensor's autograd methods are installed by the layer that implements them (the tensor layer is below).
Variable.backward = _tensor_backward
Variable.register_hook = _tensor_register_hook
Variable.register_post_accumulate_grad_hook = _tensor_register_post_accumulate_grad_hook
Variable.retain_grad = _tensor_retain_grad
Variable._execution_engine = _engine          # Variable._execution_engine.queue_callback(fn), as PyTorch's
