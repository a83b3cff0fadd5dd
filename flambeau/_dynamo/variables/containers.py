"""Trackers of Python containers: tuple, list, dict, set, slice, range and their iterators.

Lists, dicts and sets are mutable trackers: the same tracker object stands for the same Python
object everywhere in the frame (aliasing is preserved), mutations change the tracker in place,
and a mutated container that came from outside the frame (it has a source) is written back after
the graph runs (`OutputGraph.side_effects`), so eager and compiled code observe the same objects.
"""
from __future__ import annotations

import operator

from ..exc import Unsupported
from .base import VariableTracker, ConstantVariable, const
from ..._tensor import Size
from .tensor import TensorVariable
from .objects import ObjectVariable
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)


def _consts(items):
    return [x.as_python_constant() for x in items]


class BaseListVariable(VariableTracker):
    def __init__(self, items: list, source=None):
        self.items = list(items)
        self.source = source

    def as_python_constant(self):
        return self.python_type()(_consts(self.items))

    def has_unpack_var_sequence(self, tx):
        return True

    def unpack_var_sequence(self, tx):
        return list(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def getitem(self, tx, key: VariableTracker):
        k = key.as_python_constant()
        if isinstance(k, slice):
            return self.new(self.items[k])
        try:
            return self.items[operator.index(k)]
        except IndexError:
            raise Unsupported(f"IndexError: {self.python_type().__name__} index out of range")

    def new(self, items):
        return type(self)(items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__" and not args:
            return const(len(self.items))
        if name == "__contains__" and len(args) == 1:
            return kinds.builtin.BuiltinVariable(operator.contains).call_function(tx, [self, args[0]], {})
        if name == "index" and len(args) == 1 and not kwargs:
            for i, x in enumerate(self.items):
                if _same(tx, x, args[0]):
                    return const(i)
            raise Unsupported("ValueError from index()")
        if name == "count" and len(args) == 1 and not kwargs:
            return const(sum(1 for x in self.items if _same(tx, x, args[0])))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.build_sequence(self)


def _same(tx, a, b) -> bool:
    if a is b:
        return True
    if a.is_python_constant() and b.is_python_constant():
        return a.as_python_constant() == b.as_python_constant()
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        raise Unsupported("comparing tensors inside a container search")
    return False


class TupleVariable(BaseListVariable):
    """A tuple (or a namedtuple / flambeau.Size, remembered in `cls`)."""

    def __init__(self, items, source=None, cls=tuple):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def new(self, items):
        return TupleVariable(items, cls=tuple if self.cls is not _size_cls() else self.cls)

    def as_python_constant(self):
        vals = _consts(self.items)
        if self.cls is tuple or self.cls is _size_cls():
            return self.cls(vals)
        return self.cls(*vals)

    def var_getattr(self, tx, name):
        fields = getattr(self.cls, "_fields", None)
        if fields and name in fields:
            return self.items[fields.index(name)]
        if name in ("count", "index") or (self.cls is _size_cls() and name == "numel"):
            return kinds.builtin.GetAttrVariable(self, name)
        raise Unsupported(f"tuple attribute {name}")

    def call_method(self, tx, name, args, kwargs):
        if name == "numel" and self.cls is _size_cls():
            n = const(1)
            for x in self.items:
                n = kinds.builtin.BuiltinVariable(operator.mul).call_function(tx, [n, x], {})
            return n
        return super().call_method(tx, name, args, kwargs)

    def __repr__(self):
        return f"TupleVariable({self.items})"


def _size_cls():
    return Size


class ListVariable(BaseListVariable):
    mutable = True

    def __init__(self, items, source=None):
        super().__init__(items, source)
        self.mutated = False

    def python_type(self):
        return list

    def _mutate(self, tx):
        self.mutated = True
        tx.output.note_mutation(self)

    def call_method(self, tx, name, args, kwargs):
        if kwargs and name != "sort":
            raise Unsupported(f"list.{name} with keyword arguments")
        if name == "append" and len(args) == 1:
            self._mutate(tx)
            self.items.append(args[0])
            return const(None)
        if name == "extend" and len(args) == 1 and args[0].has_unpack_var_sequence(tx):
            new = args[0].unpack_var_sequence(tx)
            self._mutate(tx)
            self.items.extend(new)
            return const(None)
        if name == "insert" and len(args) == 2:
            self._mutate(tx)
            self.items.insert(args[0].as_python_constant(), args[1])
            return const(None)
        if name == "pop" and len(args) <= 1:
            if not self.items:
                raise Unsupported("IndexError: pop from empty list")
            self._mutate(tx)
            return self.items.pop(*(a.as_python_constant() for a in args))
        if name == "clear" and not args:
            self._mutate(tx)
            self.items.clear()
            return const(None)
        if name == "copy" and not args:
            return ListVariable(list(self.items))
        if name == "reverse" and not args:
            self._mutate(tx)
            self.items.reverse()
            return const(None)
        if name == "remove" and len(args) == 1:
            for i, x in enumerate(self.items):
                if _same(tx, x, args[0]):
                    self._mutate(tx)
                    del self.items[i]
                    return const(None)
            raise Unsupported("ValueError from list.remove()")
        if name == "__setitem__" and len(args) == 2:
            self.setitem(tx, args[0], args[1])
            return const(None)
        if name == "__delitem__" and len(args) == 1:
            self._mutate(tx)
            k = args[0].as_python_constant()
            del self.items[k]
            return const(None)
        if name == "sort" and not args:
            key = kwargs.get("key")
            rev = kwargs.get("reverse", const(False)).as_python_constant()
            if key is not None and not (key.is_python_constant() and key.as_python_constant() is None):
                raise Unsupported("list.sort(key=...)")
            vals = _consts(self.items)
            self._mutate(tx)
            self.items = [const(v) for v in sorted(vals, reverse=rev)]
            return const(None)
        return super().call_method(tx, name, args, kwargs)

    def setitem(self, tx, key, value):
        k = key.as_python_constant()
        self._mutate(tx)
        if isinstance(k, slice):
            self.items[k] = value.unpack_var_sequence(tx)
        else:
            self.items[operator.index(k)] = value

    def var_getattr(self, tx, name):
        if hasattr(list, name):
            return kinds.builtin.GetAttrVariable(self, name)
        raise Unsupported(f"list attribute {name}")

    def __repr__(self):
        return f"ListVariable({self.items})"


class DictVariable(VariableTracker):
    """A dict whose keys are hashable Python constants (or objects compared by identity)."""
    mutable = True

    def __init__(self, items: dict, source=None, cls=dict):
        self.items = dict(items)         # python key -> tracker
        self.source = source
        self.mutated = False
        self.cls = cls

    def python_type(self):
        return self.cls

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self.items.items()}

    def truthy(self, tx):
        return bool(self.items)

    def has_unpack_var_sequence(self, tx):
        return True

    def unpack_var_sequence(self, tx):
        return [key_variable(k) for k in self.items]

    def _mutate(self, tx):
        self.mutated = True
        tx.output.note_mutation(self)

    def getitem(self, tx, key):
        k = dict_key(key)
        if k not in self.items:
            raise Unsupported(f"KeyError: {k!r}")
        return self.items[k]

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name in ("__setitem__",) and len(args) == 2:
            self._mutate(tx)
            self.items[dict_key(args[0])] = args[1]
            return const(None)
        if name == "get" and 1 <= len(args) <= 2:
            k = dict_key(args[0])
            return self.items.get(k, args[1] if len(args) > 1 else const(None))
        if name == "keys" and not args:
            return ListIteratorLike(self.unpack_var_sequence(tx), "dict_keys")
        if name == "values" and not args:
            return ListIteratorLike(list(self.items.values()), "dict_values")
        if name == "items" and not args:
            return ListIteratorLike([TupleVariable([key_variable(k), v]) for k, v in self.items.items()], "dict_items")
        if name == "__contains__" and len(args) == 1:
            return const(dict_key(args[0]) in self.items)
        if name == "__len__":
            return const(len(self.items))
        if name == "update" and len(args) <= 1:
            self._mutate(tx)
            if args:
                other = args[0]
                if isinstance(other, DictVariable):
                    self.items.update(other.items)
                else:
                    for pair in other.unpack_var_sequence(tx):
                        k, v = pair.unpack_var_sequence(tx)
                        self.items[dict_key(k)] = v
            for k, v in kwargs.items():
                self.items[k] = v
            return const(None)
        if name == "pop" and 1 <= len(args) <= 2:
            k = dict_key(args[0])
            if k not in self.items:
                if len(args) == 2:
                    return args[1]
                raise Unsupported(f"KeyError: {k!r}")
            self._mutate(tx)
            return self.items.pop(k)
        if name == "setdefault" and 1 <= len(args) <= 2:
            k = dict_key(args[0])
            if k not in self.items:
                self._mutate(tx)
                self.items[k] = args[1] if len(args) > 1 else const(None)
            return self.items[k]
        if name == "clear":
            self._mutate(tx)
            self.items.clear()
            return const(None)
        if name == "copy":
            return DictVariable(self.items, cls=self.cls)
        if name == "__delitem__" and len(args) == 1:
            self._mutate(tx)
            self.items.pop(dict_key(args[0]))
            return const(None)
        return super().call_method(tx, name, args, kwargs)

    def var_getattr(self, tx, name):
        if hasattr(dict, name):
            return kinds.builtin.GetAttrVariable(self, name)
        raise Unsupported(f"dict attribute {name}")

    def reconstruct(self, cg):
        return cg.build_dict(self)

    def __repr__(self):
        return f"DictVariable({list(self.items)})"


def dict_key(vt: VariableTracker):
    """The Python key a tracker stands for (constants; objects with a known identity)."""
    if vt.is_python_constant():
        return vt.as_python_constant()
    if isinstance(vt, ObjectVariable):
        return vt.value
    raise Unsupported(f"dict key {vt}")


def key_variable(k) -> VariableTracker:
    return kinds.builder.wrap_constant_like(k)


class SetVariable(VariableTracker):
    mutable = True

    def __init__(self, items: list, source=None):
        self.items = {}
        for x in items:
            self.items.setdefault(dict_key(x), x)
        self.source = source
        self.mutated = False

    def python_type(self):
        return set

    def as_python_constant(self):
        return set(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def has_unpack_var_sequence(self, tx):
        return True

    def unpack_var_sequence(self, tx):
        return [self.items[k] for k in set(self.items)]

    def call_method(self, tx, name, args, kwargs):
        if name == "add" and len(args) == 1:
            self.mutated = True
            tx.output.note_mutation(self)
            self.items.setdefault(dict_key(args[0]), args[0])
            return const(None)
        if name == "__contains__" and len(args) == 1:
            return const(dict_key(args[0]) in self.items)
        if name == "__len__":
            return const(len(self.items))
        if name in ("union", "intersection", "difference", "issubset", "issuperset") and all(
                a.is_python_constant() for a in args):
            return key_or_set(getattr(self.as_python_constant(), name)(*(a.as_python_constant() for a in args)))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.build_set(self)


def key_or_set(v):
    if isinstance(v, set):
        return SetVariable([const(x) for x in v])
    return const(v)


class SliceVariable(VariableTracker):
    """slice(start, stop, step) whose parts may be symbolic sizes."""

    def __init__(self, parts: list):
        self.parts = parts

    def python_type(self):
        return slice

    def as_python_constant(self):
        return slice(*_consts(self.parts))

    def reconstruct(self, cg):
        return f"slice({', '.join(cg.reconstruct(p) for p in self.parts)})"


class ListIteratorVariable(VariableTracker):
    """An iterator over known items (from iter(list), zip, enumerate, map over known items ...)."""
    mutable = True

    def __init__(self, items: list, index: int = 0):
        self.items = items
        self.index = index

    def python_type(self):
        return type(iter([]))

    def next(self, tx):
        if self.index >= len(self.items):
            raise StopIteration
        v = self.items[self.index]
        self.index += 1
        return v

    def has_unpack_var_sequence(self, tx):
        return True

    def unpack_var_sequence(self, tx):
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest

    def call_method(self, tx, name, args, kwargs):
        if name == "__next__":
            try:
                return self.next(tx)
            except StopIteration:
                raise Unsupported("StopIteration from next()")
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return f"iter({cg.build_sequence(TupleVariable(self.items[self.index:]))})"


class ListIteratorLike(ListIteratorVariable):
    """dict.keys()/values()/items(): iterable views, modelled as their items at this point."""

    def __init__(self, items, kind):
        super().__init__(items)
        self.kind = kind

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return const(len(self.items))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.build_sequence(TupleVariable(self.items))


class RangeVariable(VariableTracker):
    def __init__(self, r: range):
        self.value = r

    def python_type(self):
        return range

    def as_python_constant(self):
        return self.value

    def has_unpack_var_sequence(self, tx):
        return True

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(i) for i in self.value]

    def reconstruct(self, cg):
        return cg.const(self.value)
