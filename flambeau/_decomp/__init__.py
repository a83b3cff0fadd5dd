"""Decompositions of flambeau's operators into the core operator set (`flambeau._decomp.core`).

A decomposition is a Python function over flambeau operators that computes what one operator
computes. It receives the operator's arguments bound positionally in schema order (so it never
parses arguments) and may return `NotImplemented` to decline an input it does not cover (e.g. a
complex dtype), in which case the operator itself runs. Decompositions are written with Op calls,
so they run on real, meta and fake tensors and under every tracing mode.

    core_aten_decompositions()      -> {Op: fn} for every non-core op that has one (`op.decomposition`,
                                       set by `@register_decomposition(aten.x)` next to the rule)
    get_decompositions(ops)         -> the same, restricted to the given ops / names
    decompose(op, args, kwargs)     -> run `op` through decompositions until only core ops run
    with DecompositionMode(): ...   -> every non-core op with a decomposition is replaced by it,
                                       recursively (tracing under it yields core-only graphs)

In-place operators (`add_`) decompose generically into their functional operator followed by
`copy_` into `self`, which functionalization turns into an output.

Layer 9 of tests/test_layers.py's order: imports tracing and below.
"""
from __future__ import annotations

from .. import _dispatch
from .._ops import OPS, Op
from ..utils._python_dispatch import TorchDispatchMode
from .core import core_ops, is_core  # noqa: F401
from ._table import register_decomposition  # noqa: F401
from . import decompositions_pointwise, decompositions_nn, decompositions_reduction  # noqa: F401
from . import decompositions_shape, decompositions_loss, decompositions_quant  # noqa: F401


def _op(x) -> Op:
    return x if isinstance(x, Op) else OPS[x]


def core_aten_decompositions() -> dict:
    """{Op: decomposition} for every registered non-core op that has one."""
    return {op: op.decomposition for op in OPS.values() if op.decomposition is not None and not is_core(op)}


def get_decompositions(ops) -> dict:
    """{Op: decomposition} for the given ops (Op objects or names; a bare name like 'add' selects
    every overload 'add.*')."""
    out = {}
    for o in ops:
        if isinstance(o, str) and o not in OPS:
            for op in OPS.values():
                if op.__name__ == o and op.decomposition is not None:
                    out[op] = op.decomposition
            continue
        op = _op(o)
        if op.decomposition is not None:
            out[op] = op.decomposition
    return out


def _apply(op: Op, fn, args, kwargs):
    """Run one decomposition: bind arguments positionally, wrap multi-output results."""
    r = fn(*op.bind(*args, **(kwargs or {})))
    if r is NotImplemented:
        return r
    if op.return_type is not None and type(r) is tuple:
        r = op.return_type(*r)
    return r


class DecompositionMode(TorchDispatchMode):
    """Replace each non-core op that has a decomposition by it, recursively.

    `decompositions` defaults to `core_aten_decompositions()`. Ops that are core, or have none,
    pass through to the next mode (or autograd + the kernel). `out=` calls are decomposed to the
    functional form, then written into `out` as the dispatcher does.
    """

    def __init__(self, decompositions: dict | None = None):
        super().__init__()
        self.decompositions = core_aten_decompositions() if decompositions is None else decompositions

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        fn = self.decompositions.get(func)
        if fn is None:
            return func(*args, **(kwargs or {}))
        with self:
            if kwargs and "out" in kwargs:
                return _dispatch._with_out(func, args, kwargs)
            r = _apply(func, fn, args, kwargs)
        if r is NotImplemented:
            return func(*args, **(kwargs or {}))
        return r


def decompose(op, args=(), kwargs=None, decompositions: dict | None = None):
    """Run `op(*args, **kwargs)` with `op` and every op it reaches decomposed until only core ops
    (or ops without a decomposition) run."""
    with DecompositionMode(decompositions):
        return _op(op)(*args, **(kwargs or {}))
