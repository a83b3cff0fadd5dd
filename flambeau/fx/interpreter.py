"""Interpreter: run a GraphModule node by node; Transformer: rebuild a graph node by node.

`Interpreter(gm).run(*args)` evaluates each node with the method named after its opcode
(`placeholder`, `get_attr`, `call_function`, `call_method`, `call_module`, `output`); override
them (or `run_node`) to observe or change execution. Values are freed after their last use.
`Transformer(gm).transform()` runs the same loop with Proxies instead of values, so overriding e.g.
`call_function` to emit a different target produces a new GraphModule.
"""
from __future__ import annotations

import inspect
from typing import Any

from .graph import Graph
from .graph_module import GraphModule
from .node import Node, map_arg, map_aggregate
from .proxy import Proxy, Tracer


class Interpreter:
    """Executes an FX graph (see module docstring)."""

    def __init__(self, module, garbage_collect_values: bool = True, graph: Graph | None = None):
        self.module = module
        self.graph = graph if graph is not None else module.graph
        self.env: dict = {}
        self.garbage_collect_values = garbage_collect_values
        self.extra_traceback = True
        self.user_to_last_uses: dict = {}
        if garbage_collect_values:
            seen = set()
            for node in reversed(list(self.graph.nodes)):
                for n in node.all_input_nodes:
                    if n not in seen:
                        seen.add(n)
                        self.user_to_last_uses.setdefault(node, []).append(n)

    def run(self, *args, initial_env: dict | None = None, enable_io_processing: bool = True) -> Any:
        self.env = dict(initial_env) if initial_env else {}
        self.args_iter = iter(args)
        for node in self.graph.nodes:
            if node in self.env:
                continue
            try:
                self.env[node] = self.run_node(node)
            except Exception as e:
                if self.extra_traceback and not getattr(e, "_fx_noted", False):
                    msg = f"While executing {node.format_node()}"
                    if hasattr(e, "add_note"):
                        e.add_note(msg)
                    e._fx_noted = True
                raise
            if self.garbage_collect_values:
                for to_delete in self.user_to_last_uses.get(node, ()):
                    self.env.pop(to_delete, None)
            if node.op == "output":
                return self.env[node]
        return None

    def run_node(self, n: Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    # ---- one method per opcode --------------------------------------------------------------
    def placeholder(self, target, args, kwargs) -> Any:
        if target.startswith("*"):
            return list(self.args_iter)
        try:
            return next(self.args_iter)
        except StopIteration:
            if args:
                return args[0]
            raise RuntimeError(f"Expected positional argument for parameter {target}, but one was not passed in!") from None

    def get_attr(self, target, args, kwargs) -> Any:
        return self.fetch_attr(target)

    def call_function(self, target, args, kwargs) -> Any:
        return target(*args, **kwargs)

    def call_method(self, target, args, kwargs) -> Any:
        self_obj, *rest = args
        return getattr(self_obj, target)(*rest, **kwargs)

    def call_module(self, target, args, kwargs) -> Any:
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target, args, kwargs) -> Any:
        return args[0]

    # ---- helpers ------------------------------------------------------------------------------
    def fetch_attr(self, target: str):
        obj = self.module
        for i, atom in enumerate(target.split(".")):
            if not hasattr(obj, atom):
                raise RuntimeError(f"Node referenced nonexistent target {'.'.join(target.split('.')[:i + 1])}")
            obj = getattr(obj, atom)
        return obj

    def fetch_args_kwargs_from_env(self, n: Node) -> tuple:
        return self.map_nodes_to_values(n.args, n), self.map_nodes_to_values(n.kwargs, n)

    def map_nodes_to_values(self, args, n: Node):
        def load(a):
            if a not in self.env:
                raise RuntimeError(f"Node {n} referenced nonexistent value {a}! Run Graph.lint() to diagnose such issues")
            return self.env[a]
        return map_arg(args, load)

    def boxed_run(self, args_list: list):
        args = list(args_list)
        args_list.clear()
        return self.run(*args)


class Transformer(Interpreter):
    """Builds a new GraphModule by re-emitting every node through overridable methods."""

    def __init__(self, module):
        super().__init__(module, garbage_collect_values=False)
        self.new_graph = Graph()

        class _T(Tracer):
            def __init__(s, graph):
                super().__init__()
                s.graph = graph
                s.root = module

            def is_leaf_module(s, m, qualified_name):
                return True
        self.tracer = _T(self.new_graph)

    def placeholder(self, target, args, kwargs) -> Proxy:
        default = args[0] if args else inspect.Signature.empty
        return Proxy(self.new_graph.placeholder(target, default_value=default), self.tracer)

    def get_attr(self, target, args, kwargs) -> Proxy:
        return self.tracer.create_proxy("get_attr", target, args, kwargs)

    def call_module(self, target, args, kwargs) -> Any:
        submod = self.fetch_attr(target)
        return self.tracer.call_module(submod, submod.forward, args, kwargs)

    def call_function(self, target, args, kwargs) -> Any:
        return self.tracer.create_proxy("call_function", target, args, kwargs)

    def call_method(self, target, args, kwargs) -> Any:
        return self.tracer.create_proxy("call_method", target, args, kwargs)

    def run_node(self, n: Node) -> Any:
        res = super().run_node(n)
        if isinstance(res, Proxy) and n.op != "output":
            res.node.meta = dict(n.meta)
        return res

    def transform(self) -> GraphModule:
        result = self.run()
        if result is not None:
            self.new_graph.output(map_aggregate(result, lambda x: x.node if isinstance(x, Proxy) else x))
        return GraphModule(self.module, self.new_graph)
