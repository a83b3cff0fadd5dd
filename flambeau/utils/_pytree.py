"""torch.utils._pytree: nested containers as a flat list of leaves plus a TreeSpec of their shape.

`tree_flatten(tree)` walks tuples, lists, dicts, namedtuples, OrderedDicts, defaultdicts, deques
and every type registered with `register_pytree_node`; everything else is a leaf (None included,
as in PyTorch). `tree_unflatten(leaves, spec)` rebuilds it; `tree_map` applies a function to the
leaves of one tree (and the matching subtrees of others); key paths (`tree_flatten_with_path`,
`keystr`) name where each leaf sits; `treespec_dumps`/`treespec_loads` write a spec as JSON in
PyTorch's protocol 1. Model libraries register their output classes here.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any, Callable, Iterable, NamedTuple

PyTree = Any
Context = Any
DumpableContext = Any
KeyEntry = Any
KeyPath = tuple
FlattenFunc = Callable[[PyTree], "tuple[list, Context]"]
UnflattenFunc = Callable[[Iterable, Context], PyTree]
FlattenWithKeysFunc = Callable[[PyTree], "tuple[list[tuple[KeyEntry, Any]], Context]"]

DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL = 1
NO_SERIALIZED_TYPE_NAME_FOUND = "NO_SERIALIZED_TYPE_NAME_FOUND"


class NodeDef(NamedTuple):
    """How one container type flattens and rebuilds."""
    type: type
    flatten_fn: FlattenFunc
    unflatten_fn: UnflattenFunc
    flatten_with_keys_fn: FlattenWithKeysFunc | None


class _SerializeNodeDef(NamedTuple):
    """How one container type's spec is written to and read from JSON."""
    typ: type
    serialized_type_name: str
    to_dumpable_context: Callable[[Context], DumpableContext] | None
    from_dumpable_context: Callable[[DumpableContext], Context] | None


SUPPORTED_NODES: dict[type, NodeDef] = {}
SUPPORTED_SERIALIZED_TYPES: dict[type, _SerializeNodeDef] = {}
SERIALIZED_TYPE_TO_PYTHON_TYPE: dict[str, type] = {}


def register_pytree_node(cls: type, flatten_fn: FlattenFunc, unflatten_fn: UnflattenFunc, *,
                         serialized_type_name: str | None = None,
                         to_dumpable_context: Callable | None = None,
                         from_dumpable_context: Callable | None = None,
                         flatten_with_keys_fn: FlattenWithKeysFunc | None = None) -> None:
    """Make `cls` a container: `flatten_fn(x) -> (children, context)`,
    `unflatten_fn(children, context) -> x`."""
    if cls in SUPPORTED_NODES:
        raise ValueError(f"{cls} is already registered as pytree node.")
    if (to_dumpable_context is None) != (from_dumpable_context is None):
        raise ValueError(f"Both to_dumpable_context and from_dumpable_context for {cls} must be None "
                         "or registered.")
    SUPPORTED_NODES[cls] = NodeDef(cls, flatten_fn, unflatten_fn, flatten_with_keys_fn)
    name = NO_SERIALIZED_TYPE_NAME_FOUND if serialized_type_name is None else serialized_type_name
    SUPPORTED_SERIALIZED_TYPES[cls] = _SerializeNodeDef(cls, name, to_dumpable_context, from_dumpable_context)
    SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls


_private_register_pytree_node = register_pytree_node


def _deregister_pytree_node(cls: type) -> None:
    SUPPORTED_NODES.pop(cls, None)
    node = SUPPORTED_SERIALIZED_TYPES.pop(cls, None)
    if node is not None and SERIALIZED_TYPE_TO_PYTHON_TYPE.get(node.serialized_type_name) is cls:
        del SERIALIZED_TYPE_TO_PYTHON_TYPE[node.serialized_type_name]


# ---- key entries: where a child sits in its parent


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    idx: int

    def __str__(self) -> str:
        return f"[{self.idx!r}]"

    def get(self, sequence):
        return sequence[self.idx]


@dataclasses.dataclass(frozen=True)
class MappingKey:
    key: Any

    def __str__(self) -> str:
        return f"[{self.key!r}]"

    def get(self, mapping):
        return mapping[self.key]


@dataclasses.dataclass(frozen=True)
class GetAttrKey:
    name: str

    def __str__(self) -> str:
        return f".{self.name}"

    def get(self, obj):
        return getattr(obj, self.name)


def keystr(kp: KeyPath) -> str:
    """The key path as Python indexing text: `['a'][1].x`."""
    return "".join(str(k) for k in kp)


def key_get(obj, kp: KeyPath):
    """The subtree of `obj` at key path `kp`."""
    for k in kp:
        obj = k.get(obj)
    return obj


# ---- the built-in containers


def is_namedtuple_class(cls) -> bool:
    return (isinstance(cls, type) and issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)
            and all(isinstance(f, str) for f in cls._fields) and callable(getattr(cls, "_make", None))
            and callable(getattr(cls, "_asdict", None)))


def is_namedtuple_instance(obj) -> bool:
    return is_namedtuple_class(type(obj))


def is_namedtuple(obj) -> bool:
    """True for a namedtuple class or instance."""
    return is_namedtuple_class(obj if isinstance(obj, type) else type(obj))


def _tuple_flatten(t):
    return list(t), None


def _tuple_flatten_with_keys(t):
    return [(SequenceKey(i), v) for i, v in enumerate(t)], None


def _tuple_unflatten(values, context):
    return tuple(values)


def _list_flatten(t):
    return list(t), None


def _list_flatten_with_keys(t):
    return [(SequenceKey(i), v) for i, v in enumerate(t)], None


def _list_unflatten(values, context):
    return list(values)


def _dict_flatten(d):
    return list(d.values()), list(d.keys())


def _dict_flatten_with_keys(d):
    values, context = _dict_flatten(d)
    return [(MappingKey(k), v) for k, v in zip(context, values)], context


def _dict_unflatten(values, context):
    return dict(zip(context, values))


def _namedtuple_flatten(t):
    return list(t), type(t)


def _namedtuple_flatten_with_keys(t):
    values, context = _namedtuple_flatten(t)
    return [(GetAttrKey(f), v) for f, v in zip(context._fields, values)], context


def _namedtuple_unflatten(values, context):
    return context(*values)


_NAMEDTUPLE_NAMES: dict[type, str] = {}


def _register_namedtuple(cls: type, *, serialized_type_name: str) -> None:
    """Give a namedtuple class a name, so specs holding it can be written with treespec_dumps."""
    _NAMEDTUPLE_NAMES[cls] = serialized_type_name


def _namedtuple_serialize(context: type) -> str:
    if context not in _NAMEDTUPLE_NAMES:
        raise NotImplementedError(f"Can't serialize TreeSpec of namedtuple class {context} because we didn't "
                                  "register a serializated_type_name. Please register using "
                                  "`_register_namedtuple`.")
    return _NAMEDTUPLE_NAMES[context]


def _namedtuple_deserialize(dumpable: str) -> type:
    for cls, name in _NAMEDTUPLE_NAMES.items():
        if name == dumpable:
            return cls
    raise NotImplementedError(f"Can't deserialize TreeSpec of namedtuple class {dumpable}: not registered "
                              "with `_register_namedtuple`.")


def _ordereddict_flatten(d):
    return list(d.values()), list(d.keys())


def _ordereddict_flatten_with_keys(d):
    values, context = _ordereddict_flatten(d)
    return [(MappingKey(k), v) for k, v in zip(context, values)], context


def _ordereddict_unflatten(values, context):
    return OrderedDict(zip(context, values))


def _defaultdict_flatten(d):
    return list(d.values()), [d.default_factory, list(d.keys())]


def _defaultdict_flatten_with_keys(d):
    values, context = _defaultdict_flatten(d)
    return [(MappingKey(k), v) for k, v in zip(context[1], values)], context


def _defaultdict_unflatten(values, context):
    factory, keys = context
    return defaultdict(factory, zip(keys, values))


def _defaultdict_serialize(context) -> dict:
    factory, keys = context
    return {"default_factory_module": factory.__module__, "default_factory_name": factory.__qualname__,
            "dict_context": keys}


def _defaultdict_deserialize(dumpable: dict):
    module = importlib.import_module(dumpable["default_factory_module"])
    return [getattr(module, dumpable["default_factory_name"]), dumpable["dict_context"]]


def _deque_flatten(d):
    return list(d), d.maxlen


def _deque_flatten_with_keys(d):
    return [(SequenceKey(i), v) for i, v in enumerate(d)], d.maxlen


def _deque_unflatten(values, context):
    return deque(values, maxlen=context)


register_pytree_node(tuple, _tuple_flatten, _tuple_unflatten, serialized_type_name="builtins.tuple",
                     flatten_with_keys_fn=_tuple_flatten_with_keys)
register_pytree_node(list, _list_flatten, _list_unflatten, serialized_type_name="builtins.list",
                     flatten_with_keys_fn=_list_flatten_with_keys)
register_pytree_node(dict, _dict_flatten, _dict_unflatten, serialized_type_name="builtins.dict",
                     flatten_with_keys_fn=_dict_flatten_with_keys)
register_pytree_node(namedtuple, _namedtuple_flatten, _namedtuple_unflatten,
                     serialized_type_name="collections.namedtuple", to_dumpable_context=_namedtuple_serialize,
                     from_dumpable_context=_namedtuple_deserialize,
                     flatten_with_keys_fn=_namedtuple_flatten_with_keys)
register_pytree_node(OrderedDict, _ordereddict_flatten, _ordereddict_unflatten,
                     serialized_type_name="collections.OrderedDict",
                     flatten_with_keys_fn=_ordereddict_flatten_with_keys)
register_pytree_node(defaultdict, _defaultdict_flatten, _defaultdict_unflatten,
                     serialized_type_name="collections.defaultdict", to_dumpable_context=_defaultdict_serialize,
                     from_dumpable_context=_defaultdict_deserialize,
                     flatten_with_keys_fn=_defaultdict_flatten_with_keys)
register_pytree_node(deque, _deque_flatten, _deque_unflatten, serialized_type_name="collections.deque",
                     flatten_with_keys_fn=_deque_flatten_with_keys)


def register_dataclass(cls: type, *, field_names: list[str] | None = None,
                       drop_field_names: list[str] | None = None,
                       serialized_type_name: str | None = None) -> None:
    """Register a dataclass: its (init) fields are its children, by name."""
    if field_names is None:
        if not dataclasses.is_dataclass(cls):
            raise ValueError(f"field_names must be given for {cls}, which is not a dataclass")
        dropped = set(drop_field_names or ())
        field_names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in dropped]
    names = list(field_names)

    def dataclass_flatten(obj):
        return [getattr(obj, n) for n in names], names

    def dataclass_flatten_with_keys(obj):
        return [(GetAttrKey(n), getattr(obj, n)) for n in names], names

    def dataclass_unflatten(values, context):
        return cls(**dict(zip(context, values)))

    register_pytree_node(cls, dataclass_flatten, dataclass_unflatten, serialized_type_name=serialized_type_name,
                         flatten_with_keys_fn=dataclass_flatten_with_keys)


def _get_node_type(tree) -> type:
    return namedtuple if is_namedtuple_instance(tree) else type(tree)


def tree_is_leaf(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None) -> bool:
    """True when `tree` is not a registered container (or `is_leaf` says it is a leaf)."""
    if is_leaf is not None and is_leaf(tree):
        return True
    return _get_node_type(tree) not in SUPPORTED_NODES


_is_leaf = tree_is_leaf


# ---- the spec


class TreeSpec:
    """The shape of a pytree: the node's type, its context (dict keys, namedtuple class, ...) and
    one spec per child. A leaf is `LeafSpec()` (printed `*`)."""

    def __init__(self, type: Any, context: Context, children_specs: list[TreeSpec]) -> None:
        self.type = type
        self._context = context
        self._children = list(children_specs)
        self.num_nodes = 1 + sum(c.num_nodes for c in self._children)
        self.num_leaves = sum(c.num_leaves for c in self._children)
        self.num_children = len(self._children)

    @property
    def context(self) -> Context:
        return self._context

    @property
    def children_specs(self) -> list[TreeSpec]:
        return self._children

    def is_leaf(self) -> bool:
        return self.num_nodes == 1 and self.num_leaves == 1

    def children(self) -> list[TreeSpec]:
        return list(self._children)

    def child(self, index: int) -> TreeSpec:
        return self._children[index]

    def __repr__(self, indent: int = 0) -> str:
        if not self._children:
            return f"TreeSpec({self.type.__name__}, {self._context}, [])"
        indent += 2
        inner = ("," + "\n" + " " * indent).join(c.__repr__(indent) for c in self._children)
        return f"TreeSpec({self.type.__name__}, {self._context}, [{inner}])"

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (str(self.type) == str(other.type) and self._context == other._context
                and self._children == other._children)

    __hash__ = None

    def flatten_up_to(self, tree: PyTree) -> list:
        """The subtrees of `tree` that sit where this spec has leaves (`tree` must have this spec's
        structure down to them)."""
        out: list = []
        self._flatten_up_to(tree, out)
        return out

    def _flatten_up_to(self, tree, out: list) -> None:
        if self.is_leaf():
            out.append(tree)
            return
        node_type = _get_node_type(tree)
        if node_type not in SUPPORTED_NODES:
            raise ValueError(f"Expected tree to be a pytree node of type {self.type}, but got {type(tree)}.")
        if node_type is not self.type:
            raise ValueError(f"Node type mismatch; expected {self.type!r}, but got {type(tree)!r}.")
        children, context = SUPPORTED_NODES[node_type].flatten_fn(tree)
        if len(children) != self.num_children:
            raise ValueError(f"Node arity mismatch; expected {self.num_children}, but got {len(children)}.")
        if node_type in (dict, OrderedDict, defaultdict):
            keys = context[1] if node_type is defaultdict else context
            mine = self._context[1] if node_type is defaultdict else self._context
            if set(keys) != set(mine):
                missing, extra = set(mine) - set(keys), set(keys) - set(mine)
                raise ValueError(f"Node keys mismatch; missing key(s): {missing}; extra key(s): {extra}.")
            by_key = dict(zip(keys, children))
            children = [by_key[k] for k in mine]
        elif context != self._context:
            raise ValueError(f"Node context mismatch for custom node type {self.type!r}.")
        for spec, child in zip(self._children, children):
            spec._flatten_up_to(child, out)

    def unflatten(self, leaves: Iterable) -> PyTree:
        """The pytree of this shape holding `leaves` in order."""
        leaves = list(leaves)
        if len(leaves) != self.num_leaves:
            raise ValueError(f"treespec.unflatten(leaves): `leaves` has length {len(leaves)} but the spec "
                             f"refers to a pytree that holds {self.num_leaves} items ({self}).")
        return self._unflatten(iter(leaves))

    def _unflatten(self, leaves):
        if self.is_leaf():
            return next(leaves)
        children = [c._unflatten(leaves) for c in self._children]
        return SUPPORTED_NODES[self.type].unflatten_fn(children, self._context)


class LeafSpec(TreeSpec):
    """The spec of a leaf."""

    def __init__(self) -> None:
        super().__init__(None, None, [])
        self.num_nodes, self.num_leaves = 1, 1

    def __repr__(self, indent: int = 0) -> str:
        return "*"


_LEAF_SPEC = LeafSpec()


def treespec_leaf() -> LeafSpec:
    return _LEAF_SPEC


def treespec_tuple(iterable: Iterable[TreeSpec] = ()) -> TreeSpec:
    return TreeSpec(tuple, None, list(iterable))


def treespec_dict(mapping: dict | None = None, **kwargs) -> TreeSpec:
    d = dict(mapping or {}, **kwargs)
    return TreeSpec(dict, list(d.keys()), list(d.values()))


# ---- flatten, unflatten, map


def _flatten(tree, leaves: list, is_leaf) -> TreeSpec:
    if tree_is_leaf(tree, is_leaf):
        leaves.append(tree)
        return _LEAF_SPEC
    node_type = _get_node_type(tree)
    children, context = SUPPORTED_NODES[node_type].flatten_fn(tree)
    return TreeSpec(node_type, context, [_flatten(c, leaves, is_leaf) for c in children])


def tree_flatten(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None) -> tuple[list, TreeSpec]:
    """The leaves of `tree` in order, and its spec."""
    leaves: list = []
    spec = _flatten(tree, leaves, is_leaf)
    return leaves, spec


def tree_unflatten(leaves: Iterable, treespec: TreeSpec) -> PyTree:
    if not isinstance(treespec, TreeSpec):
        raise TypeError(f"tree_unflatten(leaves, treespec): Expected `treespec` to be instance of TreeSpec "
                        f"but got item of type {type(treespec)}.")
    return treespec.unflatten(leaves)


def tree_iter(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None):
    """The leaves of `tree`, lazily."""
    if tree_is_leaf(tree, is_leaf):
        yield tree
        return
    children, _ = SUPPORTED_NODES[_get_node_type(tree)].flatten_fn(tree)
    for child in children:
        yield from tree_iter(child, is_leaf)


def tree_leaves(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None) -> list:
    return list(tree_iter(tree, is_leaf))


def tree_structure(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None) -> TreeSpec:
    return tree_flatten(tree, is_leaf)[1]


def arg_tree_leaves(*args, **kwargs) -> list:
    """The leaves of (args, kwargs), in that order."""
    out = []
    for a in args:
        out.extend(tree_iter(a))
    for v in kwargs.values():
        out.extend(tree_iter(v))
    return out


def tree_map(func: Callable, tree: PyTree, *rests: PyTree, is_leaf: Callable[[PyTree], bool] | None = None):
    """A tree of `tree`'s shape with `func(leaf, *matching subtrees of rests)` at each leaf."""
    leaves, spec = tree_flatten(tree, is_leaf)
    flat = [leaves] + [spec.flatten_up_to(r) for r in rests]
    return spec.unflatten(map(func, *flat))


def tree_map_(func: Callable, tree: PyTree, *rests: PyTree, is_leaf: Callable[[PyTree], bool] | None = None):
    """Call `func` on each leaf (for its side effects); returns `tree`."""
    leaves, spec = tree_flatten(tree, is_leaf)
    flat = [leaves] + [spec.flatten_up_to(r) for r in rests]
    for args in zip(*flat):
        func(*args)
    return tree


def _type_predicate(type_or_types_or_pred) -> Callable[[Any], bool]:
    if isinstance(type_or_types_or_pred, (type, tuple)):
        types = type_or_types_or_pred
        return lambda x: isinstance(x, types)
    if callable(type_or_types_or_pred):
        return type_or_types_or_pred
    raise TypeError(f"Argument must be a type, a tuple of types, or a callable, but got "
                    f"{type_or_types_or_pred!r}")


def map_only(type_or_types_or_pred) -> Callable[[Callable], Callable]:
    """Decorator: the function applies to leaves that match; other leaves pass through."""
    pred = _type_predicate(type_or_types_or_pred)

    def wrap(func):
        @functools.wraps(func)
        def apply_where_matching(x):
            return func(x) if pred(x) else x
        return apply_where_matching
    return wrap


def tree_map_only(type_or_types_or_pred, func: Callable, tree: PyTree,
                  is_leaf: Callable[[PyTree], bool] | None = None):
    return tree_map(map_only(type_or_types_or_pred)(func), tree, is_leaf=is_leaf)


def tree_map_only_(type_or_types_or_pred, func: Callable, tree: PyTree,
                   is_leaf: Callable[[PyTree], bool] | None = None):
    return tree_map_(map_only(type_or_types_or_pred)(func), tree, is_leaf=is_leaf)


def tree_all(pred: Callable[[Any], bool], tree: PyTree, is_leaf=None) -> bool:
    return all(map(pred, tree_iter(tree, is_leaf)))


def tree_any(pred: Callable[[Any], bool], tree: PyTree, is_leaf=None) -> bool:
    return any(map(pred, tree_iter(tree, is_leaf)))


def tree_all_only(type_or_types, pred: Callable[[Any], bool], tree: PyTree, is_leaf=None) -> bool:
    match = _type_predicate(type_or_types)
    return all(pred(x) for x in tree_iter(tree, is_leaf) if match(x))


def tree_any_only(type_or_types, pred: Callable[[Any], bool], tree: PyTree, is_leaf=None) -> bool:
    match = _type_predicate(type_or_types)
    return any(pred(x) for x in tree_iter(tree, is_leaf) if match(x))


# ---- key paths


def _flatten_with_path(tree, path: tuple, out: list, is_leaf) -> TreeSpec:
    if tree_is_leaf(tree, is_leaf):
        out.append((path, tree))
        return _LEAF_SPEC
    node_type = _get_node_type(tree)
    node = SUPPORTED_NODES[node_type]
    if node.flatten_with_keys_fn is None:
        raise ValueError(f"Did not find a flatten_with_keys_fn for type: {node_type}. Please pass a "
                         "flatten_with_keys_fn argument to register_pytree_node.")
    pairs, context = node.flatten_with_keys_fn(tree)
    specs = [_flatten_with_path(child, path + (key,), out, is_leaf) for key, child in pairs]
    return TreeSpec(node_type, context, specs)


def tree_flatten_with_path(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None):
    """[(key path, leaf)] in leaf order, and the spec."""
    out: list = []
    spec = _flatten_with_path(tree, (), out, is_leaf)
    return out, spec


def tree_leaves_with_path(tree: PyTree, is_leaf: Callable[[PyTree], bool] | None = None) -> list:
    return tree_flatten_with_path(tree, is_leaf)[0]


def tree_map_with_path(func: Callable, tree: PyTree, *rests: PyTree,
                       is_leaf: Callable[[PyTree], bool] | None = None):
    """Like tree_map, with the leaf's key path as `func`'s first argument."""
    pairs, spec = tree_flatten_with_path(tree, is_leaf)
    flat = [spec.flatten_up_to(r) for r in rests]
    return spec.unflatten(func(path, leaf, *others) for (path, leaf), *others in zip(pairs, *flat))


# ---- JSON (protocol 1)


def _treespec_to_json(spec: TreeSpec) -> dict:
    if spec.is_leaf():
        return {"type": None, "context": None, "children_spec": []}
    node = SUPPORTED_SERIALIZED_TYPES.get(spec.type)
    if node is None or node.serialized_type_name == NO_SERIALIZED_TYPE_NAME_FOUND:
        raise NotImplementedError(f"Serializing {spec.type} in pytree is not registered. Please register it "
                                  "with a serialized_type_name in register_pytree_node.")
    if node.to_dumpable_context is None:
        try:
            context = json.dumps(spec.context)
        except TypeError as e:
            raise TypeError("Unable to serialize context. Please make the context json dump-able, or register "
                            "a custom serializer using register_pytree_node.") from e
    else:
        context = node.to_dumpable_context(spec.context)
    return {"type": node.serialized_type_name, "context": context,
            "children_spec": [_treespec_to_json(c) for c in spec.children_specs]}


def _json_to_treespec(d: dict) -> TreeSpec:
    if d["type"] is None and d["context"] is None and not d["children_spec"]:
        return _LEAF_SPEC
    if d["type"] not in SERIALIZED_TYPE_TO_PYTHON_TYPE:
        raise NotImplementedError(f"Deserializing {d['type']} in pytree is not registered.")
    typ = SERIALIZED_TYPE_TO_PYTHON_TYPE[d["type"]]
    node = SUPPORTED_SERIALIZED_TYPES[typ]
    context = json.loads(d["context"]) if node.from_dumpable_context is None \
        else node.from_dumpable_context(d["context"])
    return TreeSpec(typ, context, [_json_to_treespec(c) for c in d["children_spec"]])


def treespec_dumps(treespec: TreeSpec, protocol: int | None = None) -> str:
    """The spec as JSON text: `[protocol, {"type", "context", "children_spec"}]`."""
    protocol = DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL if protocol is None else protocol
    if protocol != DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL:
        raise ValueError(f"Unknown protocol {protocol}. Available protocols: "
                         f"[{DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL}]")
    return json.dumps((protocol, _treespec_to_json(treespec)))


def treespec_loads(serialized: str) -> TreeSpec:
    protocol, schema = json.loads(serialized)
    if protocol != DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL:
        raise ValueError(f"Unknown protocol {protocol}. Available protocols: "
                         f"[{DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL}]")
    return _json_to_treespec(schema)
