"""Python builtins and the `operator` module while tracing.

`BuiltinVariable(fn)` calls fold on constants (`len`, `isinstance`, `range`, `min`, `math.*` ...),
build trackers for containers and iterators (`zip`, `enumerate`, `map`, `list`, `dict` ...), and
send tensor operands to the graph (`operator.add(t, 1)` becomes a call_function node). `binary_op`
and `getitem` are the shared paths for BINARY_OP / COMPARE_OP / BINARY_SUBSCR. Builtins with
effects the graph cannot hold (`print`, `input`, `open`, `id` of traced objects) are graph breaks.
"""
from __future__ import annotations

import builtins
import inspect
import operator

from ..._ops import functions
from ..exc import Unsupported
from .base import VariableTracker, ValueVariable, ConstantVariable, NULL, const, is_constant_value
from .containers import (TupleVariable, ListVariable, DictVariable, SetVariable, SliceVariable,
                         ListIteratorVariable, RangeVariable, dict_key)
from .tensor import TensorVariable, SymNodeVariable, NumpyNdarrayVariable, numpy_call, np_wrappers
from .builder import wrap_constant_like
from .objects import ObjectVariable, ClassVariable
from .nn_module import NNModuleVariable
from .functions import BaseFunctionVariable
from .torch import TorchFunctionVariable


class ObservedAttributeError(Unsupported):
    """The traced program itself would raise AttributeError here (hasattr/getattr-default use it)."""


_BINOPS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
           operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
           operator.rshift, operator.iadd, operator.isub, operator.imul, operator.itruediv,
           operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
           operator.ixor, operator.ilshift, operator.irshift, operator.eq, operator.ne, operator.lt,
           operator.le, operator.gt, operator.ge}
_INPLACE_TO_OUT = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                   operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                   operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
                   operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
                   operator.ilshift: operator.lshift, operator.irshift: operator.rshift}
_UNARY = {operator.neg, operator.pos, operator.invert, operator.abs, abs}
_FOLDABLE = {abs, bool, int, float, complex, str, len, min, max, round, divmod, pow, ord, chr, hash, repr,
             format, bin, hex, oct, sorted, sum, any, all, tuple, list, frozenset, set, dict, isinstance,
             issubclass, callable, slice, reversed, ascii}
_BREAKING = {print, input, open, breakpoint, exec, eval, compile, globals, locals, vars, dir, help, id,
             delattr, memoryview, bytearray}


def wrap_constant_result(v) -> VariableTracker:
    return wrap_constant_like(v)


def binary_op(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    if isinstance(a, NumpyNdarrayVariable) or isinstance(b, NumpyNdarrayVariable):
        return numpy_call(tx, np_wrappers.numpy_binary_operator, [BuiltinVariable(fn), a, b], {})
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return tx.output.call_in_graph(tx, "call_function", fn, [a, b], {})
    if isinstance(a, SymNodeVariable) or isinstance(b, SymNodeVariable):
        other = b if isinstance(a, SymNodeVariable) else a
        if isinstance(other, (SymNodeVariable, ConstantVariable)) and (
                isinstance(other, SymNodeVariable) or type(other.value) in (int, bool)):
            return SymNodeVariable.binop(tx, _INPLACE_TO_OUT.get(fn, fn), a, b)
        if isinstance(other, ConstantVariable) and type(other.value) is float:
            return const(fn(a.as_int(), other.value))
        raise Unsupported(f"{fn.__name__} of a symbolic size and {other}")
    if a.is_python_constant() and b.is_python_constant() and not (a.mutable or b.mutable):
        try:
            return wrap_constant_result(fn(a.as_python_constant(), b.as_python_constant()))
        except Exception as e:
            raise Unsupported(f"{type(e).__name__}: {e}")
    base = _INPLACE_TO_OUT.get(fn, fn)
    seq = (TupleVariable, ListVariable)
    if base is operator.add and isinstance(a, seq) and isinstance(b, seq) and type(a) is type(b):
        if fn is operator.iadd and isinstance(a, ListVariable):
            a.call_method(tx, "extend", [b], {})
            return a
        return a.new(a.items + b.items) if isinstance(a, TupleVariable) else ListVariable(a.items + b.items)
    if fn is operator.iadd and isinstance(a, ListVariable) and b.has_unpack_var_sequence(tx):
        a.call_method(tx, "extend", [b], {})
        return a
    if base is operator.mul and isinstance(a, seq) and isinstance(b, ConstantVariable):
        items = a.items * b.value
        return TupleVariable(items) if isinstance(a, TupleVariable) else ListVariable(items)
    if base is operator.mul and isinstance(b, seq) and isinstance(a, ConstantVariable):
        return binary_op(tx, fn, b, a)
    if fn in (operator.eq, operator.ne):
        r = _identity_eq(tx, a, b)
        if r is not None:
            return const(r if fn is operator.eq else not r)
    if base is operator.or_ and isinstance(a, DictVariable) and isinstance(b, DictVariable):
        return DictVariable({**a.items, **b.items})
    if isinstance(a, (TupleVariable, ListVariable)) and isinstance(b, type(a)) and fn in (
            operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
        if all(x.is_python_constant() for x in a.items + b.items):
            return const(fn(a.as_python_constant(), b.as_python_constant()))
    if isinstance(a, ObjectVariable) or isinstance(b, ObjectVariable):
        return _user_binop(tx, fn, a, b)
    raise Unsupported(f"{getattr(fn, '__name__', fn)}({a}, {b})")


def _user_binop(tx, fn, a, b):
    """`a + b` where an operand is a user object: inline its Python dunder method."""
    name = getattr(fn, "__name__", "").strip("_")
    if isinstance(a, ObjectVariable):
        meth = getattr(type(a.value), f"__{name}__", None)
        if meth is not None and hasattr(meth, "__code__"):
            return tx.inline_call(meth, [a, b], {})
    if isinstance(b, ObjectVariable) and name in ("add", "sub", "mul", "truediv", "matmul"):
        meth = getattr(type(b.value), f"__r{name}__", None)
        if meth is not None and hasattr(meth, "__code__"):
            return tx.inline_call(meth, [b, a], {})
    raise Unsupported(f"{name} on user objects")


def _identity_eq(tx, a, b):
    kinds = (ObjectVariable, NNModuleVariable, BaseFunctionVariable)
    if isinstance(a, kinds) and isinstance(b, kinds):
        if isinstance(a, ObjectVariable) and type(a.value).__eq__ is not object.__eq__:
            return None
        return identical(a, b)
    if isinstance(a, ConstantVariable) and a.value is None and not isinstance(b, ConstantVariable):
        return False if not isinstance(b, (ObjectVariable,)) else None
    if isinstance(b, ConstantVariable) and b.value is None and not isinstance(a, ConstantVariable):
        return False if not isinstance(a, (ObjectVariable,)) else None
    return None


def identical(a: VariableTracker, b: VariableTracker) -> bool:
    """`a is b` for trackers."""
    if a is b:
        return True
    va, vb = getattr(a, "value", _NO), getattr(b, "value", _NO)
    if va is not _NO and vb is not _NO and not isinstance(a, ConstantVariable):
        return va is vb
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return a.value is b.value
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        return a.example is b.example and a.node is b.node
    return False


_NO = object()


def unary_op(tx, fn, a):
    if isinstance(a, NumpyNdarrayVariable) and fn in np_wrappers.UNARY_OPERATORS:
        return numpy_call(tx, np_wrappers.numpy_unary_operator, [BuiltinVariable(fn), a], {})
    if isinstance(a, TensorVariable):
        return tx.output.call_in_graph(tx, "call_function", fn, [a], {})
    if isinstance(a, SymNodeVariable):
        if fn is operator.neg:
            return SymNodeVariable.binop(tx, operator.mul, a, const(-1))
        if fn is operator.pos:
            return a
        raise Unsupported(f"{fn.__name__} of a symbolic size")
    if a.is_python_constant():
        try:
            return wrap_constant_result(fn(a.as_python_constant()))
        except Exception as e:
            raise Unsupported(f"{type(e).__name__}: {e}")
    if isinstance(a, ObjectVariable):
        meth = getattr(type(a.value), f"__{fn.__name__.strip('_')}__", None)
        if meth is not None and hasattr(meth, "__code__"):
            return tx.inline_call(meth, [a], {})
    raise Unsupported(f"{fn.__name__}({a})")


def getitem(tx, obj: VariableTracker, key: VariableTracker) -> VariableTracker:
    if isinstance(obj, NumpyNdarrayVariable):
        return numpy_call(tx, np_wrappers.numpy_getitem, [obj, key], {})
    if isinstance(obj, TensorVariable):
        return tx.output.call_in_graph(tx, "call_function", operator.getitem, [obj, key], {})
    if isinstance(obj, (TupleVariable, ListVariable, DictVariable)):
        if isinstance(key, SymNodeVariable):
            key = const(key.as_int())
        return obj.getitem(tx, key)
    if isinstance(obj, NNModuleVariable):
        return obj.getitem(tx, key)
    if isinstance(obj, (ConstantVariable, RangeVariable)) and key.is_python_constant():
        try:
            return wrap_constant_result(obj.as_python_constant()[key.as_python_constant()])
        except Exception as e:
            raise Unsupported(f"{type(e).__name__}: {e}")
    return obj.call_method(tx, "__getitem__", [key], {})


def contains(tx, container, item) -> VariableTracker:
    if isinstance(container, (TensorVariable, NumpyNdarrayVariable)):
        raise Unsupported("`in` on a tensor is data-dependent")
    if isinstance(container, (DictVariable, SetVariable)):
        return const(dict_key(item) in container.items)
    if container.has_unpack_var_sequence(tx) and not isinstance(container, ListIteratorVariable):
        for x in container.unpack_var_sequence(tx):
            r = binary_op(tx, operator.eq, x, item)
            if isinstance(r, TensorVariable):
                raise Unsupported("`in` with tensor elements is data-dependent")
            if r.truthy(tx):
                return const(True)
        return const(False)
    if isinstance(container, ObjectVariable) and inspect.getattr_static(type(container.value), "__contains__", None):
        return container.call_method(tx, "__contains__", [item], {})
    raise Unsupported(f"`in` on {container}")


class BuiltinVariable(ValueVariable):
    """A builtin function or an `operator`/`math` function."""

    def __repr__(self):
        return f"BuiltinVariable({getattr(self.value, '__name__', self.value)})"

    def reconstruct(self, cg):
        return cg.const(self.value)

    def call_function(self, tx, args, kwargs):
        fn = self.value
        if fn in _BREAKING:
            raise Unsupported(f"call to {fn.__name__}() (a builtin with effects outside the graph)")
        if fn in _BINOPS and len(args) == 2 and not kwargs:
            return binary_op(tx, fn, *args)
        if fn in _UNARY and len(args) == 1 and not kwargs:
            return unary_op(tx, fn, args[0])
        if fn is operator.getitem and len(args) == 2:
            return getitem(tx, *args)
        if fn in (operator.contains,) and len(args) == 2:
            return contains(tx, args[0], args[1])
        if fn in (operator.is_, operator.is_not) and len(args) == 2:
            r = identical(*args)
            return const(r if fn is operator.is_ else not r)
        if fn is operator.not_ and len(args) == 1:
            return const(not args[0].truthy(tx))
        if fn is operator.truth and len(args) == 1:
            return const(args[0].truthy(tx))
        if fn is operator.setitem and len(args) == 3:
            tx.store_subscr(args[0], args[1], args[2])
            return const(None)
        if fn is operator.index and len(args) == 1:
            if isinstance(args[0], SymNodeVariable):
                return const(args[0].as_int())
        handler = getattr(self, "_call_" + getattr(fn, "__name__", ""), None)
        if handler is not None and (fn is getattr(builtins, fn.__name__, None)):
            r = handler(tx, *args, **kwargs)
            if r is not None:
                return r
        if (fn in _FOLDABLE or getattr(fn, "__module__", None) in ("math", "_operator", "operator")) and all(
                a.is_python_constant() and not a.mutable for a in args) and all(
                v.is_python_constant() for v in kwargs.values()):
            try:
                return wrap_constant_result(fn(*(a.as_python_constant() for a in args),
                                               **{k: v.as_python_constant() for k, v in kwargs.items()}))
            except Exception as e:
                raise Unsupported(f"{type(e).__name__} in {getattr(fn, '__name__', fn)}(): {e}")
        raise Unsupported(f"builtin {getattr(fn, '__name__', fn)} with arguments {args} {kwargs}")

    # ---- individual builtins (return None to fall through to constant folding) --------------------
    def _call_len(self, tx, x):
        if isinstance(x, (TupleVariable, ListVariable, DictVariable, SetVariable)):
            return const(len(x.items))
        if isinstance(x, ConstantVariable):
            return None
        return x.call_method(tx, "__len__", [], {})

    def _call_isinstance(self, tx, obj, cls):
        tp = obj.python_type()
        c = cls.as_python_constant()
        return const(_isinstance_type(tp, c, obj))

    def _call_issubclass(self, tx, a, b):
        return const(issubclass(a.as_python_constant(), b.as_python_constant()))

    def _call_getattr(self, tx, obj, name, default=None):
        n = name.as_python_constant()
        try:
            return obj.var_getattr(tx, n)
        except ObservedAttributeError:
            if default is None:
                raise
            return default

    def _call_hasattr(self, tx, obj, name):
        try:
            obj.var_getattr(tx, name.as_python_constant())
            return const(True)
        except ObservedAttributeError:
            return const(False)

    def _call_setattr(self, tx, obj, name, value):
        tx.store_attr(obj, name.as_python_constant(), value)
        return const(None)

    def _call_type(self, tx, obj):
        return ClassVariable(obj.python_type())

    def _call_callable(self, tx, obj):
        if isinstance(obj, (BaseFunctionVariable, NNModuleVariable, TorchFunctionVariable, BuiltinVariable)):
            return const(True)
        if isinstance(obj, (TensorVariable, TupleVariable, ListVariable, DictVariable)):
            return const(False)
        return None

    def _call_range(self, tx, *args):
        vals = [a.as_int() if isinstance(a, SymNodeVariable) else a.as_python_constant() for a in args]
        return RangeVariable(range(*vals))

    def _call_iter(self, tx, obj):
        return tx.get_iter(obj)

    def _call_next(self, tx, it, default=None):
        if isinstance(it, ListIteratorVariable):
            try:
                return it.next(tx)
            except StopIteration:
                if default is not None:
                    return default
                raise Unsupported("StopIteration from next()")
        return None

    def _seq(self, tx, x):
        if not x.has_unpack_var_sequence(tx):
            raise Unsupported(f"iterating over {x}")
        return x.unpack_var_sequence(tx)

    def _call_enumerate(self, tx, it, start=None):
        s = start.as_python_constant() if start is not None else 0
        return ListIteratorVariable([TupleVariable([const(i + s), v]) for i, v in enumerate(self._seq(tx, it))])

    def _call_zip(self, tx, *its, strict=None):
        seqs = [self._seq(tx, i) for i in its]
        return ListIteratorVariable([TupleVariable(list(t)) for t in zip(*seqs)])

    def _call_map(self, tx, fn, *its):
        seqs = [self._seq(tx, i) for i in its]
        return ListIteratorVariable([fn.call_function(tx, list(t), {}) for t in zip(*seqs)])

    def _call_filter(self, tx, fn, it):
        out = []
        for x in self._seq(tx, it):
            keep = x if (fn.is_python_constant() and fn.as_python_constant() is None) else fn.call_function(tx, [x], {})
            if keep.truthy(tx):
                out.append(x)
        return ListIteratorVariable(out)

    def _call_reversed(self, tx, seq):
        if isinstance(seq, (TupleVariable, ListVariable, RangeVariable)):
            return ListIteratorVariable(list(reversed(self._seq(tx, seq))))
        return None

    def _call_list(self, tx, it=None):
        return ListVariable([] if it is None else self._seq(tx, it))

    def _call_tuple(self, tx, it=None):
        return TupleVariable([] if it is None else self._seq(tx, it))

    def _call_set(self, tx, it=None):
        return SetVariable([] if it is None else self._seq(tx, it))

    def _call_dict(self, tx, arg=None, **kwargs):
        d = DictVariable({})
        if arg is not None:
            if isinstance(arg, DictVariable):
                d.items.update(arg.items)
            else:
                for pair in self._seq(tx, arg):
                    k, v = self._seq(tx, pair)
                    d.items[dict_key(k)] = v
        d.items.update(kwargs)
        return d

    def _call_slice(self, tx, *args):
        return SliceVariable(list(args))

    def _call_sum(self, tx, seq, start=None):
        items = self._seq(tx, seq)
        if all(x.is_python_constant() for x in items) and (start is None or start.is_python_constant()):
            vals = [x.as_python_constant() for x in items]
            return wrap_constant_result(sum(vals, start.as_python_constant() if start is not None else 0))
        acc = start if start is not None else const(0)
        for x in items:
            acc = binary_op(tx, operator.add, acc, x)
        return acc

    def _minmax(self, tx, fn, args, kwargs):
        if kwargs:
            return None
        items = self._seq(tx, args[0]) if len(args) == 1 else list(args)
        if any(isinstance(x, TensorVariable) for x in items):
            if len(items) == 2 and fn is max:
                return tx.output.call_in_graph(tx, "call_function", functions.maximum, items, {})
            if len(items) == 2 and fn is min:
                return tx.output.call_in_graph(tx, "call_function", functions.minimum, items, {})
            raise Unsupported(f"{fn.__name__}() over tensors")
        if any(isinstance(x, SymNodeVariable) for x in items):
            best = items[0]
            for x in items[1:]:
                better = binary_op(tx, operator.gt if fn is max else operator.lt, x, best)
                if better.truthy(tx):
                    best = x
            return best
        if all(x.is_python_constant() for x in items):
            return wrap_constant_result(fn([x.as_python_constant() for x in items]))
        return None

    def _call_max(self, tx, *args, **kwargs):
        return self._minmax(tx, max, args, kwargs)

    def _call_min(self, tx, *args, **kwargs):
        return self._minmax(tx, min, args, kwargs)

    def _call_any(self, tx, it):
        for x in self._seq(tx, it):
            if x.truthy(tx):
                return const(True)
        return const(False)

    def _call_all(self, tx, it):
        for x in self._seq(tx, it):
            if not x.truthy(tx):
                return const(False)
        return const(True)

    def _call_bool(self, tx, x=None):
        return const(False) if x is None else const(x.truthy(tx))

    def _call_int(self, tx, x=None, *rest):
        if isinstance(x, SymNodeVariable) and not rest:
            return const(x.as_int())
        if isinstance(x, TensorVariable):
            raise Unsupported("int() of a tensor needs its value")
        return None

    def _call_float(self, tx, x=None):
        if isinstance(x, SymNodeVariable):
            return const(float(x.as_int()))
        if isinstance(x, TensorVariable):
            raise Unsupported("float() of a tensor needs its value")
        return None

    def _call_abs(self, tx, x):
        return unary_op(tx, abs, x)

    def _call_sorted(self, tx, it, key=None, reverse=None):
        items = self._seq(tx, it)
        rev = reverse.as_python_constant() if reverse is not None else False
        if key is None and all(x.is_python_constant() for x in items):
            return ListVariable([wrap_constant_result(v) for v in sorted((x.as_python_constant() for x in items),
                                                                          reverse=rev)])
        if key is not None:
            keyed = [(key.call_function(tx, [x], {}).as_python_constant(), i, x) for i, x in enumerate(items)]
            keyed.sort(key=lambda t: (t[0], t[1]), reverse=rev)
            return ListVariable([t[2] for t in keyed])
        raise Unsupported("sorted() of non-constant items")

    def _call_super(self, tx, *args):
        return tx.make_super(args)

    def _call_object(self, tx, *args):
        raise Unsupported("object()")


def _isinstance_type(tp, c, obj) -> bool:
    if isinstance(c, tuple):
        return any(_isinstance_type(tp, x, obj) for x in c)
    return issubclass(tp, c)


class GetAttrVariable(VariableTracker):
    """`obj.name` not yet called: a bound method of a traced object."""

    def __init__(self, obj: VariableTracker, name: str):
        self.obj = obj
        self.name = name

    def __repr__(self):
        return f"GetAttrVariable({self.obj}, {self.name})"

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def python_type(self):
        return type(len)

    def reconstruct(self, cg):
        return f"{cg.reconstruct(self.obj)}.{self.name}"


class BoundConstantMethod(VariableTracker):
    """A method of a constant (`"{}".format`, `(1, 2).index`)."""

    def __init__(self, obj: ConstantVariable, name: str):
        self.obj = obj
        self.name = name

    def call_function(self, tx, args, kwargs):
        return call_constant_method(tx, self.obj, self.name, args, kwargs)

    def reconstruct(self, cg):
        return f"{cg.reconstruct(self.obj)}.{self.name}"


def call_constant_method(tx, obj: ConstantVariable, name, args, kwargs):
    if name == "__getitem__" and len(args) == 1:
        return getitem(tx, obj, args[0])
    if all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values()):
        try:
            r = getattr(obj.value, name)(*(a.as_python_constant() for a in args),
                                          **{k: v.as_python_constant() for k, v in kwargs.items()})
        except Exception as e:
            raise Unsupported(f"{type(e).__name__}: {e}")
        return wrap_constant_result(r)
    if name == "format" and isinstance(obj.value, str):
        raise Unsupported("str.format with non-constant arguments")
    fn = getattr(operator, name.strip("_"), None) if name.startswith("__") else None
    if fn is not None and len(args) == 1:
        return binary_op(tx, fn, obj, args[0])
    raise Unsupported(f"{type(obj.value).__name__}.{name} with non-constant arguments")


def is_builtin_callable(v) -> bool:
    if v in _BREAKING or v in _FOLDABLE:
        return True
    mod = getattr(v, "__module__", None)
    return (type(v) is type(len) and (mod in ("builtins", "math", "_operator", "operator")
                                      or getattr(builtins, getattr(v, "__name__", ""), None) is v)) or (
        v in (range, enumerate, zip, map, filter, reversed, slice, super, object, type, property))


__all__ = ["BuiltinVariable", "GetAttrVariable", "binary_op", "unary_op", "getitem", "contains",
           "identical", "ObservedAttributeError", "NULL", "is_constant_value"]
