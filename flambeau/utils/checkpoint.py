"""torch.utils.checkpoint: activation checkpointing, trading compute for memory.

`checkpoint(fn, *args, use_reentrant=False)` runs `fn` keeping none of its intermediate values for
backward: each tensor autograd would save is replaced (through `saved_tensors_hooks`) by its
position, and the first time backward asks for one, `fn` runs again with the same RNG state under
hooks that collect the recomputed values in the same order. `use_reentrant=True` is the older
form: `fn` runs under no_grad inside an autograd Function whose backward reruns it with grad on and
backpropagates through the rerun (parameters get their gradients there).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterable

from .. import random as _random
from .._tensor import Tensor
from ..autograd.engine import backward as _backward
from ..autograd.function import Function
from ..autograd.grad_mode import enable_grad, no_grad
from ..autograd.graph import saved_tensors_hooks
from ..cuda import get_rng_state as _cuda_get_rng_state, set_rng_state as _cuda_set_rng_state

__all__ = ["checkpoint", "checkpoint_sequential", "noop_context_fn"]


def noop_context_fn() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    return contextlib.nullcontext(), contextlib.nullcontext()


class _RngState:
    """The cpu generator's state (and cuda's, when an argument lives there), to replay a forward."""

    def __init__(self, args: Iterable, enabled: bool) -> None:
        self.enabled = enabled
        self.cuda = enabled and any(isinstance(a, Tensor) and a.device.type == "cuda" for a in args)
        self.cpu_state = _random.get_rng_state() if enabled else None
        self.cuda_state = _cuda_get_rng_state() if self.cuda else None

    @contextlib.contextmanager
    def replay(self):
        """Run the block from the saved state; the state before it is restored after."""
        if not self.enabled:
            yield
            return
        before_cpu = _random.get_rng_state()
        before_cuda = _cuda_get_rng_state() if self.cuda else None
        _random.set_rng_state(self.cpu_state)
        if self.cuda:
            _cuda_set_rng_state(self.cuda_state)
        try:
            yield
        finally:
            _random.set_rng_state(before_cpu)
            if self.cuda:
                _cuda_set_rng_state(before_cuda)


class _Recomputation:
    """The pack/unpack pair of one non-reentrant checkpoint call."""

    def __init__(self, function: Callable, args: tuple, kwargs: dict, rng: _RngState, context_fn: Callable):
        self.function, self.args, self.kwargs, self.rng, self.context_fn = function, args, kwargs, rng, context_fn
        self.count = 0
        self.values: list | None = None

    def pack(self, t: Tensor) -> int:
        self.count += 1
        return self.count - 1

    def unpack(self, position: int) -> Tensor:
        if self.values is None:
            collected: list = []

            def pack_recomputed(t: Tensor) -> Tensor:
                collected.append(t)
                return t

            def unpack_recomputed(t: Tensor) -> Tensor:
                return t

            _, recompute_ctx = self.context_fn()
            with self.rng.replay(), enable_grad(), recompute_ctx, \
                    saved_tensors_hooks(pack_recomputed, unpack_recomputed):
                self.function(*self.args, **self.kwargs)
            if len(collected) != self.count:
                raise RuntimeError(f"torch.utils.checkpoint: the recomputed forward saved {len(collected)} tensors "
                                   f"for backward, the original {self.count}: the checkpointed function must "
                                   "run the same operations when run again")
            self.values = collected
        return self.values[position]


class _ReentrantCheckpoint(Function):
    @staticmethod
    def forward(ctx, function, rng, *args):
        ctx.function, ctx.rng = function, rng
        ctx.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.args = list(args)
        ctx.save_for_backward(*[args[i] for i in ctx.tensor_positions])
        with no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        args = list(ctx.args)
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors):
            args[i] = t.detach().requires_grad_(t.requires_grad)
        with ctx.rng.replay(), enable_grad():
            outputs = ctx.function(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, Tensor) and o.requires_grad and g is not None]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        _backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(a.grad if isinstance(a, Tensor) else None for a in args)


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None,
               context_fn: Callable = noop_context_fn, determinism_check: str = "default",
               debug: bool = False, **kwargs) -> Any:
    """`function(*args, **kwargs)` with its activations recomputed in backward instead of stored."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
                      "use_reentrant=False is recommended; without it the reentrant variant runs.",
                      stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if context_fn is not noop_context_fn:
            raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2)
        return _ReentrantCheckpoint.apply(function, _RngState(args, preserve), *args)
    recomputation = _Recomputation(function, args, kwargs, _RngState(args, preserve), context_fn)
    forward_ctx, _ = context_fn()
    with forward_ctx, saved_tensors_hooks(recomputation.pack, recomputation.unpack):
        return function(*args, **kwargs)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None, **kwargs):
    """Run the modules of `functions` in order, checkpointing each of `segments` groups but the last."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be "
                      "passed explicitly.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = len(functions) // segments

    def run_segment(start: int, end: int) -> Callable:
        def forward(x):
            for f in functions[start:end + 1]:
                x = f(x)
            return x
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run_segment(start, end), input, use_reentrant=use_reentrant, preserve_rng_state=preserve)
    return run_segment(end + 1, len(functions) - 1)(input)
