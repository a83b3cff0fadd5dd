"""`flambeau.library` (PyTorch's `torch.library`): Python custom operators.

High level: `custom_op("ns::name", mutates_args=())` turns a type-annotated function into an
operator (schema inferred from its hints, `infer_schema`), reachable as `flambeau.ops.ns.name`;
`register_fake` gives it the shape function that fake tensors, `dynamic=True` and compilation
use, `register_autograd` a backward (`setup_context` saves what it needs), `register_kernel` a
kernel per device type (`cpu`, `cuda`, a renamed PrivateUse1 device). `opcheck` tests an
operator's registrations as PyTorch's does (schema, fake, autograd, AOT under dynamic shapes).

Low level: `Library("ns", "DEF" | "IMPL" | "FRAGMENT")` with `define(schema)` and
`impl(name, fn, dispatch_key)`; `define`, `impl`, `impl_abstract`, `register_fake` as functions.

Every operator defined here is a `CustomOp` (`custom_ops.py`): one operator to the dispatcher,
autograd, tracing, AOT autograd and the code generator.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Sequence

from .. import _device
from . import custom_ops as _co
from .._ops._registry import OPS, Op
from .custom_ops import CustomOp, CustomOpDef, OpOverloadPacket, split_qualname
from .infer_schema import infer_schema
from .opcheck_tests import opcheck, OpCheckError, register_opcheck_test

__all__ = ["custom_op", "register_fake", "register_autograd", "register_kernel", "CustomOpDef", "Library",
           "define", "impl", "impl_abstract", "infer_schema", "opcheck", "OpCheckError", "get_op"]

_DISPATCH_KEYS = {"CPU": "cpu", "CUDA": "cuda", "Meta": "meta", "PrivateUse1": "privateuseone",
                  "CompositeExplicitAutograd": None, "CompositeImplicitAutograd": None, "": None}
_LIBRARY_KINDS = ("DEF", "IMPL", "FRAGMENT")
_DEF_NAMESPACES: set = set()


def _as_op(op) -> Op:
    if isinstance(op, CustomOpDef):
        return op._opoverload
    if isinstance(op, OpOverloadPacket):
        return op.default
    if isinstance(op, CustomOp):
        return op
    if isinstance(op, Op):
        return op
    if isinstance(op, str) and op.startswith("aten::"):
        name = op[len("aten::"):]
        found = OPS.get(name[:-len(".default")] if name.endswith(".default") else name)
        if found is None:
            raise ValueError(f"Could not find the operator {op}.")
        return found
    if isinstance(op, str):
        return _co.lookup(op)
    raise TypeError(f"Expected an operator name (ns::name), a CustomOpDef or an OpOverload, got {type(op).__name__}")


def get_op(qualname: str) -> OpOverloadPacket:
    """The packet `flambeau.ops.<ns>.<name>` of a defined custom operator."""
    return OpOverloadPacket(_co.lookup(qualname))


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args: str | Iterable[str],
              device_types: str | Sequence[str] | None = None, schema: str | None = None):
    """Define operator `name` ("ns::op") from `fn`; usable as a decorator (see the module docstring)."""
    ns, opname = split_qualname(name)

    def make(f: Callable) -> CustomOpDef:
        if schema is None:
            text = infer_schema(f, mutates_args=mutates_args, op_name=opname)
        else:
            text = opname + schema
        op = _co.define(ns, text)
        if schema is not None and mutates_args != "unknown":
            expected = {op._schema.args[i].name for i in op.mutated_args}
            if expected != set(mutates_args):
                raise ValueError(f"Attempted to create a custom op with `mutates_args={mutates_args}` and "
                                 f"`schema={schema}. The schema suggests that the op mutates {expected}which is "
                                 f"different from what was provided to us in `mutates_args`. Please make these "
                                 f"consistent.")
        result = CustomOpDef(op, f)
        _co.register_kernel(op, device_types, f)
        return result
    return make if fn is None else make(fn)


def register_fake(op, func: Callable | None = None, /, *, lib=None, _stacklevel: int = 1,
                  allow_override: bool = False):
    """Register the fake (shape) function of `op`; usable as a decorator."""
    target = _as_op(op)

    def register(f: Callable) -> Callable:
        target.fake = f
        return f
    return register if func is None else register(func)


def impl_abstract(qualname, func: Callable | None = None, *, lib=None, _stacklevel: int = 1):
    """The old name of `register_fake` (warns as PyTorch's)."""
    warnings.warn("`torch.library.impl_abstract` was renamed to `torch.library.register_fake`. Please use that "
                  "instead; we will remove `torch.library.impl_abstract` in a future version of PyTorch.",
                  FutureWarning, stacklevel=2)
    return register_fake(qualname, func, lib=lib)


def register_autograd(op, backward: Callable, /, *, setup_context: Callable | None = None, lib=None) -> None:
    """Register `backward(ctx, *grads)` (and `setup_context(ctx, inputs, output)`) for `op`."""
    _co.register_autograd(_as_op(op), backward, setup_context=setup_context)


def register_kernel(op, device_types: str | Sequence[str] | None, func: Callable | None = None, /, *, lib=None):
    """Register `func` as `op`'s kernel on `device_types` (None: every device); usable as a decorator."""
    target = _as_op(op)

    def register(f: Callable) -> Callable:
        if isinstance(target, CustomOp):
            _co.register_kernel(target, device_types, f)
            return f
        for d in [device_types] if isinstance(device_types, str) else device_types:
            _co.override_kernel(target, _device.canonical(d).type, f)
        return f
    return register if func is None else register(func)


def define(qualname: str, schema: str, *, lib=None, tags=()) -> None:
    """Define `qualname` ("ns::name") with `schema` ("(Tensor x) -> Tensor"), no kernel yet."""
    ns, name = split_qualname(qualname)
    _co.define(ns, name + schema, tags)


def impl(qualname, types: str | Sequence[str], func: Callable | None = None, *, lib=None):
    """Register `func` as the kernel of `qualname` on the device type(s) `types`; usable as a decorator."""
    return register_kernel(qualname, types, func)


def _apply_dispatch_key(op: Op, fn: Callable, dispatch_key: str) -> None:
    if not isinstance(op, CustomOp):        # a registry operator: its kernel replaced on one device
        device_type = _DISPATCH_KEYS.get(dispatch_key)
        if device_type is None or device_type == "meta":
            raise NotImplementedError(f"impl: overriding {op.name} at '{dispatch_key}' (only a device key: CPU, "
                                      f"CUDA, PrivateUse1)")
        _co.override_kernel(op, _device.privateuse1_name() if device_type == "privateuseone" else device_type, fn)
        return
    if dispatch_key in ("Meta", "Fake"):
        op.fake = fn
        return
    if dispatch_key == "CompositeImplicitAutograd":
        op.default_kernel = fn
        op.decomposition = fn       # differentiated and compiled through its body, as in PyTorch
        return
    if dispatch_key in _DISPATCH_KEYS:
        device_type = _DISPATCH_KEYS[dispatch_key]
        _co.register_kernel(op, _device.privateuse1_name() if device_type == "privateuseone" else device_type, fn)
        return
    raise ValueError(f"impl: dispatch key '{dispatch_key}' is not one of {sorted(k for k in _DISPATCH_KEYS if k)} "
                     "or Meta")


class Library:
    """`Library(ns, kind)`: "DEF" defines the namespace's operators, "IMPL" registers kernels for
    operators defined elsewhere, "FRAGMENT" may do both (PyTorch's torch.library.Library)."""

    def __init__(self, ns: str, kind: str, dispatch_key: str = ""):
        if kind not in _LIBRARY_KINDS:
            raise ValueError(f"Unsupported kind: {kind}")
        if kind == "DEF":
            if ns in _DEF_NAMESPACES:
                raise RuntimeError(f"Only a single TORCH_LIBRARY can be used to register the namespace {ns}; "
                                   f"please put all of your definitions in a single TORCH_LIBRARY block. If you "
                                   f"were trying to specify implementations, consider using TORCH_LIBRARY_IMPL "
                                   f"(which can be duplicated). If you really intended to define operators for a "
                                   f"single namespace in a distributed way, you can use TORCH_LIBRARY_FRAGMENT to "
                                   f"explicitly indicate this.")
            _DEF_NAMESPACES.add(ns)
        self.ns, self.kind, self.dispatch_key = ns, kind, dispatch_key
        self._defined: list[str] = []

    def __repr__(self) -> str:
        return f"Library(kind={self.kind}, ns={self.ns}, dispatch_key={self.dispatch_key})>"

    def define(self, schema: str, alias_analysis: str = "", *, tags=()) -> str:
        """Define an operator of this namespace from its full schema ("name(Tensor x) -> Tensor")."""
        if self.kind == "IMPL":
            raise RuntimeError(f'def("{schema.partition("(")[0]}"): Cannot define an operator inside of a '
                               "TORCH_LIBRARY_IMPL block.  All def()s should be placed in the (unique) TORCH_LIBRARY "
                               "block for their namespace.")
        op = _co.define(self.ns, schema, tags)
        self._defined.append(op._schema.name)
        return op._schema.name

    def impl(self, op_name, fn: Callable, dispatch_key: str = "", *, with_keyset: bool = False,
             allow_override: bool = False) -> None:
        """Register `fn` for `op_name` (a name of this namespace, "ns::name", or an op) at `dispatch_key`."""
        if isinstance(op_name, str) and "::" not in op_name:
            op_name = f"{self.ns}::{op_name if self.ns == 'aten' else op_name.split('.')[0]}"
        _apply_dispatch_key(_as_op(op_name), fn, dispatch_key or self.dispatch_key)

    def _destroy(self) -> None:
        for name in self._defined:
            _co.DEFINED.get(self.ns, {}).pop(name, None)
        self._defined.clear()
        _DEF_NAMESPACES.discard(self.ns)
