"""Arbitrary Python objects, classes and modules while tracing.

`ObjectVariable` is an object the frame read (an argument, a global, an attribute): attribute reads
look the attribute up statically (`inspect.getattr_static`, so no user code runs while tracing):
instance data is read through its source (and guarded), Python methods and properties are
inlined, and attribute writes are recorded as side effects replayed after the graph.
`ClassVariable` is a class (calling it builds namedtuples / flambeau.Size; other classes break the
graph), `PythonModuleVariable` a module such as `math` or `flambeau.nn.functional`.
"""
from __future__ import annotations

import collections
import inspect
import types

import numpy as np

from ..exc import Unsupported
from .base import VariableTracker, ValueVariable, const, is_constant_value
from ...autograd.function import Function
from ..._tensor import Size
from .torch import TorchFunctionVariable, AutogradFunctionApplyVariable, class_call
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)


# dict's methods that only read, answered for a dict subclass instance from its guarded entries
_DICT_READS = frozenset({"keys", "values", "items", "__getitem__", "get", "__len__", "__contains__", "__iter__"})
# the types of methods written in C (`dict.keys`, `list.append`, `object.__eq__`)
_C_METHODS = frozenset({"method_descriptor", "wrapper_descriptor", "builtin_function_or_method",
                        "classmethod_descriptor"})


def _is_dict_method(meth, name: str) -> bool:
    """Is `meth` dict's or OrderedDict's own (C) method `name`, not one a subclass wrote?"""
    return meth is getattr(dict, name) or meth is getattr(collections.OrderedDict, name, None)


def _missing_attr(obj_desc: str, name: str):
    return kinds.builtin.ObservedAttributeError(f"AttributeError: {obj_desc} has no attribute {name!r}")


def read_attribute(tx, vt: VariableTracker, value, name: str) -> VariableTracker:
    """`value.name` for an object `value` reached through `vt.source`, without running user code
    except as traced (properties and methods are inlined)."""
    pending = tx.output.side_effects.pending_attr(vt, name)
    if pending is not None:
        return pending
    try:
        static = inspect.getattr_static(value, name)
    except AttributeError:
        getattr_hook = inspect.getattr_static(type(value), "__getattr__", None)
        if getattr_hook is not None and isinstance(getattr_hook, types.FunctionType):
            return tx.inline_call(getattr_hook, [vt, const(name)], {})
        raise _missing_attr(f"'{type(value).__name__}' object", name)
    src = vt.source.attr(name) if vt.source is not None else None
    inst_dict = getattr(value, "__dict__", None)
    if isinstance(inst_dict, dict) and name in inst_dict and not isinstance(value, type):
        if src is None:
            raise Unsupported(f"attribute {name} of an object without a source")
        return kinds.builder.build(tx, inst_dict[name], src)
    if isinstance(static, property):
        if static.fget is None:
            raise _missing_attr("property", name)
        return tx.inline_call(static.fget, [vt], {})
    if isinstance(static, staticmethod):
        if src is not None:
            return kinds.builder.build(tx, static.__func__, src)
        return kinds.functions.UserFunctionVariable(static.__func__)
    if isinstance(static, classmethod):
        return kinds.functions.UserMethodVariable(static.__func__, ClassVariable(type(value)))
    if isinstance(static, types.FunctionType) and not isinstance(value, type):
        return kinds.functions.UserMethodVariable(static, vt, src)
    if type(static).__name__ in ("member_descriptor", "getset_descriptor") or hasattr(type(static), "__get__"):
        if type(static).__name__ in ("member_descriptor", "getset_descriptor") and src is not None:
            return kinds.builder.build(tx, getattr(value, name), src)
        if callable(static) and type(static).__name__ in ("method_descriptor", "wrapper_descriptor",
                                                          "builtin_function_or_method"):
            return kinds.builtin.GetAttrVariable(vt, name)
        raise Unsupported(f"descriptor {type(static).__name__} for attribute {name}")
    if src is None:
        return kinds.builder.wrap_constant_like(static)
    return kinds.builder.build(tx, getattr(value, name), src)


class ObjectVariable(VariableTracker):
    """A user-defined (or otherwise unknown) Python object that exists outside the traced code."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def __repr__(self):
        return f"ObjectVariable({type(self.value).__name__})"

    def var_getattr(self, tx, name):
        if name == "__class__":
            return ClassVariable(type(self.value))
        return read_attribute(tx, self, self.value, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__setattr__" and len(args) == 2:
            tx.store_attr(self, args[0].as_python_constant(), args[1])
            return const(None)
        meth = inspect.getattr_static(type(self.value), name, None)
        if isinstance(meth, types.FunctionType):
            return tx.inline_call(meth, [self] + list(args), kwargs)
        if isinstance(self.value, dict) and name in _DICT_READS and _is_dict_method(meth, name):
            return self._dict_view(tx).call_method(tx, name, args, kwargs)
        if meth is not None and type(meth).__name__ in _C_METHODS:
            # reading it back as an attribute gives a bound method whose call lands here again
            raise Unsupported(f"call to {type(self.value).__name__}.{name} ({type(meth).__name__}: a method "
                              f"written in C, which the trace cannot follow)")
        return super().call_method(tx, name, args, kwargs)

    def _dict_view(self, tx):
        """The entries of a dict subclass instance that came from outside the frame (a transformers
        `ModelOutput` returned by a graph break), read through dict's own item lookup and guarded on
        its keys, for the read-only dict methods its Python methods call (`keys`, `items`, ...)."""
        value = self.value
        if self.source is None:
            raise Unsupported(f"dict methods of a {type(value).__name__} without a source")
        keys = list(value.keys())
        if not all(is_constant_value(k) for k in keys):
            raise Unsupported(f"a {type(value).__name__} with non-constant keys")
        tx.output.guards.dict_keys(self.source, type(value), keys)
        return kinds.containers.DictVariable(
            {k: kinds.builder.build(tx, dict.__getitem__(value, k), self.source.dict_item(k)) for k in keys},
            cls=type(value))

    def call_function(self, tx, args, kwargs):
        call = inspect.getattr_static(type(self.value), "__call__", None)
        if isinstance(call, types.FunctionType):
            return tx.inline_call(call, [self] + list(args), kwargs)
        raise Unsupported(f"call to an object of type {type(self.value).__name__}")

    def truthy(self, tx):
        tp = type(self.value)
        if getattr(tp, "__bool__", None) is None and getattr(tp, "__len__", None) is None:
            return True
        raise Unsupported(f"bool() of a {tp.__name__}")

    def has_unpack_var_sequence(self, tx):
        return False

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.const(self.value)


class ClassVariable(ValueVariable):
    def __repr__(self):
        return f"ClassVariable({self.value.__name__})"

    def var_getattr(self, tx, name):
        if name == "apply" and isinstance(self.value, type) and issubclass(self.value, Function):
            return AutogradFunctionApplyVariable(self.value)
        try:
            static = inspect.getattr_static(self.value, name)
        except AttributeError:
            raise _missing_attr(f"type object '{self.value.__name__}'", name)
        if isinstance(static, staticmethod):
            static = static.__func__
        if isinstance(static, classmethod):
            return kinds.functions.UserMethodVariable(static.__func__, self)
        if self.source is not None:
            return kinds.builder.build(tx, getattr(self.value, name), self.source.attr(name))
        return kinds.builder.wrap_constant_like(getattr(self.value, name))

    def call_function(self, tx, args, kwargs):
        cls = self.value
        if cls is Size:
            (seq,) = args
            return kinds.containers.TupleVariable(seq.unpack_var_sequence(tx), cls=Size)
        if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            bound = kinds.functions.bind_arguments(cls.__new__, [self] + list(args), kwargs)
            return kinds.containers.TupleVariable([bound[f] for f in cls._fields], cls=cls)
        if issubclass(cls, np.generic) and all(a.is_python_constant() for a in args) and not kwargs:
            return kinds.base.ConstantVariable(cls(*[a.as_python_constant() for a in args]))   # np.float32(2)
        if cls in (list, tuple, dict, set, range, int, float, bool, str, slice, enumerate, zip, map,
                   filter, reversed, frozenset, object, super, type):
            return kinds.builtin.BuiltinVariable(cls).call_function(tx, args, kwargs)
        r = class_call(tx, cls, args, kwargs)
        if r is not None:
            return r
        raise Unsupported(f"constructing a {cls.__name__} object")

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.const(self.value)


class PythonModuleVariable(VariableTracker):
    def __init__(self, module, source=None):
        self.value = module
        self.source = source

    def python_type(self):
        return types.ModuleType

    def as_python_constant(self):
        return self.value

    def __repr__(self):
        return f"PythonModuleVariable({self.value.__name__})"

    def var_getattr(self, tx, name):
        if name not in self.value.__dict__:
            try:
                v = getattr(self.value, name)
            except AttributeError:
                raise _missing_attr(f"module '{self.value.__name__}'", name)
        else:
            v = self.value.__dict__[name]
        trusted = self.value.__name__.split(".")[0] in ("flambeau", "math", "operator", "builtins", "itertools",
                                                         "functools", "collections", "typing", "numbers", "numpy")
        src = None if trusted or self.source is None else self.source.attr(name)
        return kinds.builder.build(tx, v, src)

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.const(self.value)


class SuperVariable(VariableTracker):
    """`super()` inside an inlined method: attribute lookup starts after `cls` in type(obj).__mro__."""

    def __init__(self, cls, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        tp = self.obj.value if isinstance(self.obj, ClassVariable) else type(self.obj.value)
        mro = tp.__mro__
        for base in mro[mro.index(self.cls) + 1:]:
            if name in base.__dict__:
                attr = base.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return kinds.functions.UserMethodVariable(attr, self.obj)
                if isinstance(attr, classmethod):
                    return kinds.functions.UserMethodVariable(attr.__func__, ClassVariable(tp))
                if isinstance(attr, staticmethod):
                    return kinds.functions.UserFunctionVariable(attr.__func__)
                if attr is object.__init__:
                    return kinds.builtin.BuiltinVariable(_noop)
                if (base in (dict, collections.OrderedDict) and name in _DICT_READS
                        and isinstance(self.obj, ObjectVariable)):
                    return kinds.builtin.GetAttrVariable(self.obj._dict_view(tx), name)
                break
        raise Unsupported(f"super().{name}")


def _noop(*args, **kwargs):
    return None
