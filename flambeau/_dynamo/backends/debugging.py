"""Debug backends: "eager" runs the captured graph as it is; "aot_eager" runs AOT autograd
(functionalize, joint trace, partition) with the resulting graphs run as GraphModules."""
from __future__ import annotations

from ..._functorch.aot_autograd import aot_module_simplified
from .registry import register_builtin


def eager(gm, example_inputs, options=None):
    return gm.forward


def _run_graph(gm, example_inputs):
    return gm.forward


def aot_eager(gm, example_inputs, options=None):
    return aot_module_simplified(gm, example_inputs, fw_compiler=_run_graph, bw_compiler=_run_graph)


register_builtin("eager", eager, ("debug",))
register_builtin("aot_eager", aot_eager, ("debug",))
