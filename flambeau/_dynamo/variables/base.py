"""VariableTracker: the symbolic value of one Python object while a frame is evaluated.

Each tracker knows its `source` (where it was read from, for guards and for reaching it again at
run time, or None when the traced code created it), answers the questions the bytecode asks
(`var_getattr`, `call_function`, `call_method`, `unpack_var_sequence`, `truthy`), and can
`reconstruct` itself in the generated entry code when the real object is needed after the graph
(return values, live state at a graph break). Anything a tracker cannot do raises `Unsupported`.
"""
from __future__ import annotations

import enum
import inspect

import numpy as np

from ..exc import Unsupported
from ..._dtype import dtype as _dt
from ..._device import device as _dev
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)


class VariableTracker:
    source = None
    mutable = False

    def python_type(self) -> type:
        raise Unsupported(f"python_type of {self}")

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except Unsupported:
            return False

    def as_python_constant(self):
        raise Unsupported(f"{self} is not a constant")

    def var_getattr(self, tx, name: str) -> "VariableTracker":
        raise Unsupported(f"getattr({self}, {name!r})")

    def call_function(self, tx, args: list, kwargs: dict) -> "VariableTracker":
        raise Unsupported(f"call of {self}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        if name == "__getattribute__" and len(args) == 1 and args[0].is_python_constant():
            return self.var_getattr(tx, args[0].as_python_constant())
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def has_unpack_var_sequence(self, tx) -> bool:
        return False

    def unpack_var_sequence(self, tx) -> list:
        raise Unsupported(f"iterating over {self}")

    def truthy(self, tx):
        """bool(self) when known at trace time, else raise Unsupported (a data-dependent branch)."""
        if self.is_python_constant():
            return bool(self.as_python_constant())
        raise Unsupported(f"bool() of {self}")

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.source_expr(self.source)
        raise Unsupported(f"cannot rebuild {self} after the graph")

    def __repr__(self) -> str:
        return type(self).__name__


class NullVariable(VariableTracker):
    """The NULL CPython pushes below a callable."""

    def __repr__(self):
        return "NULL"


NULL = NullVariable()


class ValueVariable(VariableTracker):
    """A tracker that stands for one known Python object (a builtin, a class, a flambeau function):
    its type and constant value are the object's."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value


class ConstantVariable(VariableTracker):
    """An immutable Python value known at trace time (number, str, None, dtype, device, ...)."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def is_python_constant(self) -> bool:
        return True

    def var_getattr(self, tx, name):
        try:
            v = getattr(self.value, name)
        except AttributeError:
            raise Unsupported(f"AttributeError: {type(self.value).__name__!r} object has no attribute {name!r}")
        if callable(v) and not isinstance(v, type):
            return kinds.builtin.BoundConstantMethod(self, name)
        return kinds.builtin.wrap_constant_result(v)

    def call_method(self, tx, name, args, kwargs):
        return kinds.builtin.call_constant_method(tx, self, name, args, kwargs)

    def has_unpack_var_sequence(self, tx):
        return isinstance(self.value, (str, bytes, tuple, frozenset))

    def unpack_var_sequence(self, tx):
        if not self.has_unpack_var_sequence(tx):
            raise Unsupported(f"iterating over {type(self.value).__name__}")
        return [ConstantVariable(x) for x in self.value]

    def reconstruct(self, cg):
        return cg.const(self.value)

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


def is_constant_value(v) -> bool:
    """Values a ConstantVariable may hold (immutable and safe to embed)."""
    t = type(v)
    if t in (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented), range):
        return True
    if t in (_dt, _dev) or t.__name__ == "memory_format" or t.__name__ == "_Layout":
        return True
    if t is slice:
        return all(is_constant_value(x) for x in (v.start, v.stop, v.step))
    if t is frozenset:
        return all(is_constant_value(x) for x in v)
    if t in (inspect.Signature, inspect.Parameter) or isinstance(v, (np.dtype, np.generic)):
        return True
    if getattr(t, "_dynamo_trace_constant", False):     # a type declaring its instances fixed for a trace
        return True                                      # (distributed's ProcessGroup: PyTorch's ProcessGroupVariable)
    return isinstance(v, enum.Enum)      # a member is an immutable singleton (transformers' `Action.RAISE`)


def const(v) -> ConstantVariable:
    return ConstantVariable(v)
