"""`autograd.Function`: user-defined forward/backward pairs recorded as one graph node.

`autograd_function_apply(fwd, bwd, *args, ...)` is PyTorch's higher-order op of the same name: a
Function whose forward and backward were traced into graphs (`fwd(*args) -> (*outputs, *saved)`,
`bwd(*grads, *saved) -> grads of the tensor arguments`). Dynamo records it in place of a user
Function's `apply`; AOT autograd then traces through both graphs, so both are compiled.
"""
from __future__ import annotations

import functools
import weakref

from .. import _state
from .._tensor import Tensor
from .graph import Node, _edge, _meta_of, SavedTensor, _differentiable
from .._ops.creation import zeros_like, zeros
from .._dispatch import check_inplace_autograd


class FunctionCtx:
    def __init__(self):
        self._saved = ()
        self.to_save = ()
        self._dirty = set()
        self._non_diff = set()
        self.materialize_grads = True
        self.needs_input_grad = ()
        self._node_ref = None

    @property
    def _node(self):
        """The graph node of this call (None before it is recorded, or once the graph is gone). The node
        holds the ctx and the ctx only a weak reference back: no ctx <-> node cycle, so a step's graph is
        freed by reference counting when its last tensor goes, not by the next garbage collection."""
        return self._node_ref() if self._node_ref is not None else None

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self):
        if self._saved is None:
            raise RuntimeError("Trying to backward through the graph a second time (or directly access "
                               "saved tensors after they have already been freed). Saved intermediate "
                               "values of the graph are freed when you call .backward() or autograd.grad(). "
                               "Specify retain_graph=True if you need to backward through the graph a "
                               "second time or if you need to access saved tensors after calling backward.")
        return tuple(s.unpack(self._node) if isinstance(s, SavedTensor) else s for s in self._saved)

    def mark_dirty(self, *tensors):
        self._dirty = {id(t) for t in tensors}

    def mark_non_differentiable(self, *tensors):
        self._non_diff = {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool):
        self.materialize_grads = value


class BackwardCFunction(Node):
    def __init__(self, cls, ctx, next_functions, in_meta, out_meta, arg_slots):
        super().__init__(next_functions, in_meta)
        self._cls = cls
        self._ctx = ctx
        self._out_meta = out_meta
        self._arg_slots = arg_slots      # forward-arg positions of each edge

    def name(self):
        return self._cls.__name__ + "Backward"

    def release(self):
        # the forward's tensors are freed after backward, whoever still holds the ctx
        self._ctx._saved = None
        self._ctx.to_save = ()

    def apply(self, grads):
        ctx = self._ctx
        if ctx.materialize_grads:
            grads = [g if g is not None or m is None else zeros(m[0], dtype=m[1], device=m[2])
                     for g, m in zip(grads, self._out_meta)]
        res = self._cls.backward(ctx, *grads)
        if not isinstance(res, tuple):
            res = (res,)
        nargs = self._nargs
        if len(res) != nargs and not (len(res) > nargs and all(r is None for r in res[nargs:])):
            raise RuntimeError(f"function {self.name()} returned an incorrect number of gradients "
                               f"(expected {nargs}, got {len(res)})")
        out = []
        for slot in self._arg_slots:
            out.append(res[slot])
        return out


class _FunctionMeta(type):
    def __init__(cls, name, bases, attrs):
        super().__init__(name, bases, attrs)
        cls._backward_cls = cls


class Function(metaclass=_FunctionMeta):
    """Subclass with static `forward(ctx, *args)` (or `forward(*args)` + `setup_context`) and
    `backward(ctx, *grads)`; call with `.apply(*args)`."""
    generate_vmap_rule = False

    def __init__(self, *args, **kwargs):
        pass

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for your custom "
                                  "autograd.Function to use it with backward mode AD.")

    vjp = backward

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError("You must implement the jvp function for custom autograd.Function to "
                                  "use it with forward mode AD.")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
        record = _state.tls.grad_enabled and any(a.requires_grad for _, a in tensors)
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        uses_setup = cls.setup_context is not Function.setup_context
        prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False
        try:
            if uses_setup:
                out = cls.forward(*args, **kwargs)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        finally:
            _state.tls.grad_enabled = prev
        if uses_setup:
            cls.setup_context(ctx, args, out)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        if not record:
            ctx._saved = tuple(ctx.to_save)
            if cls.jvp is not Function.jvp and any(a._fw_grad is not None for _, a in tensors):
                _forward_jvp(cls, ctx, args, outs)
            return out
        input_ids = {id(a) for _, a in tensors}
        outs = list(outs)
        for k, o in enumerate(outs):
            if isinstance(o, Tensor) and id(o) in input_ids and id(o) not in ctx._dirty:
                # returning an input unchanged: PyTorch returns a view of it
                outs[k] = o.view_as(o)
        next_fns = [_edge(a) for _, a in tensors]
        in_meta = [_meta_of(a) for _, a in tensors]
        out_meta = [_meta_of(o) if isinstance(o, Tensor) else None for o in outs]
        node = BackwardCFunction(cls, ctx, next_fns, in_meta, out_meta, [i for i, _ in tensors])
        node._nargs = len(args)
        ctx._node_ref = weakref.ref(node)
        for k, o in enumerate(outs):
            if isinstance(o, Tensor) and id(o) not in ctx._non_diff and _differentiable(o):
                if id(o) in ctx._dirty:
                    check_inplace_autograd(o)
                    o._version[0] += 1
                o._grad_fn = node
                o._output_nr = k
                o._requires_grad = True
        out_ids = {id(o): k for k, o in enumerate(outs) if isinstance(o, Tensor)}
        saved = []
        name = node.name()               # (once: a compiled graph's forward saves hundreds of tensors)
        for t in ctx.to_save:
            if isinstance(t, Tensor):
                if id(t) in out_ids:
                    saved.append(SavedTensor(t, True, name, out_ids[id(t)]))
                else:
                    saved.append(SavedTensor(t, False, name))
            else:
                saved.append(t)
        ctx._saved = tuple(saved)
        return outs[0] if single else tuple(outs)


def _forward_jvp(cls, ctx, args, outs):
    tangents = [a._fw_grad if isinstance(a, Tensor) and a._fw_grad is not None else
                (zeros_like(a) if isinstance(a, Tensor) else None) for a in args]
    res = cls.jvp(ctx, *tangents)
    if not isinstance(res, tuple):
        res = (res,)
    for o, t in zip(outs, res):
        if isinstance(o, Tensor) and t is not None:
            o._fw_grad = t


def once_differentiable(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False
        try:
            return fn(ctx, *args)
        finally:
            _state.tls.grad_enabled = prev
    wrapper.once_differentiable = True
    return wrapper


class _TracedFunction(Function):
    """The Function that `autograd_function_apply` applies: runs the traced forward and backward."""

    @staticmethod
    def forward(ctx, fwd, bwd, n_outputs, non_differentiable, materialize, once, replay, *args):
        flat = fwd(*args)
        outs, saved = flat[:n_outputs], flat[n_outputs:]
        ctx.save_for_backward(*saved)
        ctx.bwd, ctx.once, ctx.replay = bwd, once, replay
        ctx.mark_non_differentiable(*[outs[i] for i in non_differentiable])
        ctx.set_materialize_grads(materialize)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        prev = _state.tls.grad_enabled
        if ctx.once:
            _state.tls.grad_enabled = False
        try:
            if any(g is None for g in grads) and ctx.replay is not None:
                res = ctx.replay(grads, ctx.saved_tensors)      # the user's backward, absent gradients as None
            else:
                grads = [g if g is not None else zeros(m[0], dtype=m[1], device=m[2])
                         for g, m in zip(grads, ctx._node._out_meta)]   # the traced backward takes every gradient
                res = ctx.bwd(*grads, *ctx.saved_tensors)
        finally:
            _state.tls.grad_enabled = prev
        return (None,) * _TRACED_FUNCTION_OPTIONS + tuple(res)


_TRACED_FUNCTION_OPTIONS = 7          # the non-tensor leading arguments of _TracedFunction.forward


def autograd_function_apply(fwd, bwd, *args, n_outputs: int, non_differentiable: tuple = (),
                            materialize: bool = True, once: bool = False, replay=None) -> tuple:
    """Apply the traced Function `fwd`/`bwd` to `args` (see the module docstring); the outputs as a tuple.
    `replay`: the user's backward, called instead of `bwd` when a gradient is absent (only reached
    with materialize=False: materialized gradients are never absent)."""
    return _TracedFunction.apply(fwd, bwd, n_outputs, tuple(non_differentiable), materialize, once, replay,
                                 *args)


class InplaceFunction(Function):
    def __init__(self, inplace=False):
        self.inplace = inplace


class NestedIOFunction(Function):
    pass
