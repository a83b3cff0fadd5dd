"""A module's graph as TensorBoard's GraphDef, traced with flambeau.fx.

Nodes are named in PyTorch's scopes (`Sequential/Linear[0]/<node>`), which TensorBoard folds into
one box per submodule; a submodule call is one node whose op is the module's class, a function
call one node of its name; graph inputs and outputs are `IO Node`s under `input/` and `output/`.
With example inputs the graph is run once (ShapeProp) and each node carries `_output_shapes`.
"""
from __future__ import annotations

from typing import Any

from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.config_pb2 import RunMetadata
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.step_stats_pb2 import DeviceStepStats, StepStats
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.versions_pb2 import VersionDef

from ...fx import symbolic_trace
from ...fx.passes.shape_prop import ShapeProp

GRAPH_PRODUCER = 22           # the GraphDef version PyTorch's writer declares
IO_NODE = "IO Node"


def _scope(model, target: str) -> str:
    """`Root/Child[name]/Grandchild[name]` for the submodule at dotted path `target`."""
    parts, mod = [type(model).__name__], model
    for name in target.split("."):
        mod = getattr(mod, name)
        parts.append(f"{type(mod).__name__}[{name}]")
    return "/".join(parts)


def _shape_attr(node) -> dict:
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return {}
    shape = TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(s)) for s in meta.shape])
    return {"_output_shapes": AttrValue(list=AttrValue.ListValue(shape=[shape]))}


def graph(model, args: Any = None, verbose: bool = False) -> tuple[GraphDef, RunMetadata]:
    gm = symbolic_trace(model)
    if args is not None:
        ShapeProp(gm).propagate(*(args if isinstance(args, (tuple, list)) else (args,)))
    root = type(model).__name__
    names: dict = {}
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            name, op = f"input/{n.name}", IO_NODE
        elif n.op == "output":
            name, op = f"output/{n.name}", IO_NODE
        elif n.op == "call_module":
            name, op = f"{_scope(model, n.target)}/{n.name}", type(gm.get_submodule(n.target)).__name__
        elif n.op == "get_attr":
            name, op = f"{root}/{n.target.replace('.', '/')}", "prim::GetAttr"
        else:
            name, op = f"{root}/{n.name}", getattr(n.target, "__name__", str(n.target))
        names[n] = name
        attr = {"attr": AttrValue(s=str(n.kwargs or "").encode())}
        attr.update(_shape_attr(n.args[0] if n.op == "output" and n.args and hasattr(n.args[0], "meta") else n))
        nodes.append(NodeDef(name=name, op=op, input=[names[i] for i in n.all_input_nodes], attr=attr))
        if verbose:
            print(name, op, [names[i] for i in n.all_input_nodes])
    stats = RunMetadata(step_stats=StepStats(dev_stats=[DeviceStepStats(device="/device:CPU:0")]))
    return GraphDef(node=nodes, versions=VersionDef(producer=GRAPH_PRODUCER)), stats
