"""GraphModule: an nn.Module whose `forward` is Python source generated from an FX Graph.

`GraphModule(root, graph)` copies from `root` (a Module or a dict) every submodule and attribute
the graph references (call_module / get_attr targets; plain tensors become buffers), then
`recompile()` generates `forward` (`gm.code`), compiles it and installs it on a per-instance
class, so editing `gm.graph` and calling `recompile()` changes only this module.
"""
from __future__ import annotations

import copy
import itertools
import linecache

from ..nn.modules.module import Module
from ..nn.parameter import Parameter
from .._code_cache import compile_source
from .._tensor import Tensor
from . import packed_graph
from .graph import Graph, PythonCode

_keys = itertools.count()


def _copy_attr(src, dst: Module, target: str) -> None:
    *prefix, field = target.split(".")
    for item in prefix:
        f = getattr(src, item) if not isinstance(src, dict) else src[item]
        t = getattr(dst, item, None)
        if f is t:
            return
        if t is None:
            t = Module()
            setattr(dst, item, t)
        src, dst = f, t
    orig = src[field] if isinstance(src, dict) else getattr(src, field)
    if isinstance(orig, Tensor) and not isinstance(orig, Parameter):
        if field in dst.__dict__:
            del dst.__dict__[field]
        dst.register_buffer(field, orig)
    else:
        setattr(dst, field, orig)


def _exec_with_source(src: str, globals_: dict) -> dict:
    key = f"<eval_with_key>.{next(_keys)}"
    linecache.cache[key] = (len(src), None, src.splitlines(True), key)
    env = dict(globals_)
    exec(compile_source(src, key), env)
    return env


class GraphModule(Module):
    """A Module generated from a Graph (see module docstring)."""

    def __new__(cls, *args, **kwargs):
        base = cls
        while base.__dict__.get("_per_instance"):
            base = base.__mro__[1]
        impl = type("GraphModuleImpl", (base,), {"_per_instance": True})
        return object.__new__(impl)

    def __init__(self, root, graph: Graph, class_name: str = "GraphModule"):
        super().__init__()
        type(self).__name__ = class_name
        type(self).__qualname__ = class_name
        if isinstance(root, Module):
            if hasattr(root, "training"):
                self.training = root.training
        elif not isinstance(root, dict):
            raise RuntimeError("Unsupported type " + str(root) + " passed for root!")
        for node in graph.nodes:
            if node.op in ("get_attr", "call_module"):
                _copy_attr(root, self, node.target)
        self._tracer_cls = None
        self.meta: dict = {}
        self.graph = graph

    @property
    def graph(self) -> Graph:
        return self._graph

    def pack_graph(self) -> None:
        """Keep the graph as bytes until it is read again (packed_graph.py): for a graph kept only for a
        later recompile, whose nodes every full garbage collection would otherwise walk. `forward` and
        `code` stay; the first read of `graph` unpacks it."""
        g = self.__dict__.pop("_graph", None)
        if g is not None:
            self.__dict__["_packed_graph"] = packed_graph.pack(g)

    def __getattr__(self, name: str):
        if name == "_graph" and "_packed_graph" in self.__dict__:
            g = packed_graph.unpack(self.__dict__["_packed_graph"])
            g.owning_module = self
            self.__dict__["_graph"] = g
            self.__dict__.pop("_packed_graph", None)
            return g
        return super().__getattr__(name)

    @graph.setter
    def graph(self, g: Graph) -> None:
        self.__dict__["_graph"] = g
        self.__dict__.pop("_packed_graph", None)
        g.owning_module = self
        self.recompile()

    @property
    def code(self) -> str:
        return self._code

    def recompile(self) -> PythonCode:
        """Regenerate `forward` from `self.graph` (call after editing the graph)."""
        pc = self._graph.python_code(root_module="self")
        self.__dict__["_code"] = pc.src
        env = _exec_with_source(pc.src, pc.globals)
        type(self).forward = env["forward"]
        return pc

    def print_readable(self, print_output: bool = True, include_stride: bool = False,
                       include_device: bool = False, colored: bool = False) -> str:
        """The generated code inside a class header, each value annotated with its dtype and shape."""
        pc = _annotated_code(self._graph, include_stride, include_device)
        name = type(self).__name__
        lines = [f"class {name}(flambeau.nn.Module):"] + ["    " + ln if ln else ln for ln in pc.strip("\n").split("\n")]
        out = "\n".join(lines) + "\n"
        if print_output:
            print(out)
        return out

    def add_submodule(self, target: str, m: Module) -> bool:
        *prefix, field = target.split(".")
        mod = self
        for item in prefix:
            sub = getattr(mod, item, None)
            if sub is None:
                sub = Module()
                setattr(mod, item, sub)
            if not isinstance(sub, Module):
                return False
            mod = sub
        setattr(mod, field, m)
        return True

    def delete_submodule(self, target: str) -> bool:
        *prefix, field = target.split(".")
        mod = self
        for item in prefix:
            if not hasattr(mod, item):
                return False
            mod = getattr(mod, item)
        if field not in mod._modules:
            return False
        del mod._modules[field]
        return True

    def delete_all_unused_submodules(self) -> None:
        used = set()
        for n in self._graph.nodes:
            if n.op in ("call_module", "get_attr"):
                parts = n.target.split(".")
                for i in range(1, len(parts) + 1):
                    used.add(".".join(parts[:i]))
        for name, _ in list(self.named_modules()):
            if name and name not in used:
                self.delete_submodule(name)

    def __deepcopy__(self, memo) -> "GraphModule":
        res = GraphModule.__new__(type(self))
        memo[id(self)] = res
        state = copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("_graph", "_code")}, memo)
        res.__dict__.update(state)
        type(res).__name__ = type(res).__qualname__ = type(self).__name__
        res.graph = copy.deepcopy(self._graph, memo)
        return res

    def __str__(self) -> str:
        return super().__repr__() + "\n\n\n" + self._code.strip("\n") + "\n"

    def __repr__(self) -> str:
        return super().__repr__()


_ABBR = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
         "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8", "complex64": "c64",
         "complex128": "c128"}


def _annotation(val, include_stride, include_device) -> str | None:
    if isinstance(val, Tensor):
        s = f"{_ABBR.get(val.dtype.name, val.dtype.name)}[{', '.join(map(str, val.shape))}]"
        if include_stride:
            s += f"[{', '.join(map(str, val.stride()))}]"
        if include_device:
            s += str(val.device)
        return s
    if isinstance(val, (tuple, list)):
        parts = [_annotation(v, include_stride, include_device) or type(v).__name__ for v in val]
        return "(" + ", ".join(parts) + ")"
    return None


def _annotated_code(graph: Graph, include_stride: bool, include_device: bool) -> str:
    src = graph.python_code(root_module="self").src
    ann = {n.name: _annotation(n.meta.get("val"), include_stride, include_device) for n in graph.nodes}
    out = []
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    for line in src.split("\n"):
        if line.startswith("def forward(") and phs and not any(n.args for n in phs):     # (defaults: as is)
            line = "def forward(self, " + ", ".join(f'{n.target}: "{ann[n.name]}"' if ann.get(n.name) else n.target
                                                    for n in phs) + "):"
        head = line.strip().split(" = ", 1)[0]
        a = ann.get(head)
        if a and line.startswith("    ") and not line.strip().startswith("return"):
            line = line.replace(f"{head} = ", f'{head}: "{a}" = ', 1)
        out.append(line)
    return "\n".join(out)
