"""Custom operators as registry operators: `CustomOp` is an `Op` (PyTorch's OpOverload) whose
kernel, meta function and derivative come from the user's Python functions.

Because it is an `Op`, every interpreter treats a custom operator as one operator: the
dispatcher runs its kernel per device (the function passed to `custom_op`, or one registered for
that device type), fake tensors and symbolic shapes run its fake function (`register_fake`),
autograd records one node whose derivative calls the registered `setup_context` + `backward`,
make_fx / dynamo / AOT autograd record one call_function node, and the code generator calls it as
an extern kernel. An operator that mutates arguments (`mutates_args`) has a functional twin
(`<name>_functional`: the mutated arguments cloned, run on the clones, returned after the outputs),
which functionalization records in its place (PyTorch's `auto_functionalized`).

`CustomOpDef` is what `custom_op` returns (PyTorch's class of the same name); `flambeau.ops.<ns>.<name>`
is an `OpOverloadPacket` (`fx/_aten.py`) whose `.default` is the `CustomOp`.
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable

import numpy as np

from .. import _backends, _dispatch
from .._device import canonical
from .._ops._registry import Op, TensorSpec
from .._ops._schema import _NODEFAULT as _NO_DEFAULT
from .._tags import Tag
from .._tensor import Tensor
from .._subclasses.fake_tensor import FakeTensor
from ..autograd.grad_mode import no_grad
from ..fx._aten import CUSTOM_OPS, CustomOpPacket as OpOverloadPacket

__all__ = ["CustomOp", "CustomOpDef", "OpOverloadPacket", "DEFINED", "lookup"]

# namespace -> {name: CustomOp}: every operator defined by `custom_op` or `Library.define`
DEFINED: dict[str, dict[str, "CustomOp"]] = CUSTOM_OPS
_ALIASING = ("The output of this custom operator (1) must not also be an input to this custom operator and "
             "(2) may not alias any inputs to this custom operator or other returns. The most common way to "
             "trigger this error is if we have y = custom_op(x) and y and x are the same Tensor. Please instead "
             "return a clone of the offending output tensor(s) (e.g. return x.clone()) or refactor the custom "
             "operator to not return y.")


def split_qualname(qualname: str) -> tuple[str, str]:
    ns, sep, name = qualname.partition("::")
    if not sep or not ns or not name or "." in name:
        raise ValueError(f"Expected there to be a namespace in {qualname}, i.e. The operator name should "
                         "look something like ns::foo")
    return ns, name


def _is_array(a) -> bool:
    return type(a) is np.ndarray or type(a) in _dispatch.device_array_types or hasattr(a, "__cuda_array_interface__")


def _device_of(xp, args, kwargs) -> tuple:
    """(the device whose array namespace is `xp`, with the index of the first array carrying one;
    the arrays among the arguments)."""
    arrays = [a for a in list(args) + list(kwargs.values()) if _is_array(a)]
    name = _backends.namespace_backend(xp).name
    for a in arrays:
        idx = getattr(getattr(a, "device", None), "id", None)
        if isinstance(idx, int):
            return canonical(f"{name}:{idx}"), arrays
    return canonical(name), arrays


def _call_with_tensors(fn: Callable, dev, args, kwargs):
    """`fn` (a kernel over tensors) called on the arrays `args`/`kwargs` as tensors on `dev`, below autograd."""
    def wrap(a):
        if _is_array(a):
            return Tensor._make(a, dev)
        if type(a) in (list, tuple):
            return type(a)(wrap(x) for x in a)
        return a
    with no_grad():
        return fn(*[wrap(a) for a in args], **{k: wrap(v) for k, v in kwargs.items()})


def _arrays_of(out):
    if isinstance(out, Tensor):
        return out._data
    if type(out) in (list, tuple):
        return type(out)(_arrays_of(o) for o in out)
    return out


def override_kernel(op: Op, device_type: str, fn: Callable) -> None:
    """`fn` (over tensors) replaces the kernel of the registry op `op` on `device_type` (PyTorch's
    `Library("aten", "IMPL").impl(name, fn, "PrivateUse1")`). The op's kernel becomes a wrapper that
    looks its namespace up among the overridden devices; ops never overridden are untouched."""
    table = op.__dict__.get("kernel_overrides")
    if table is None:
        table = op.kernel_overrides = {}
        original = op.kernel

        def kernel_with_overrides(xp, *args, **kwargs):
            for device_type, f in table.items():
                if _backends.array_namespaces.get(device_type) is xp:
                    dev, _ = _device_of(xp, args, kwargs)
                    return _arrays_of(_call_with_tensors(f, dev, args, kwargs))
            return original(xp, *args, **kwargs)
        kernel_with_overrides.__name__ = f"{op.__name__}_with_overrides"
        op.kernel = kernel_with_overrides
    table[device_type] = fn


class _Ctx:
    """The `ctx` of `register_autograd`'s `setup_context` and `backward` (autograd.Function's)."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        """Accepted for autograd.Function's API; the op's outputs follow its schema."""

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


class CustomOp(Op):
    """One custom operator overload (see the module docstring)."""

    def __init__(self, namespace: str, schema: str, tags=()):
        super().__init__(schema, self._array_kernel, tags=(Tag.extern,) + tuple(tags),
                         no_decomposition="a custom operator: its body is the user's Python function")
        self.namespace = namespace
        self.qualname = f"{namespace}::{self._schema.name}"
        self._schema.text = f"{namespace}::{self._schema.text}"      # printed qualified, as PyTorch's
        self.is_inplace = False        # a custom op writes the arguments its schema marks, whatever their place
        self.mutated_args = tuple(i for i, a in enumerate(self._schema.args) if a.mutated)
        self.meta = self._meta
        self.default_kernel: Callable | None = None     # CompositeExplicitAutograd: every device
        self.kernels: dict[str, Callable] = {}           # device type -> kernel (CPU, CUDA, PrivateUse1)
        self.fake: Callable | None = None
        self.setup_context: Callable | None = None
        self.backward_fn: Callable | None = None
        self.functional_twin: CustomOp | None = None
        self.owner: CustomOpDef | None = None
        params = [inspect.Parameter("grad", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + \
                 [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY) for a in self._schema.args] + \
                 [inspect.Parameter("result", inspect.Parameter.KEYWORD_ONLY)]
        self.def_derivative(_with_signature(self._derivative, inspect.Signature(params)))

    def __repr__(self) -> str:
        return f"<OpOverload(op='{self.namespace}.{self._schema.name}', overload='default')>"

    def __call__(self, *args, **kwargs):
        out = Op.__call__(self, *args, **kwargs)
        if self.mutated_args:
            bound = self.bind(*args, **kwargs)
            for i in self.mutated_args:
                for t in bound[i] if isinstance(bound[i], (list, tuple)) else (bound[i],):
                    if isinstance(t, Tensor):
                        t._version[0] += 1
        return out

    def name(self) -> str:
        return self.qualname

    # ---- kernel (below the modes: arrays in, arrays out) ----------------------------------------
    def kernel_for(self, device_type: str) -> Callable:
        fn = self.kernels.get(device_type, self.default_kernel)
        if fn is None:
            raise NotImplementedError(f"{self.qualname} does not have a kernel registered for {device_type}. "
                                      "Please use register_kernel to do so.")
        return fn

    def _array_kernel(self, xp, *args, **kwargs):
        dev, arrays = _device_of(xp, args, kwargs)
        out = _call_with_tensors(self.kernel_for(dev.type), dev, args, kwargs)
        return self._unwrap(out, {id(a) for a in arrays}, set())

    def _unwrap(self, out, inputs: set, seen: set):
        if isinstance(out, Tensor):
            a = out._data
            root = a.base if getattr(a, "base", None) is not None else a
            if id(a) in inputs or id(root) in inputs or id(root) in seen:
                raise RuntimeError(f"{self._schema.name} (with implementation in "
                                   f"{inspect.getmodule(self.kernel_for(out.device.type))}): {_ALIASING}")
            seen.add(id(root))
            return a
        if type(out) in (list, tuple):
            return type(out)(self._unwrap(o, inputs, seen) for o in out)
        return out

    # ---- meta (fake tensors, symbolic shapes) ------------------------------------------------------
    def _meta(self, *args, **kwargs):
        if self.fake is None:
            if not self._schema.returns:
                return None
            owner = self.owner
            hint = f"`{owner._init_fn.__name__}.register_fake`" if owner is not None else \
                f"`flambeau.library.register_fake(\"{self.qualname}\")`"
            raise RuntimeError(f"There was no fake impl registered for {owner if owner is not None else self}. "
                               f"This is necessary for torch.compile/export/fx tracing to work. Please use "
                               f"{hint} to add an fake impl.")
        mode = _fake_mode_of(list(args) + list(kwargs.values()))
        if mode is None:
            return _spec(self.fake(*args, **kwargs))
        with mode:          # as in PyTorch, the fake function runs under the fake tensors' mode
            return _spec(self.fake(*args, **kwargs))

    # ---- derivative (register_autograd) -------------------------------------------------------------
    def _derivative(self, grad, **saved):
        if self.backward_fn is None:
            raise RuntimeError(f"Trying to backward through {self.namespace}.{self._schema.name}.default but no "
                               f"autograd formula was registered. "
                               f"Please use register_autograd to add one.")
        result = saved.pop("result")
        inputs = tuple(saved[a.name] for a in self._schema.args)
        ctx = _Ctx(tuple(isinstance(x, Tensor) and x.requires_grad for x in inputs))
        if self.setup_context is not None:
            self.setup_context(ctx=ctx, inputs=inputs, output=result)
        grads = grad if len(self._schema.returns) > 1 else (grad,)
        res = self.backward_fn(ctx, *grads)
        res = res if isinstance(res, tuple) else (res,)
        if len(res) != len(inputs):
            raise RuntimeError(f"Expected the return from backward to be of the same structure as the inputs. "
                               f"Got: {len(res)} gradients (return from backward), {len(inputs)} inputs")
        return tuple(res[i] for i in self.tensor_args)

    # ---- the functional twin of a mutating op ---------------------------------------------------------
    def make_functional_twin(self) -> None:
        s = self._schema
        args = []
        kw = False
        for a in s.args:
            if a.kwarg_only and not kw:
                args.append("*")
                kw = True
            default = "" if a.default is _NO_DEFAULT else "=" + repr(a.default).replace("'", '"')
            args.append(f"{a.type} {a.name}{default}")
        rets = [r[0] for r in s.returns] + [s.args[i].type for i in self.mutated_args]
        twin = CustomOp(self.namespace, f"{s.name}_functional({', '.join(args)}) -> ({', '.join(rets)})")
        twin.owner = self.owner
        twin.original = self
        twin.default_kernel = self._run_on_clones
        twin.fake = self._fake_on_clones
        self.functional_twin = twin

    def _clone_mutated(self, args, kwargs) -> list:
        bound = list(self.bind(*args, **kwargs))
        for i in self.mutated_args:
            v = bound[i]
            bound[i] = v.clone() if isinstance(v, Tensor) else \
                [x.clone() for x in v] if isinstance(v, (list, tuple)) else v
        return bound

    def _split(self, out, bound) -> tuple:
        outs = () if out is None else out if isinstance(out, tuple) and len(self._schema.returns) > 1 else (out,)
        return tuple(outs) + tuple(bound[i] for i in self.mutated_args)

    def _run_on_clones(self, *args, **kwargs):
        bound = self._clone_mutated(args, kwargs)
        return self._split(self(*bound), bound)

    def _fake_on_clones(self, *args, **kwargs):
        bound = self._clone_mutated(args, kwargs)
        return self._split(self._meta(*bound) if self.fake is None else self.fake(*bound), bound)


def _with_signature(fn: Callable, sig: inspect.Signature) -> Callable:
    """`fn` under `sig`: `Op.def_derivative` reads the argument names to save from the signature."""
    def derivative(grad, **saved):
        return fn(grad, **saved)
    derivative.__signature__ = sig
    return derivative


def _fake_mode_of(values):
    for v in values:
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, FakeTensor):
                return t.fake_mode
    return None


def _spec(out):
    if isinstance(out, Tensor):
        return TensorSpec(tuple(out.shape), out.dtype, tuple(out.stride()), out.storage_offset())
    if isinstance(out, (tuple, list)):
        return type(out)(_spec(o) for o in out)
    return out


class CustomOpDef:
    """What `flambeau.library.custom_op` returns: call it like the function it was made from."""

    def __init__(self, op: CustomOp, fn: Callable):
        self._opoverload = op
        self._init_fn = fn
        self._name = op._schema.name
        self._namespace = op.namespace
        self._qualname = op.qualname
        self.__name__ = self._name
        self.__doc__ = fn.__doc__
        op.owner = self

    def __repr__(self) -> str:
        return f"<CustomOpDef({self._qualname})>"

    def __call__(self, *args, **kwargs):
        return self._opoverload(*args, **kwargs)

    def register_fake(self, fn: Callable, /) -> Callable:
        self._opoverload.fake = fn
        return fn

    def register_autograd(self, backward: Callable, /, *, setup_context: Callable | None = None) -> None:
        register_autograd(self._opoverload, backward, setup_context=setup_context)

    def register_kernel(self, device_types: str | Iterable[str] | None, fn: Callable | None = None, /):
        def register(kernel: Callable) -> Callable:
            register_kernel(self._opoverload, device_types, kernel)
            return kernel
        return register if fn is None else register(fn)


def register_autograd(op: CustomOp, backward: Callable, *, setup_context: Callable | None = None) -> None:
    if op.mutated_args:
        raise RuntimeError(f"Cannot register autograd formula for non-functional operator {op.owner or op} with "
                           f"schema {op._schema}. Please create a functional operator and register an autograd "
                           f"formula for that.")
    op.backward_fn, op.setup_context = backward, setup_context


def register_kernel(op: CustomOp, device_types, fn: Callable) -> None:
    if device_types is None:
        op.default_kernel = fn
        return
    for d in [device_types] if isinstance(device_types, str) else device_types:
        op.kernels[canonical(d).type] = fn


def lookup(qualname: str) -> CustomOp:
    ns, name = split_qualname(qualname)
    op = DEFINED.get(ns, {}).get(name)
    if op is None:
        raise ValueError(f"Could not find the operator {qualname}. Please make sure you have already "
                         f"registered the operator and (if registered from C++) loaded it via "
                         f"torch.ops.load_library.")
    return op


def define(namespace: str, schema: str, tags=()) -> CustomOp:
    """Register the operator `namespace::<schema>` (no kernel yet)."""
    op = CustomOp(namespace, schema, tags)
    name = op._schema.name
    if name in DEFINED.get(namespace, {}):
        raise RuntimeError(f"Tried to register an operator ({op.qualname}) with the same name and overload "
                           f"name multiple times.")
    DEFINED.setdefault(namespace, {})[name] = op
    if op.mutated_args:
        op.make_functional_twin()
        DEFINED[namespace][op.functional_twin._schema.name] = op.functional_twin
    return op
