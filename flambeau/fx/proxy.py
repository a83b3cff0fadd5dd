"""Python-level tracing: `Proxy`, `Tracer`, `symbolic_trace`, `wrap`.

`symbolic_trace(module_or_fn)` calls the function with `Proxy` objects in place of its inputs.
Each operation on a Proxy records a Node instead of computing: Tensor methods become
call_method nodes, Python operators (`+`, `[]`) call_function nodes on `operator.*`, flambeau
functions called with a Proxy argument call_function nodes on that function (the operator
registry asks `_fx_hook` before dispatching), calls of leaf modules (those of `flambeau.nn`, except
containers) call_module nodes, and parameters read inside forward get_attr nodes. Python control
flow on a Proxy cannot be recorded and raises `TraceError`. A Proxy can also be made by hand around a
node of any graph (`Proxy(node)`, `GraphAppendingTracer(graph)`): operations on it append to that graph.
"""
from __future__ import annotations

import builtins
import dis
import inspect
import operator
import weakref
from typing import Any, Callable

from .._ops import _registry
from .._tensor import Tensor
from ..nn.modules.module import Module
from ..nn.modules.container import Sequential, ModuleList, ModuleDict
from ..nn.parameter import Parameter
from .graph import Graph
from .node import Node, map_aggregate
from .graph_module import GraphModule


class TraceError(ValueError):
    pass


class Proxy:
    """Stands for the value of `node` while tracing; operations on it record new nodes."""

    def __init__(self, node: Node, tracer: "Tracer | None" = None):
        self.node = node
        self.tracer = tracer if tracer is not None else GraphAppendingTracer(node.graph)
        if not _tracing:
            _hold_hook(self)

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    def __getattr__(self, k: str) -> "Attribute":
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        return Attribute(self, k)

    def __call__(self, *args, **kwargs) -> "Proxy":
        return self.tracer.create_proxy("call_method", "__call__", (self,) + args, kwargs)

    def __iter__(self):
        frame = inspect.currentframe().f_back
        for inst in dis.get_instructions(frame.f_code):
            if inst.offset == frame.f_lasti and inst.opname == "UNPACK_SEQUENCE":
                return iter([self[i] for i in range(inst.argval)])
        raise TraceError("Proxy object cannot be iterated. This can be attempted when the Proxy is used "
                         "in a loop or as a *args or **kwargs function argument.")

    def __bool__(self) -> bool:
        raise TraceError("symbolically traced variables cannot be used as inputs to control flow")

    def __len__(self) -> int:
        raise RuntimeError("'len' is not supported in symbolic tracing by default. If you want this call to "
                           "be recorded, please call flambeau.fx.wrap('len') at module scope")

    def __index__(self):
        raise TraceError("symbolically traced variables cannot be used as indices or sizes of Python objects")

    def keys(self):
        return self.tracer.create_proxy("call_method", "keys", (self,), {})

    __hash__ = object.__hash__


class Attribute(Proxy):
    """`proxy.attr`: a call_method when called, else a lazily created `getattr` node."""

    def __init__(self, root: Proxy, attr: str):
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node = None

    @property
    def node(self) -> Node:
        if self._node is None:
            self._node = self.tracer.create_proxy("call_function", builtins.getattr, (self.root, self.attr), {}).node
        return self._node

    def __call__(self, *args, **kwargs) -> Proxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root,) + args, kwargs)


def _binary(fn, reflected=False):
    def impl(self, other):
        a = (other, self) if reflected else (self, other)
        return self.tracer.create_proxy("call_function", fn, a, {})
    return impl


def _unary(fn):
    def impl(self):
        return self.tracer.create_proxy("call_function", fn, (self,), {})
    return impl


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift",
              "and", "or", "xor"):
    _fn = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(Proxy, f"__{_name}__", _binary(_fn))
    setattr(Proxy, f"__r{_name}__", _binary(_fn, True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge", "getitem"):
    setattr(Proxy, f"__{_name}__", _binary(getattr(operator, _name)))
for _name in ("neg", "pos", "invert", "abs"):
    setattr(Proxy, f"__{_name}__", _unary(getattr(operator, _name)))


def _find_tracer(args, kwargs):
    for a in args:
        if isinstance(a, Proxy):
            return a.tracer
        if type(a) in (list, tuple):
            for x in a:
                if isinstance(x, Proxy):
                    return x.tracer
    if kwargs:
        return _find_tracer(tuple(kwargs.values()), None)
    return None


def _proxy_hook(target, args, kwargs):
    """Installed with `_registry.set_fx_hook` while tracing: record calls that received a Proxy."""
    tracer = _find_tracer(args, kwargs)
    if tracer is None:
        return NotImplemented
    return tracer.create_proxy("call_function", target, args, kwargs)


_wrapped: list = []          # (globals dict, name) registered by `wrap`

# Proxies made outside symbolic_trace (graphs built by hand, a traced module inlined into another graph):
# flambeau functions called on them must record nodes, as PyTorch's __torch_function__ makes them, so the
# registry's hook is installed while any of them lives (operators' fast paths are off while it is).
_tracing = 0                 # symbolic_trace calls under way
_free_proxies = 0            # live Proxies made outside them


def _hold_hook(proxy: Proxy) -> None:
    global _free_proxies
    if _free_proxies == 0 and _registry._fx_hook is None:
        _registry.set_fx_hook(_proxy_hook)
    _free_proxies += 1
    weakref.finalize(proxy, _release_hook)


def _release_hook() -> None:
    global _free_proxies
    _free_proxies -= 1
    if _free_proxies == 0 and not _tracing and _registry._fx_hook is _proxy_hook:
        _registry.set_fx_hook(None)


def wrap(fn_or_name):
    """Record calls of a module-level function as call_function leaves (calling module's globals)."""
    name = fn_or_name if isinstance(fn_or_name, str) else fn_or_name.__name__
    caller = inspect.currentframe().f_back
    if caller.f_code.co_name != "<module>":
        raise NotImplementedError("wrap must be called at the top level of a module")
    _wrapped.append((caller.f_globals, name))
    return fn_or_name


class Tracer:
    """Turns a Module or function into a Graph by running it on Proxies (see module docstring)."""

    def __init__(self, autowrap_modules=(), autowrap_functions=(), param_shapes_constant: bool = False):
        self.graph: Graph | None = None
        self.root: Module | None = None
        self._attr_names: dict = {}
        self._attr_proxies: dict = {}
        self._n_consts = 0

    # ---- node creation --------------------------------------------------------------------------
    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> Node:
        return self.graph.create_node(kind, target, args, kwargs, name, type_expr)

    def proxy(self, node: Node) -> Proxy:
        return Proxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None) -> Proxy:
        node = self.create_node(kind, target, self.create_arg(tuple(args)), self.create_arg(dict(kwargs)),
                                name, type_expr)
        return proxy_factory_fn(node) if proxy_factory_fn else self.proxy(node)

    def create_arg(self, a) -> Any:
        """Map a Python value to a node argument: Proxies to their nodes, tensors to get_attr nodes."""
        def leaf(x):
            if isinstance(x, Proxy):
                return x.node
            if isinstance(x, Tensor):
                return self._tensor_attr(x).node
            if isinstance(x, Module):
                return self.create_node("get_attr", self.path_of_module(x), (), {})
            return x
        return map_aggregate(a, leaf)

    def _tensor_attr(self, t: Tensor) -> Proxy:
        name = self._attr_names.get(id(t))
        if name is None:
            name = f"_tensor_constant{self._n_consts}"
            self._n_consts += 1
            setattr(self.root, name, t)
            self._attr_names[id(t)] = name
        p = self._attr_proxies.get(name)
        if p is None:
            p = self._attr_proxies[name] = self.create_proxy("get_attr", name, (), {})
        return p

    # ---- modules --------------------------------------------------------------------------------
    def is_leaf_module(self, m: Module, module_qualified_name: str) -> bool:
        mod = type(m).__module__
        return mod.startswith("flambeau.nn") and not isinstance(m, (Sequential, ModuleList, ModuleDict))

    def path_of_module(self, mod: Module) -> str:
        for name, m in self.root.named_modules():
            if m is mod:
                return name
        raise NameError("module is not installed as a submodule")

    def call_module(self, m: Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        path = self.path_of_module(m)
        if not self.is_leaf_module(m, path):
            return forward(*args, **kwargs)
        return self.create_proxy("call_module", path, args, kwargs)

    def getattr(self, attr: str, attr_val, parameter_proxy_cache: dict | None = None):
        if isinstance(attr_val, Parameter) and id(attr_val) in self._attr_names:
            return self._tensor_attr(attr_val)
        return attr_val

    # ---- tracing --------------------------------------------------------------------------------
    def trace(self, root, concrete_args: dict | None = None) -> Graph:
        if isinstance(root, Module):
            self.root = root
            fn = type(root).forward
        else:
            self.root = Module()
            fn = root
        self.graph = Graph(tracer_cls=type(self))
        self._attr_names = {id(t): n for n, t in self.root.named_parameters()}
        self._attr_names.update({id(t): n for n, t in self.root.named_buffers()})
        self._attr_proxies = {}
        concrete_args = concrete_args or {}
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        args = [self.root] if isinstance(root, Module) else []
        for p in params[len(args):]:
            if p.name in concrete_args:
                args.append(concrete_args[p.name])
            elif p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TraceError(f"symbolic_trace does not support *args/**kwargs parameters ({p.name})")
            else:
                default = inspect.Signature.empty if p.default is p.empty else p.default
                args.append(self.proxy(self.graph.placeholder(p.name, default_value=default)))
        with _patched(self):
            result = fn(*args)
        self.graph.output(self.create_arg(result))
        return self.graph


class GraphAppendingTracer(Tracer):
    """The tracer of Proxies made around an existing graph's nodes: operations on them append nodes to
    `graph` (at its insertion point)."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.root = Module()


class _patched:
    """While tracing: route Module calls, parameter reads, registry ops and wrapped functions here."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    def __enter__(self):
        global _tracing
        _tracing += 1
        tracer = self.tracer
        self.saved_call = Module.__call__
        self.saved_getattr = Module.__getattr__
        saved_call, saved_getattr = self.saved_call, self.saved_getattr

        def module_call(mod, *args, **kwargs):
            return tracer.call_module(mod, lambda *a, **k: saved_call(mod, *a, **k), args, kwargs)

        def module_getattr(mod, name):
            return tracer.getattr(name, saved_getattr(mod, name))

        Module.__call__ = module_call
        Module.__getattr__ = module_getattr
        self.saved_hook = _registry.set_fx_hook(_proxy_hook)
        self.saved_globals = []
        for g, name in _wrapped:
            orig = g[name] if name in g else getattr(builtins, name)
            self.saved_globals.append((g, name, g.get(name, _MISSING)))
            g[name] = _leaf_wrapper(orig)
        return self

    def __exit__(self, *exc):
        global _tracing
        _tracing -= 1
        Module.__call__ = self.saved_call
        Module.__getattr__ = self.saved_getattr
        released = self.saved_hook is _proxy_hook and _free_proxies == 0 and not _tracing
        _registry.set_fx_hook(None if released else self.saved_hook)
        for g, name, old in reversed(self.saved_globals):
            if old is _MISSING:
                del g[name]
            else:
                g[name] = old
        return False


_MISSING = object()


def _leaf_wrapper(fn):
    def call(*args, **kwargs):
        r = _proxy_hook(fn, args, kwargs)
        return fn(*args, **kwargs) if r is NotImplemented else r
    call.__name__ = getattr(fn, "__name__", "fn")
    return call


def symbolic_trace(root, concrete_args: dict | None = None):
    """Trace a Module or function into a GraphModule with Python-level (Proxy) tracing."""
    tracer = Tracer()
    graph = tracer.trace(root, concrete_args)
    name = type(root).__name__ if isinstance(root, Module) else root.__name__
    return GraphModule(tracer.root, graph, name)
