"""How decompositions are attached to their ops, and the small vocabulary they are written in.

`@register_decomposition(aten.softmax)` sets `op.decomposition` on each given `Op` (the op object,
so a misspelt op fails at import). `aten.<short name>` is the registered Op (`aten.sum` is
`sum.dim_IntList`, see `_ALIASES`); another overload is named after it, PyTorch's way
(`aten.max.dim`, `aten.rsub.Tensor`, `aten.add.Tensor`). So a decomposition states exactly which operators it emits
and which it replaces. The helpers below (casts, factories, dim handling) emit only core ops.
"""
from __future__ import annotations

from .. import _dtype as D
from .._ops import OPS, Op, EXPORTS
from ..fx._aten import OpOverloadPacket
from .._ops._helpers import result_type


def register_decomposition(*ops: Op):
    """Decorator: `fn` becomes the decomposition (`op.decomposition`) of each given op."""
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"register_decomposition takes Op objects (one overload), got {op!r}")

    def wrap(fn):
        for op in ops:
            op.def_decomposition(fn)
        return fn
    return wrap


_ALIASES = {
    "add": "add.Tensor", "sub": "sub.Tensor", "mul": "mul.Tensor", "div": "div.Tensor",
    "div_mode": "div.Tensor_mode", "pow": "pow.Tensor_Tensor", "remainder": "remainder.Tensor",
    "fmod": "fmod.Tensor", "eq": "eq.Tensor", "ne": "ne.Tensor", "lt": "lt.Tensor", "le": "le.Tensor",
    "gt": "gt.Tensor", "ge": "ge.Tensor", "where": "where.self", "sum": "sum.dim_IntList",
    "prod": "prod.dim_int", "any": "any.dims", "all": "all.dims", "squeeze": "squeeze.dims",
    "slice": "slice.Tensor", "select": "select.int", "arange": "arange.start_step", "index": "index.Tensor",
    "scatter": "scatter.src", "scatter_reduce": "scatter_reduce.two", "bitwise_and": "bitwise_and.Tensor",
    "bitwise_or": "bitwise_or.Tensor", "bitwise_xor": "bitwise_xor.Tensor", "clamp": "clamp.Tensor",
    "randint": "randint.low", "softmax": "softmax.int", "log_softmax": "log_softmax.int",
}


class _Aten:
    """`aten.exp` -> OPS['exp'], `aten.sum` -> OPS['sum.dim_IntList'] (see _ALIASES); a name that
    is no op by itself -> its overload packet (`aten.rsub.Tensor` -> OPS['rsub.Tensor']); an Op
    names its sibling overloads (`aten.max.dim` -> OPS['max.dim'])."""

    def __getattr__(self, name: str):
        full = _ALIASES.get(name, name)
        if full in OPS:
            op = OPS[full]
        elif any(k.startswith(name + ".") for k in OPS):
            op = OpOverloadPacket(name)
        else:
            raise AttributeError(f"aten.{name}: no such operator")
        setattr(self, name, op)
        return op


aten = _Aten()


# ---- helpers ----------------------------------------------------------------------------------
def to(x, dtype):
    """Cast to `dtype` (no op when it already has it)."""
    return x if x.dtype is dtype else aten._to_copy(x, dtype=dtype)


def compute_dtype(dt):
    """The dtype a decomposition computes in: float32 for half/bfloat16, else `dt` itself."""
    return D.float32 if dt in D.LOW_PRECISION else dt


def upcast(x):
    return to(x, compute_dtype(x.dtype))


def full(shape, value, like, dtype=None):
    return aten.full(tuple(shape), value, dtype=dtype or like.dtype, device=like.device)


def scalar_tensor(value, like, dtype=None):
    return full((), value, like, dtype)


def maximum(x, y):
    """maximum(x, y) where either side may be a Python number (made a 0-dim tensor first)."""
    return aten.maximum(*_tensors(x, y))


def minimum(x, y):
    return aten.minimum(*_tensors(x, y))


def _tensors(x, y):
    dt = result_type(x, y)
    like = x if hasattr(x, "dtype") else y
    if not hasattr(x, "dtype"):
        x = scalar_tensor(x, like, dt)
    if not hasattr(y, "dtype"):
        y = scalar_tensor(y, like, dt)
    return x, y


def dims_of(dim, ndim: int) -> tuple:
    """Normalise an int / list / None dim argument to a sorted tuple of non-negative dims
    (None or [] means every dim)."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted(wrap(d, ndim) for d in dim))


def wrap(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return d + n if d < 0 else d


def numel(shape, dims=None) -> int:
    n = 1
    for i, s in enumerate(shape):
        if dims is None or i in dims:
            n *= s
    return n


def reshape(x, shape):
    return EXPORTS["reshape"](x, *shape) if shape else EXPORTS["reshape"](x, ())


def by_name(op: Op, values) -> object:
    """Call `op` with positional `values` in schema order, passing keyword-only args by name."""
    args, kwargs = [], {}
    for a, v in zip(op._schema.args, values):
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return op(*args, **kwargs)
