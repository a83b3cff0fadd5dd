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
from .graph import Node, _edge, _meta_of, SavedTensor, _differentiable, _saved_hooks, accumulator
from .._dispatch import WRAPPER_DEVICE
from .._ops.creation import zeros_like, zeros
from .._dispatch import check_inplace_autograd


class FunctionCtx:
    def __init__(self):
        self._saved = ()
        self._versions = None        # per `_saved` entry kept as the tensor itself, its version when saved
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
        versions = self._versions
        if versions is None:
            return tuple(s.unpack(self._node) if isinstance(s, SavedTensor) else s for s in self._saved)
        node = self._node
        out = []
        for s, v in zip(self._saved, versions):
            if v is None:
                out.append(s.unpack(node) if type(s) is SavedTensor else s)
            elif s._version[0] != v:
                _raise_modified(s, v, node)
            else:
                out.append(s)
        return tuple(out)

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
        self._arg_slots = arg_slots      # forward-arg positions of each edge (None: every argument's)

    def name(self):
        return self._cls.__name__ + "Backward"

    def release(self):
        # the forward's tensors are freed after backward, whoever still holds the ctx
        self._ctx._saved = self._ctx._versions = None
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
        slots = self._arg_slots
        if slots is None:               # every argument a tensor
            return list(res[:nargs]) if len(res) != nargs else list(res)
        return [res[slot] for slot in slots]


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
        tensors = [a for a in args if isinstance(a, Tensor)]
        slots = None if len(tensors) == len(args) else [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        needs = [a._requires_grad if a._base is None else a.requires_grad for a in tensors]   # (a view may refresh)
        record = _state.tls.grad_enabled and True in needs
        if slots is None:
            ctx.needs_input_grad = tuple(needs)
        else:
            flags = iter(needs)
            ctx.needs_input_grad = tuple(next(flags) if isinstance(a, Tensor) else False for a in args)
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
            if cls.jvp is not Function.jvp and any(a._fw_grad is not None for a in tensors):
                _forward_jvp(cls, ctx, args, outs)
            return out
        input_ids = set(map(id, tensors))
        outs = list(outs)
        for k, o in enumerate(outs):
            if isinstance(o, Tensor) and id(o) in input_ids and id(o) not in ctx._dirty:
                # returning an input unchanged: PyTorch returns a view of it
                outs[k] = o.view_as(o)
        node = BackwardCFunction(cls, ctx, (), (), [_meta_of(o) if isinstance(o, Tensor) else None for o in outs],
                                 slots)
        node._next_nodes, node._next_nrs, node._in_meta = _edges(tensors)
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
        _save(ctx, node, outs)
        return outs[0] if single else tuple(outs)


def _edges(tensors: list) -> tuple:
    """(next nodes, their output numbers, input metadata) of a Function's tensor arguments: `graph._edge`
    and `_meta_of` of each, a leaf's edge and metadata (its AccumulateGrad's, kept across steps) found
    without either call (a compiled graph's Function takes every parameter of the model)."""
    nodes, nrs, meta = [], [], []
    for a in tensors:
        if a._base is None and a._grad_fn is None and a._device is not WRAPPER_DEVICE:
            if a._requires_grad:
                acc = accumulator(a)
                nodes.append(acc)
                meta.append(acc.meta())
            else:
                nodes.append(None)
                meta.append((a._data.shape, a._dtype, a._device))
            nrs.append(0)
        else:
            n, nr = _edge(a)
            nodes.append(n)
            nrs.append(nr)
            meta.append(_meta_of(a))
    return tuple(nodes), tuple(nrs), tuple(meta)


def _save(ctx: FunctionCtx, node: Node, outs: list) -> None:
    """Keep what `ctx.save_for_backward` named: a tensor that is neither an output of this call nor a wrapper
    as itself, with its version in `ctx._versions` (checked when unpacked); an output (whose node holds the
    ctx: no reference back to it) or a wrapper as a SavedTensor, as is any tensor under saved_tensors_hooks."""
    out_ids = {id(o): k for k, o in enumerate(outs) if isinstance(o, Tensor)}
    hooked = bool(_saved_hooks.stack)
    name = None
    saved, versions = [], []
    for t in ctx.to_save:
        if isinstance(t, Tensor):
            k = out_ids.get(id(t))
            if k is None and not hooked and t._device is not WRAPPER_DEVICE:
                saved.append(t)
                versions.append(t._version[0])
                continue
            if name is None:
                name = node.name()        # (once: a compiled graph's forward saves hundreds of tensors)
            saved.append(SavedTensor(t, k is not None, name, k or 0))
        else:
            saved.append(t)
        versions.append(None)
    ctx._saved = tuple(saved)
    ctx._versions = versions


def _raise_modified(t: Tensor, version: int, node) -> None:
    """The error of a saved tensor (kept as itself, at `version` when saved) modified in place since."""
    s = SavedTensor(t, False, node.name() if node is not None else "")
    s.version = version
    s._raise_modified(t._dtype, t.shape, t._version[0])


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
