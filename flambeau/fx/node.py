"""FX nodes: one operation of a `Graph` (placeholder, get_attr, call_function, call_method,
call_module or output), its arguments (which may reference other nodes), its users, and `meta`.

Nodes form a doubly linked list owned by their graph (`_prev`/`_next`); `args`/`kwargs` setters
keep the `users` maps of the referenced nodes up to date, so rewrites (`replace_all_uses_with`,
`replace_input_with`) are cheap and the def-use chains are always exact.
"""
from __future__ import annotations

import builtins
from typing import Any, Callable

from ._aten import is_op

OPCODES = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output", "root")


def map_aggregate(a, fn: Callable):
    """Apply `fn` to every leaf of a nested tuple/list/dict/slice structure."""
    if isinstance(a, tuple):
        r = tuple(map_aggregate(x, fn) for x in a)
        return type(a)(*r) if hasattr(a, "_fields") else r
    if isinstance(a, list):
        return [map_aggregate(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_aggregate(a.start, fn), map_aggregate(a.stop, fn), map_aggregate(a.step, fn))
    return fn(a)


def map_arg(a, fn: Callable):
    """Apply `fn` to every Node inside the argument structure `a`."""
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    if is_op(target):
        return f"flambeau.ops.{target.namespace}." + op_attr_path(target)
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    if mod in ("_operator", "operator"):
        return "operator." + name
    if mod == "builtins" or target is getattr(builtins, name, None):
        return name
    return f"{mod}.{name}" if mod else name


def op_attr_path(op) -> str:
    """`add.Tensor` for the Op `aten.add.Tensor`, `relu.default` for an op without overload."""
    s = op._schema
    return f"{s.name}.{s.overload or 'default'}"


class Node:
    """One operation in a Graph (see module docstring)."""

    def __init__(self, graph, name: str, op: str, target, args: tuple, kwargs: dict, return_type=None):
        if op not in OPCODES:
            raise ValueError(f"unknown node opcode {op!r}")
        if op in ("call_method", "call_module", "get_attr", "placeholder") and not isinstance(target, str):
            raise ValueError(f"node target for {op} must be a string, got {target!r}")
        if op == "call_function" and not callable(target):
            raise ValueError(f"node target for call_function must be callable, got {target!r}")
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.type = return_type
        self._input_nodes: dict = {}
        self.users: dict = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._prev = self
        self._next = self
        self._erased = False
        self.meta: dict = {}
        self._update_args_kwargs(args, kwargs)

    # ---- linked list ------------------------------------------------------------------------
    @property
    def next(self) -> "Node":
        return self._next

    @property
    def prev(self) -> "Node":
        return self._prev

    def prepend(self, x: "Node") -> None:
        """Move (or insert) `x` right before this node."""
        if x is self:
            return
        x._remove_from_list()
        p = self._prev
        p._next, x._prev, x._next, self._prev = x, p, self, x

    def append(self, x: "Node") -> None:
        """Move (or insert) `x` right after this node."""
        self._next.prepend(x)

    def _remove_from_list(self):
        p, n = self._prev, self._next
        p._next, n._prev = n, p
        self._prev = self._next = self

    # ---- arguments and users ------------------------------------------------------------------
    @property
    def args(self) -> tuple:
        return self._args

    @args.setter
    def args(self, a):
        self._update_args_kwargs(tuple(a), self._kwargs)

    @property
    def kwargs(self) -> dict:
        return self._kwargs

    @kwargs.setter
    def kwargs(self, k):
        self._update_args_kwargs(self._args, dict(k))

    def _update_args_kwargs(self, args, kwargs):
        for old in self._input_nodes:
            old.users.pop(self, None)
        self._input_nodes = {}
        seen = self._input_nodes

        def note(n):
            seen.setdefault(n, None)
            return n
        self._args = map_arg(tuple(args), note)
        self._kwargs = map_arg(dict(kwargs), note)
        for n in seen:
            n.users.setdefault(self, None)

    @property
    def all_input_nodes(self) -> list:
        return list(self._input_nodes)

    def update_arg(self, idx: int, arg) -> None:
        a = list(self._args)
        a[idx] = arg
        self.args = tuple(a)

    def update_kwarg(self, key: str, arg) -> None:
        k = dict(self._kwargs)
        k[key] = arg
        self.kwargs = k

    def replace_input_with(self, old_input: "Node", new_input: "Node") -> None:
        def f(n):
            return new_input if n is old_input else n
        self._update_args_kwargs(map_arg(self._args, f), map_arg(self._kwargs, f))

    def replace_all_uses_with(self, replace_with: "Node", delete_user_cb: Callable = lambda u: True,
                              *, propagate_meta: bool = False) -> list:
        """Make every user of this node use `replace_with` instead; returns the changed users."""
        if propagate_meta:
            for k, v in self.meta.items():
                replace_with.meta.setdefault(k, v)
        changed = []
        for user in list(self.users):
            if not delete_user_cb(user):
                continue
            user.replace_input_with(self, replace_with)
            changed.append(user)
        return changed

    # ---- semantics -----------------------------------------------------------------------------
    def is_impure(self) -> bool:
        """Side-effecting nodes survive dead-code elimination."""
        if self.op in ("placeholder", "output"):
            return True
        if self.op == "call_function":
            t = self.target
            if is_op(t):
                return t.is_inplace or any(a.mutated for a in t._schema.args) or "out" in self._kwargs
            return t in _SIDE_EFFECTFUL
        if self.op == "call_module" and self.graph.owning_module is not None:
            m = self.graph.owning_module.get_submodule(self.target)
            return bool(getattr(m, "_is_impure", False))
        if self.op == "call_method":
            return isinstance(self.target, str) and self.target.endswith("_") and not self.target.startswith("__")
        return False

    # ---- printing -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        return self.name

    def format_node(self, placeholder_names: list | None = None, maybe_return_typename: list | None = None) -> str:
        """The node as one line of `str(graph)`, e.g. `%add : [num_users=1] = call_function[...]`."""
        if self.op == "placeholder":
            if placeholder_names is not None:
                placeholder_names.append(self.target)
                return None
            default = f" (default={self.args[0]!r})" if self.args else ""
            return f"%{self.name} : [num_users={len(self.users)}] = placeholder[target={self.target}]{default}"
        if self.op == "output":
            return f"return {_fmt_arg(self.args[0])}"
        tgt = _target_name(self.target)
        return (f"%{self.name} : [num_users={len(self.users)}] = {self.op}[target={tgt}]"
                f"(args = {_fmt_arg(self.args)}, kwargs = {_fmt_arg(self.kwargs)})")


_SIDE_EFFECTFUL: set = {builtins.print}


def _fmt_arg(a) -> str:
    if isinstance(a, Node):
        return "%" + a.name
    if isinstance(a, tuple):
        inner = ", ".join(_fmt_arg(x) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(_fmt_arg(x) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}: {_fmt_arg(v)}" for k, v in a.items()) + "}"
    return str(a)


Argument = Any
Target = Any
