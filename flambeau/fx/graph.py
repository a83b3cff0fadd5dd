"""FX Graph: an ordered list of Nodes plus Python code generation.

A Graph owns a doubly linked list of `Node`s closed by a sentinel root. Nodes are created at the
current insert point (the end, or where `inserting_before/after` put it), named uniquely
(`add`, `add_1`, ...), and erased only when unused. `python_code()` turns the graph into the source
of a `forward(self, ...)` function: one readable line per node, freeing each value after its last
use, with the names it needs (operators, flambeau, constants) in a globals dict: generated code runs
with the public namespace `flambeau` as a global (`_public.public_namespace`).
"""
from __future__ import annotations

import builtins
import contextlib
import inspect
import keyword
import math
import operator
import re
from typing import Any, Callable
import importlib

from .._device import device as Device
from .._dtype import dtype as DType
from .._public import public_namespace
from .node import Node, map_arg, _target_name
from ._aten import is_op

_RESERVED = {"self", "flambeau", "operator", "inf", "nan", "NoneType", "device", "torch"}

_INFIX = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
          operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
          operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
          operator.rshift: ">>", operator.eq: "==", operator.ne: "!=", operator.lt: "<",
          operator.le: "<=", operator.gt: ">", operator.ge: ">="}
_PREFIX = {operator.neg: "-", operator.pos: "+", operator.invert: "~", operator.not_: "not "}


class _Namespace:
    """Unique, valid Python identifiers for node names."""

    def __init__(self):
        self._used: set = set()
        self._base_count: dict = {}

    def create_name(self, candidate: str) -> str:
        c = re.sub(r"[^0-9a-zA-Z_]+", "_", candidate)
        if not c:
            c = "_unnamed"
        if c[0].isdigit():
            c = "_" + c
        m = re.match(r"(.*)_(\d+)$", c)
        base, num = (m.group(1), int(m.group(2))) if m else (c, None)
        if num is None and c not in self._used and not self._illegal(c):
            self._used.add(c)
            return c
        n = num if num is not None else self._base_count.get(base, 0) + 1
        while f"{base}_{n}" in self._used:
            n += 1
        self._base_count[base] = n
        name = f"{base}_{n}"
        self._used.add(name)
        return name

    @staticmethod
    def _illegal(name: str) -> bool:
        return keyword.iskeyword(name) or name in _RESERVED or hasattr(builtins, name)

    def release(self, name: str) -> None:
        self._used.discard(name)


class _NodeList:
    def __init__(self, graph, reverse=False):
        self._root = graph._root
        self._reverse = reverse

    def __len__(self):
        return self._root.graph._len

    def __iter__(self):
        root = self._root
        cur = root._prev if self._reverse else root._next
        while cur is not root:
            nxt = cur._prev if self._reverse else cur._next
            if not cur._erased:
                yield cur
            cur = nxt

    def __reversed__(self):
        return iter(_NodeList(self._root.graph, not self._reverse))

    def __getitem__(self, i):
        return list(self)[i]


class PythonCode:
    """Generated source of `forward` and the globals it runs in."""

    def __init__(self, src: str, globals_: dict):
        self.src = src
        self.globals = globals_


class Graph:
    """A list of FX Nodes (see module docstring)."""

    def __init__(self, owning_module=None, tracer_cls=None, tracer_extras=None):
        self._root = Node(self, "", "root", "", (), {})
        self._len = 0
        self._namespace = _Namespace()
        self._insert = self._root.prepend
        self.owning_module = owning_module
        self._tracer_cls = tracer_cls

    @property
    def nodes(self) -> _NodeList:
        return _NodeList(self)

    # ---- creation -------------------------------------------------------------------------------
    def create_node(self, op: str, target, args: tuple | None = None, kwargs: dict | None = None,
                    name: str | None = None, type_expr: Any = None) -> Node:
        name = self._namespace.create_name(name if name is not None else self._name_for(op, target))
        n = Node(self, name, op, target, tuple(args or ()), dict(kwargs or {}), type_expr)
        self._insert(n)
        self._len += 1
        return n

    def _name_for(self, op, target) -> str:
        if op == "call_function":
            if is_op(target):
                return target._schema.name
            return getattr(target, "__name__", None) or "fn"
        if op == "output":
            return "output"
        return str(target).replace(".", "_")

    def placeholder(self, name: str, type_expr=None, default_value=inspect.Signature.empty) -> Node:
        args = () if default_value is inspect.Signature.empty else (default_value,)
        n = self.create_node("placeholder", name, args, name=name, type_expr=type_expr)
        if n.name != name:
            n.target = n.name
        return n

    def get_attr(self, qualified_name: str, type_expr=None) -> Node:
        return self.create_node("get_attr", qualified_name, type_expr=type_expr)

    def call_module(self, module_name: str, args=None, kwargs=None, type_expr=None) -> Node:
        return self.create_node("call_module", module_name, args, kwargs, type_expr=type_expr)

    def call_method(self, method_name: str, args=None, kwargs=None, type_expr=None) -> Node:
        return self.create_node("call_method", method_name, args, kwargs, type_expr=type_expr)

    def call_function(self, the_function: Callable, args=None, kwargs=None, type_expr=None) -> Node:
        return self.create_node("call_function", the_function, args, kwargs, type_expr=type_expr)

    def output(self, result, type_expr=None) -> Node:
        return self.create_node("output", "output", (result,), type_expr=type_expr)

    def output_node(self) -> Node:
        for n in reversed(self.nodes):
            if n.op == "output":
                return n
        raise RuntimeError("graph has no output node")

    def node_copy(self, node: Node, arg_transform: Callable = lambda x: x) -> Node:
        """Copy `node` from another graph into this one, mapping its input nodes with `arg_transform`."""
        args = map_arg(node.args, arg_transform)
        kwargs = map_arg(node.kwargs, arg_transform)
        name = node.name if node.op != "placeholder" else node.target
        n = self.create_node(node.op, node.target, args, kwargs, name, node.type)
        n.meta = dict(node.meta)
        return n

    def graph_copy(self, g: "Graph", val_map: dict, return_output_node: bool = False):
        """Copy all nodes of `g` (except its output) into this graph; returns the output value."""
        for node in g.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                rv = map_arg(node.args[0], lambda n: val_map[n])
                return (rv, node) if return_output_node else rv
            val_map[node] = self.node_copy(node, lambda n: val_map[n])
        return None

    def __deepcopy__(self, memo) -> "Graph":
        g = Graph(tracer_cls=self._tracer_cls)
        memo[id(self)] = g
        out = g.graph_copy(self, {}, return_output_node=True)
        if out is not None:
            rv, onode = out
            g.output(rv, onode.type).meta = dict(onode.meta)
        return g

    # ---- insert point ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _insert_at(self, insert):
        saved = self._insert
        self._insert = insert
        try:
            yield
        finally:
            self._insert = saved

    def inserting_before(self, n: Node | None = None):
        """New nodes go right before `n` (or at the start of the graph when n is None)."""
        if n is None:
            n = self._root._next
        return self._insert_at(n.prepend)

    def inserting_after(self, n: Node | None = None):
        """New nodes go after `n` (or at the end when n is None), in creation order."""
        if n is None:
            return self._insert_at(self._root.prepend)
        last = [n]

        def ins(x):
            last[0].append(x)
            last[0] = x
        return self._insert_at(ins)

    # ---- removal -----------------------------------------------------------------------------
    def erase_node(self, to_erase: Node) -> None:
        if to_erase.users:
            raise RuntimeError(f"Tried to erase Node {to_erase} but it still had {len(to_erase.users)} users "
                               f"in the graph: {to_erase.users}!")
        if to_erase.graph is not self:
            raise RuntimeError(f"Attempting to remove {to_erase} from wrong graph!")
        if to_erase._erased:
            return
        to_erase._remove_from_list()
        to_erase._erased = True
        self._len -= 1
        to_erase._update_args_kwargs((), {})
        self._namespace.release(to_erase.name)

    def eliminate_dead_code(self, is_impure_node: Callable | None = None) -> bool:
        """Erase nodes without users that have no side effects; returns whether anything changed."""
        impure = is_impure_node or (lambda n: n.is_impure())
        changed = False
        for node in reversed(self.nodes):
            if not node.users and not impure(node):
                self.erase_node(node)
                changed = True
        return changed

    def find_nodes(self, *, op: str, target=None, sort: bool = True) -> list:
        return [n for n in self.nodes if n.op == op and (target is None or n.target == target)]

    # ---- checks and printing -----------------------------------------------------------------
    def lint(self) -> None:
        """Check the graph's invariants: unique names, defs before uses, consistent users, ownership."""
        seen, names = set(), set()
        for n in self.nodes:
            if n.graph is not self:
                raise RuntimeError(f"Node {n} does not belong to this Graph!")
            if n.name in names:
                raise RuntimeError(f"Node redefined name {n.name}!")
            names.add(n.name)
            for inp in n.all_input_nodes:
                if inp.graph is not self:
                    raise RuntimeError(f"Argument '{inp}' of Node '{n}' does not belong to this Graph")
                if inp not in seen:
                    raise RuntimeError(f"Argument '{inp}' of Node '{n}' was used before it has been defined! "
                                       "Please check that Nodes in the graph are topologically ordered")
                if n not in inp.users:
                    raise RuntimeError(f"Node {inp} does not list {n} among its users")
            for u in n.users:
                if u._erased or n not in u._input_nodes:
                    raise RuntimeError(f"Node {n} lists {u} as a user but {u} does not use it")
            seen.add(n)
        if self.owning_module is not None:
            for n in self.nodes:
                if n.op in ("get_attr", "call_module"):
                    obj = self.owning_module
                    for part in n.target.split("."):
                        if not hasattr(obj, part):
                            raise RuntimeError(f"Node {n} target {n.target} references nonexistent attribute "
                                               f"{part} of {type(obj).__name__}")
                        obj = getattr(obj, part)

    def __str__(self) -> str:
        names: list = []
        body = []
        for n in self.nodes:
            line = n.format_node()
            if line:
                body.append("    " + line)
        for n in self.nodes:
            if n.op == "placeholder":
                names.append(n.target)
        return f"graph({', '.join(names)}):\n" + "\n".join(body)

    def print_tabular(self) -> None:
        rows = [[n.op, n.name, _target_name(n.target), str(n.args), str(n.kwargs)] for n in self.nodes]
        hdr = ["opcode", "name", "target", "args", "kwargs"]
        w = [max(len(r[i]) for r in rows + [hdr]) for i in range(5)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        print("  ".join("-" * w[i] for i in range(5)))
        for r in rows:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))

    # ---- code generation ------------------------------------------------------------------------
    def python_code(self, root_module: str = "self") -> PythonCode:
        return _CodeGen(self, root_module).run()


class _CodeGen:
    """Emit `def forward(self, ...)` for a graph (see Graph.python_code)."""

    def __init__(self, graph: Graph, root: str):
        self.graph = graph
        self.root = root
        self.globals = {"flambeau": public_namespace(), "operator": operator, "inf": math.inf, "nan": math.nan,
                        "NoneType": type(None)}
        self._global_ids: dict = {}

    def add_global(self, hint: str, obj) -> str:
        key = id(obj)
        if key in self._global_ids:
            return self._global_ids[key]
        base = re.sub(r"[^0-9a-zA-Z_]+", "_", hint) or "_g"
        if base[0].isdigit():
            base = "_" + base
        name, i = base, 0
        while name in self.globals or name in _RESERVED or hasattr(builtins, name) or keyword.iskeyword(name) \
                or name in self.graph._namespace._used:
            i += 1
            name = f"{base}_{i}"
        self.globals[name] = obj
        self._global_ids[key] = name
        return name

    def target_expr(self, target) -> str:
        if is_op(target):
            return _target_name(target)
        mod = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", None)
        if name and mod in ("_operator", "operator") and getattr(operator, name, None) is target:
            return "operator." + name
        if name and getattr(builtins, name, None) is target:
            return name
        qual = getattr(target, "__qualname__", None)
        if qual and mod.startswith("flambeau") and "<" not in qual:
            try:                # the dotted path as the generated code reads it, attribute by attribute
                importlib.import_module(mod)        # (a name may shadow its module: flambeau.export.unflatten)
                obj = importlib.import_module("flambeau")
                for part in f"{mod}.{qual}".split(".")[1:]:
                    obj = getattr(obj, part)
                if obj is target:
                    return f"{mod}.{qual}"
            except (ImportError, AttributeError):
                pass
        return self.add_global(name or "fn", target)

    def arg(self, a) -> str:
        if isinstance(a, Node):
            return a.name
        t = type(a)
        if a is None or t in (bool, int, str, complex):
            return repr(a)
        if t is float:
            if math.isinf(a):
                return "inf" if a > 0 else "-inf"
            return "nan" if math.isnan(a) else repr(a)
        if isinstance(a, tuple) and not hasattr(a, "_fields"):
            inner = ", ".join(self.arg(x) for x in a)
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        if isinstance(a, list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.arg(v)}" for k, v in a.items()) + "}"
        if isinstance(a, slice):
            return f"slice({self.arg(a.start)}, {self.arg(a.stop)}, {self.arg(a.step)})"
        if a is Ellipsis:
            return "..."
        if isinstance(a, DType) and getattr(self.globals["flambeau"], a.name, None) is a:
            return "flambeau." + a.name
        if isinstance(a, Device):
            return f"flambeau.device({str(a)!r})"
        return self.add_global(type(a).__name__.lower() + "_const", a)

    def call_args(self, args, kwargs) -> str:
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)

    def attr_path(self, target: str) -> str:
        expr = self.root
        for part in target.split("."):
            expr = f"{expr}.{part}" if part.isidentifier() and not keyword.iskeyword(part) \
                else f"getattr({expr}, {part!r})"
        return expr

    def node_expr(self, n: Node) -> str:
        if n.op == "get_attr":
            return self.attr_path(n.target)
        if n.op == "call_module":
            return f"{self.attr_path(n.target)}({self.call_args(n.args, n.kwargs)})"
        if n.op == "call_method":
            return f"{self.arg(n.args[0])}.{n.target}({self.call_args(n.args[1:], n.kwargs)})"
        t, a = n.target, n.args
        if not n.kwargs:
            if t in _INFIX and len(a) == 2:
                return f"{self.arg(a[0])} {_INFIX[t]} {self.arg(a[1])}"
            if t in _PREFIX and len(a) == 1:
                return f"{_PREFIX[t]}{self.arg(a[0])}"
            if t is operator.getitem and len(a) == 2:
                return f"{self.arg(a[0])}[{self.arg(a[1])}]"
            if t is builtins.getattr and len(a) == 2 and isinstance(a[1], str) and a[1].isidentifier():
                return f"{self.arg(a[0])}.{a[1]}"
        return f"{self.target_expr(t)}({self.call_args(a, n.kwargs)})"

    def run(self) -> PythonCode:
        nodes = list(self.graph.nodes)
        last_use: dict = {}
        for n in reversed(nodes):
            for inp in n.all_input_nodes:
                last_use.setdefault(inp, n)
        frees: dict = {}
        for v, user in last_use.items():
            frees.setdefault(user, []).append(v)
        params, body = [self.root], []
        for n in nodes:
            if n.op == "placeholder":
                p = n.target
                params.append(p if not n.args else f"{p} = {self.arg(n.args[0])}")
                if n.name != p:
                    body.append(f"{n.name} = {p}")
                if not n.users:
                    body.append(f"{n.name} = None")
                continue
            if n.op == "output":
                body.append(f"return {self.arg(n.args[0])}")
                continue
            line = f"{n.name} = {self.node_expr(n)}"
            dead = [v.name for v in frees.get(n, ())]
            if not n.users:
                dead.append(n.name)
            if dead:
                line += ";  " + " = ".join(dead) + " = None"
            body.append(line)
        if not body or not body[-1].startswith("return"):
            body.append("return None")
        src = f"\n\ndef forward({', '.join(params)}):\n" + "".join(f"    {b}\n" for b in body)
        return PythonCode(src, self.globals)
