"""Tracing a user `autograd.Function` for dynamo: its forward and its backward become two graphs,
recorded as one `autograd_function_apply(fwd, bwd, *tensor_args)` node (PyTorch's higher-order op).

`trace_function(cls, args, fake_mode)` runs `cls.forward` (with `ctx`, or `forward` +
`setup_context`) on dynamo's fake tensors under proxy tracing: the graph returns the outputs, then
the tensors saved for backward (`ctx.save_for_backward` and tensors stored as `ctx` attributes).
Then `cls.backward` is traced on fake gradients and those saved tensors, with a `ctx` that
replays what the forward recorded (`saved_tensors`, attributes, `needs_input_grad`). The ctx
methods keep their meaning: `mark_non_differentiable` outputs get no gradient,
`set_materialize_grads(False)` is honoured for the forward's outputs (the traced backward took every
gradient as a tensor, so when a gradient is absent the runtime calls the user's backward itself with
None for it, on a ctx rebuilt from the saved tensors: `BackwardReplay`; under AOT autograd that call
is traced into the compiled backward), a `once_differentiable` backward runs without grad mode, so a second
differentiation raises as in eager. Anything the tracer cannot follow (data-dependent Python,
non-tensor outputs, a backward that calls out of flambeau) raises `NotTraceable` with the reason;
the caller then records `cls.apply` as an opaque call and logs that reason.
"""
from __future__ import annotations

from .. import _state
from .._tensor import Tensor
from ..autograd.function import Function
from ..fx.experimental.proxy_tensor import ProxyTorchDispatchMode, _Recorder
from ..fx.graph_module import GraphModule
from .._ops.creation import empty_like


class NotTraceable(Exception):
    """Why a Function's forward or backward could not be traced (the message is the reason)."""


class _TraceCtx:
    """The `ctx` of a traced forward: records what `save_for_backward` and the ctx methods say."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        self.to_save = ()
        self.non_differentiable: set = set()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable = {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    def mark_dirty(self, *tensors) -> None:
        raise NotTraceable("ctx.mark_dirty (an in-place forward)")

    def save_for_forward(self, *tensors) -> None:
        raise NotTraceable("ctx.save_for_forward (forward-mode AD)")

    def attributes(self) -> dict:
        return {k: v for k, v in vars(self).items()
                if k not in ("needs_input_grad", "to_save", "non_differentiable", "materialize_grads")}


class _ReplayCtx:
    """The `ctx` of a traced backward: what the forward's ctx held, saved tensors as graph inputs."""

    def __init__(self, needs_input_grad: tuple, saved: tuple, attributes: dict):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = saved
        self.materialize_grads = True
        self.__dict__.update(attributes)


class BackwardReplay:
    """The user's backward with the ctx it saw while traced, for gradients the traced graph did not
    expect (absent ones under `set_materialize_grads(False)`): `saved` and tensor attributes are
    positions in the saved tensors the forward graph returns, other attributes are their values."""

    def __init__(self, cls: type, needs_input_grad: tuple, saved: tuple, attributes: dict, tensor_pos: list):
        self.cls = cls
        self.needs_input_grad = needs_input_grad
        self.saved = saved                    # indices into the saved tensors
        self.attributes = attributes          # name -> (True, index) for a tensor, (False, value) otherwise
        self.tensor_pos = tensor_pos

    def __repr__(self) -> str:
        return f"BackwardReplay({self.cls.__name__})"

    def __call__(self, grads: tuple, saved: tuple) -> tuple:
        attrs = {k: saved[v] if is_tensor else v for k, (is_tensor, v) in self.attributes.items()}
        ctx = _ReplayCtx(self.needs_input_grad, tuple(saved[i] for i in self.saved), attrs)
        res = self.cls.backward(ctx, *grads)
        res = res if isinstance(res, tuple) else (res,)
        return tuple(res[i] for i in self.tensor_pos)


class TracedFunction:
    """What `trace_function` gives: the two graphs and the ctx facts the runtime op needs."""

    def __init__(self, fwd: GraphModule, bwd: GraphModule, n_outputs: int, single: bool,
                 non_differentiable: tuple, materialize: bool, once: bool, replay: BackwardReplay):
        self.fwd, self.bwd = fwd, bwd
        self.n_outputs, self.single = n_outputs, single
        self.non_differentiable, self.materialize, self.once = non_differentiable, materialize, once
        self.replay = replay


def _record(fake_mode, inputs: list, fn, names: list) -> GraphModule:
    """A graph of `fn(*inputs)` (inputs: fake tensors, one placeholder each)."""
    rec = _Recorder(fake_mode)
    for t, name in zip(inputs, names):
        ph = rec.graph.placeholder(name)
        rec.bind(t, ph)
        ph.meta["val"] = t
        rec.note_sizes(ph, t)
    mode = ProxyTorchDispatchMode(rec)
    with fake_mode, mode:
        out = fn()
    rec.graph.output(rec.to_arg(tuple(out)))
    return GraphModule(rec.root, rec.graph)


def trace_function(cls: type, args: list, fake_mode) -> tuple[TracedFunction, list]:
    """Trace `cls`'s forward and backward on `args` (fake tensors and constants); returns the traced
    function and the positions of the tensor arguments (the runtime op's inputs)."""
    if cls.backward is Function.backward and getattr(cls, "vjp", None) is Function.vjp:
        raise NotTraceable("the Function has no backward")
    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    tensors = [args[i] for i in tensor_pos]
    ctx = _TraceCtx(tuple(isinstance(a, Tensor) and a.requires_grad for a in args))
    uses_setup = cls.setup_context is not Function.setup_context
    box: dict = {}

    def forward():
        prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False          # Function.apply runs the forward without grad mode
        try:
            out = cls.forward(*args) if uses_setup else cls.forward(ctx, *args)
        finally:
            _state.tls.grad_enabled = prev
        if uses_setup:
            cls.setup_context(ctx, tuple(args), out)
        single = not isinstance(out, tuple)
        outs = (out,) if single else tuple(out)
        if not all(isinstance(o, Tensor) for o in outs):
            raise NotTraceable("the forward returns a value that is not a tensor")
        saved = [t for t in ctx.to_save if isinstance(t, Tensor)]
        if len(saved) != len(ctx.to_save):
            raise NotTraceable("save_for_backward of a value that is not a tensor")
        attrs = ctx.attributes()
        extra = _unique(saved + [v for v in attrs.values() if isinstance(v, Tensor)])
        box.update(outs=outs, single=single, saved=saved, attrs=attrs, extra=extra)
        return list(outs) + extra
    try:
        fwd = _record(fake_mode, tensors, forward, [f"arg{i}" for i in range(len(tensors))])
    except NotTraceable:
        raise
    except Exception as e:
        raise NotTraceable(f"forward: {type(e).__name__}: {e}") from None
    outs, saved, extra = box["outs"], box["saved"], box["extra"]
    with fake_mode:
        grads = [empty_like(o) for o in outs]
    once = getattr(cls.backward, "once_differentiable", False)

    def backward():
        rctx = _ReplayCtx(ctx.needs_input_grad, tuple(saved), box["attrs"])
        res = cls.backward(rctx, *grads)
        res = res if isinstance(res, tuple) else (res,)
        if len(res) < len(args) or any(r is not None for r in res[len(args):]):
            raise NotTraceable(f"backward returned {len(res)} gradients for {len(args)} inputs")
        picked = [res[i] for i in tensor_pos]
        if any(r is not None and not isinstance(r, Tensor) for r in picked):
            raise NotTraceable("backward returned a gradient that is not a tensor")
        return picked
    try:
        bwd = _record(fake_mode, grads + extra, backward,
                      [f"grad{i}" for i in range(len(grads))] + [f"saved{i}" for i in range(len(extra))])
    except NotTraceable:
        raise
    except Exception as e:
        raise NotTraceable(f"backward: {type(e).__name__}: {e}") from None
    nondiff = tuple(i for i, o in enumerate(outs) if id(o) in ctx.non_differentiable)
    where = {id(t): i for i, t in enumerate(extra)}
    layout = {k: (True, where[id(v)]) if isinstance(v, Tensor) else (False, v) for k, v in box["attrs"].items()}
    replay = BackwardReplay(cls, ctx.needs_input_grad, tuple(where[id(t)] for t in saved), layout, tensor_pos)
    traced = TracedFunction(fwd, bwd, len(outs), box["single"], nondiff, ctx.materialize_grads, once, replay)
    return traced, tensor_pos


def _unique(tensors: list) -> list:
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out
