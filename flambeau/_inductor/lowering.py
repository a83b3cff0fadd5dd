"""Lowering rules: one function per core operator, from IR inputs to IR outputs.

`@register_lowering(aten.add)` sets `op.lowering` on the given `Op` (keyed by the op object, so a
misspelt or missing op fails at import). Rules receive the GraphLowering and the op's arguments bound
positionally in schema order (IR values in place of tensors, Python values otherwise) and return
an IR value. Pointwise ops become `Pointwise` (broadcast by index remapping, operands cast to the
compute dtype), reductions become realised `Reduction` buffers, conversions are casts, matrix
products, convolutions, scans and sorts are `ExternKernel`s calling the eager kernel (BLAS) on
realised buffers. Ops tagged `Tag.extern` without a rule are called that way too (see `graph.py`).
Views, indexing and data movement live in `lowering_views`; scatters, index_put and `copy_` in
`lowering_scatter`; `lowerings` loads all three.
"""
from __future__ import annotations

import math

from .. import _dtype as D
from .._decomp._table import aten
from .._device import canonical
from .._ops import Op, _helpers as H
from .._ops.pointwise import POWERS_BY_PRODUCTS
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


def spelled(g, *xs):
    """The lowering of every op that declares its formula (`op.pointwise`) and has no rule of its
    own (attached by `lowerings`): computed in the result dtype, or, for a comparison or predicate,
    in the operands' common dtype."""
    dt = out_dtype(g)
    op = g.node.target
    if op in _ROUNDING and dt.category < D.FLOATING:
        return make_pointwise(g, lambda a: a, list(xs), dt)
    if op.pointwise.result == "bool":
        return make_pointwise(g, lambda *a: ops.apply(op, *a), list(xs), common_dtype(*xs), dt)
    return make_pointwise(g, lambda *a: ops.apply(op, *a), list(xs), dt)


@register_lowering(aten.neg, aten.abs, aten.sign)
def _unary(g, x):
    dt = out_dtype(g)
    op = g.node.target
    if op is not aten.neg and dt is D.bool:              # abs and sign are the identity on bool
        return make_pointwise(g, lambda a: a, [x], dt)
    return make_pointwise(g, lambda a: ops.apply(op, a), [x], dt)


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


@register_lowering(aten.pow)
def _pow(g, a, b):
    """x ** 0.5 and x ** -0.5 are sqrt and rsqrt, as PyTorch's kernel computes them (sqrt(-0.0) is
    -0.0 and sqrt(-inf) NaN, where C's pow gives +0.0 and +inf)."""
    dt = out_dtype(g)
    if dt.category == D.FLOATING and type(b) is float and b in (0.5, -0.5):
        root = aten.sqrt if b > 0 else aten.rsqrt
        return make_pointwise(g, lambda x: ops.apply(root, x), [a], dt)
    if dt.category == D.FLOATING and type(b) in (int, float) and b in POWERS_BY_PRODUCTS:
        return make_pointwise(g, lambda x: _pow_by_products(x, b, dt), [a], dt)
    return make_pointwise(g, ops.pow, [a, b], dt)


def _pow_by_products(x, b, dt):
    """x ** b for b in 2, 3, -1, -2 as ATen's kernel (and torch.compile) computes it: x * x, x * x * x,
    1 / x, 1 / (x * x), each product rounded (pow's own spelling rounds x ** 3 once)."""
    if b == -1:
        return ops.div(ops.constant(1, dt), x)
    square = ops.mul(x, x)
    return square if b == 2 else ops.mul(square, x) if b == 3 else ops.div(ops.constant(1, dt), square)


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


@register_lowering(aten.div_mode)
def _div_mode(g, a, b, rounding_mode=None):
    op = {None: aten.div, "trunc": aten._div_trunc, "floor": aten.floor_divide}[rounding_mode]
    return make_pointwise(g, lambda x, y: ops.apply(op, x, y), [a, b], out_dtype(g))


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
    if device is not None and canonical(device) != g.device:
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
        s0 = start if isinstance(start, SizeExpr) else int(start)     # a symbolic start: flip's size - 1
        st = int(step)
        return Pointwise(out_shape(g), dt, lambda idx: ops.index_expr(idx[0] * st + s0, dt))
    # floating arange: start + i * step computed in double like PyTorch's kernel
    def inner(idx):
        i = ops.index_expr(idx[0], D.float64)
        v = ops.add(ops.constant(float(start), D.float64), ops.mul(i, ops.constant(float(step), D.float64)))
        return ops.to_dtype(v, dt)
    return Pointwise(out_shape(g), dt, inner)


def _lin_values(steps, start, end, cd):
    """Element loader of PyTorch's linspace in dtype `cd`: the first half counts up from start, the
    second half down from end (the eager kernel's formula, with its step rounded the same way)."""
    if isinstance(steps, SizeExpr) or any(isinstance(v, (complex, SizeExpr)) for v in (start, end)):
        raise Unsupported("linspace with symbolic or complex bounds")
    if steps == 1:
        return lambda idx: ops.constant(start, cd)
    step = float((cd.np.type(end) - cd.np.type(start)) / cd.np.type(steps - 1))
    half = steps // 2

    def inner(idx):
        i = idx[0]
        up = ops.add(ops.constant(start, cd), ops.mul(ops.constant(step, cd), ops.index_expr(i, cd)))
        down = ops.sub(ops.constant(end, cd),
                       ops.mul(ops.constant(step, cd), ops.index_expr(Index(None, steps - 1) - i, cd)))
        return ops.where(ops.lt(ops.index_expr(i, D.int64), ops.constant(half, D.int64)), up, down)
    return inner


@register_lowering(aten.linspace)
def _linspace(g, start, end, steps, dtype=None, device=None):
    dt = out_dtype(g)
    cd = dt if dt in (D.float32, D.float64) else D.float64
    lin = _lin_values(steps, start, end, cd)
    return Pointwise(out_shape(g), dt, lambda idx: ops.to_dtype(lin(idx), dt))


@register_lowering(aten.logspace)
def _logspace(g, start, end, steps, base=10.0, dtype=None, device=None):
    dt = out_dtype(g)
    lin = _lin_values(steps, start, end, D.float64)

    def inner(idx):
        return ops.to_dtype(ops.pow(ops.constant(float(base), D.float64), lin(idx)), dt)
    return Pointwise(out_shape(g), dt, inner)


@register_lowering(aten.tril_indices, aten.triu_indices)
def _tri_indices(g, row, col, offset=0, dtype=None, device=None, **kw):
    """Row-major (row, col) pairs of a triangle, element k of a closed form: the rows of the
    triangle form a rectangle of full rows and a trapezoid whose row lengths change by one; the
    trapezoid row holding k solves a quadratic (in double, then corrected by one either way).
    Symbolic sizes enter the closed form as index expressions; its min/max choices must then hold
    for every size (SizeExpr comparisons raise Unsupported otherwise: the op runs eagerly)."""
    dt, shape = out_dtype(g), out_shape(g)
    if isinstance(offset, SizeExpr):
        raise Unsupported("triangle indices with a symbolic offset")
    if shape[1] == 0:
        return Pointwise(shape, dt, lambda idx: ops.constant(0, dt))
    lower = g.node.target.name == "tril_indices"
    if lower:           # trapezoid first: rows r0 + j of length m + j; then full rows
        r0 = max(0, -offset)
        m = min(col, r0 + offset + 1)
        n_trap = max(0, min(row - r0, col - m))
        trap_row0, trap_k0, trap_c0 = r0, 0, 0
        rect_row0, rect_k0 = r0 + n_trap, n_trap * m + n_trap * (n_trap - 1) // 2
    else:               # full rows first; then rows R + j of length m - j starting at column R + j + offset
        n_full = min(max(1 - offset, 0), row)
        m = col - (n_full + offset)
        trap_row0, trap_k0, trap_c0 = n_full, n_full * col, n_full + offset
        rect_row0, rect_k0 = 0, 0
    sign = 1 if lower else -1

    def c(v):
        return ops.index_expr(Index(None, v), D.int64) if isinstance(v, SizeExpr) else ops.constant(v, D.int64)

    def f(v):
        return ops.to_dtype(c(v), D.float64) if isinstance(v, SizeExpr) else ops.constant(float(v), D.float64)

    def started(j):                 # elements of the trapezoid before its row j
        return ops.add(ops.mul(j, c(m)), ops.mul(c(sign), ops.floor_divide(ops.mul(j, ops.sub(j, c(1))), c(2))))

    def inner(idx):
        k = ops.index_expr(idx[1], D.int64)
        kt = ops.sub(k, c(trap_k0))
        b = 2 * m - 1 if lower else 2 * m + 1
        disc = ops.maximum(ops.to_dtype(ops.add(c(b * b), ops.mul(c(8 * sign), kt)), D.float64),
                           ops.constant(0.0, D.float64))
        root = ops.apply(aten.sqrt, disc)
        est = ops.div(ops.sub(root, f(b)) if lower else ops.sub(f(b), root), ops.constant(2.0, D.float64))
        j = ops.to_dtype(ops.apply(aten.floor, est), D.int64)
        j = ops.sub(j, ops.to_dtype(ops.gt(started(j), kt), D.int64))
        j = ops.add(j, ops.to_dtype(ops.le(started(ops.add(j, c(1))), kt), D.int64))
        trap_r = ops.add(c(trap_row0), j)
        trap_col = ops.add(ops.sub(kt, started(j)), ops.add(c(trap_c0), j) if not lower else c(0))
        kr = ops.sub(k, c(rect_k0))
        rect_r = ops.add(c(rect_row0), ops.floor_divide(kr, c(col)))
        rect_col = ops.remainder(kr, c(col))
        in_trap = ops.ge(k, c(trap_k0)) if not lower else ops.lt(k, c(rect_k0))
        r, cc = ops.where(in_trap, trap_r, rect_r), ops.where(in_trap, trap_col, rect_col)
        first = ops.eq(ops.index_expr(idx[0], D.int64), c(0))
        return ops.to_dtype(ops.where(first, r, cc), dt)
    return Pointwise(shape, dt, inner)


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

