"""Batching rules for vmap, shared by the op declarations that attach them (`op.def_batching_rule`).

A rule is `rule(in_dims, *args)`: the op's arguments in schema order with each batched tensor
replaced by its physical value (one more dimension), and `in_dims` their batch dimensions (None for
unbatched arguments, a list for a list of tensors). It returns `(outputs, out_dims)` computed with
flambeau ops on physical tensors, or `NotImplemented` to decline (the interpreter then decomposes the
op, or loops over the batch). Rules never mix examples: the batch dimension is never reduced,
indexed or broadcast against a logical dimension. The interpreter is `flambeau._functorch.batched`.

The factories here build the rules of op families; each op file attaches them next to its ops.
"""
from __future__ import annotations

from .._tensor import Tensor


def call(op, values, fn=None):
    """Call `op` (or `fn`, e.g. its meta function) with its schema-ordered `values` (keyword-only
    arguments by name)."""
    args = op._schema.args
    pos = []
    kw = {}
    for a, v in zip(args, values):
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return (fn or op)(*pos, **kw)


def front(x: Tensor, d):
    """Batch dimension `d` of `x` moved to 0."""
    return x.movedim(d, 0) if d else x


def batch_size(values, dims) -> int:
    for v, d in zip(values, dims):
        if isinstance(d, list):
            for x, dx in zip(v, d):
                if dx is not None:
                    return x.shape[dx]
        elif d is not None:
            return v.shape[d]
    raise RuntimeError("batching rule called without a batched argument")


def logical_dim(x: Tensor, d) -> int:
    return x.dim() - (d is not None)


def pad_front(x: Tensor, d, ndim: int) -> Tensor:
    """`x` batched at `d` as `[B, 1, ..., 1, *logical]` with `ndim` logical dimensions."""
    x = front(x, d)
    extra = ndim - (x.dim() - 1)
    if extra > 0:
        x = x.reshape((x.shape[0],) + (1,) * extra + tuple(x.shape[1:]))
    return x


def materialize(x: Tensor, d, size: int) -> Tensor:
    """`x` with its batch at dimension 0, broadcast when unbatched."""
    if d is not None:
        return front(x, d)
    return x.unsqueeze(0).expand((size,) + tuple(x.shape))


def wrap_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def _tensor_positions(values):
    return [i for i, v in enumerate(values) if isinstance(v, Tensor)]


def pointwise_rule(op):
    """Elementwise over broadcast tensor arguments: batched ones as `[B, 1.., *logical]` aligned to the
    widest; the result dtype is the logical one (a batched 0-dim tensor promotes as a 0-dim tensor)."""
    def rule(in_dims, *values):
        pos = _tensor_positions(values)
        if any(isinstance(d, list) for d in in_dims):
            return NotImplemented
        nd = max(logical_dim(values[i], in_dims[i]) for i in pos)
        new = list(values)
        zero_dim_batched = False
        for i in pos:
            d = in_dims[i]
            if d is not None:
                zero_dim_batched |= values[i].dim() == 1
                new[i] = pad_front(values[i], d, nd)
        out = call(op, new)
        if zero_dim_batched and len(pos) > 1 and op.meta is not None and isinstance(out, Tensor):
            logical = [v.select(in_dims[i], 0) if i in pos and in_dims[i] is not None else v
                       for i, v in enumerate(values)]
            spec = call(op, logical, op.meta)
            if spec.dtype is not out.dtype:
                out = out.to(spec.dtype)
        return out, (tuple(0 for _ in out) if isinstance(out, tuple) else 0)
    rule.__name__ = f"_{op.__name__}_pointwise_batching"
    return rule


def unary_rule(op):
    """One batched tensor argument (`self`), the rest plain: run on the physical value, the batch
    dimension where it was (elementwise ops, clones, casts)."""
    def rule(in_dims, *values):
        if any(d is not None for d in in_dims[1:]):
            return NotImplemented
        out = call(op, values)
        return out, (tuple(in_dims[0] for _ in out) if isinstance(out, tuple) else in_dims[0])
    rule.__name__ = f"_{op.__name__}_unary_batching"
    return rule


def dim_rule(op, *names, extra: int = 0, all_when_none: bool = False, scalar_examples: bool = False):
    """`self` batched; the arguments `names` hold logical dimensions (an int or a list): they shift by
    one past the batch dimension (moved to 0). `extra`: the op's output has that many more
    dimensions than its input (unsqueeze). `all_when_none`: a None dim means every logical dimension.
    `scalar_examples`: a reduction-like op whose 0-d examples reduce over themselves (see
    `_scalar_examples`); other ops leave 0-d examples to the loop, which raises as the op does."""
    idx = [[a.name for a in op._schema.args].index(n) for n in names]

    def rule(in_dims, *values):
        if any(d is not None for d in in_dims[1:]) or any(isinstance(d, list) for d in in_dims):
            return NotImplemented
        x = front(values[0], in_dims[0])
        n = x.dim() - 1 + extra
        if n == 0 and scalar_examples:
            return _scalar_examples(op, idx, x, values, all_when_none)
        new = list(values)
        new[0] = x
        for i in idx:
            v = values[i]
            if v is None:
                if not all_when_none or n == 0:
                    return NotImplemented
                new[i] = list(range(1, n + 1))
            elif isinstance(v, int):
                if n == 0:
                    return NotImplemented
                new[i] = wrap_dim(v, n) + 1
            else:
                if n == 0 or len(v) == 0:
                    return NotImplemented
                new[i] = [wrap_dim(d, n) + 1 for d in v]
        out = call(op, new)
        return out, (tuple(0 for _ in out) if isinstance(out, (tuple, list)) else 0)
    rule.__name__ = f"_{op.__name__}_dim_batching"
    return rule


def _scalar_examples(op, idx, x, values, all_when_none: bool):
    """A dim op on 0-d examples (`loss.mean()` of a per-example scalar): the op over a new dimension 1
    of one element (the only dims a 0-d tensor takes are 0, -1, [] and None, all meaning itself),
    that dimension dropped again where keepdim kept it."""
    new = list(values)
    new[0] = x.unsqueeze(1)
    for i in idx:
        v = values[i]
        if v is None and not all_when_none:
            return NotImplemented
        if isinstance(v, int):
            wrap_dim(v, 0)                      # the op's IndexError for a dim a 0-d tensor lacks
        elif v is not None:
            for d in v:
                wrap_dim(d, 0)
        new[i] = 1 if isinstance(v, int) else [1]
    out = call(op, new)

    def drop(t):
        return t.squeeze(1) if isinstance(t, Tensor) and t.dim() == 2 else t
    if isinstance(out, (tuple, list)):
        items = [drop(t) for t in out]
        return (type(out)(*items) if hasattr(out, "_fields") else type(out)(items)), tuple(0 for _ in out)
    return drop(out), 0


def full_reduction_rule(op, dim_op):
    """A reduction over every element (`max(x)`): `dim_op(x.flatten(1), 1)` per example."""
    def rule(in_dims, *values):
        x = front(values[0], in_dims[0])
        return dim_op(x.reshape(x.shape[0], -1), 1), 0
    rule.__name__ = f"_{op.__name__}_full_reduction_batching"
    return rule


def matmul_like(a: Tensor, da, b: Tensor, db) -> Tensor:
    """`a @ b` per example (matmul's semantics for 1-D and broadcast batch dimensions)."""
    na, nb = logical_dim(a, da), logical_dim(b, db)
    A = front(a, da) if da is not None else a
    B = front(b, db) if db is not None else b
    if na == 1:
        A = A.unsqueeze(-2)
    if nb == 1:
        B = B.unsqueeze(-1)
    r = max(max(na, 2), max(nb, 2))
    if da is not None:
        A = pad_front(A, 0, r)
    if db is not None:
        B = pad_front(B, 0, r)
    out = A.matmul(B)
    if na == 1:
        out = out.squeeze(-2)
    if nb == 1:
        out = out.squeeze(-1)
    return out


def matmul_rule(op):
    """matmul, mm, bmm, mv, dot: the product per example through `matmul_like`."""
    def rule(in_dims, *values):
        return matmul_like(values[0], in_dims[0], values[1], in_dims[1]), 0
    rule.__name__ = f"_{op.__name__}_matmul_batching"
    return rule


def self_shaped_rule(op):
    """An op whose output takes `self`'s shape (masked_fill, copy): `self` broadcast over the batch
    when only another argument is batched, then the pointwise rule."""
    pw = pointwise_rule(op)

    def rule(in_dims, *values):
        if in_dims[0] is None:
            values = (materialize(values[0], None, batch_size(values, in_dims)),) + values[1:]
            in_dims = (0,) + tuple(in_dims[1:])
        return pw(in_dims, *values)
    rule.__name__ = f"_{op.__name__}_self_shaped_batching"
    return rule


def written_rule(op, *names, keep=()):
    """Ops that write into `self` by index (scatter, index_add, select_scatter, ...): every tensor
    argument but those named in `keep` is broadcast over the batch and put at dimension 0; the
    arguments `names` hold dimensions of `self`, shifted past the batch. A batched `keep` argument
    (a 1-D index) declines."""
    arg_names = [a.name for a in op._schema.args]
    idx = [arg_names.index(n) for n in names]
    kept = {arg_names.index(n) for n in keep}

    def rule(in_dims, *values):
        if any(in_dims[i] is not None for i in kept) or any(isinstance(d, list) for d in in_dims):
            return NotImplemented
        size = batch_size(values, in_dims)
        n = values[0].dim() - (in_dims[0] is not None)
        if n == 0:
            return NotImplemented
        new = [materialize(v, d, size) if isinstance(v, Tensor) and i not in kept else v
               for i, (v, d) in enumerate(zip(values, in_dims))]
        for i in idx:
            new[i] = wrap_dim(values[i], n) + 1
        return call(op, new), 0
    rule.__name__ = f"_{op.__name__}_written_batching"
    return rule
