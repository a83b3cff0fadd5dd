"""nn.Module instances while tracing.

A module is guarded by identity. Its parameters and buffers become `get_attr` nodes that refer to
the very tensor objects (so optimizer updates are seen without recompiling; replacing a parameter
fails the identity guard on `_parameters[name]`), its submodules are modules again, `training` is
guarded when read. Calling a module from `flambeau.nn` records one `call_module` node (the module
runs its own code, hooks included, when the graph runs); calling a user module inlines its
`forward` (modules with hooks break the graph); containers (Sequential, ModuleList, ModuleDict)
are unrolled.
"""
from __future__ import annotations

import inspect
import types

from .. import config
from ..exc import Unsupported
from .base import VariableTracker, const
from ...nn.modules.container import Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict
from ...nn.modules._module_utils import hooks_version
from .builder import build
from .functions import UserMethodVariable
from .objects import ClassVariable, _missing_attr
from .containers import ListIteratorVariable, TupleVariable
from ..utils import is_disabled


def _containers():
    return Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict


def is_leaf_module(m) -> bool:
    """Built-in layers are inlined like user modules (PyTorch's inline_inbuilt_nn_modules), so the
    graph shows their functional calls; with the config off, or for the few whose forward is not
    capturable Python (recurrent layers: packed sequences, flattened weights), one call_module node."""
    mod = type(m).__module__
    if not mod.startswith("flambeau.nn.") or isinstance(m, _containers()):
        return False
    return not config.inline_inbuilt_nn_modules or type(m).__name__ in _OPAQUE_BUILTINS


_OPAQUE_BUILTINS = {"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"}


def has_hooks(m) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def _guard_hooks_unchanged(tx) -> None:
    """One guard per graph for every inlined module's "has no hooks": the global hook version."""
    out = tx.output
    if getattr(out, "_hooks_guarded", False):
        return
    g = out.guards
    g.raw(f"{g.const(hooks_version)}[0] == {hooks_version[0]}",
          "HOOKS: no module hook registered or removed since capture (the inlined modules had none)")
    out._hooks_guarded = True


class NNModuleVariable(VariableTracker):
    def __init__(self, module, source):
        self.value = module
        self.source = source

    def python_type(self):
        return type(self.value)

    def __repr__(self):
        return f"NNModuleVariable({type(self.value).__name__})"

    def _sub(self, tx, name):
        return build(tx, self.value.__dict__["_modules"][name], self.source.attr("_modules").item(name))

    def var_getattr(self, tx, name):
        m = self.value
        pending = tx.output.side_effects.pending_attr(self, name)
        if pending is not None:
            return pending
        d = m.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if name in d.get(store, ()):
                v = d[store][name]
                src = self.source.attr(store).item(name)
                if v is None:
                    tx.output.guards.add(src, "{S} is None", f"{src.name()} is None")
                    return const(None)
                if store == "_modules":
                    return build(tx, v, src)
                return tx.output.module_tensor(v, src, is_param=store == "_parameters")
        if name == "training":
            tx.output.guards.add(self.source, f"{{S}}.training is {m.training}", f"{self.source.name()}.training")
            return const(m.training)
        if name == "__class__":
            return ClassVariable(type(m))
        if name in d:
            return build(tx, d[name], self.source.attr(name))
        try:
            static = inspect.getattr_static(m, name)
        except AttributeError:
            raise _missing_attr(f"'{type(m).__name__}' object", name)
        if isinstance(static, types.FunctionType):
            return UserMethodVariable(static, self)
        if isinstance(static, property):
            return tx.inline_call(static.fget, [self], {})
        if isinstance(static, staticmethod):
            return build(tx, static.__func__, None)
        if isinstance(static, classmethod):
            return UserMethodVariable(static.__func__, ClassVariable(type(m)))
        return build(tx, getattr(m, name), self.source.attr(name))

    def children(self, tx):
        m = self.value
        src = self.source.attr("_modules")
        tx.output.guards.dict_keys(src, type(m._modules), list(m._modules))
        return [(k, self._sub(tx, k)) for k in m._modules]

    def has_unpack_var_sequence(self, tx):
        return isinstance(self.value, _containers())

    def unpack_var_sequence(self, tx):
        Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict = _containers()
        m = self.value
        if isinstance(m, (ParameterList, ParameterDict)):
            src = self.source.attr("_parameters")
            tx.output.guards.dict_keys(src, type(m._parameters), list(m._parameters))
            items = [self.var_getattr(tx, k) for k in m._parameters]
            return items if isinstance(m, ParameterList) else [const(k) for k in m._parameters]
        kids = self.children(tx)
        if isinstance(m, ModuleDict):
            return [const(k) for k, _ in kids]
        return [v for _, v in kids]

    def getitem(self, tx, key):
        Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict = _containers()
        m = self.value
        k = key.as_python_constant()
        if isinstance(m, (ParameterList, ParameterDict)):
            names = list(m._parameters)
            name = names[k] if isinstance(m, ParameterList) else k
            return self.var_getattr(tx, name)
        if isinstance(m, ModuleDict):
            return self.var_getattr(tx, k)
        if isinstance(m, (Sequential, ModuleList)):
            if isinstance(k, slice):
                raise Unsupported("slicing a module container")
            kids = self.children(tx)
            return kids[k][1]
        raise Unsupported(f"indexing {type(m).__name__}")

    def call_method(self, tx, name, args, kwargs):
        m = self.value
        if name == "forward":
            return self._forward(tx, args, kwargs)
        if name == "__len__" and isinstance(m, _containers()):
            return const(len(self.unpack_var_sequence(tx)))
        if name in ("children", "values") and not args:
            return ListIteratorVariable([v for _, v in self.children(tx)])
        if name in ("named_children", "items") and not args:
            return ListIteratorVariable([TupleVariable([const(k), v]) for k, v in self.children(tx)])
        if name == "keys" and not args:
            return ListIteratorVariable([const(k) for k, _ in self.children(tx)])
        if name in ("parameters", "buffers", "named_parameters", "named_buffers", "modules", "named_modules"):
            return self._walk(tx, name, args, kwargs)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__setattr__" and len(args) == 2:
            tx.store_attr(self, args[0].as_python_constant(), args[1])
            return const(None)
        if name in ("train", "eval", "to", "cuda", "cpu", "apply", "register_buffer", "register_parameter",
                    "add_module", "zero_grad", "requires_grad_", "half", "float", "double", "load_state_dict"):
            raise Unsupported(f"Module.{name}() changes the module (run eagerly)")
        return super().call_method(tx, name, args, kwargs)

    def _walk(self, tx, name, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"Module.{name} with arguments")
        m = self.value
        out = []
        if name in ("modules", "named_modules"):
            for qn, sub in m.named_modules():
                vt = self._by_path(tx, qn)
                out.append(TupleVariable([const(qn), vt]) if name.startswith("named") else vt)
            return ListIteratorVariable(out)
        kind = "parameters" if "parameters" in name else "buffers"
        gen = m.named_parameters() if kind == "parameters" else m.named_buffers()
        for qn, _ in gen:
            *path, leaf = qn.split(".")
            owner = self._by_path(tx, ".".join(path))
            vt = owner.var_getattr(tx, leaf)
            out.append(TupleVariable([const(qn), vt]) if name.startswith("named") else vt)
        return ListIteratorVariable(out)

    def _by_path(self, tx, path: str):
        vt = self
        for part in (path.split(".") if path else []):
            vt = vt._sub(tx, part)
        return vt

    def call_function(self, tx, args, kwargs):
        Sequential = _containers()[0]
        m = self.value
        if is_leaf_module(m):
            return tx.output.call_module(tx, self, args, kwargs)
        _guard_hooks_unchanged(tx)
        if has_hooks(m):
            raise Unsupported(f"{type(m).__name__} has hooks (calls with hooks are not captured)")
        if type(m).forward is Sequential.forward and isinstance(m, Sequential):
            (x,) = args
            for sub in self.unpack_var_sequence(tx):
                x = sub.call_function(tx, [x], {})
            return x
        return self._forward(tx, args, kwargs)

    def _forward(self, tx, args, kwargs):
        fwd = inspect.getattr_static(self.value, "forward")
        if not isinstance(fwd, types.FunctionType):
            raise Unsupported(f"{type(self.value).__name__}.forward is not a Python function")
        if is_disabled(fwd):
            raise Unsupported(f"{type(self.value).__name__}.forward is marked flambeau._dynamo.disable")
        return tx.inline_call(fwd, [self] + list(args), kwargs)

    def reconstruct(self, cg):
        return cg.source_expr(self.source)
