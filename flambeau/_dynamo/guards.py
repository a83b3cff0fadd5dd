"""Sources (where a value came from) and guards (what must still hold for a compiled entry to be valid).

A `Source` is a Python expression over the compiled frame's arguments — its locals at entry, named
`L_<name>` — plus `F` (the function object: closure cells) and `G` (its globals): `L_x`,
`G['w']`, `L_self.layer`, `L_xs[0]`, `F.__closure__[1].cell_contents`. The translator attaches a
source to every value it read from the frame, so that it can guard it and reach it again at run time.

`GuardSet` collects guards while translating (deduplicated, in order: an object's type/identity
before its attributes) and `build()` generates ONE Python function `__guard(F, L_a, L_b, ...)`
returning a bool: an `and` chain of cheap checks, where a nested source is computed once with an
assignment expression and reused. Any exception while checking means "does not hold".
"""
from __future__ import annotations

import itertools
import keyword
import operator
import re
import weakref

from .. import _state
from .._code_cache import compile_source
from .._device import canonical
from .._tensor import Tensor
from ..nn.modules.module import Module

_WEAKLY_HELD = (Module,)          # identity-guarded by weak reference (see GuardSet.id_match)

_ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def local_name(name: str) -> str:
    """The generated-code parameter name for frame local `name`."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return "L_" + s


class Source:
    """A Python expression naming where a value lives (see module docstring). Derived sources keep
    a template over their base (`{B}.weight`) so generated code can substitute a cached base."""
    __slots__ = ("expr", "base", "tmpl", "_name")

    def __init__(self, expr: str, base: "Source | None" = None, name: str | None = None, tmpl: str | None = None):
        self.expr = expr
        self.base = base
        self.tmpl = tmpl
        self._name = name or expr

    def name(self) -> str:
        """PyTorch-style name for messages: L['x'], G['w'], L['self'].weight."""
        return self._name

    def _derive(self, tmpl: str, name: str) -> "Source":
        return Source(tmpl.replace("{B}", self.expr), self, name, tmpl)

    def attr(self, a: str) -> "Source":
        if _ident.match(a) and not keyword.iskeyword(a):
            return self._derive("{B}." + a, f"{self._name}.{a}")
        return self._derive("getattr({B}, %r)" % a, f"getattr({self._name}, {a!r})")

    def item(self, key) -> "Source":
        return self._derive("{B}[%r]" % (key,), f"{self._name}[{key!r}]")

    def dict_item(self, key) -> "Source":
        """The entry `key` of a dict (or dict subclass) by dict's own lookup, whatever `__getitem__`
        the subclass defines."""
        return self._derive("dict.__getitem__({B}, %r)" % (key,), f"{self._name}[{key!r}]")

    def expr_with(self, base_expr: str) -> str:
        return self.tmpl.replace("{B}", base_expr)

    def root(self) -> "Source":
        s = self
        while s.base is not None:
            s = s.base
        return s

    def __repr__(self) -> str:
        return self._name


def LocalSource(name: str) -> Source:
    return Source(local_name(name), None, f"L[{name!r}]")


def GlobalSource(name: str) -> Source:
    return Source(f"G[{name!r}]", None, f"G[{name!r}]")


def ClosureSource(index: int, name: str) -> Source:
    return Source(f"F.__closure__[{index}].cell_contents", None, f"L[{name!r}]")


def graph_input_name(src: Source) -> str:
    """A readable placeholder name for a graph input, like PyTorch's `L_x_`, `L_self_weight_`."""
    return re.sub(r"_+", "_", re.sub(r"[^0-9A-Za-z]", "_", src.name().replace("'", ""))).strip("_") + "_"


class GuardSet:
    """Guards collected while translating one frame (see module docstring)."""

    def __init__(self):
        self.checks: list = []            # (source or None, python condition text using {S} for the source);
                                          # after build(), a tuple of (None, condition text, description)
        self._seen: set = set()
        self.consts: dict = {}            # name -> object referenced by the guard code
        self._const_ids: dict = {}
        self.weak: list = []              # weakrefs to the objects identity-guarded by weak reference
        self._module_state = None
        self._modules: dict = {}          # source expr -> weakref of the module identity-guarded there

    def const(self, obj) -> str:
        k = id(obj)
        name = self._const_ids.get(k)
        if name is None:
            name = f"___c{len(self.consts)}"
            self.consts[name] = obj
            self._const_ids[k] = name
        return name

    def add(self, source: Source | None, cond: str, desc: str) -> None:
        key = (source.expr if source is not None else None, cond)
        if key in self._seen:
            return
        self._seen.add(key)
        self.checks.append((source, cond, desc))

    # ---- guard kinds ---------------------------------------------------------------------------
    def type_match(self, src: Source, tp: type) -> None:
        self.add(src, f"type({{S}}) is {self.const(tp)}", f"TYPE_MATCH: type({src.name()}) is {tp.__name__}")

    def weak_const(self, obj) -> str:
        """A name the guard code calls to get `obj` back (None once it died): the entry does not
        keep it alive, and dies with it (see `drop_with`)."""
        k = ("weak", id(obj))
        name = self._const_ids.get(k)
        if name is None:
            ref = weakref.ref(obj)
            name = f"___c{len(self.consts)}"
            self.consts[name] = ref
            self._const_ids[k] = name
            self.weak.append(ref)
        return name

    def id_match(self, src: Source, obj) -> None:
        if isinstance(obj, _WEAKLY_HELD):      # a model: its compiled code must not keep its weights alive
            self.add(src, f"{{S}} is {self.weak_const(obj)}()", f"ID_MATCH: {src.name()} is {_short(obj)}")
            self._modules.setdefault(src.expr, weakref.ref(obj))
            return
        self.add(src, f"{{S}} is {self.const(obj)}", f"ID_MATCH: {src.name()} is {_short(obj)}")

    def drop_with(self, on_death) -> None:
        """Call `on_death()` once when any weakly guarded object dies (an entry that can never match
        again is dropped, as PyTorch's guards invalidate their cache entry)."""
        for ref in self.weak:
            obj = ref()
            if obj is not None:
                weakref.finalize(obj, on_death)

    def equals_match(self, src: Source, value) -> None:
        self.type_match(src, type(value))
        if isinstance(value, float) and value != value:
            self.add(src, "{S} != {S}", f"EQUALS_MATCH: {src.name()} is nan")
            return
        lit = repr(value) if _literal(value) else self.const(value)
        self.add(src, f"{{S}} == {lit}", f"EQUALS_MATCH: {src.name()} == {value!r}")

    def len_match(self, src: Source, tp: type, n: int) -> None:
        self.type_match(src, tp)
        self.add(src, f"len({{S}}) == {n}", f"LENGTH_CHECK: len({src.name()}) == {n}")

    def dict_keys(self, src: Source, tp: type, keys: list) -> None:
        self.type_match(src, tp)
        self.add(src, f"list({{S}}.keys()) == {self.const(list(keys))}", f"DICT_KEYS: {src.name()} keys == {keys!r}")

    def attr_equals(self, src: Source, attr: str, value) -> None:
        self.add(src, f"{{S}}.{attr} is {value!r}" if isinstance(value, bool) or value is None
                 else f"{{S}}.{attr} == {value!r}", f"{src.name()}.{attr} == {value!r}")

    def tensor_match(self, src: Source, t: Tensor, dynamic_dims: tuple = ()) -> None:
        c = self.const
        shape = tuple(t._data.shape)
        parts = [f"type({{S}}) is {c(type(t))}", f"{{S}}._dtype is {c(t._dtype)}",
                 f"{{S}}._device == {c(t._device)}", f"{{S}}._requires_grad is {bool(t._requires_grad)}"]
        if not dynamic_dims:
            parts.append(f"{{S}}._data.shape == {shape!r}")
            parts.append(f"{{S}}._data.strides == {tuple(t._data.strides)!r}")
            size_desc = str(list(shape))
        else:
            parts.append(f"{{S}}._data.ndim == {len(shape)}")
            for d, s in enumerate(shape):
                if d not in dynamic_dims:
                    parts.append(f"{{S}}._data.shape[{d}] == {s}")
            parts.append(f"{c(_is_contiguous)}({{S}}) is {t.is_contiguous()}")
            size_desc = str([("*" if d in dynamic_dims else s) for d, s in enumerate(shape)])
        self.add(src, " and ".join(parts),
                 f"TENSOR_MATCH: {src.name()} {t.dtype} {t.device} requires_grad={t.requires_grad} size={size_desc}")

    def grad_mode(self) -> None:
        self.add(None, f"{self.const(_state.tls)}.grad_enabled is {_state.tls.grad_enabled}",
                 f"GLOBAL_STATE: grad_enabled is {_state.tls.grad_enabled}")
        self.add(None, f"{self.const(_state.tls)}.autocast == {self.const(dict(_state.tls.autocast))}",
                 f"GLOBAL_STATE: autocast == {dict(_state.tls.autocast)!r}")
        self.add(None, f"{self.const(_state)}.default_dtype is {self.const(_state.default_dtype)}",
                 f"GLOBAL_STATE: default_dtype is {_state.default_dtype}")
        dev = _state.tls.default_device       # None (cpu) or the device of `with flambeau.device(...)`
        if dev is None:
            self.add(None, f"{self.const(_state.tls)}.default_device is None", "DEFAULT_DEVICE: cpu")
        else:
            self.add(None, f"{self.const(canonical)}({self.const(_state.tls)}.default_device) == "
                           f"{self.const(canonical(dev))}", f"DEFAULT_DEVICE: {canonical(dev)}")

    def raw(self, cond: str, desc: str) -> None:
        self.add(None, cond, desc)

    def module_state(self, module) -> None:
        """Guard (in one bulk check per entry) what a backend bakes in when it traces a module call:
        the training flags, absence of hooks, identity of parameters/buffers/submodules and their
        requires_grad, for `module` and everything below it."""
        if self._module_state is None:
            self._module_state = ModuleState()
            self.add(None, f"{self.const(self._module_state)}()", "MODULE_STATE: training flags, no hooks, "
                     "same parameters/buffers/submodules with the same requires_grad")
        self._module_state.extend(module.modules())

    # ---- code generation ---------------------------------------------------------------------
    def build(self, argnames: list, globals_dict: dict):
        """(guard function, its source, per-check descriptions)."""
        temps: dict = {}
        counter = itertools.count()
        conds = []

        def expr_of(src: Source) -> str:
            if src.base is None:
                return src.expr
            t = temps.get(src.expr)
            if t is not None:
                return t
            t = temps[src.expr] = f"___t{next(counter)}"
            return f"({t} := {src.expr_with(expr_of(src.base))})"

        def body_of(checks) -> str:
            temps.clear()
            conds = []
            for src, cond, _ in checks:
                if src is None:
                    conds.append(cond)
                    continue
                first = expr_of(src)
                cond = cond.replace("{S}", first, 1)
                conds.append(cond.replace("{S}", temps.get(src.expr, first)))
            return " and\n            ".join(f"({c})" for c in conds) or "True"
        params = ", ".join(["F"] + argnames)
        src = (f"def ___guard({params}):\n"
               f"    try:\n"
               f"        return ({body_of(self.checks)})\n"
               f"    except Exception:\n"
               f"        return False\n")
        ns = dict(self.consts)
        ns["G"] = globals_dict
        kept, held = self._fold_module_constants()
        if held is not None:
            # the checks on constants held by guarded modules as one identity check (`ModuleConstants`); when
            # it fails (an attribute given another object, maybe an equal one), the full guard decides
            ns["___held"] = held
            src = (f"def ___guard({params}):\n"
                   f"    try:\n"
                   f"        if not ({body_of(kept)}):\n"
                   f"            return False\n"
                   f"    except Exception:\n"
                   f"        return False\n"
                   f"    return ___held() or ___guard_full({params})\n"
                   f"def ___guard_full({params}):\n"
                   f"    try:\n"
                   f"        return ({body_of(self.checks)})\n"
                   f"    except Exception:\n"
                   f"        return False\n")
        exec(compile_source(src, "<flambeau._dynamo guards>"), ns)
        # kept for recompile reasons and explain() only: each check as its condition text and description,
        # strings the garbage collector never walks (not the Source objects, nor the set of seen keys)
        self.checks = tuple((None, cond.replace("{S}", f"({s.expr})") if s is not None else cond, desc)
                            for s, cond, desc in self.checks)
        self._seen = set()
        return ns["___guard"], src

    def _fold_module_constants(self) -> tuple:
        """(the checks left, a `ModuleConstants` standing for the others, or None when none fold). A check
        folds when its source is an attribute of an identity-guarded module, or an item of one (a conv's
        `stride[0]`), whose value is immutable (numbers, strings, None, tuples of them) and kept in the
        module's `__dict__` or its class's (`_plain_attribute`): while that attribute holds the same object,
        every check on it gives what it gave when the guard was built. An attribute folds only if all the
        checks below it do and they hold now (they are evaluated here on its current value)."""
        if not self._modules:
            return self.checks, None
        units: dict = {}                  # attribute source expr -> [(check, item steps below it)], or None
        order = []
        for check in self.checks:
            src = check[0]
            steps = []
            while src is not None and src.base is not None and src.base.expr not in self._modules:
                steps.append(src.tmpl)
                src = src.base
            if src is None or src.base is None:
                continue
            attr = src.tmpl[4:] if src.tmpl.startswith("{B}.") else None
            if attr is None or not all(t.startswith("{B}[") for t in steps):
                units[src.expr] = None
                continue
            if src.expr not in units:
                order.append((src.expr, src.base.expr, attr))
                units[src.expr] = []
            if units[src.expr] is not None:
                units[src.expr].append((check, steps[::-1]))
        held = ModuleConstants()
        folded = set()
        for expr, base, attr in order:
            checks = units[expr]
            module = self._modules[base]()
            if checks is None or module is None or not _plain_attribute(module, attr):
                continue
            value = getattr(module, attr)
            if not _immutable(value) or not all(self._holds(cond, value, steps) for (_, cond, _), steps in checks):
                continue
            held.add(module, attr, value)
            folded.update(id(c) for c, _ in checks)
        if not folded:
            return self.checks, None
        return [c for c in self.checks if id(c) not in folded], held

    def _holds(self, cond: str, value, steps: list) -> bool:
        """Whether check `cond` holds on the value reached from `value` by the item `steps` (templates)."""
        expr = "___v"
        for tmpl in steps:
            expr = tmpl.replace("{B}", expr)
        try:
            return bool(eval(cond.replace("{S}", f"({expr})"), dict(self.consts, ___v=value)))
        except Exception:
            return False

    def failures(self, argnames: list, globals_dict: dict, F, args) -> list:
        """Descriptions of the checks that fail for these arguments (for recompile reasons)."""
        ns = dict(self.consts)
        ns["G"] = globals_dict
        ns["F"] = F
        ns.update(zip(argnames, args))
        out = []
        for src, cond, desc in self.checks:
            text = cond.replace("{S}", f"({src.expr})") if src is not None else cond
            try:
                ok = bool(eval(text, ns))
            except Exception:
                ok = False
            if not ok:
                out.append(desc)
        return out


_get_training = operator.itemgetter("training")
_requires_grad = operator.attrgetter("_requires_grad")
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


class ModuleState:
    """A bulk guard over many modules (whose identities other guards check), evaluated with C-level
    iteration over objects captured at compile time: their `__dict__`s (training flags), their hook
    dicts (must stay empty), the dict slots of their parameters/buffers/submodules (same objects)
    and the parameters' requires_grad."""

    def __init__(self):
        self.dicts, self.hooks, self.slot_dicts, self.slot_keys, self.members = [], [], [], [], []
        self._ids: set = set()

    def extend(self, modules) -> None:
        for m in modules:
            if id(m) in self._ids:
                continue
            self._ids.add(id(m))
            d = m.__dict__
            self.dicts.append(d)
            self.hooks += [d[h] for h in _HOOKS]
            for store in ("_parameters", "_buffers", "_modules"):
                for k, v in d[store].items():
                    self.slot_dicts.append(d[store])
                    self.slot_keys.append(k)
                    self.members.append(v)
        self.training = list(map(_get_training, self.dicts))
        self.tensors = [t for t in self.members if isinstance(t, Tensor)]
        self.requires_grad = list(map(_requires_grad, self.tensors))
        self.hooks_t = tuple(self.hooks)

    def __call__(self) -> bool:
        return (list(map(_get_training, self.dicts)) == self.training and not any(self.hooks_t)
                and all(map(operator.is_, map(operator.getitem, self.slot_dicts, self.slot_keys), self.members))
                and list(map(_requires_grad, self.tensors)) == self.requires_grad)


_MISSING = object()           # what ModuleConstants reads for an attribute no longer in the module's __dict__


class ModuleConstants:
    """Attributes of guarded modules that must still hold the same (immutable) objects, checked in C-level
    passes over the modules' `__dict__`s (held here: they hold what the modules' other guards already keep;
    the entry is dropped with its modules, `GuardSet.drop_with`) and, for an attribute the class holds
    (a conv's `_n`), over the classes, the instance dicts not shadowing it."""

    def __init__(self):
        self.dicts, self.names, self.values = [], [], []
        self.classes, self.class_dicts, self.class_names, self.class_values = [], [], [], []

    def add(self, module, name: str, value) -> None:
        if name in module.__dict__:
            self.dicts.append(module.__dict__)
            self.names.append(name)
            self.values.append(value)
        else:
            self.classes.append(type(module))
            self.class_dicts.append(module.__dict__)
            self.class_names.append(name)
            self.class_values.append(value)

    def __call__(self) -> bool:
        is_ = operator.is_
        return all(map(is_, map(dict.get, self.dicts, self.names, itertools.repeat(_MISSING)), self.values)) and \
            all(map(is_, map(getattr, self.classes, self.class_names), self.class_values)) and \
            not any(map(dict.__contains__, self.class_dicts, self.class_names))


def _plain_attribute(obj, attr: str) -> bool:
    """Whether `getattr(obj, attr)` reads `obj.__dict__[attr]`, or the class's value when the instance has none:
    no `__getattribute__` of the class's own, no data descriptor of that name on the class (a property) and,
    for a class-held value, no descriptor at all."""
    cls = type(obj)
    if cls.__getattribute__ is not object.__getattribute__:
        return False
    found = getattr(cls, attr, _MISSING)
    if attr in obj.__dict__:
        return found is _MISSING or not (hasattr(type(found), "__set__") or hasattr(type(found), "__delete__"))
    return found is not _MISSING and not hasattr(type(found), "__get__")


def _immutable(v) -> bool:
    if type(v) in (int, float, bool, str, bytes, type(None), complex):
        return True
    return type(v) is tuple and all(_immutable(x) for x in v)


def _is_contiguous(t) -> bool:
    return t.is_contiguous()


def _literal(v) -> bool:
    if type(v) in (int, float, bool, str, bytes, type(None)):
        return not (type(v) is float and (v != v or v in (float("inf"), float("-inf"))))
    if type(v) in (tuple, frozenset):
        return all(_literal(x) for x in v)
    return False


def _short(obj) -> str:
    r = repr(obj) if not hasattr(obj, "__name__") else f"{type(obj).__name__} {obj.__name__}"
    return r if len(r) < 60 else r[:57] + "..."
