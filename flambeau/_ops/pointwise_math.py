"""Unary pointwise math: abs/sign, roots, logs and exponentials, trigonometric and hyperbolic
functions, sigmoid/logit, erf family, gamma family, rounding, classification (isnan, ...),
real/imag/angle, bitwise/logical not, plus their aliases (fix, arcsin, ...).

`unary` declares an op from a NumPy-style function and a derivative. Its `kind` states the result
dtype as PyTorch does: 'float' promotes bool/integer inputs to the default float, 'same' keeps
the input dtype, 'bool' returns bool. Half and bfloat16 compute in float32. Special functions
come from scipy.special on NumPy and cupyx.scipy.special on CuPy.
"""
from __future__ import annotations

import builtins
import math

import numpy as np
import ml_dtypes

from .. import _dtype as D, _state
from .._tensor import Tensor
from .._backends import is_cupy
from ._registry import defop, export, TensorSpec, METHODS, EXPORTS, SPECIAL, Tag, PointwiseSpelling
from ._helpers import (opmath, pointwise_strides, result_type, broadcast_shapes, shape_of, round_to,
                       lay_out_pointwise)
from .pointwise import _conj, _write, cast_wrap, require_tensors, pow as pointwise_pow
from .._dispatch import type_name
from .creation import zeros_like
from . import _batching


def unsupported(name: str, dt) -> NotImplementedError:
    return NotImplementedError(f'"{name}_cpu" not implemented for \'{type_name(dt)}\'')


def special_ns(xp):
    """scipy.special for NumPy arrays, cupyx.scipy.special for CuPy arrays."""
    if not is_cupy(xp):
        import scipy.special as sp  # deferred: scipy.special is slow to import
    else:
        import cupyx.scipy.special as sp  # deferred: optional dependency, present only where cuda is used
    return sp


def result_dtype(kind: str, dt, real_out=False):
    if kind == "bool":
        return D.bool
    if kind == "float" and dt.category < D.FLOATING:
        dt = _state.default_dtype
    return dt.to_real() if real_out else dt


def _zeros(grad):
    return zeros_like(grad)


def unary(name, fn, deriv=None, *, kind="float", bad=(), bad_exc=None, real_out=False, method=True,
          inplace=True, namespace=None, schema=None, function=True, tags=(), pointwise=None):
    """Declare `name(Tensor self) -> Tensor` computing `fn(xp, a)` (a in the compute dtype)."""
    def check(dt):
        if dt.category in bad:
            if bad_exc is not None:
                raise bad_exc(dt)
            raise unsupported(name, dt)

    def kernel(xp, self, *args, **kwargs):
        dt = D.FROM_NP[self.dtype]
        check(dt)
        src = result_dtype("float", dt) if kind == "float" else dt
        cd = opmath(src)
        r = fn(xp, self.astype(cd) if self.dtype != cd else self, *args, **kwargs)
        return xp.asarray(r).astype(result_dtype(kind, dt, real_out).np, copy=False)

    def meta(self, *args, **kwargs):
        check(self.dtype)
        return TensorSpec(self.shape, result_dtype(kind, self.dtype, real_out), pointwise_strides(self.shape, self))

    op = defop(schema or f"{name}(Tensor self) -> Tensor", method=method, inplace=inplace,
               namespace=namespace, function=function, tags=tags, pointwise=pointwise)(kernel)
    op.def_meta(meta)
    if deriv is not None:
        op.def_derivative(deriv)
    return op


def _sp(fname):
    return lambda xp, a: getattr(special_ns(xp), fname)(a)


def _int_identity(f):
    """Rounding functions: integer inputs are returned unchanged (as a copy)."""
    return lambda xp, a: a.copy() if a.dtype.kind in "iub" else f(xp, a)


_LN2, _LN10 = math.log(2.0), math.log(10.0)
_c = _conj

abs = unary("abs", lambda xp, a: xp.abs(a), lambda grad, self: grad * self.sgn(), kind="same",
            bad=(D.BOOL,), real_out=True, tags=(Tag.core, Tag.pointwise, Tag.recomputable),
            pointwise=PointwiseSpelling({"float": "fabs{f}({0})", "int": "static_cast<{T}>({0} < 0 ? -{0} : {0})"},
                                        "np.abs({0})", "tl.abs({0})", heavy=False))


@export("abs_", method=True, function=False)
def abs_(self):
    if self.is_complex():
        raise RuntimeError("In-place abs is not supported for complex tensors.")
    return abs.inplace(self)


_SIGN = "({0} > 0) - ({0} < 0)"          # a NaN's sign is 0, as PyTorch's (NumPy's is NaN)


def _sign(xp, a):
    """(a > 0) - (a < 0), as PyTorch: a NaN's sign is 0 (NumPy's is NaN)."""
    if a.dtype == bool:
        return a.copy()
    return xp.where(a != a, 0, xp.sign(a)).astype(a.dtype) if a.dtype.kind == "f" else xp.sign(a)


sign = unary("sign", _sign,
             lambda grad: _zeros(grad), kind="same", bad=(D.COMPLEX,), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(
                 {"float": "static_cast<{T}>(%s)" % _SIGN, "int": "static_cast<{T}>(%s)" % _SIGN, "bool": "{0}"},
                 {"float": "np.sign(np.nan_to_num({0}, nan=0.0))", "int": "np.sign({0})",
                  "bool": "{0}"},
                 {"float": "({0} > 0).to({T}) - ({0} < 0).to({T})",
                  "int": "({0} > 0).to({T}) - ({0} < 0).to({T})", "bool": "{0}"}, heavy=False))


def _sgn(xp, a):
    if a.dtype.kind != "c":
        return _sign(xp, a)             # a real NaN's sgn is 0, as its sign (PyTorch's)
    m = xp.abs(a)
    return xp.where(m == 0, 0, a / xp.where(m == 0, 1, m)).astype(a.dtype)


def _sgn_grad(grad, self, result):
    if not self.is_complex():
        return _zeros(grad)
    m = self.abs()
    g = (grad - (grad * result.conj()).real * result) / m.where(m != 0, 1)
    return g.where(m != 0, 0)


sgn = unary("sgn", _sgn, _sgn_grad, kind="same")
sqrt = unary("sqrt", lambda xp, a: xp.sqrt(a), lambda grad, result: grad / (2 * _c(result)),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(cpp="sqrt{f}({0})", numpy="np.sqrt({0})", triton="libdevice.sqrt({0})"))
rsqrt = unary("rsqrt", lambda xp, a: 1 / xp.sqrt(a), lambda grad, result: -0.5 * grad * _c(result) ** 3,
              tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
              pointwise=PointwiseSpelling(cpp="{one} / sqrt{f}({0})", numpy="np.reciprocal(np.sqrt({0}))",
                                          triton="1.0 / libdevice.sqrt({0})"))
log = unary("log", lambda xp, a: xp.log(a), lambda grad, self: grad / _c(self),
            tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
            pointwise=PointwiseSpelling(cpp="log{f}({0})", numpy="np.log({0})", triton="tl.log({0})", simd="log"))
log2 = unary("log2", lambda xp, a: xp.log2(a), lambda grad, self: grad / (_c(self) * _LN2), tags=(Tag.autocast_fp32,))
log10 = unary("log10", lambda xp, a: xp.log10(a), lambda grad, self: grad / (_c(self) * _LN10),
              tags=(Tag.autocast_fp32,))
log1p = unary("log1p", lambda xp, a: xp.log1p(a), lambda grad, self: grad / (_c(self) + 1),
              namespace="special", tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
              pointwise=PointwiseSpelling(cpp="log1p{f}({0})", numpy="np.log1p({0})",
                                          triton="libdevice.log1p({0})", simd="log1p"))
expm1 = unary("expm1", lambda xp, a: xp.expm1(a), lambda grad, result: grad * (_c(result) + 1),
              namespace="special", tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
              pointwise=PointwiseSpelling(cpp="expm1{f}({0})", numpy="np.expm1({0})",
                                          triton="libdevice.expm1({0})", simd="expm1"))
exp2 = unary("exp2", lambda xp, a: xp.exp2(a) if a.dtype.kind != "c" else xp.exp(a * _LN2),
             lambda grad, result: grad * _c(result) * _LN2, namespace="special")
sin = unary("sin", lambda xp, a: xp.sin(a), lambda grad, self: grad * _c(self.cos()),
            tags=(Tag.core, Tag.pointwise, Tag.recomputable),
            pointwise=PointwiseSpelling(cpp="sin{f}({0})", numpy="np.sin({0})", triton="tl.sin({0})", simd="sin"))
cos = unary("cos", lambda xp, a: xp.cos(a), lambda grad, self: -grad * _c(self.sin()),
            tags=(Tag.core, Tag.pointwise, Tag.recomputable),
            pointwise=PointwiseSpelling(cpp="cos{f}({0})", numpy="np.cos({0})", triton="tl.cos({0})", simd="cos"))
tan = unary("tan", lambda xp, a: xp.tan(a), lambda grad, result: grad * _c(1 + result * result),
            tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
            pointwise=PointwiseSpelling(cpp="tan{f}({0})", numpy="np.tan({0})",
                                        triton="libdevice.tan({0})", simd="tan"))
asin = unary("asin", lambda xp, a: xp.arcsin(a), lambda grad, self: grad / _c((1 - self * self).sqrt()),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
             pointwise=PointwiseSpelling(cpp="asin{f}({0})", numpy="np.arcsin({0})",
                                         triton="libdevice.asin({0})", simd="asin"))
acos = unary("acos", lambda xp, a: xp.arccos(a), lambda grad, self: -grad / _c((1 - self * self).sqrt()),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
             pointwise=PointwiseSpelling(cpp="acos{f}({0})", numpy="np.arccos({0})",
                                         triton="libdevice.acos({0})", simd="acos"))
atan = unary("atan", lambda xp, a: xp.arctan(a), lambda grad, self: grad / _c(1 + self * self),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(cpp="atan{f}({0})", numpy="np.arctan({0})",
                                         triton="libdevice.atan({0})", simd="atan"))
sinh = unary("sinh", lambda xp, a: xp.sinh(a), lambda grad, self: grad * _c(self.cosh()),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
             pointwise=PointwiseSpelling(cpp="sinh{f}({0})", numpy="np.sinh({0})",
                                         triton="libdevice.sinh({0})", simd="sinh"))
cosh = unary("cosh", lambda xp, a: xp.cosh(a), lambda grad, self: grad * _c(self.sinh()),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable, Tag.autocast_fp32),
             pointwise=PointwiseSpelling(cpp="cosh{f}({0})", numpy="np.cosh({0})",
                                         triton="libdevice.cosh({0})", simd="cosh"))
tanh = unary("tanh", lambda xp, a: xp.tanh(a), lambda grad, result: grad * _c(1 - result * result),
             tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(cpp="tanh{f}({0})", numpy="np.tanh({0})",
                                         triton="libdevice.tanh({0})", simd="tanh"))
asinh = unary("asinh", lambda xp, a: xp.arcsinh(a), lambda grad, self: grad / _c((self * self + 1).sqrt()),
              tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling(cpp="asinh{f}({0})", numpy="np.arcsinh({0})",
                                          triton="libdevice.asinh({0})", simd="asinh"))


def _acosh_grad(grad, self):
    """1 / sqrt(x*x - 1), PyTorch's real formula: finite where x < -1 (acosh itself NaN there);
    sqrt(x - 1) * sqrt(x + 1) only for complex x, where sqrt(x*x - 1) takes the wrong branch."""
    if self.is_complex():
        return grad / _c((self - 1).sqrt() * (self + 1).sqrt())
    return grad * (self * self - 1).rsqrt()


acosh = unary("acosh", lambda xp, a: xp.arccosh(a), _acosh_grad,
              tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling(cpp="acosh{f}({0})", numpy="np.arccosh({0})",
                                          triton="libdevice.acosh({0})", simd="acosh"))
atanh = unary("atanh", lambda xp, a: xp.arctanh(a), lambda grad, self: grad / _c(1 - self * self),
              tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling(cpp="atanh{f}({0})", numpy="np.arctanh({0})",
                                          triton="libdevice.atanh({0})", simd="atanh"))
sigmoid = unary("sigmoid", lambda xp, a: 1 / (1 + xp.exp(-a)),
                lambda grad, result: grad * _c(result * (1 - result)), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                pointwise=PointwiseSpelling(cpp="{one} / ({one} + fl_exp(-{0}))", numpy="np.reciprocal(1 + np.exp(np.negative({0})))",
                                            triton="1.0 / (1.0 + tl.exp(-{0}))"))
erf = unary("erf", _sp("erf"), lambda grad, self: grad * (2 / math.sqrt(math.pi)) * (-self * self).exp(),
            bad=(D.COMPLEX,), namespace="special", tags=(Tag.core, Tag.pointwise, Tag.recomputable),
            pointwise=PointwiseSpelling(cpp="erf{f}({0})", numpy="_sp.erf({0})",
                                        triton="libdevice.erf({0})", simd="erf"))
erfc = unary("erfc", _sp("erfc"), lambda grad, self: grad * (-2 / math.sqrt(math.pi)) * (-self * self).exp(),
             bad=(D.COMPLEX,), namespace="special", tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(cpp="erfc{f}({0})", numpy="_sp.erfc({0})",
                                         triton="libdevice.erfc({0})", simd="erfc"))
erfinv = unary("erfinv", _sp("erfinv"),
               lambda grad, result: grad * (math.sqrt(math.pi) / 2) * (result * result).exp(),
               bad=(D.COMPLEX,), namespace="special", tags=(Tag.core, Tag.extern, Tag.autocast_fp32))
lgamma = unary("lgamma", _sp("gammaln"), lambda grad, self: grad * self.digamma(), bad=(D.COMPLEX,),
               tags=(Tag.core, Tag.pointwise, Tag.recomputable),
               pointwise=PointwiseSpelling(cpp="lgamma{f}({0})", numpy="_sp.gammaln({0})",
                                           triton="libdevice.lgamma({0})"))
digamma = unary("digamma", _sp("psi"), lambda grad, self: grad * polygamma(1, self), bad=(D.COMPLEX,),
                namespace="special", tags=(Tag.core, Tag.extern))
i0 = unary("i0", _sp("i0"), lambda grad, self: grad * special_i1(self), bad=(D.COMPLEX,), namespace="special",
           tags=(Tag.core, Tag.extern))
special_i1 = unary("special_i1", _sp("i1"), lambda grad, self, result: grad * (
    self.i0() - result / self.where(self != 0, 1)).where(self != 0, 0.5),
    bad=(D.COMPLEX,), method=False, inplace=False, function=False, tags=(Tag.core, Tag.extern))
SPECIAL["i1"] = special_i1


def _sinc(xp, a):
    return xp.sinc(a)


def _sinc_grad(grad, self):
    px = self * math.pi
    safe = px.where(self != 0, 1)
    d = (px.cos() * px - px.sin()) / (safe * self.where(self != 0, 1))
    return grad * _c(d.where(self != 0, 0))


sinc = unary("sinc", _sinc, _sinc_grad, namespace="special")
_rad_exc = (lambda dt: RuntimeError("deg2rad is not supported for complex tensors."))
deg2rad = unary("deg2rad", lambda xp, a: a * (math.pi / 180), lambda grad: grad * (math.pi / 180),
                bad=(D.COMPLEX,), bad_exc=_rad_exc)
rad2deg = unary("rad2deg", lambda xp, a: a * (180 / math.pi), lambda grad: grad * (180 / math.pi),
                bad=(D.COMPLEX,), bad_exc=lambda dt: RuntimeError("rad2deg is not supported for complex tensors."))
floor = unary("floor", _int_identity(lambda xp, a: xp.floor(a)), lambda grad: _zeros(grad),
              kind="same", bad=(D.BOOL, D.COMPLEX), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling(cpp="floor{f}({0})", numpy="np.floor({0})",
                                          triton="libdevice.floor({0})", heavy=False))
ceil = unary("ceil", _int_identity(lambda xp, a: xp.ceil(a)), lambda grad: _zeros(grad),
             kind="same", bad=(D.BOOL, D.COMPLEX), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
             pointwise=PointwiseSpelling(cpp="ceil{f}({0})", numpy="np.ceil({0})",
                                         triton="libdevice.ceil({0})", heavy=False))
trunc = unary("trunc", _int_identity(lambda xp, a: xp.trunc(a)), lambda grad: _zeros(grad),
              kind="same", bad=(D.BOOL, D.COMPLEX), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
              pointwise=PointwiseSpelling(cpp="trunc{f}({0})", numpy="np.trunc({0})",
                                          triton="libdevice.trunc({0})", heavy=False))
frac = unary("frac", lambda xp, a: a - xp.trunc(a), lambda grad: grad, kind="same", bad=(D.BOOL, D.INTEGER, D.COMPLEX))
reciprocal = unary("reciprocal", lambda xp, a: 1 / a, lambda grad, result: -grad * _c(result * result),
                   tags=(Tag.recomputable, Tag.autocast_fp32),
                   pointwise=PointwiseSpelling(cpp="{one} / {0}", numpy="np.reciprocal({0})",
                                               triton="1.0 / {0}", heavy=False))
_round = unary("round", _int_identity(lambda xp, a: xp.round(a)), lambda grad: _zeros(grad),
               kind="same", bad=(D.BOOL, D.COMPLEX), method=False, tags=(Tag.core, Tag.pointwise, Tag.recomputable),
               pointwise=PointwiseSpelling(cpp="nearbyint{f}({0})", numpy="np.round({0})",
                                           triton="libdevice.nearbyint({0})", heavy=False))


def _round_decimals(xp, a, *, decimals):
    if a.dtype.kind in "iub":
        return a.copy()
    p = 10.0 ** builtins.abs(decimals)
    if decimals > 0:
        return xp.round(a * p) / p
    return xp.round(a / p) * p


_round_dec = unary("round", _round_decimals, lambda grad: _zeros(grad), kind="same", bad=(D.BOOL, D.COMPLEX),
                   method=False, schema="round.decimals(Tensor self, *, int decimals) -> Tensor")


@export("round", method=True)
def round(input, *, decimals=0, out=None):
    kw = {} if out is None else {"out": out}
    return _round(input, **kw) if decimals == 0 else _round_dec(input, decimals=decimals, **kw)


@export("round_", method=True, function=False)
def round_(self, *, decimals=0):
    return _round.inplace(self) if decimals == 0 else _round_dec.inplace(self, decimals=decimals)


def _is(test):
    def f(xp, a):
        if a.dtype.kind not in "fc":
            return test(xp, None, a)
        return test(xp, a, a)
    return f


isnan = unary("isnan", _is(lambda xp, f, a: xp.zeros(a.shape, bool) if f is None else xp.isnan(f)),
              kind="bool", inplace=False)
isinf = unary("isinf", _is(lambda xp, f, a: xp.zeros(a.shape, bool) if f is None else xp.isinf(f)),
              kind="bool", inplace=False)
isfinite = unary("isfinite", _is(lambda xp, f, a: xp.ones(a.shape, bool) if f is None else xp.isfinite(f)),
                 kind="bool", inplace=False)
isposinf = unary("isposinf", _is(lambda xp, f, a: xp.zeros(a.shape, bool) if f is None else f == xp.inf),
                 kind="bool", inplace=False, bad=(D.COMPLEX,),
                 bad_exc=lambda dt: RuntimeError("isposinf does not support complex inputs."))
isneginf = unary("isneginf", _is(lambda xp, f, a: xp.zeros(a.shape, bool) if f is None else f == -xp.inf),
                 kind="bool", inplace=False, bad=(D.COMPLEX,),
                 bad_exc=lambda dt: RuntimeError("isneginf does not support complex inputs."))
signbit = unary("signbit", lambda xp, a: xp.signbit(a) if a.dtype.kind == "f" else a < 0,
                kind="bool", inplace=False, bad=(D.COMPLEX,), tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                pointwise=PointwiseSpelling("std::signbit({0})", "np.signbit({0})", "libdevice.signbit({0}) != 0",
                                            heavy=False, result="bool"))
bitwise_not = unary("bitwise_not", lambda xp, a: xp.invert(a), kind="same", bad=(D.FLOATING, D.COMPLEX),
                    tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                    pointwise=PointwiseSpelling("static_cast<{T}>(~{0})", "np.invert({0})", "~{0}", heavy=False))
logical_not = unary("logical_not", lambda xp, a: xp.logical_not(a), kind="bool",
                    tags=(Tag.core, Tag.pointwise, Tag.recomputable),
                    pointwise=PointwiseSpelling("!{0}", "np.logical_not({0})", "{0} == 0", heavy=False, result="bool"))


def _angle(xp, a):
    if a.dtype.kind == "c":
        return xp.angle(a)
    return xp.where(xp.isnan(a), a, xp.where(a < 0, math.pi, 0.0).astype(a.dtype))


def _angle_grad(grad, self):
    if not self.is_complex():
        return _zeros(grad)
    m2 = self.abs() ** 2
    g = grad * self / m2.where(m2 != 0, 1) * 1j
    return g.where(m2 != 0, 0)


angle = unary("angle", _angle, _angle_grad, real_out=True, inplace=False)


def _logit(xp, a, eps=None):
    if eps is not None:
        a = xp.clip(a, eps, 1 - eps)
    return xp.log(a / (1 - a))


def _logit_grad(grad, self, eps):
    """PyTorch's logit_backward: NaN outside [0, 1] without eps (where the forward is NaN too), 0 outside
    [eps, 1 - eps] with it."""
    g = grad / (self * (1 - self))
    if eps is None:
        return g.where(~((self < 0) | (self > 1)), math.nan)
    return g.where(~((self < eps) | (self > 1 - eps)), 0)


logit = unary("logit", _logit, _logit_grad, bad=(D.COMPLEX,), namespace="special",
              schema="logit(Tensor self, float? eps=None) -> Tensor")


def _finfo(npdt):
    return ml_dtypes.finfo(npdt)


def _nan_to_num_real(xp, a, nan, posinf, neginf, fi):
    hi = float(fi.max) if posinf is None else posinf
    lo = float(fi.min) if neginf is None else neginf
    r = xp.where(xp.isnan(a), nan if nan is not None else 0.0, a)
    return xp.where(r == xp.inf, hi, xp.where(r == -xp.inf, lo, r)).astype(a.dtype)


@defop("nan_to_num(Tensor self, float? nan=0.0, float? posinf=None, float? neginf=None) -> Tensor",
       method=True, inplace=True)
def nan_to_num(xp, self, nan=0.0, posinf=None, neginf=None):
    if D.FROM_NP[self.dtype].category < D.FLOATING:
        return self.copy()
    fi = _finfo(self.real.dtype)
    a = self.astype(np.float32) if self.dtype.itemsize <= 2 else self
    if a.dtype.kind == "c":
        r = (_nan_to_num_real(xp, a.real, nan, posinf, neginf, fi) +
             1j * _nan_to_num_real(xp, a.imag, nan, posinf, neginf, fi))
    else:
        r = _nan_to_num_real(xp, a, nan, posinf, neginf, fi)
    return xp.asarray(r).astype(self.dtype)


@nan_to_num.def_meta
def _(self, nan=0.0, posinf=None, neginf=None):
    return TensorSpec(self.shape, self.dtype)


@nan_to_num.def_derivative
def _(grad, self):
    return grad * self.isfinite()


# ---- polygamma ---------------------------------------------------------------------------------
@defop("polygamma(int n, Tensor self) -> Tensor", namespace="special", tags=(Tag.core, Tag.extern))
def polygamma(xp, n, self):
    dt = result_dtype("float", D.FROM_NP[self.dtype])
    if dt.category == D.COMPLEX:
        raise unsupported("polygamma", dt)
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    cd = opmath(dt)
    sp = special_ns(xp)
    a = self.astype(cd)
    r = sp.psi(a) if n == 0 else sp.polygamma(xp.asarray(n) if xp is not np else n, a)
    return xp.asarray(r).astype(dt.np)


@polygamma.def_meta
def _(n, self):
    return TensorSpec(self.shape, result_dtype("float", self.dtype))


@polygamma.def_derivative
def _(grad, n, self):
    return grad * polygamma(n + 1, self)


@export("polygamma", method=True, function=False)
def _polygamma_method(self, n):
    return polygamma(n, self)


@export("polygamma_", method=True, function=False)
def _polygamma_inplace(self, n):
    return _write(self, polygamma(n, self), "polygamma_")


# ---- real / imag / positive / composites ------------------------------------------------------
@defop("_pw_real(Tensor(a) self) -> Tensor(a)", function=False, tags=(Tag.core, Tag.extern))
def _real_view(xp, self):
    return self.real


def _component_spec(self, part):
    """A complex tensor's real (part 0) or imaginary (part 1) view: every stride and the offset
    doubled in units of the real dtype, as PyTorch's view_as_real then select."""
    st = [2 * s for s in self.stride()]
    return TensorSpec(self.shape, self.dtype.to_real(), st, 2 * self.storage_offset() + part)


@_real_view.def_meta
def _(self):
    return _component_spec(self, 0)


@_real_view.def_derivative
def _(grad):
    return grad + 0j


@defop("_pw_imag(Tensor(a) self) -> Tensor(a)", function=False, tags=(Tag.core, Tag.extern))
def _imag_view(xp, self):
    return self.imag


@_imag_view.def_meta
def _(self):
    return _component_spec(self, 1)


@_imag_view.def_derivative
def _(grad):
    return grad * 1j


@export("real")
def real(input):
    return _real_view(input) if input.is_complex() else input


@export("imag")
def imag(input):
    if not input.is_complex():
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return _imag_view(input)


# ---- complex numbers as pairs of reals (rotary embeddings: llama's `precompute_freqs_cis`) -----------------
def _as_real_spec(self):
    if not self.dtype.is_complex:
        raise RuntimeError("view_as_real is only supported for complex tensors")
    return TensorSpec(tuple(self.shape) + (2,), self.dtype.to_real(), [2 * s for s in self.stride()] + [1],
                      2 * self.storage_offset())


def _as_complex_spec(self):
    if self.dtype not in (D.float32, D.float64):
        raise RuntimeError("view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"scalar type: {type_name(self.dtype)}")
    st = self.stride()
    if self.dim() == 0 or self.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if st[-1] != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in st[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    if self.storage_offset() % 2:
        raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    return TensorSpec(tuple(self.shape[:-1]), self.dtype.to_complex(), [s // 2 for s in st[:-1]],
                      self.storage_offset() // 2)


@defop("view_as_real(Tensor(a) self) -> Tensor(a)", function=False, tags=(Tag.core, Tag.extern))
def _view_as_real(xp, self):
    return self[..., None].view(self.real.dtype)


_view_as_real.def_meta(_as_real_spec)


@_view_as_real.def_derivative
def _(grad):
    return _view_as_complex(grad.contiguous())


@defop("view_as_complex(Tensor(a) self) -> Tensor(a)", function=False, tags=(Tag.core, Tag.extern))
def _view_as_complex(xp, self):
    return self.view(xp.result_type(self.dtype, xp.complex64))[..., 0]


_view_as_complex.def_meta(_as_complex_spec)


@_view_as_complex.def_derivative
def _(grad):
    return _view_as_real(grad.contiguous())


@export("view_as_real")
def view_as_real(input):
    """The complex tensor's memory seen as (..., 2) reals: real and imaginary parts side by side."""
    _as_real_spec(input)
    return _view_as_real(input)


@export("view_as_complex", tags=(Tag.cpu_autocast_fp32,))
def view_as_complex(input):
    """A (..., 2) float tensor's pairs (last stride 1) seen as complex numbers, sharing its memory."""
    _as_complex_spec(input)
    return _view_as_complex(input)


def _complex_parts_check(name, a, b):
    if a.dtype not in (D.float32, D.float64) or b.dtype is not a.dtype:
        raise RuntimeError(f"{name}: expected both inputs to be float or double tensors of one dtype, but got "
                           f"{type_name(a.dtype)} and {type_name(b.dtype)}")
    shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
    return TensorSpec(shape, a.dtype.to_complex(), pointwise_strides(shape, a, b))


@defop("complex(Tensor real, Tensor imag) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
def _complex(xp, real, imag):
    out = xp.empty(xp.broadcast_shapes(real.shape, imag.shape), dtype=xp.result_type(real.dtype, xp.complex64))
    out.real, out.imag = real, imag
    return lay_out_pointwise(xp, out, real, imag)           # PyTorch's output follows its inputs' layout


_complex.def_meta(lambda real, imag: _complex_parts_check("complex", real, imag))


@_complex.def_derivative
def _(grad, real, imag):
    return (_sum_to(_real_view(grad), real.shape), _sum_to(_imag_view(grad), imag.shape))


def _sum_to(g, shape):
    """A broadcast input's gradient: summed over the dimensions it was broadcast along."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g                          # PyTorch's: the complex gradient's real (or imaginary) view itself
    lead = g.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(dims, keepdim=True).reshape(shape) if dims else g.reshape(shape)


@export("complex")
def complex(real, imag):
    """real + i imag (float or double tensors of one dtype, broadcast)."""
    _complex_parts_check("complex", real, imag)
    return _complex(real, imag)


@export("polar", tags=(Tag.cpu_autocast_fp32,))
def polar(abs, angle):
    """abs * (cos(angle) + i sin(angle))."""
    _complex_parts_check("polar", abs, angle)
    return _complex(abs * angle.cos(), abs * angle.sin())


def _set_part(part):
    def setter(self, value):
        part(self).copy_(value)
    return setter


Tensor.real = property(real, _set_part(real), doc="The real part (the tensor itself when it is not complex).")
Tensor.imag = property(imag, _set_part(imag), doc="The imaginary part of a complex tensor (a view).")


@export("positive", method=True)
def positive(input):
    if input.dtype is D.bool:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return input


@export("square", method=True)
def square(input, *, out=None):
    return pointwise_pow(input, 2) if out is None else pointwise_pow(input, 2, out=out)


@export("square_", method=True, function=False)
def square_(self):
    return self.pow_(2)


# ---- aliases -------------------------------------------------------------------------------------
def _alias(new, old, *, inplace=True, namespace=None):
    f = EXPORTS[old]
    export(new, method=True, namespace=namespace)(f)
    if inplace and old + "_" in METHODS:
        export(new + "_", method=True, function=False)(METHODS[old + "_"])


for _new, _old in [("fix", "trunc"), ("arcsin", "asin"), ("arccos", "acos"), ("arctan", "atan"),
                   ("arcsinh", "asinh"), ("arccosh", "acosh"), ("arctanh", "atanh"),
                   ("negative", "neg")]:
    _alias(_new, _old)
export("expit", namespace="special", function=False)(sigmoid)
export("psi", namespace="special", function=False)(digamma)
export("gammaln", namespace="special", function=False)(lgamma)


# ---- ternary ops: where, clamp, lerp, addcmul, addcdiv ------------------------------------------
def _operands_dtype(*xs):
    return result_type(*xs)


def _bshape(*xs):
    return broadcast_shapes(*(shape_of(x) for x in xs if x is not None))


def _compute(xp, dt, *xs):
    cd = opmath(dt)
    return [None if x is None else cast_wrap(xp, round_to(x, dt) if cd != dt.np else x, cd) for x in xs]


def _where_check(condition):
    dt = condition.dtype if hasattr(condition, "dtype") else None
    if dt is not None and dt not in (D.bool, np.dtype(bool)):
        name = type_name(dt if isinstance(dt, D.dtype) else D.FROM_NP[dt])
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {name}")


@defop("where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", function=False,
       tags=(Tag.core, Tag.pointwise, Tag.recomputable),
       pointwise=PointwiseSpelling("{0} ? {1} : {2}", "np.where({0}, {1}, {2})", "tl.where({0}, {1}, {2})", heavy=False))
def _where(xp, condition, self, other):
    _where_check(condition)
    dt = _operands_dtype(self, other)
    shape = _bshape(condition, self, other)
    a, b = _compute(xp, dt, self, other)
    r = xp.where(condition, a, b)
    return xp.broadcast_to(xp.asarray(r), shape).astype(dt.np)


@_where.def_meta
def _(condition, self, other):
    _where_check(condition)
    return TensorSpec(_bshape(condition, self, other), _operands_dtype(self, other))


@_where.def_derivative
def _where_derivative(grad, condition):
    """Saves only the condition (PyTorch's): an in-place write to self or other afterwards is no error."""
    z = zeros_like(grad)
    return None, _where(condition, grad, z), _where(condition, z, grad)


@export("where")
def where(condition, input=None, other=None, *, out=None):
    if input is None and other is None:
        return EXPORTS["nonzero"](condition, as_tuple=True)
    kw = {} if out is None else {"out": out}
    return _where(condition, input, other, **kw)


@export("where", method=True, function=False)
def _where_method(self, condition, other):
    return _where(condition, self, other)


def _clamp_check(self, min, max):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    dt = _operands_dtype(self, min, max)
    if dt.category in (D.BOOL, D.COMPLEX):
        raise unsupported("clamp", dt)
    return dt


@defop("clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", method=True, inplace=True,
       tags=(Tag.recomputable,))
def clamp(xp, self, min=None, max=None):
    dt = _clamp_check(self, min, max)
    a, lo, hi = _compute(xp, dt, self, min, max)
    r = a
    if lo is not None:
        r = xp.where((r < lo) | (lo != lo), lo, r)      # a tie keeps self: clamp(0.0, min=-0.0) is 0.0
    if hi is not None:
        r = xp.where((r > hi) | (hi != hi), hi, r)
    return xp.broadcast_to(xp.asarray(r), _bshape(self, min, max)).astype(dt.np)


@clamp.def_meta
def _(self, min=None, max=None):
    return TensorSpec(_bshape(self, min, max), _clamp_check(self, min, max))


@clamp.def_derivative
def _(grad, self, min, max):
    z = zeros_like(grad)
    keep = None
    gmin = gmax = None
    if min is not None:
        keep = self >= min
        if isinstance(min, Tensor):
            gmin = _where(keep, z, grad)
    if max is not None:
        le = self <= max
        keep = le if keep is None else keep & le
        if isinstance(max, Tensor):
            gmax = _where(le, z, grad)
    return _where(keep, grad, z), gmin, gmax


@export("clip", method=True)
def clip(input, min=None, max=None, *, out=None):
    return clamp(input, min, max) if out is None else clamp(input, min, max, out=out)


@export("clip_", method=True, function=False)
def clip_(self, min=None, max=None):
    return clamp.inplace(self, min, max)


@export("clamp_min", method=True)
def clamp_min(input, min, *, out=None):
    return clamp(input, min, None) if out is None else clamp(input, min, None, out=out)


@export("clamp_max", method=True)
def clamp_max(input, max, *, out=None):
    return clamp(input, None, max) if out is None else clamp(input, None, max, out=out)


@export("clamp_min_", method=True, function=False)
def clamp_min_(self, min):
    return clamp.inplace(self, min, None)


@export("clamp_max_", method=True, function=False)
def clamp_max_(self, max):
    return clamp.inplace(self, None, max)


def _lerp_check(self, end, weight):
    require_tensors("lerp", self, end, "none")
    sd = self.dtype if isinstance(self.dtype, D.dtype) else D.FROM_NP[self.dtype]
    for what, x in (("end", end), ("weight", weight)):
        if hasattr(x, "dtype"):
            xd = x.dtype if isinstance(x.dtype, D.dtype) else D.FROM_NP[x.dtype]
            if xd is not sd:
                raise RuntimeError(f"expected dtype {sd.name if sd.name != 'float32' else 'float'} for `{what}` "
                                   f"but got dtype {xd.name if xd.name != 'float32' else 'float'}")
    if sd.category < D.FLOATING:
        raise unsupported("lerp_kernel_scalar", sd)
    return sd


@defop("lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor", method=True, inplace=True)
def lerp(xp, self, end, weight):
    dt = _lerp_check(self, end, weight)
    a, b, w = _compute(xp, dt, self, end, weight)
    d = b - a
    r = xp.where(xp.abs(xp.asarray(w)) < 0.5, a + w * d, b - d * (1 - xp.asarray(w)))
    return xp.broadcast_to(xp.asarray(r), _bshape(self, end, weight)).astype(dt.np)


@lerp.def_meta
def _(self, end, weight):
    return TensorSpec(_bshape(self, end, weight), _lerp_check(self, end, weight))


@lerp.def_derivative
def _(grad, self, end, weight):
    gw = grad * _conj(end - self) if isinstance(weight, Tensor) else None
    return grad * _conj(1 - weight), grad * _conj(weight), gw


def _addc_dtype(self, t1, t2, name):
    dt = _operands_dtype(self, t1, t2)
    if dt.category == D.BOOL:
        raise unsupported(name, dt)
    if name == "addcdiv" and _operands_dtype(t1, t2).category < D.FLOATING:
        raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future release "
                           "addcdiv will perform a true division of tensor1 and tensor2. The historic "
                           "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
                           "tensor2)).to(input.dtype) using PyTorch 1.7 or later.")
    return dt


def _addc(name, combine, *, tags=()):
    def kernel(xp, self, tensor1, tensor2, *, value=1):
        dt = _addc_dtype(self, tensor1, tensor2, name)
        a, b, c = _compute(xp, dt, self, tensor1, tensor2)
        if dt.category < D.FLOATING:
            value = int(value)
        r = a + value * combine(b, c)
        return xp.broadcast_to(xp.asarray(r), _bshape(self, tensor1, tensor2)).astype(dt.np)
    op = defop(f"{name}(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
               method=True, inplace=True, tags=tags)(kernel)
    op.def_meta(lambda self, tensor1, tensor2, *, value=1: TensorSpec(
        _bshape(self, tensor1, tensor2), _addc_dtype(self, tensor1, tensor2, name)))
    return op


addcmul = _addc("addcmul", lambda b, c: b * c, tags=(Tag.autocast_promote,))
addcdiv = _addc("addcdiv", lambda b, c: b / c, tags=(Tag.autocast_promote,))
addcmul.def_derivative(lambda grad, tensor1, tensor2, value: (
    grad, grad * _conj(tensor2 * value), grad * _conj(tensor1 * value)))
addcdiv.def_derivative(lambda grad, tensor1, tensor2, value: (
    grad, grad * _conj(value / tensor2), -grad * _conj(value * tensor1 / (tensor2 * tensor2))))


# ---- vmap of the complex views: the batch dimension stays where it is (moved to the front when it is the
# pairs' dimension that view_as_complex consumes) --------------------------------------------------------------
_view_as_real.def_batching_rule(_batching.unary_rule(_view_as_real))
_complex.def_batching_rule(_batching.pointwise_rule(_complex))


@_view_as_complex.def_batching_rule
def _(in_dims, x):
    d = in_dims[0]
    if d == x.dim() - 1:
        x, d = x.movedim(d, 0).contiguous(), 0
    return _view_as_complex(x), d


# ---- vmap: elementwise ops outside the pointwise tag batch as the tagged ones ----------------------
for _op in (sgn, log2, log10, exp2, erfinv, digamma, i0, special_i1, sinc, deg2rad, rad2deg, frac, reciprocal,
            _round_dec, isnan, isinf, isfinite, isposinf, isneginf, angle, logit, nan_to_num, polygamma, _real_view,
            _imag_view, clamp, lerp, addcmul, addcdiv):
    _op.def_batching_rule(_batching.pointwise_rule(_op))
