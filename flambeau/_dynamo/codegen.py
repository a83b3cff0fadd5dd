"""Python source of a compiled entry: run the graph, replay side effects, rebuild the frame's values.

`EntryCodegen` turns trackers back into Python expressions over the entry's arguments (the frame's
locals at entry, `F`, `G`) and the graph outputs `___o`: tensors produced by the graph are
`___o[i]`, values read from the frame are their source expressions, containers built in the
frame are rebuilt (once each, in a temporary, so aliasing survives), constants are literals or
names bound in the entry's globals. `render()` returns the source of one function.
"""
from __future__ import annotations

import itertools

from .guards import _literal
from .variables.containers import TupleVariable


class EntryCodegen:
    def __init__(self, guard_consts: dict):
        self.ns: dict = dict(guard_consts)
        self._const_ids: dict = {}
        self.prelude: list = []            # statements before the graph call (inputs copied to a device)
        self.statements: list = []
        self.outputs: list = []            # graph nodes returned by the graph, in order
        self._out_index: dict = {}
        self._memo: dict = {}
        self._tmp = itertools.count()
        self.input_tensors: dict = {}      # node -> source expr for graph inputs

    # ---- naming ----------------------------------------------------------------------------------
    def const(self, v) -> str:
        if _literal(v) and not (type(v) is str and len(v) > 200):
            return repr(v)
        k = id(v)
        name = self._const_ids.get(k)
        if name is None:
            name = f"___k{len(self._const_ids)}"
            self._const_ids[k] = name
            self.ns[name] = v
        return name

    def source_expr(self, src) -> str:
        return src.expr

    def new_temp(self, expr: str) -> str:
        t = f"___v{next(self._tmp)}"
        self.statements.append(f"{t} = {expr}")
        return t

    # ---- values ----------------------------------------------------------------------------------
    def tensor(self, vt) -> str:
        node = vt.node
        if node in self.input_tensors:
            return self.input_tensors[node]
        attr_source = getattr(vt, "attr_source", None)
        if attr_source is not None:            # a parameter/buffer: the object itself, not a graph output
            return attr_source.expr
        i = self._out_index.get(node)
        if i is None:
            i = self._out_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"___o[{i}]"

    def reconstruct(self, vt) -> str:
        hit = self._memo.get(id(vt))
        if hit is not None:
            return hit[1]
        expr = vt.reconstruct(self)
        self._memo[id(vt)] = (vt, expr)
        return expr

    def build_sequence(self, vt) -> str:
        if vt.source is not None:
            return vt.source.expr
        parts = [self.reconstruct(x) for x in vt.items]
        if isinstance(vt, TupleVariable):
            inner = "(" + "".join(p + ", " for p in parts) + ")"
            if vt.cls is tuple:
                return inner
            if hasattr(vt.cls, "_fields"):
                return f"{self.const(vt.cls)}(*{inner})"
            return f"{self.const(vt.cls)}({inner})"
        return self.new_temp("[" + ", ".join(parts) + "]")

    def build_dict(self, vt) -> str:
        if vt.source is not None:
            return vt.source.expr
        body = ", ".join(f"{self.const(k)}: {self.reconstruct(v)}" for k, v in vt.items.items())
        if vt.cls is dict:
            return self.new_temp("{" + body + "}")
        return self.new_temp(f"{self.const(vt.cls)}({{{body}}})")

    def build_set(self, vt) -> str:
        if vt.source is not None:
            return vt.source.expr
        if not vt.items:
            return self.new_temp("set()")
        return self.new_temp("{" + ", ".join(self.reconstruct(v) for v in vt.items.values()) + "}")

    # ---- rendering --------------------------------------------------------------------------------
    def render(self, argnames: list, graph_call: str | None, tail: str) -> str:
        lines = [f"def ___entry({', '.join(['F'] + argnames)}):"]
        lines += ["    " + s for s in self.prelude]
        if graph_call is not None:
            lines.append(f"    ___o = {graph_call}")
        lines += ["    " + s for s in self.statements]
        lines.append(f"    return {tail}")
        return "\n".join(lines) + "\n"
