"""flambeau.fx: PyTorch's torch.fx. Graphs of Nodes, GraphModule (Python code generated from a
graph), Interpreter/Transformer, Python-level tracing (`symbolic_trace`) and, in
`fx.experimental.proxy_tensor`, dispatcher-level tracing (`make_fx`) with fake tensors and
symbolic sizes (`fx.experimental.symbolic_shapes`).

Layer 8 (tracing, with `_subclasses`) of tests/test_layers.py's order: imports the library and
below; the operators reach proxy tracing through `_ops._registry.set_fx_hook`.
"""
from .node import Node, map_arg, map_aggregate  # noqa: F401
from .graph import Graph, PythonCode  # noqa: F401
from .graph_module import GraphModule  # noqa: F401
from .proxy import Proxy, Attribute, Tracer, TraceError, GraphAppendingTracer, symbolic_trace, wrap  # noqa: F401
from .interpreter import Interpreter, Transformer  # noqa: F401
from .subgraph_rewriter import replace_pattern  # noqa: F401
from ._aten import ops  # noqa: F401
from . import experimental, passes  # noqa: F401
