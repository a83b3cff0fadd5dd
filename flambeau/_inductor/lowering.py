"""Lowering rules: one function per core operator, from IR inputs to IR outputs.

`@register_lowering(aten.add)` sets `op.lowering` on the given `Op` (keyed by the op object, so a
misspelt or missing op fails at import). Rules receive the GraphLowering and the op's arguments bound
positionally in schema order (IR values in place of tensors, Python values otherwise) and return
an IR value. Pointwise ops become `Pointwise` (broadcast by index remapping, operands cast to the
compute dtype), reductions become realised `Reduction` buffers, conversions are casts, matrix
products, convolutions, scans and sorts are `ExternKernel`s calling the eager kernel (BLAS) on
realised buffers. Ops tagged `Tag.extern` without a rule are called that way too (see `graph.py`).
Views, indexing and data movement live in `lowering_views`.
"""
from __future__ import annotations

import math

from .. import _dtype as D
from .._decomp._table import aten
from .._ops import OPS, Op, _helpers as H
from .index import Index
from .ir import IRNode, Pointwise, Reduction, Unsupported, ops
from .sizevars import SizeExpr, known_lt, size_tuple

def register_lowering(*ops: Op):
    """Decorator: `fn` becomes the lowering (`op.lowering`) of each given op."""
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"register_lowering takes Op objects (one overload), got {op!r}")

    def wrap(fn):
        for op in ops:
            op.def_lowering(fn)
        return fn
    return wrap


# ---- helpers ------------------------------------------------------------------------------------
def out_val(g):
    return g.node.meta["val"]


def out_shape(g) -> tuple:
    return size_tuple(out_val(g).shape)


def out_dtype(g):
    return out_val(g).dtype


def loader(g, x, shape, dtype):
    """Element loader of `x` (IR value or Python scalar) broadcast to `shape`, cast to `dtype`."""
    if not isinstance(x, IRNode):
        if isinstance(x, complex):
            raise Unsupported("complex scalars")
        v = x
        if isinstance(v, SizeExpr):           # a symbolic size used as a number (mean's divisor)
            return lambda idx: ops.to_dtype(ops.index_expr(Index(None, v), D.int64), dtype)
        return lambda idx: ops.constant(v, dtype)
    xs = tuple(x.shape)
    lead = len(shape) - len(xs)
    n_in = math.prod(xs)
    if isinstance(x, Pointwise) and x.realized is None and known_lt(2 * (n_in if n_in != 0 else 1), math.prod(shape)) \
            and x.stats().heavy > 0:
        g.realize(x)                  # don't recompute transcendental work for every broadcast copy
    ld = x.make_loader()
    broadcast = [xs[j] == 1 and shape[lead + j] != 1 for j in range(len(xs))]

    def load(idx):
        sub = [Index() if broadcast[j] or xs[j] == 1 else idx[lead + j] for j in range(len(xs))]
        return ops.to_dtype(ld(sub), dtype)
    return load


def make_pointwise(g, fn, inputs, compute_dtype, result_dtype=None):
    """Pointwise node computing `fn(*loaded inputs)` with inputs in `compute_dtype`."""
    shape = out_shape(g)
    rdt = result_dtype or out_dtype(g)
    loaders = [loader(g, x, shape, compute_dtype) for x in inputs]

    def inner(idx):
        return ops.to_dtype(fn(*[ld(idx) for ld in loaders]), rdt)
    return Pointwise(shape, rdt, inner)


def common_dtype(*xs):
    """PyTorch's result type over IR values (by rank class) and Python scalars."""
    dims, zeros, scalars = [], [], []
    for x in xs:
        if isinstance(x, IRNode):
            (dims if len(x.shape) else zeros).append(x.dtype)
        elif isinstance(x, SizeExpr):
            scalars.append(D.int64)
        elif x is not None:
            scalars.append(D.scalar_dtype(x, D.float32))
    return D.result_type_of(dims, zeros, scalars)


# ---- pointwise ----------------------------------------------------------------------------------
_ROUNDING = (aten.floor, aten.ceil, aten.round, aten.trunc)     # the identity on integers


@register_lowering(*(op for op in OPS.values() if op.pointwise is not None))
def _spelled(g, *xs):
    """An op that declares its formula (`op.pointwise`): computed in the result dtype."""
    dt = out_dtype(g)
    op = g.node.target
    if op in _ROUNDING and dt.category < D.FLOATING:
        return make_pointwise(g, lambda a: a, list(xs), dt)
    return make_pointwise(g, lambda *a: ops.apply(op, *a), list(xs), dt)


@register_lowering(aten.neg, aten.abs, aten.sign)
def _unary(g, x):
    dt = out_dtype(g)
    op = g.node.target
    if op is not aten.neg and dt is D.bool:              # abs and sign are the identity on bool
        return make_pointwise(g, lambda a: a, [x], dt)
    return make_pointwise(g, getattr(ops, op.__name__), [x], dt)


@register_lowering(aten.conj_physical, aten._pw_real, aten.clone, aten.alias)
def _identity(g, x, *rest, **kw):
    return make_pointwise(g, lambda a: a, [x], out_dtype(g))


@register_lowering(aten.bitwise_not)
def _bitwise_not(g, x):
    dt = out_dtype(g)
    if dt is D.bool:
        return make_pointwise(g, ops.logical_not, [x], dt)
    return make_pointwise(g, ops.bitwise_not, [x], dt)


@register_lowering(aten.logical_not)
def _logical_not(g, x):
    return make_pointwise(g, ops.logical_not, [x], D.bool)


@register_lowering(aten.signbit)
def _signbit(g, x):
    return make_pointwise(g, ops.signbit, [x], x.dtype if x.dtype.category == D.FLOATING else D.float32)


def _binary(opname, float_only=False):
    def rule(g, a, b):
        dt = out_dtype(g)
        if float_only and dt.category != D.FLOATING:
            raise Unsupported(f"{opname} on {dt}")
        return make_pointwise(g, getattr(ops, opname), [a, b], dt)
    return rule


for _op, _name in {aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.fmod: "fmod",
                   aten.remainder: "remainder",
                   aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
                   aten.bitwise_xor: "bitwise_xor", aten.bitwise_left_shift.Tensor: "lshift",
                   aten.bitwise_right_shift.Tensor: "rshift", aten.gcd: "gcd", aten.lcm: "lcm"}.items():
    register_lowering(_op)(_binary(_name))


@register_lowering(aten.pow)
def _pow(g, a, b):
    """x ** 0.5 and x ** -0.5 are sqrt and rsqrt, as PyTorch's kernel computes them (sqrt(-0.0) is
    -0.0 and sqrt(-inf) NaN, where C's pow gives +0.0 and +inf)."""
    dt = out_dtype(g)
    if dt.category == D.FLOATING and type(b) is float and b in (0.5, -0.5):
        root = aten.sqrt if b > 0 else aten.rsqrt
        return make_pointwise(g, lambda x: ops.apply(root, x), [a], dt)
    return make_pointwise(g, ops.pow, [a, b], dt)


@register_lowering(aten.add, aten.sub)
def _add_sub(g, a, b, alpha=1):
    dt = out_dtype(g)
    fn = ops.add if g.node.target is aten.add else ops.sub
    if alpha != 1:
        if isinstance(alpha, complex):
            raise Unsupported("complex alpha")
        return make_pointwise(g, lambda x, y: fn(x, ops.mul(y, ops.constant(alpha, dt))), [a, b], dt)
    if dt is D.bool and fn is ops.add:
        return make_pointwise(g, ops.logical_or, [a, b], dt)
    return make_pointwise(g, fn, [a, b], dt)


@register_lowering(aten.div)
def _div(g, a, b):
    return make_pointwise(g, ops.truediv, [a, b], out_dtype(g))


@register_lowering(aten.div_mode)
def _div_mode(g, a, b, rounding_mode=None):
    dt = out_dtype(g)
    if rounding_mode is None:
        return make_pointwise(g, ops.truediv, [a, b], dt)
    fn = ops.truncdiv if rounding_mode == "trunc" else ops.floordiv
    return make_pointwise(g, fn, [a, b], dt)


def _compare(opname):
    def rule(g, a, b):
        return make_pointwise(g, getattr(ops, opname), [a, b], common_dtype(a, b), D.bool)
    return rule


for _op in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge):
    register_lowering(_op)(_compare(_op.__name__))


@register_lowering(aten.logical_and, aten.logical_or, aten.logical_xor)
def _logical(g, a, b):
    fn = {aten.logical_and: ops.logical_and, aten.logical_or: ops.logical_or, aten.logical_xor: ops.ne}[g.node.target]
    return make_pointwise(g, fn, [a, b], D.bool, out_dtype(g))


@register_lowering(aten.where)
def _where(g, c, a, b):
    dt = out_dtype(g)
    shape = out_shape(g)
    lc = loader(g, c, shape, D.bool)
    la, lb = loader(g, a, shape, dt), loader(g, b, shape, dt)
    return Pointwise(shape, dt, lambda idx: ops.where(lc(idx), la(idx), lb(idx)))


# ---- conversions --------------------------------------------------------------------------------
@register_lowering(aten._to_copy)
def _to_copy(g, x, dtype=None, device=None, non_blocking=False, **kw):
    if device is not None and str(device) not in ("cpu", "cpu:0"):
        raise Unsupported("device copies")
    return make_pointwise(g, lambda a: a, [x], out_dtype(g))


@register_lowering(aten.copy)
def _copy(g, self, src, non_blocking=False):
    return make_pointwise(g, lambda a: a, [src], out_dtype(g))


# ---- factories ----------------------------------------------------------------------------------
@register_lowering(aten.full)
def _full(g, size, fill_value, dtype=None, device=None, **kw):
    dt = out_dtype(g)
    if isinstance(fill_value, complex):
        raise Unsupported("complex fill")
    return Pointwise(out_shape(g), dt, lambda idx: ops.constant(fill_value, dt))


@register_lowering(aten.empty, aten.empty_strided)
def _empty(g, *args, **kw):
    dt = out_dtype(g)
    return Pointwise(out_shape(g), dt, lambda idx: ops.constant(0, dt))


@register_lowering(aten.arange)
def _arange(g, start, end, step=1, dtype=None, device=None, **kw):
    dt = out_dtype(g)
    if dt.category < D.FLOATING:
        s0, st = int(start), int(step)
        return Pointwise(out_shape(g), dt, lambda idx: ops.index_expr(idx[0] * st + s0, dt))
    # floating arange: start + i * step computed in double like PyTorch's kernel
    def inner(idx):
        i = ops.index_expr(idx[0], D.float64)
        v = ops.add(ops.constant(float(start), D.float64), ops.mul(i, ops.constant(float(step), D.float64)))
        return ops.to_dtype(v, dt)
    return Pointwise(out_shape(g), dt, inner)


# ---- reductions ---------------------------------------------------------------------------------
def reduce(g, x, dims, keepdim, rtype, dtype, src_dtype):
    nd = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(nd))
    elif isinstance(dims, int):
        dims = [dims]
    dims = sorted({H.wrap_dim(d, nd) for d in dims}) if nd else []
    kept = [d for d in range(nd) if d not in dims]
    shape = out_shape(g)
    ld = x.make_loader()
    rranges = [x.shape[d] for d in dims]

    def inner(idx, ridx):
        full = [None] * nd
        for k, d in enumerate(kept):
            full[d] = idx[d] if keepdim else idx[k]
        for k, d in enumerate(dims):
            full[d] = ridx[k]
        return ops.to_dtype(ld(full), src_dtype)
    return g.realize(Reduction(shape, rranges, rtype, dtype, src_dtype, inner))


@register_lowering(aten.sum)
def _sum(g, x, dim=None, keepdim=False, dtype=None):
    dt = out_dtype(g)
    if dt is D.bool:
        return reduce(g, x, dim, keepdim, "any", dt, D.bool)
    return reduce(g, x, dim, keepdim, "sum", dt, dt)


@register_lowering(aten.prod)
def _prod(g, x, dim=None, keepdim=False, dtype=None):
    dt = out_dtype(g)
    if dt is D.bool:
        return reduce(g, x, dim, keepdim, "all", dt, D.bool)
    return reduce(g, x, dim, keepdim, "prod", dt, dt)


@register_lowering(aten.amax, aten.amin)
def _amax(g, x, dim=(), keepdim=False):
    dt = out_dtype(g)
    is_max = g.node.target is aten.amax
    if x.dtype is D.bool:
        return reduce(g, x, dim, keepdim, "any" if is_max else "all", dt, D.bool)
    return reduce(g, x, dim, keepdim, "max" if is_max else "min", dt, dt)


@register_lowering(aten.argmax, aten.argmin)
def _argmax(g, x, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            raise Unsupported("argmax keepdim over all dims")
    src = x.dtype if x.dtype is not D.bool else D.uint8
    return reduce(g, x, dim, keepdim, g.node.target.__name__, out_dtype(g), src)


@register_lowering(aten.any, aten.all)
def _any(g, x, dim=None, keepdim=False):
    rtype = "any" if g.node.target is aten.any else "all"
    return reduce(g, x, dim, keepdim, rtype, out_dtype(g), D.bool)


from . import lowering_views  # noqa: E402,F401  (registers the view and data-movement rules)
