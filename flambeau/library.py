"""torch.library, the Python custom-operator API: `custom_op("ns::name", fn, mutates_args=())`
makes `fn` an operator reachable as `flambeau.ops.ns.name`; `register_fake` gives it a shape
function (used for meta tensors), `register_autograd` a backward (with `setup_context` saving what
it needs), `register_kernel` a per-device implementation.

The operator runs its Python function; it is not declared in `flambeau._ops` (so the compiler
traces through it rather than keeping it as one node).
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable

from ._tensor import Tensor
from .autograd.function import Function
from .autograd.grad_mode import is_grad_enabled, no_grad
from .fx._aten import CUSTOM_OPS

__all__ = ["custom_op", "register_fake", "register_autograd", "register_kernel", "CustomOpDef"]


def _split_name(qualname: str) -> tuple[str, str]:
    ns, sep, name = qualname.partition("::")
    if not sep or not ns or not name or "." in name:
        raise ValueError(f"Expected there to be a namespace in {qualname}, i.e. The operator name should "
                         "look something like ns::foo")
    return ns, name


def _tensors_in(values: Iterable) -> list[Tensor]:
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, Tensor))
    return out


class _CustomOpAutograd(Function):
    """Runs a custom op under no_grad and its registered backward in backward."""

    @staticmethod
    def forward(ctx, op: CustomOpDef, *args):
        ctx._flambeau_custom_op = op
        with no_grad():
            out = op._run(*args)
        if op._setup_context is not None:
            op._setup_context(ctx, args, out)
        return out

    @staticmethod
    def backward(ctx, *grads):
        op = ctx._flambeau_custom_op
        result = op._backward(ctx, *grads)
        result = result if isinstance(result, tuple) else (result,)
        return (None,) + result


class CustomOpDef:
    """One custom operator (see the module docstring)."""

    def __init__(self, namespace: str, name: str, fn: Callable, mutates_args, schema: str | None) -> None:
        self._namespace, self._name = namespace, name
        self._fn = fn
        self._signature = inspect.signature(fn)
        self._schema = schema
        self._mutates_args = mutates_args
        self._fake: Callable | None = None
        self._backward: Callable | None = None
        self._setup_context: Callable | None = None
        self._kernels: dict[str, Callable] = {}
        self.__name__ = name
        self.__doc__ = fn.__doc__

    def __repr__(self) -> str:
        return f"<CustomOpDef({self._namespace}::{self._name})>"

    @property
    def default(self) -> CustomOpDef:
        return self

    def register_fake(self, fn: Callable) -> Callable:
        self._fake = fn
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        self._backward, self._setup_context = backward, setup_context

    def register_kernel(self, device_types: str | Iterable[str], fn: Callable | None = None):
        def register(kernel: Callable) -> Callable:
            for d in [device_types] if isinstance(device_types, str) else device_types:
                self._kernels[d] = kernel
            return kernel
        return register if fn is None else register(fn)

    def _run(self, *args):
        tensors = _tensors_in(args)
        device = tensors[0].device.type if tensors else "cpu"
        if device == "meta":
            if self._fake is None:
                raise RuntimeError(f"{self._namespace}::{self._name}: there was no fake impl registered for "
                                   "it (needed for meta tensors); use register_fake")
            return self._fake(*args)
        return self._kernels.get(device, self._fn)(*args)

    def __call__(self, *args, **kwargs):
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        args = tuple(bound.arguments.values())
        if self._backward is not None and is_grad_enabled() and \
                any(t.requires_grad for t in _tensors_in(args)):
            return _CustomOpAutograd.apply(self, *args)
        return self._run(*args)


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args, device_types=None,
              schema: str | None = None):
    """Define operator `name` ("ns::op") from `fn`; usable as a decorator."""
    ns, opname = _split_name(name)

    def define(f: Callable) -> CustomOpDef:
        op = CustomOpDef(ns, opname, f, mutates_args, schema)
        if device_types is not None:
            op.register_kernel(device_types, f)
        CUSTOM_OPS.setdefault(ns, {})[opname] = op
        return op
    return define if fn is None else define(fn)


def _lookup(op) -> CustomOpDef:
    if isinstance(op, CustomOpDef):
        return op
    ns, name = _split_name(op)
    found = CUSTOM_OPS.get(ns, {}).get(name)
    if found is None:
        raise ValueError(f"register: operator {op} was not defined with flambeau.library.custom_op")
    return found


def register_fake(op, func: Callable | None = None, /, *, lib=None, _stacklevel: int = 1):
    """Register the shape function of custom operator `op`; usable as a decorator."""
    target = _lookup(op)
    return target.register_fake if func is None else target.register_fake(func)


def register_autograd(op, backward: Callable, /, *, setup_context: Callable | None = None, lib=None) -> None:
    _lookup(op).register_autograd(backward, setup_context=setup_context)


def register_kernel(op, device_types, func: Callable | None = None, /, *, lib=None):
    return _lookup(op).register_kernel(device_types, func)
