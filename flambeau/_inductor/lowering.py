"""Lowering rules: one function per core operator, from IR inputs to IR outputs.

`@register("add.Tensor")` rules receive the GraphLowering and the op's arguments bound
positionally in schema order (IR values in place of tensors, Python values otherwise) and return
an IR value. Pointwise ops become `Pointwise` (broadcast by index remapping, operands cast to the
compute dtype), reductions become realised `Reduction` buffers, conversions are casts, matrix
products, convolutions, scans and sorts are `ExternKernel`s calling the eager kernel (BLAS) on
realised buffers. Views, indexing and data movement live in `lowering_views`.
"""
from __future__ import annotations

import math

from .. import _dtype as D
from .._ops import _helpers as H
from .index import Index
from .ir import IRNode, Pointwise, Reduction, Unsupported, ops
from .sizevars import SizeExpr, known_lt, size_tuple

LOWERINGS: dict = {}


def register(*names):
    def wrap(fn):
        for n in names:
            LOWERINGS[n] = fn
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
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1",
          "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin",
          "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh",
          "acosh": "acosh", "atanh": "atanh", "erf": "erf", "erfc": "erfc", "lgamma": "lgamma",
          "floor": "floor", "ceil": "ceil", "round": "round", "trunc": "trunc", "sign": "sign",
          "sigmoid": "sigmoid", "reciprocal": "reciprocal"}


def _unary(opname):
    def rule(g, x):
        dt = out_dtype(g)
        if opname in ("floor", "ceil", "round", "trunc") and dt.category < D.FLOATING:
            return make_pointwise(g, lambda a: a, [x], dt)
        if opname in ("abs", "sign") and dt is D.bool:
            return make_pointwise(g, lambda a: a, [x], dt)
        return make_pointwise(g, getattr(ops, opname), [x], dt)
    return rule


for _name, _op in _UNARY.items():
    register(_name)(_unary(_op))


@register("conj_physical", "_pw_real", "clone", "alias", "detach", "lift_fresh_copy", "positive")
def _identity(g, x, *rest, **kw):
    return make_pointwise(g, lambda a: a, [x], out_dtype(g))


@register("bitwise_not")
def _bitwise_not(g, x):
    dt = out_dtype(g)
    if dt is D.bool:
        return make_pointwise(g, ops.logical_not, [x], dt)
    return make_pointwise(g, ops.bitwise_not, [x], dt)


@register("logical_not")
def _logical_not(g, x):
    return make_pointwise(g, ops.logical_not, [x], D.bool)


@register("signbit")
def _signbit(g, x):
    return make_pointwise(g, ops.signbit, [x], x.dtype if x.dtype.category == D.FLOATING else D.float32)


def _binary(opname, float_only=False):
    def rule(g, a, b):
        dt = out_dtype(g)
        if float_only and dt.category != D.FLOATING:
            raise Unsupported(f"{opname} on {dt}")
        return make_pointwise(g, getattr(ops, opname), [a, b], dt)
    return rule


for _name, _op in {"mul.Tensor": "mul", "maximum": "maximum", "minimum": "minimum",
                   "atan2": "atan2", "nextafter": "nextafter", "fmod.Tensor": "fmod",
                   "remainder.Tensor": "remainder", "pow.Tensor_Tensor": "pow",
                   "bitwise_and.Tensor": "bitwise_and", "bitwise_or.Tensor": "bitwise_or",
                   "bitwise_xor.Tensor": "bitwise_xor", "bitwise_left_shift.Tensor": "lshift",
                   "bitwise_right_shift.Tensor": "rshift", "gcd": "gcd", "lcm": "lcm"}.items():
    register(_name)(_binary(_op))


@register("add.Tensor", "sub.Tensor")
def _add_sub(g, a, b, alpha=1):
    dt = out_dtype(g)
    fn = ops.add if g.node.target.name == "add.Tensor" else ops.sub
    if alpha != 1:
        if isinstance(alpha, complex):
            raise Unsupported("complex alpha")
        return make_pointwise(g, lambda x, y: fn(x, ops.mul(y, ops.constant(alpha, dt))), [a, b], dt)
    if dt is D.bool and fn is ops.add:
        return make_pointwise(g, ops.logical_or, [a, b], dt)
    return make_pointwise(g, fn, [a, b], dt)


@register("div.Tensor")
def _div(g, a, b):
    return make_pointwise(g, ops.truediv, [a, b], out_dtype(g))


@register("div.Tensor_mode")
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


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(f"{_name}.Tensor", f"{_name}.Scalar")(_compare(_name))


@register("logical_and", "logical_or", "logical_xor")
def _logical(g, a, b):
    name = g.node.target.name
    fn = {"logical_and": ops.logical_and, "logical_or": ops.logical_or, "logical_xor": ops.ne}[name]
    return make_pointwise(g, fn, [a, b], D.bool, out_dtype(g))


@register("where.self")
def _where(g, c, a, b):
    dt = out_dtype(g)
    shape = out_shape(g)
    lc = loader(g, c, shape, D.bool)
    la, lb = loader(g, a, shape, dt), loader(g, b, shape, dt)
    return Pointwise(shape, dt, lambda idx: ops.where(lc(idx), la(idx), lb(idx)))


# ---- conversions --------------------------------------------------------------------------------
@register("_to_copy")
def _to_copy(g, x, dtype=None, device=None, non_blocking=False, **kw):
    if device is not None and str(device) not in ("cpu", "cpu:0"):
        raise Unsupported("device copies")
    return make_pointwise(g, lambda a: a, [x], out_dtype(g))


@register("copy")
def _copy(g, self, src, non_blocking=False):
    return make_pointwise(g, lambda a: a, [src], out_dtype(g))


# ---- factories ----------------------------------------------------------------------------------
@register("full")
def _full(g, size, fill_value, dtype=None, device=None, **kw):
    dt = out_dtype(g)
    if isinstance(fill_value, complex):
        raise Unsupported("complex fill")
    return Pointwise(out_shape(g), dt, lambda idx: ops.constant(fill_value, dt))


@register("empty", "empty_strided", "zeros")
def _empty(g, *args, **kw):
    dt = out_dtype(g)
    return Pointwise(out_shape(g), dt, lambda idx: ops.constant(0, dt))


@register("arange.start_step")
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


@register("sum.dim_IntList", "sum.default", "sum")
def _sum(g, x, dim=None, keepdim=False, dtype=None):
    dt = out_dtype(g)
    if dt is D.bool:
        return reduce(g, x, dim, keepdim, "any", dt, D.bool)
    return reduce(g, x, dim, keepdim, "sum", dt, dt)


@register("prod.dim_int")
def _prod(g, x, dim=None, keepdim=False, dtype=None):
    dt = out_dtype(g)
    if dt is D.bool:
        return reduce(g, x, dim, keepdim, "all", dt, D.bool)
    return reduce(g, x, dim, keepdim, "prod", dt, dt)


@register("amax", "amin")
def _amax(g, x, dim=(), keepdim=False):
    dt = out_dtype(g)
    if x.dtype is D.bool:
        return reduce(g, x, dim, keepdim, "any" if g.node.target.name == "amax" else "all", dt, D.bool)
    return reduce(g, x, dim, keepdim, "max" if g.node.target.name == "amax" else "min", dt, dt)


@register("argmax", "argmin")
def _argmax(g, x, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            raise Unsupported("argmax keepdim over all dims")
    src = x.dtype if x.dtype is not D.bool else D.uint8
    return reduce(g, x, dim, keepdim, g.node.target.name, out_dtype(g), src)


@register("any.dims", "all.dims", "any.dim", "all.dim", "any", "all")
def _any(g, x, dim=None, keepdim=False):
    rtype = "any" if g.node.target.name.startswith("any") else "all"
    return reduce(g, x, dim, keepdim, rtype, out_dtype(g), D.bool)


# ---- extern kernels: BLAS, convolution, scans, sorting ------------------------------------------
EXTERN_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "convolution", "_convolution_weight_grad",
              "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "sort", "topk", "kthvalue",
              "linear", "dot", "mv")


def _extern(g, *args):
    node = g.node
    target = node.target
    return g.fallback(node, target, _map_nodes_to_ir(node.args, g), _map_nodes_to_ir(node.kwargs, g),
                      kind="extern")


def _map_nodes_to_ir(a, g):
    from .graph import _map_nodes
    return _map_nodes(a, g.env)


for _name in EXTERN_OPS:
    register(_name)(_extern)

from . import lowering_views  # noqa: E402,F401  (registers the view and data-movement rules)
