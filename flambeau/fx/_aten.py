"""`flambeau.ops.aten.<name>.<overload>`: PyTorch's `torch.ops.aten` view of the operator registry.

`flambeau.ops.aten.add` is an overload packet; `.Tensor`, `.Scalar`, `.default` are the `Op`
objects of `flambeau._ops.OPS` ('add.Tensor', 'add.Scalar', 'add'). Graphs produced by `make_fx`
use these Ops as call_function targets and print them under this path.
"""
from __future__ import annotations

from .._ops._registry import OPS, OP_LIBRARIES, Op
from .._tensor import Tensor


def is_op(x) -> bool:
    return isinstance(x, Op)


class OpOverloadPacket:
    """All overloads of one operator name; calling it picks the overload whose binder accepts the
    arguments and whose Tensor-typed slots hold tensors."""

    def __init__(self, name: str, library: str = "aten"):
        self._name = name          # the key prefix in OPS: 'add', or 'quantized_decomposed::quantize_per_tensor'
        self._library = library
        self._ovs = None

    @property
    def _overloads(self) -> dict:
        if self._ovs is None:
            out = {}
            for k, op in OPS.items():
                base, _, ov = k.partition(".")
                if base == self._name:
                    out[ov or "default"] = op
            self._ovs = out
        return self._ovs

    def overloads(self) -> list:
        return list(self._overloads)

    def __getattr__(self, ov: str):
        if ov.startswith("__"):
            raise AttributeError(ov)
        op = OPS.get(self._name if ov == "default" else f"{self._name}.{ov}")
        if op is None:
            raise AttributeError(f"The underlying op of '{self}' has no overload name '{ov}'")
        return op

    def __call__(self, *args, **kwargs):
        ovs = self._overloads
        if len(ovs) == 1:
            return next(iter(ovs.values()))(*args, **kwargs)
        for op in ovs.values():
            try:
                bound = op.bind(*args, **kwargs)
            except TypeError:
                continue
            if all(isinstance(bound[i], Tensor) == op._schema.args[i].is_tensor
                   for i in op.tensor_args if bound[i] is not None and not op._schema.args[i].is_tensor_list):
                return op(*args, **kwargs)
        raise TypeError(f"{self}: no overload accepts these arguments")

    def __repr__(self):
        return f"{self._library}.{self._name.rpartition('::')[2]}"


class _Namespace:
    """`flambeau.ops.aten`, or the namespace of another library whose operators are declared in
    `flambeau._ops` (registered as "<library>::<name>")."""

    def __init__(self, name: str):
        self._ns = name
        self._prefix = "" if name == "aten" else name + "::"
        self._cache: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        p = self._cache.get(name)
        if p is None:
            key = self._prefix + name
            if key not in OPS and not any(k.startswith(key + ".") for k in OPS):
                raise AttributeError(f"'_OpNamespace' '{self._ns}' object has no attribute '{name}'")
            p = self._cache[name] = OpOverloadPacket(key, self._ns)
        return p


# namespace -> {name: CustomOp} of the operators defined by flambeau.library (custom_op, Library.define)
CUSTOM_OPS: dict[str, dict] = {}


class CustomOpPacket:
    """`flambeau.ops.<ns>.<name>` of a custom operator: calls its one overload, `.default`."""

    def __init__(self, op: Op):
        self.default = op
        self._qualified_op_name = f"{op.namespace}::{op._schema.name}"
        self.__name__ = op._schema.name

    @property
    def _schema(self):
        return self.default._schema

    def overloads(self) -> list:
        return ["default"]

    def __getattr__(self, name: str):
        raise AttributeError(f"The underlying op of '{self.default.namespace}.{self.__name__}' has no overload "
                             f"name '{name}'")

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<OpOverloadPacket(op='{self.default.namespace}.{self.__name__}')>"


class _CustomNamespace:
    """`flambeau.ops.<ns>` for a namespace of custom operators."""

    def __init__(self, name: str):
        self._ns = name
        self._packets: dict = {}

    def __getattr__(self, name: str):
        op = CUSTOM_OPS.get(self._ns, {}).get(name)
        if op is None:
            raise AttributeError(f"'_OpNamespace' '{self._ns}' object has no attribute '{name}'")
        p = self._packets.get(name)
        if p is None or p.default is not op:
            p = self._packets[name] = CustomOpPacket(op)
        return p


class _Ops:
    """`flambeau.ops`: the `aten` namespace, and one per namespace of custom operators."""

    def __init__(self):
        self.aten = _Namespace("aten")
        self._custom: dict = {}

    def __getattr__(self, ns: str):
        if ns.startswith("__"):
            raise AttributeError(ns)
        n = self._custom.get(ns)
        if n is None:
            n = self._custom[ns] = _Namespace(ns) if ns in OP_LIBRARIES else _CustomNamespace(ns)
        return n


ops = _Ops()
