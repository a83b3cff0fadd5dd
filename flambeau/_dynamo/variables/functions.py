"""User functions while tracing: calls are inlined (their bytecode is evaluated in a child translator).

`UserFunctionVariable` is an existing Python function (its closure cells are read through its
source, so they are guarded); `NestedUserFunctionVariable` is a function the traced code created
with MAKE_FUNCTION (lambdas, nested defs, comprehensions on 3.11), whose defaults and closure cells
are trackers; `UserMethodVariable` binds `self`. `CellVariable` is a closure cell created inside
the traced code. Functions marked with `flambeau._dynamo.disable` are never inlined (graph break).
"""
from __future__ import annotations

import inspect
import types
from inspect import (CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR, CO_ITERABLE_COROUTINE, CO_VARARGS,
                     CO_VARKEYWORDS)

from ..exc import Unsupported
from .base import VariableTracker, ConstantVariable, const
from .builder import build, wrap_constant_like
from .containers import TupleVariable, DictVariable
from ..utils import is_disabled
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)


class CellVariable(VariableTracker):
    """A closure cell made by the traced code (MAKE_CELL); `value` is None while empty."""
    mutable = True

    def __init__(self, value: VariableTracker | None = None):
        self.value = value

    def reconstruct(self, cg):
        cell = cg.const(types.CellType)
        return cg.new_temp(f"{cell}({cg.reconstruct(self.value)})" if self.value is not None else f"{cell}()")


class RealCellVariable(VariableTracker):
    """An existing closure cell of the compiled function (its contents read through `source`, the
    cell itself through `cell_expr`)."""

    def __init__(self, cell, source, cell_expr=None):
        self.cell = cell
        self.source = source
        self.cell_expr = cell_expr

    def reconstruct(self, cg):
        if self.cell_expr is None:
            raise Unsupported("a closure cell without a source is live after the graph")
        return self.cell_expr


class BaseFunctionVariable(VariableTracker):
    def python_type(self):
        return types.FunctionType


class UserFunctionVariable(BaseFunctionVariable):
    def __init__(self, fn, source=None):
        self.value = fn
        self.source = source

    def __repr__(self):
        return f"UserFunctionVariable({self.value.__qualname__})"

    def as_python_constant(self):
        return self.value

    def get_code(self):
        return self.value.__code__

    def call_function(self, tx, args, kwargs):
        if is_disabled(self.value):
            raise Unsupported(f"call to {self.value.__qualname__}, marked flambeau._dynamo.disable")
        if self.value is inspect.signature and len(args) == 1 and not kwargs:
            return _signature(args[0])
        return tx.inline_call(self.value, args, kwargs, source=self.source)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return const(getattr(self.value, name))
        if name in self.value.__dict__:
            src = self.source.attr(name) if self.source is not None else None
            if src is None:
                raise Unsupported("attribute of a function without a source")
            return build(tx, self.value.__dict__[name], src)
        if name == "__code__":
            return ConstantVariable(self.value.__code__)
        raise Unsupported(f"function attribute {name}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.const(self.value)


def _signature(fn: VariableTracker) -> VariableTracker:
    """`inspect.signature(fn)` of a function the trace knows, computed at trace time (the function is
    guarded already; inlining `inspect` would meet `functools.partial` and C internals)."""
    if isinstance(fn, UserMethodVariable):
        sig = inspect.signature(fn.value)
        return const(sig.replace(parameters=list(sig.parameters.values())[1:]))
    if isinstance(fn, UserFunctionVariable):
        return const(inspect.signature(fn.value))
    raise Unsupported(f"inspect.signature of {fn}")


class NestedUserFunctionVariable(BaseFunctionVariable):
    """A function object created by MAKE_FUNCTION inside the traced code."""

    def __init__(self, code, f_globals, name, defaults=None, kwdefaults=None, closure=None, annotations=None):
        self.code = code
        self.f_globals = f_globals
        self.name = name
        self.defaults = defaults          # TupleVariable or None
        self.kwdefaults = kwdefaults      # DictVariable or None
        self.closure = closure            # list of CellVariable / RealCellVariable, or None
        self.annotations = annotations

    def __repr__(self):
        return f"NestedUserFunctionVariable({self.name})"

    def get_code(self):
        return self.code

    def signature_fn(self):
        """A function object with this code and these defaults (the trackers), for argument binding."""
        cells = tuple(types.CellType() for _ in self.code.co_freevars) or None
        f = types.FunctionType(self.code, self.f_globals, self.name, None, cells)
        if self.defaults is not None:
            f.__defaults__ = tuple(self.defaults.items)
        if self.kwdefaults is not None:
            f.__kwdefaults__ = dict(self.kwdefaults.items)
        return f

    def call_function(self, tx, args, kwargs):
        return tx.inline_call(self.signature_fn(), args, kwargs, closure=self.closure)

    def real_function(self):
        """The function as a Python object, for a higher-order op that traces it later (`flambeau.cond`):
        its free variables must be real values (modules, constants), not tensors of the graph."""
        cells = []
        for c in self.closure or ():
            if isinstance(c, RealCellVariable):
                cells.append(c.cell)
                continue
            v = c.value
            if v is None or isinstance(v, kinds.TensorVariable) or not hasattr(v, "value") and \
                    not v.is_python_constant():
                raise Unsupported(f"the function {self.name} passed to a higher-order op closes over {v}, a value "
                                  "computed in the graph: pass tensors as operands")
            cells.append(types.CellType(v.as_python_constant() if v.is_python_constant() else v.value))
        f = types.FunctionType(self.code, self.f_globals, self.name, None, tuple(cells) or None)
        if self.defaults is not None:
            f.__defaults__ = tuple(d.as_python_constant() for d in self.defaults.items)
        return f

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__"):
            return const(self.name)
        if name == "__code__":
            return ConstantVariable(self.code)
        raise Unsupported(f"attribute {name} of a nested function")

    def reconstruct(self, cg):
        defaults = cg.reconstruct(self.defaults) if self.defaults is not None else "None"
        closure = "None"
        if self.closure:
            closure = "(" + "".join(f"{cg.reconstruct(c)}, " for c in self.closure) + ")"
        fn = cg.new_temp(f"{cg.const(types.FunctionType)}({cg.const(self.code)}, G, {self.name!r}, "
                         f"{defaults}, {closure})")
        if self.kwdefaults is not None:
            cg.statements.append(f"{fn}.__kwdefaults__ = {cg.reconstruct(self.kwdefaults)}")
        return fn


class UserMethodVariable(BaseFunctionVariable):
    """`obj.method` for a Python-level method of a traced object."""

    def __init__(self, fn, obj: VariableTracker, source=None):
        self.value = fn
        self.obj = obj
        self.source = source

    def __repr__(self):
        return f"UserMethodVariable({self.value.__qualname__})"

    def python_type(self):
        return types.MethodType

    def get_code(self):
        return self.value.__code__

    def call_function(self, tx, args, kwargs):
        if is_disabled(self.value):
            raise Unsupported(f"call to {self.value.__qualname__}, marked flambeau._dynamo.disable")
        fn_source = self.source.attr("__func__") if self.source is not None else None
        return tx.inline_call(self.value, [self.obj] + list(args), kwargs, source=fn_source)

    def var_getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return UserFunctionVariable(self.value)
        if name in ("__name__", "__qualname__"):
            return const(getattr(self.value, name))
        raise Unsupported(f"method attribute {name}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return f"{cg.const(types.MethodType)}({cg.const(self.value)}, {cg.reconstruct(self.obj)})"


def bind_arguments(fn, args: list, kwargs: dict) -> dict:
    """{parameter name: tracker} for calling `fn` (a function object whose defaults may be trackers),
    following CPython's rules for positional, keyword-only, *args and **kwargs parameters."""
    code = fn.__code__
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:npos]
    kw_names = names[npos:npos + nkw]
    i = npos + nkw
    var_name = names[i] if code.co_flags & CO_VARARGS else None
    i += bool(code.co_flags & CO_VARARGS)
    varkw_name = names[i] if code.co_flags & CO_VARKEYWORDS else None
    out = {}
    for name, v in zip(pos_names, args):
        out[name] = v
    extra = list(args[npos:])
    if extra and var_name is None:
        raise Unsupported(f"TypeError: {code.co_name}() takes {npos} positional arguments but {len(args)} were given")
    rest_kw = {}
    posonly = set(pos_names[:code.co_posonlyargcount])
    for k, v in kwargs.items():
        if (k in pos_names and k not in posonly) or k in kw_names:
            if k in out:
                raise Unsupported(f"TypeError: {code.co_name}() got multiple values for argument {k!r}")
            out[k] = v
        elif varkw_name is not None:
            rest_kw[k] = v
        else:
            raise Unsupported(f"TypeError: {code.co_name}() got an unexpected keyword argument {k!r}")
    defaults = fn.__defaults__ or ()
    first_default = npos - len(defaults)
    for j, name in enumerate(pos_names):
        if name not in out:
            if j < first_default:
                raise Unsupported(f"TypeError: {code.co_name}() missing required argument {name!r}")
            out[name] = defaults[j - first_default]
    kwdefaults = fn.__kwdefaults__ or {}
    for name in kw_names:
        if name not in out:
            if name not in kwdefaults:
                raise Unsupported(f"TypeError: {code.co_name}() missing keyword-only argument {name!r}")
            out[name] = kwdefaults[name]
    if var_name is not None:
        out[var_name] = TupleVariable(extra)
    if varkw_name is not None:
        out[varkw_name] = DictVariable(rest_kw)
    for k, v in out.items():
        if not isinstance(v, VariableTracker):
            if isinstance(v, (list, dict, set)):
                raise Unsupported(f"mutable default argument {k!r} of {code.co_name}")
            out[k] = wrap_constant_like(v)
    return out


def is_generator_code(code) -> bool:
    return bool(code.co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
