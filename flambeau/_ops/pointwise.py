"""Pointwise operators: arithmetic, math functions, comparisons, logical and bitwise ops.

Binary ops promote their operands with PyTorch's rules (`_helpers.result_type`), compute in
float32 for half/bfloat16, and broadcast. Derivatives return the gradient for each Tensor
argument; the autograd engine sums it over broadcast dimensions and casts it to the input dtype.
"""
from __future__ import annotations

import numpy as np

import math

import numpy as np

from .. import _dtype as D, _state
from .._tensor import Tensor
from ._registry import defop, export, TensorSpec, Tag, PointwiseSpelling
from ._spelling import infix, call2
from ._helpers import (binary_kernel, binary_meta, unary_kernel, unary_meta, dtype_of, result_type, opmath,
                       round_to, cast, broadcast_shapes, shape_of, pointwise_strides,
                       lay_out_pointwise)
from .._dispatch import type_name, write_into, check_inplace_autograd
from .creation import zeros_like
from . import _batching, _sharding


def _conj(x):
    return x.conj() if hasattr(x, "is_complex") and x.is_complex() else x


@defop("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("+", "np.add"))
def add(xp, self, other, *, alpha=1):
    return _add_kernel(xp, self, other if alpha == 1 else _scaled(other, alpha))


def _sub_check(self, other):
    a, b = dtype_of(self).category == D.BOOL, dtype_of(other).category == D.BOOL
    if a and b:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use "
                           "the `^` or `logical_xor()` operator instead.")
    if a or b:
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
                           "trying to invert a mask, use the `~` or `logical_not()` operator instead.")


def _scaled(x, alpha):
    return x * alpha


_add_kernel = binary_kernel(lambda xp, a, b: xp.add(a, b), name="add", ufunc=np.add)
add.def_meta(binary_meta())


@add.def_derivative
def _(grad, alpha):
    return grad, (grad if alpha == 1 else grad * alpha)


@defop("sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("-", "np.subtract"))
def sub(xp, self, other, *, alpha=1):
    _sub_check(self, other)
    return _sub_kernel(xp, self, other if alpha == 1 else _scaled(other, alpha))


_sub_kernel = binary_kernel(lambda xp, a, b: xp.subtract(a, b), name="sub", ufunc=np.subtract)
sub.def_meta(binary_meta())


@sub.def_derivative
def _(grad, alpha):
    return grad, (-grad if alpha == 1 else grad * -alpha)


@defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("*", "np.multiply"))
def mul(xp, self, other):
    return _mul_kernel(xp, self, other)


_mul_kernel = binary_kernel(lambda xp, a, b: xp.multiply(a, b), name="mul", ufunc=np.multiply)
mul.def_meta(binary_meta())


@mul.def_derivative
def _mul_derivative(grad, self, other, output_mask):
    """Each operand's gradient only when it needs one (PyTorch's mask): `x * mask`, `x * scale` run one
    product in backward, not two."""
    return grad * _conj(other) if output_mask[0] else None, grad * _conj(self) if output_mask[1] else None


@defop("div.Tensor(Tensor self, Tensor other) -> Tensor", method=False, function=False, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("/", "np.true_divide", heavy=True))
def div(xp, self, other):
    return _div_kernel(xp, self, other)


_div_kernel = binary_kernel(lambda xp, a, b: xp.true_divide(a, b), to_float=True, name="div", ufunc=np.true_divide)
div.def_meta(binary_meta(to_float=True))


@div.def_derivative
def _div_derivative(grad, self, other, output_mask):
    """The divisor's gradient (two more products) only when it needs one: a mean's count, a
    normalisation by a constant, do not."""
    g_self = grad / _conj(other)
    return g_self if output_mask[0] else None, -g_self * _conj(self) / _conj(other) if output_mask[1] else None


@defop("neg(Tensor self) -> Tensor", method=True, inplace=True, tags=(Tag.core, Tag.pointwise, Tag.recomputable),
       pointwise=PointwiseSpelling({"float": "-{0}", "int": "-{0}", "narrow": "static_cast<{T}>(-{0})"},
                                   "np.negative({0})", "-{0}", heavy=False))
def neg(xp, self):
    if self.dtype == bool:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you are "
                           "trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return xp.negative(self)


neg.def_meta(unary_meta())


@neg.def_derivative
def _(grad):
    return -grad


@defop("exp(Tensor self) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
       pointwise=PointwiseSpelling(cpp="fl_exp({0})", numpy="np.exp({0})", triton="tl.exp({0})", simd="exp"))
def exp(xp, self):
    return _exp(xp, self)


_exp = unary_kernel(lambda xp, a: xp.exp(a), to_float=True)
exp.def_meta(unary_meta(to_float=True))


@exp.def_derivative
def _(grad, result):
    return grad * _conj(result)


@defop("conj_physical(Tensor self) -> Tensor", method=True, inplace=True, tags=(Tag.core, Tag.extern))
def conj_physical(xp, self):
    return xp.conj(self) if self.dtype.kind == "c" else self.copy(order="K")    # keeps the layout, as torch


conj_physical.def_meta(unary_meta())


@conj_physical.def_derivative
def _(grad):
    return grad.conj_physical()


@export("conj", method=True)
def conj(self):
    """For real tensors `self`; for complex ones a conjugated copy (PyTorch returns a lazy view)."""
    return conj_physical(self) if self.is_complex() else self


@export("resolve_conj", method=True)
def resolve_conj(self):
    return self


@export("is_conj", method=True)
def is_conj(self):
    return False


# ---- binary ops: a factory over promoted operands ------------------------------------------------
def unsupported(name: str, dt) -> NotImplementedError:
    return NotImplementedError(f'"{name}_cpu" not implemented for \'{type_name(dt)}\'')


def _is_arr(x):
    return hasattr(x, "shape")


def _zero_div_check(b):
    if (bool((b == 0).any()) if _is_arr(b) else b == 0):
        raise RuntimeError("ZeroDivisionError")


def _binary_dtype(kind, dt):
    if kind == "bool":
        return D.bool
    if kind == "float" and dt.category < D.FLOATING:
        return _state.default_dtype
    return dt


def binary(schema, fn, deriv=None, *, kind="promote", bad=(), check=None, method=True, inplace=True,
           function=True, namespace=None, tags=(), scalars="both", pointwise=None):
    """Declare a broadcasting binary op computing `fn(xp, a, b, **kw)` in the op-math dtype.

    kind: 'promote' (common dtype), 'float' (bool/integer promote to the default float), 'bool'.
    bad: dtype categories rejected with NotImplementedError; check(dt, a, b): extra validation.
    scalars: which operands may be Python numbers ('both', 'other' or 'none'), as PyTorch's overloads.
    """
    name = schema.split("(")[0].split(".")[0]

    def validate(a, b):
        require_tensors(name, a, b, scalars)
        dt = result_type(a, b)
        if dt.category in bad:
            raise unsupported(name, dt)
        if check is not None:
            check(dt, a, b)
        return dt

    def kernel(xp, self, other, *args, **kw):
        dt = validate(self, other)
        cdt = dt if kind == "bool" else _binary_dtype(kind, dt)
        cd = opmath(cdt)
        a, b = self, other
        if cd != cdt.np:
            a, b = round_to(a, cdt), round_to(b, cdt)
        try:
            r = fn(xp, cast_wrap(xp, a, cd), cast_wrap(xp, b, cd), *args, **kw)
        except ValueError:
            broadcast_shapes(shape_of(self), shape_of(other))
            raise
        return lay_out_pointwise(xp, xp.asarray(r).astype(_binary_dtype(kind, dt).np, copy=False), self, other)

    def meta(self, other, *args, **kw):
        dt = validate(self, other)
        shape = broadcast_shapes(shape_of(self), shape_of(other))
        return TensorSpec(shape, _binary_dtype(kind, dt), pointwise_strides(shape, self, other))

    op = defop(schema, method=method, inplace=inplace, function=function, namespace=namespace,
               tags=tags, pointwise=pointwise)(kernel)
    op.def_meta(meta)
    if deriv is not None:
        op.def_derivative(deriv)
    return op


def require_tensors(name, a, b, scalars):
    """PyTorch has no Scalar overload for some ops: a Python number there is a TypeError."""
    for i, x in enumerate((a, b)):
        if not _is_arr(x) and not isinstance(x, Tensor) and (scalars == "none" or (scalars == "other" and i == 0)):
            raise TypeError(f"{name}(): argument '{'other' if i else 'input'}' (position {i + 1}) must be "
                            f"Tensor, not {type(x).__name__}")


def cast_wrap(xp, x, npdt):
    """`cast`, except that a Python int meeting an integer dtype wraps around like a C cast."""
    if type(x) is int and npdt.kind in "iu" and not (np.iinfo(npdt).min <= x <= np.iinfo(npdt).max):
        return xp.asarray(np.asarray(x, dtype=np.int64).astype(npdt))
    return cast(xp, x, npdt)


def _zeros(g):
    return zeros_like(g)


def _t(x):
    return isinstance(x, Tensor)


def _kind_of(a, b):
    for x in (a, b):
        if _is_arr(x):
            return x.dtype.kind
    return "f" if isinstance(a, float) or isinstance(b, float) else "i"


# ---- division family -----------------------------------------------------------------------------
def _trunc_div(xp, a, b):
    if _kind_of(a, b) in "iu":
        _zero_div_check(b)
        q = xp.floor_divide(a, b)
        return q + ((xp.remainder(a, b) != 0) & ((xp.asarray(a) < 0) != (xp.asarray(b) < 0)))
    return xp.trunc(xp.true_divide(a, b))


def _floor_div(xp, a, b):
    if _kind_of(a, b) in "iu":
        _zero_div_check(b)
    return xp.floor_divide(a, b)


_div_trunc = binary("_div_trunc(Tensor self, Tensor other) -> Tensor", _trunc_div, kind="promote",
                    bad=(D.BOOL, D.COMPLEX), function=False, method=False, inplace=False,
                    pointwise=PointwiseSpelling("fl_truncdiv({0}, {1})", "_truncdiv({0}, {1})",
                                                {"float": "libdevice.trunc({0} / {1})", "int": "{0} // {1}"},
                                                heavy=False))
_div_trunc.__name__ = "div_trunc"
floor_divide = binary("floor_divide(Tensor self, Tensor other) -> Tensor", _floor_div, bad=(D.BOOL, D.COMPLEX),
                      pointwise=PointwiseSpelling(
                          "fl_floordiv({0}, {1})",
                          {"float": "np.floor_divide({0}, {1})", "int": "_floordiv({0}, {1})"},
                          {"float": "fl_floordiv_float({0}, {1})", "int": "fl_floordiv_int({0}, {1})"}, heavy=False))


def _check_mode(rounding_mode):
    if rounding_mode not in (None, "trunc", "floor"):
        raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                           f"'{rounding_mode}'")


@defop("div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor", function=False,
       inplace=True, tags=(Tag.core, Tag.pointwise, Tag.recomputable))
def div_mode(xp, self, other, *, rounding_mode):
    _check_mode(rounding_mode)
    if rounding_mode is None:
        return div.kernel(xp, self, other)
    if rounding_mode == "trunc":
        dt = result_type(self, other)
        if dt in D.LOW_PRECISION:      # the quotient is rounded to the dtype before truncation
            return xp.trunc(div.kernel(xp, self, other).astype(np.float32)).astype(dt.np)
        return _div_trunc.kernel(xp, self, other)
    return floor_divide.kernel(xp, self, other)


@div_mode.def_meta
def _(self, other, *, rounding_mode):
    _check_mode(rounding_mode)
    return (div if rounding_mode is None else floor_divide).meta(self, other)


@div_mode.def_derivative
def _(grad, self, other, rounding_mode):
    if rounding_mode is None:
        return div.derivative(grad, self, other)
    return _zeros(grad), (_zeros(grad) if _t(other) else None)


@export("div", method=True)
def div_(input, other, *, rounding_mode=None, out=None):
    kw = {} if out is None else {"out": out}
    if rounding_mode is None:
        return div(input, other, **kw)
    return div_mode(input, other, rounding_mode=rounding_mode, **kw)


@export("div_", method=True, function=False)
def div_inplace(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div.inplace(self, other)
    return div_mode.inplace(self, other, rounding_mode=rounding_mode)


for _n in ("divide", "true_divide"):
    export(_n, method=True)(div_)
    export(_n + "_", method=True, function=False)(div_inplace)


def _remainder(xp, a, b):
    if _kind_of(a, b) in "iu":
        _zero_div_check(b)
        return xp.remainder(a, b)
    m = xp.fmod(a, b)
    return xp.where((m != 0) & ((xp.asarray(b) < 0) != (m < 0)), m + b, m)


def _fmod(xp, a, b):
    if _kind_of(a, b) in "iu":
        _zero_div_check(b)
    return xp.fmod(a, b)


remainder = binary("remainder.Tensor(Tensor self, Tensor other) -> Tensor", _remainder,
                   lambda grad, self, other: (grad, -grad * div_mode(self, other, rounding_mode="floor")
                                              if _t(other) else None), bad=(D.BOOL, D.COMPLEX),
                   tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                   pointwise=PointwiseSpelling("fl_remainder({0}, {1})", "_remainder({0}, {1})",
                                               {"float": "fl_remainder_float({0}, {1})",
                                                "int": "fl_remainder_int({0}, {1})"}, heavy=False))
fmod = binary("fmod.Tensor(Tensor self, Tensor other) -> Tensor", _fmod,
              lambda grad, self, other: (grad, -grad * div_mode(self, other, rounding_mode="trunc")
                                         if _t(other) else None), bad=(D.BOOL, D.COMPLEX), scalars="other",
              tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling("fl_fmod({0}, {1})", "_fmod({0}, {1})",
                                          {"float": "libdevice.fmod({0}, {1})", "int": "{0} % {1}"}, heavy=False))


@defop("rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
def rsub(xp, self, other, *, alpha=1):
    require_tensors("rsub", self, other, "other")
    _sub_check(self, other)
    return _sub_kernel(xp, other, self if alpha == 1 else _scaled(self, alpha))


@rsub.def_meta
def _(self, other, *, alpha=1):
    _sub_check(self, other)
    return binary_meta()(other, self)          # other - self: the layout follows `other`, as the kernel


@rsub.def_derivative
def _(grad, alpha):
    return -grad * alpha, grad


export("subtract", method=True)(sub)
export("subtract_", method=True, function=False)(sub.inplace)
export("multiply", method=True)(mul)
export("multiply_", method=True, function=False)(mul.inplace)


# ---- powers --------------------------------------------------------------------------------------
def _pow_check(dt, a, b):
    if dt.category == D.INTEGER and type(b) is int and b < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")


POWERS_BY_PRODUCTS = (2, 3, -1, -2)       # Python-number exponents ATen's CPU and CUDA kernels multiply out


def _pow_by_products(a, b):
    """`a ** b` for b in POWERS_BY_PRODUCTS as ATen computes it: a * a, a * a * a, 1 / a, 1 / (a * a),
    each product rounded (so x ** 3 is not the correctly rounded cube, as in PyTorch)."""
    if b == -1:
        return 1 / a
    square = a * a
    return square if b == 2 else square * a if b == 3 else 1 / square


def _pow(xp, a, b):
    if type(b) is float and b in (0.5, -0.5) and _kind_of(a, b) not in "iu":
        r = xp.sqrt(a)                      # as PyTorch: sqrt(-0.0) is -0.0, sqrt(-inf) NaN (C's pow: +0.0, +inf)
        return r if b > 0 else 1 / r
    if _kind_of(a, b) == "f" and type(b) in (int, float) and b in POWERS_BY_PRODUCTS:
        return _pow_by_products(a, b)
    if _kind_of(a, b) not in "iu":
        return xp.power(a, b)
    a, b = xp.asarray(a), xp.asarray(b)
    neg = b < 0
    r = xp.power(a, xp.where(neg, 0, b).astype(b.dtype))
    if not bool(neg.any()):
        return r
    odd = (b % 2) != 0
    at_neg = xp.where(a == 1, 1, xp.where(a == -1, xp.where(odd, -1, 1), 0))
    return xp.where(neg, at_neg, r)


def _pow_grads(grad, self, exponent, result):
    gs = ge = None
    if _t(self):
        if _t(exponent):
            gs = (grad * _conj(exponent * self ** (exponent - 1))).where(exponent != 0, 0)
        else:
            gs = _zeros(grad) if exponent == 0 else grad * _conj(exponent * self ** (exponent - 1))
    if _t(exponent) and result is not None:
        if _t(self):
            lg = (result * self.log()).where(~((self == 0) & (exponent >= 0)), 0)
        else:
            lg = result * math.log(self) if self != 0 else result * 0
        ge = grad * _conj(lg)
    return gs, ge


pow = binary("pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor", _pow, _pow_grads, bad=(D.BOOL,),
             check=_pow_check, tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
             pointwise=PointwiseSpelling({"float": "pow{f}({0}, {1})", "int": "fl_ipow({0}, {1})"},
                                         {"float": "np.power({0}, {1})", "int": "_ipow({0}, {1})"},
                                         {"float": "libdevice.pow({0}, {1})", "int": "fl_ipow({0}, {1})"},
                                         simd="pow"))
pow.def_derivative(_pow_grads, result_needed_for=("exponent",))


def _float_power(xp, a, b):
    cplx = any(_is_arr(x) and x.dtype.kind == "c" or type(x) is complex for x in (a, b))
    dt = np.complex128 if cplx else np.float64
    return xp.power(cast(xp, a, np.dtype(dt)), cast(xp, b, np.dtype(dt)))


@defop("float_power.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor", method=True)
def float_power(xp, self, exponent):
    return xp.asarray(_float_power(xp, self, exponent))


@float_power.def_meta
def _(self, exponent):
    cplx = result_type(self, exponent).category == D.COMPLEX
    return TensorSpec(broadcast_shapes(shape_of(self), shape_of(exponent)), D.complex128 if cplx else D.float64)


float_power.def_derivative(_pow_grads, result_needed_for=("exponent",))


@export("float_power_", method=True, function=False)
def float_power_(self, exponent):
    want = float_power.meta(self, exponent).dtype
    if self.dtype is not want:
        raise RuntimeError(f"the base given to float_power_ has dtype {_type_name(self.dtype)} but the "
                           f"operation's result requires dtype {_type_name(want)}")
    return _write(self, float_power(self, exponent), "float_power_")


def _write(self, res, name):
    """In-place result for composite in-place ops (no autograd: these ops are not differentiable in place)."""
    check_inplace_autograd(self)
    write_into(self, res, name)
    return self


def _type_name(dt):
    return type_name(dt)


# ---- other float binaries ------------------------------------------------------------------------
def _hyp_grad(grad, self, other, result):
    return grad * self / result, (grad * other / result if _t(other) else None)


def _atan2_grad(grad, self, other):
    d = self * self + other * other
    return grad * other / d, (grad * -self / d if _t(other) else None)


atan2 = binary("atan2(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.arctan2(a, b),
               _atan2_grad, kind="float", bad=(D.COMPLEX,), scalars="none",
               tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_promote),
               pointwise=PointwiseSpelling(cpp="atan2{f}({0}, {1})", numpy="np.arctan2({0}, {1})",
                                           triton="libdevice.atan2({0}, {1})", simd="atan2"))
export("arctan2", method=True)(atan2)
export("arctan2_", method=True, function=False)(atan2.inplace)
hypot = binary("hypot(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.hypot(a, b), _hyp_grad,
               bad=(D.BOOL, D.INTEGER, D.COMPLEX), scalars="none", tags=(Tag.core, Tag.pointwise, Tag.recomputable),
               pointwise=PointwiseSpelling(cpp="hypot{f}({0}, {1})", numpy="np.hypot({0}, {1})",
                                           triton="libdevice.hypot({0}, {1})"))


def _minmax_grads(pick):
    def grads(grad, self, other):
        eq = self == other
        half = grad.where(~eq, grad / 2)
        gs = half.where(~(pick(other, self)), 0)
        go = half.where(~(pick(self, other)), 0) if _t(other) else None
        return gs, go
    return grads


def _complex_minmax(name):
    def check(dt, a, b):
        if dt.category == D.COMPLEX:
            raise RuntimeError(f"{name} not implemented for complex tensors.")
    return check


maximum = binary("maximum(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.maximum(a, b),
                 _minmax_grads(lambda x, y: x > y), check=_complex_minmax("maximum"), inplace=False, scalars="none",
                 tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=call2("fl_max", "np.maximum", "fl_max"))
minimum = binary("minimum(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.minimum(a, b),
                 _minmax_grads(lambda x, y: x < y), check=_complex_minmax("minimum"), inplace=False, scalars="none",
                 tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=call2("fl_min", "np.minimum", "fl_min"))


def _fminmax_grads(cmp):
    def grads(grad, self, other):
        keep_self = cmp(self, other) | other.isnan()
        return grad.where(keep_self, 0), grad.where(~(keep_self), 0)
    return grads


def _fmax(xp, a, b):
    """`other` where it is larger or `self` is NaN, else `self`: a tie of zeros keeps `self`, as PyTorch's
    fmax (NumPy's picks either)."""
    return xp.where((b > a) | (a != a), b, a)


def _fmin(xp, a, b):
    return xp.where((b < a) | (a != a), b, a)


fmax = binary("fmax(Tensor self, Tensor other) -> Tensor", _fmax,
              _fminmax_grads(lambda x, y: x >= y), check=_complex_minmax("fmax"), inplace=False, scalars="none")
fmin = binary("fmin(Tensor self, Tensor other) -> Tensor", _fmin,
              _fminmax_grads(lambda x, y: x <= y), check=_complex_minmax("fmin"), inplace=False, scalars="none")


def _copysign_grad(grad, self, other, result):
    ratio = (result / self.where(self != 0, 1)).where(self != 0, 0)
    return grad * ratio, (_zeros(grad) if _t(other) else None)


copysign = binary("copysign.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.copysign(a, b),
                  _copysign_grad, kind="float", bad=(D.COMPLEX,), scalars="other")


def _xlogy(xp, a, b):
    return xp.where((xp.asarray(a) == 0) & ~xp.isnan(b), 0, a * xp.log(b))


def _xlogy_grad(grad, self, other):
    gs = go = None
    if _t(self):
        gs = xlogy(grad, other).where(~((self == 0) & (other <= 0)), 0)
    if _t(other):
        go = grad * self / other
    return gs, go


xlogy = binary("xlogy.Tensor(Tensor self, Tensor other) -> Tensor", _xlogy, _xlogy_grad, kind="float",
               bad=(D.COMPLEX,), namespace="special")


def _ldexp_grad(grad, self, other, result):
    return grad * pow(2.0, other), (grad * result * math.log(2.0) if _t(other) else None)


ldexp = binary("ldexp.Tensor(Tensor self, Tensor other) -> Tensor",
               lambda xp, a, b: a * xp.power(2.0, b).astype(xp.result_type(a, 2.0)), _ldexp_grad,
               kind="float", scalars="none",
               tags=(Tag.autocast_fp32,))   # PyTorch's self * pow(2, other): pow is float32 under cuda autocast


def _logaddexp(xp, a, b):
    if _kind_of(a, b) == "c":
        return xp.log(xp.exp(a) + xp.exp(b))
    return xp.logaddexp(a, b)


logaddexp = binary("logaddexp(Tensor self, Tensor other) -> Tensor", _logaddexp,
                   lambda grad, self, other: (grad / (1 + (other - self).exp()),
                                              grad / (1 + (self - other).exp())),
                   bad=(D.BOOL, D.INTEGER), inplace=False, scalars="none")
logaddexp2 = binary("logaddexp2(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.logaddexp2(a, b),
                    lambda grad, self, other: (grad / (1 + pow(2.0, other - self)),
                                               grad / (1 + pow(2.0, self - other))),
                    bad=(D.BOOL, D.INTEGER, D.COMPLEX), inplace=False, scalars="none")


@defop("nextafter(Tensor self, Tensor other) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable),
       pointwise=PointwiseSpelling(cpp="nextafter{f}({0}, {1})", numpy="np.nextafter({0}, {1})",
                                   triton="libdevice.nextafter({0}, {1})", heavy=False))
def nextafter(xp, self, other):
    require_tensors("nextafter", self, other, "none")
    dt = result_type(self, other)
    if dt.category != D.FLOATING:
        raise unsupported("nextafter", dt)
    a, b = xp.broadcast_arrays(xp.asarray(round_to(self, dt)), xp.asarray(round_to(other, dt)))
    if dt.np.itemsize >= 4 or dt is D.float16:
        return xp.asarray(xp.nextafter(a, b))
    bits = a.view(np.uint16).astype(np.int32)          # bfloat16: step the bit pattern
    up = (b > a) == (a > 0)
    stepped = xp.where(a == 0, xp.where(b > 0, 1, 0x8001), xp.where(up, bits + 1, bits - 1))
    r = stepped.astype(np.uint16).view(dt.np)
    return xp.where(xp.isnan(a) | xp.isnan(b), a + b, xp.where(a == b, b, r))


nextafter.def_meta(lambda self, other: TensorSpec(broadcast_shapes(shape_of(self), shape_of(other)),
                                                  result_type(self, other)))
nextafter.def_derivative(lambda grad, other: (grad, _zeros(grad) if _t(other) else None))


# ---- comparisons and logical ops -----------------------------------------------------------------
def _ordered(name):
    def check(dt, a, b):
        if dt.category == D.COMPLEX:
            raise unsupported(name, dt)
    return check


_COMPARE_TAGS = (Tag.core, Tag.pointwise, Tag.recomputable)
_EQUALITY_TAGS = _COMPARE_TAGS + (Tag.exact_compare,)
eq = binary("eq.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.equal(a, b), kind="bool", scalars="other",
            tags=_EQUALITY_TAGS, pointwise=infix("==", "np.equal", result="bool"))
ne = binary("ne.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.not_equal(a, b), kind="bool", scalars="other",
            tags=_EQUALITY_TAGS, pointwise=infix("!=", "np.not_equal", result="bool"))
lt = binary("lt.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.less(a, b), kind="bool",
            check=_ordered("lt"), scalars="other", tags=_COMPARE_TAGS, pointwise=infix("<", "np.less", result="bool"))
le = binary("le.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.less_equal(a, b),
            kind="bool", check=_ordered("le"), scalars="other", tags=_COMPARE_TAGS,
            pointwise=infix("<=", "np.less_equal", result="bool"))
gt = binary("gt.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.greater(a, b),
            kind="bool", check=_ordered("gt"), scalars="other", tags=_COMPARE_TAGS,
            pointwise=infix(">", "np.greater", result="bool"))
ge = binary("ge.Tensor(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.greater_equal(a, b),
            kind="bool", check=_ordered("ge"), scalars="other", tags=_COMPARE_TAGS,
            pointwise=infix(">=", "np.greater_equal", result="bool"))
for _n, _op in [("greater", gt), ("greater_equal", ge), ("less", lt), ("less_equal", le), ("not_equal", ne)]:
    export(_n, method=True)(_op)
    export(_n + "_", method=True, function=False)(_op.inplace)
logical_and = binary("logical_and(Tensor self, Tensor other) -> Tensor",
                     lambda xp, a, b: xp.logical_and(a, b), kind="bool", scalars="none",
                     tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                     pointwise=PointwiseSpelling("{0} && {1}", "np.logical_and({0}, {1})", "({0} != 0) & ({1} != 0)",
                                                 heavy=False, result="bool"))
logical_or = binary("logical_or(Tensor self, Tensor other) -> Tensor",
                    lambda xp, a, b: xp.logical_or(a, b), kind="bool", scalars="none",
                    tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                    pointwise=PointwiseSpelling("{0} || {1}", "np.logical_or({0}, {1})", "({0} != 0) | ({1} != 0)",
                                                heavy=False, result="bool"))
logical_xor = binary("logical_xor(Tensor self, Tensor other) -> Tensor",
                     lambda xp, a, b: xp.logical_xor(a, b), kind="bool", scalars="none")


def _same_dtype(what):
    def check(dt, a, b):
        if _is_arr(a) and _is_arr(b) and a.dtype != b.dtype:
            raise RuntimeError(what(D.FROM_NP[a.dtype], D.FROM_NP[b.dtype]))
    return check


@defop("isclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> Tensor",
       method=True)
def isclose(xp, self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    _isclose_check(self, other, rtol, atol)
    cd = np.complex128 if self.dtype.kind == "c" else np.float64
    a, b = self.astype(cd), xp.asarray(other).astype(cd)
    close = (a == b) | (xp.isfinite(a) & xp.isfinite(b) & (xp.abs(a - b) <= atol + rtol * xp.abs(b)))
    if equal_nan:
        close = close | (xp.isnan(a) & xp.isnan(b))
    return xp.asarray(close)


def _isclose_check(self, other, rtol, atol):
    require_tensors("isclose", self, other, "none")
    if self.dtype != other.dtype:
        raise RuntimeError(f"{_type_name(D.FROM_NP[self.dtype])} did not match {_type_name(D.FROM_NP[other.dtype])}")
    if rtol < 0 or atol < 0:
        raise RuntimeError(f"{'rtol' if rtol < 0 else 'atol'} must be greater than or equal to zero, but got "
                           f"{rtol if rtol < 0 else atol}")


@isclose.def_meta
def _(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    require_tensors("isclose", self, other, "none")
    if self.dtype is not other.dtype:
        raise RuntimeError(f"{_type_name(self.dtype)} did not match {_type_name(other.dtype)}")
    return TensorSpec(broadcast_shapes(self.shape, other.shape), D.bool)


@export("allclose", method=True)
def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return int(isclose(input, other, rtol, atol, equal_nan).logical_not().sum()) == 0


@export("equal", method=True)
def equal(input, other) -> bool:
    if tuple(input.shape) != tuple(other.shape):
        return False
    return int(ne(input, other).sum()) == 0


# ---- bitwise and integer ops ---------------------------------------------------------------------
bitwise_and = binary("bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor",
                     lambda xp, a, b: xp.bitwise_and(a, b), bad=(D.FLOATING, D.COMPLEX),
                     tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("&", "np.bitwise_and"))
bitwise_or = binary("bitwise_or.Tensor(Tensor self, Tensor other) -> Tensor",
                    lambda xp, a, b: xp.bitwise_or(a, b), bad=(D.FLOATING, D.COMPLEX),
                    tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("|", "np.bitwise_or"))
bitwise_xor = binary("bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor",
                     lambda xp, a, b: xp.bitwise_xor(a, b), bad=(D.FLOATING, D.COMPLEX),
                     tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=infix("^", "np.bitwise_xor"))


def _shift(left):
    def f(xp, a, b):
        a, b = xp.asarray(a), xp.asarray(b)
        dt = a.dtype if a.ndim or not b.ndim else b.dtype
        a, b = a.astype(dt), b.astype(dt)
        nbits = dt.itemsize * 8
        out_of_range = (b < 0) | (b >= nbits)
        s = xp.where(out_of_range, 0, b).astype(dt)
        if left:
            return xp.where(out_of_range, 0, xp.left_shift(a, s)).astype(dt)
        fill = xp.where(a < 0, -1, 0).astype(dt) if dt.kind == "i" else xp.zeros_like(a)
        return xp.where(out_of_range, fill, xp.right_shift(a, s)).astype(dt)
    return f


bitwise_left_shift = binary("bitwise_left_shift.Tensor(Tensor self, Tensor other) -> Tensor", _shift(True),
                            bad=(D.BOOL, D.FLOATING, D.COMPLEX), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                            pointwise=call2("fl_shl", "_shl", "fl_shl"))
bitwise_right_shift = binary("bitwise_right_shift.Tensor(Tensor self, Tensor other) -> Tensor",
                             _shift(False), bad=(D.BOOL, D.FLOATING, D.COMPLEX),
                             tags=(Tag.core, Tag.pointwise, Tag.recomputable), pointwise=call2("fl_shr", "_shr", "fl_shr"))
gcd = binary("gcd(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.gcd(a, b), bad=(D.BOOL, D.FLOATING, D.COMPLEX), scalars="none",
             tags=(Tag.core, Tag.extern),
             pointwise=PointwiseSpelling("static_cast<{T}>(std::gcd({0}, {1}))", "np.gcd({0}, {1})", "fl_gcd({0}, {1})",
                                         heavy=False))
lcm = binary("lcm(Tensor self, Tensor other) -> Tensor", lambda xp, a, b: xp.lcm(a, b), bad=(D.BOOL, D.FLOATING, D.COMPLEX), scalars="none",
             tags=(Tag.core, Tag.extern), pointwise=call2("fl_lcm", "np.lcm", "fl_lcm"))


def _heaviside(xp, a, b):
    a = xp.asarray(a)
    return xp.where(a == 0, b, a > 0)


heaviside = binary("heaviside(Tensor self, Tensor values) -> Tensor", _heaviside, bad=(D.COMPLEX,),
                   check=_same_dtype(lambda x, y: "heaviside is not yet implemented for tensors with "
                                     "different dtypes."), scalars="none")


# ---- vmap: elementwise ops outside the pointwise tag batch as the tagged ones ----------------------
for _op in (conj_physical, _div_trunc, floor_divide, rsub, float_power, fmax, fmin, copysign, xlogy, ldexp,
            logaddexp, logaddexp2, logical_xor, isclose, gcd, lcm, heaviside):
    _op.def_batching_rule(_batching.pointwise_rule(_op))


# ---- DTensor sharding rules (the other pointwise ops share _sharding.pointwise_rule by their tag) --------
add.def_sharding_rule(_sharding.linear_pointwise_rule("sum_all"))
sub.def_sharding_rule(_sharding.linear_pointwise_rule("sum_all"))
mul.def_sharding_rule(_sharding.linear_pointwise_rule("one_factor"))
div.def_sharding_rule(_sharding.linear_pointwise_rule("numerator"))
neg.def_sharding_rule(_sharding.linear_pointwise_rule("unary"))
