"""Decompositions of pointwise math (reciprocal, log2, clamp, lerp, isclose, ...) and the
generic rule for in-place operators: `op_(self, ...)` = `copy_(self, op(self, ...))`.

Floating results that the original computes in a promoted dtype (xlogy of an int and a float, ...)
are computed here in that dtype too, so the decomposition agrees with the kernel to rounding.
"""
from __future__ import annotations

import math

import numpy as np
import ml_dtypes

from .. import _dtype as D, _state
from .._ops import OPS
from .._ops._helpers import result_type
from ._table import aten, register_decomposition, maximum, to, by_name, full, scalar_tensor
from .._dispatch import can_cast, type_name, check_no_internal_overlap
from .._ops._registry import Tag

# ---- in-place operators --------------------------------------------------------------------------


def _inplace_decomposition(op):
    f = op.functional

    overlap_ok = Tag.overlap_ok in op.tags

    def decomposition(self, *rest):
        if not overlap_ok:
            check_no_internal_overlap(self)       # as the eager op: only fill_/zero_ may write an expanded self
        src = self
        if _state.tls.grad_enabled and any(getattr(x, "requires_grad", False) for x in (self,) + rest):
            src = aten.clone(self)          # autograd may save the input; copy_ is about to overwrite it
        r = by_name(f, (src,) + rest)
        if not can_cast(r.dtype, self.dtype):
            raise RuntimeError(f"result type {type_name(r.dtype)} can't be cast to the desired output type "
                               f"{type_name(self.dtype)}")
        if tuple(r.shape) != tuple(self.shape):
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                               f"{list(r.shape)}")
        return aten.copy_(self, r)
    decomposition.__name__ = op.name.replace(".", "_") + "_decomposition"
    return decomposition


for _op in list(OPS.values()):
    if _op.is_inplace and _op.functional is not None and _op is not aten.copy_:
        register_decomposition(_op)(_inplace_decomposition(_op))


# ---- helpers ---------------------------------------------------------------------------------
def _float_dtype(*xs):
    """The result dtype of a float-producing op: ints/bools promote to the default float."""
    dt = result_type(*xs)
    return dt if dt.category >= D.FLOATING else _state.default_dtype


def _as(dt, *xs):
    """Each operand as a tensor of dtype `dt` (Python numbers become 0-dim tensors)."""
    like = next(x for x in xs if hasattr(x, "dtype"))
    return tuple(to(x, dt) if hasattr(x, "dtype") else scalar_tensor(x, like, dt) for x in xs)


def _tensor(x, like):
    """A Python number as a 0-dim tensor of its own scalar dtype (tensors pass through)."""
    if hasattr(x, "dtype"):
        return x
    return scalar_tensor(x, like, D.scalar_dtype(x, _state.default_dtype))


def _finfo(dt):
    if dt is D.bfloat16:
        return ml_dtypes.finfo(dt.np)
    return np.finfo(dt.np)


# ---- arithmetic ------------------------------------------------------------------------------
@register_decomposition(aten.rsub.Tensor)
def rsub(self, other, alpha=1):
    return aten.sub(other, self, alpha=alpha)


@register_decomposition(aten.reciprocal)
def reciprocal(self):
    return aten.div(1, self) if self.dtype.category >= D.FLOATING else aten.div(1.0, self)


@register_decomposition(aten.floor_divide)
def floor_divide(self, other):
    return aten.div_mode(self, other, rounding_mode="floor")


@register_decomposition(aten._div_trunc)
def div_trunc(self, other):
    return aten.div_mode(self, other, rounding_mode="trunc")


@register_decomposition(aten.frac)
def frac(self):
    return aten.sub(self, aten.trunc(self))


@register_decomposition(aten.addcmul)
def addcmul(self, tensor1, tensor2, value=1):
    if result_type(self, tensor1, tensor2).category < D.FLOATING:
        value = int(value)
    return to(aten.add(self, aten.mul(aten.mul(tensor1, tensor2), value)), result_type(self, tensor1, tensor2))


@register_decomposition(aten.addcdiv)
def addcdiv(self, tensor1, tensor2, value=1):
    return to(aten.add(self, aten.mul(aten.div(tensor1, tensor2), value)), result_type(self, tensor1, tensor2))


@register_decomposition(aten.lerp.Tensor)
def lerp(self, end, weight):
    weight = _tensor(weight, self)
    diff = aten.sub(end, self)
    low = aten.add(self, aten.mul(weight, diff))
    high = aten.sub(end, aten.mul(diff, aten.sub(1, weight)))
    return aten.where(aten.lt(aten.abs(weight), 0.5), low, high)


@register_decomposition(aten.clamp)
def clamp(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    dt = result_type(self, min, max)
    r = to(self, dt)
    if min is not None:
        r = _clamp_to(r, min, aten.lt)
    if max is not None:
        r = _clamp_to(r, max, aten.gt)
    return to(r, dt)


def _clamp_to(r, bound, beyond):
    """`bound` where `r` lies `beyond` it or the bound is NaN, else `r`: a tie keeps `r`, so clamp(0.0,
    min=-0.0) is 0.0, as PyTorch's kernel (maximum/minimum would pick either zero)."""
    if hasattr(bound, "dtype") or bound != bound:
        b = _tensor(bound, r)
        return aten.where(aten.logical_or(beyond(r, b), aten.ne(b, b)), b, r)
    return aten.where(beyond(r, bound), bound, r)


@register_decomposition(aten.fmax)
def fmax(self, other):
    """`other` where it is larger or `self` is NaN: a tie of zeros keeps `self`, as the kernel."""
    return aten.where(aten.logical_or(aten.gt(other, self), aten.isnan(self)), other, self)


@register_decomposition(aten.fmin)
def fmin(self, other):
    return aten.where(aten.logical_or(aten.lt(other, self), aten.isnan(self)), other, self)


@register_decomposition(aten.round.decimals)
def round_decimals(self, decimals):
    if decimals == 0:
        return aten.round(self)
    p = 10.0 ** abs(decimals)
    if decimals > 0:
        return aten.div(aten.round(aten.mul(self, p)), p)
    return aten.mul(aten.round(aten.div(self, p)), p)


# ---- exp / log families ------------------------------------------------------------------------
@register_decomposition(aten.exp2)
def exp2(self):
    return aten.pow(2.0, to(self, _float_dtype(self)))


@register_decomposition(aten.log2)
def log2(self):
    return aten.mul(aten.log(self), 1 / math.log(2))


@register_decomposition(aten.log10)
def log10(self):
    return aten.mul(aten.log(self), 1 / math.log(10))


@register_decomposition(aten.xlogy.Tensor)
def xlogy(self, other):
    x, y = _as(_float_dtype(self, other), self, other)
    r = aten.where(aten.eq(x, 0), 0.0, aten.mul(x, aten.log(y)))
    return aten.where(aten.isnan(y), y, r)


@register_decomposition(aten.logaddexp)
def logaddexp(self, other):
    a, b = _as(_float_dtype(self, other), self, other)
    m = maximum(a, b)
    r = aten.add(m, aten.log1p(aten.exp(aten.neg(aten.abs(aten.sub(a, b))))))
    return aten.where(aten.logical_and(aten.isinf(m), aten.eq(a, b)), a, r)


@register_decomposition(aten.logaddexp2)
def logaddexp2(self, other):
    a, b = _as(_float_dtype(self, other), self, other)
    m = maximum(a, b)
    r = aten.add(m, aten.mul(aten.log1p(aten.pow(2.0, aten.neg(aten.abs(aten.sub(a, b))))), 1 / math.log(2)))
    return aten.where(aten.logical_and(aten.isinf(m), aten.eq(a, b)), a, r)


@register_decomposition(aten.logit)
def logit(self, eps=None):
    x = to(self, _float_dtype(self))
    if eps is not None:
        x = aten.clamp(x, eps, 1 - eps)
    return aten.log(aten.div(x, aten.sub(1, x)))


@register_decomposition(aten.float_power.Tensor_Tensor)
def float_power(self, exponent):
    cplx = any(getattr(x, "dtype", None) is not None and x.dtype.is_complex or isinstance(x, complex)
               for x in (self, exponent))
    dt = D.complex128 if cplx else D.float64
    return aten.pow(*_as(dt, self, exponent))


# ---- trigonometric helpers ---------------------------------------------------------------------
@register_decomposition(aten.deg2rad)
def deg2rad(self):
    return aten.mul(to(self, _float_dtype(self)), math.pi / 180)


@register_decomposition(aten.rad2deg)
def rad2deg(self):
    return aten.mul(to(self, _float_dtype(self)), 180 / math.pi)


@register_decomposition(aten.sinc)
def sinc(self):
    x = to(self, _float_dtype(self))
    px = aten.mul(x, math.pi)
    return aten.where(aten.eq(x, 0), 1.0, aten.div(aten.sin(px), px))


@register_decomposition(aten.ldexp.Tensor)
def ldexp(self, other):
    a, b = _as(_float_dtype(self, other), self, other)
    return aten.mul(a, aten.pow(2.0, b))


@register_decomposition(aten.angle)
def angle(self):
    if self.dtype.is_complex:
        return NotImplemented
    x = to(self, _float_dtype(self))
    return aten.where(aten.isnan(x), x, aten.where(aten.lt(x, 0), math.pi, 0.0))


# ---- sign-like ---------------------------------------------------------------------------------
@register_decomposition(aten.sgn)
def sgn(self):
    if self.dtype.is_complex:
        return NotImplemented
    return aten.sign(self)


@register_decomposition(aten.copysign.Tensor)
def copysign(self, other):
    a, b = _as(_float_dtype(self, other), self, other)
    r = aten.abs(a)
    return aten.where(aten.signbit(b), aten.neg(r), r)


@register_decomposition(aten.heaviside)
def heaviside(self, values):
    dt = result_type(self, values)
    return to(aten.where(aten.eq(self, 0), values, aten.gt(self, 0)), dt)


# ---- classification ----------------------------------------------------------------------------
def _false(self):
    return full(self.shape, False, self, D.bool)


@register_decomposition(aten.isnan)
def isnan(self):
    return aten.ne(self, self)


@register_decomposition(aten.isinf)
def isinf(self):
    if self.dtype.category < D.FLOATING:
        return _false(self)
    return aten.eq(aten.abs(self), math.inf)


@register_decomposition(aten.isposinf)
def isposinf(self):
    return _false(self) if self.dtype.category < D.FLOATING else aten.eq(self, math.inf)


@register_decomposition(aten.isneginf)
def isneginf(self):
    return _false(self) if self.dtype.category < D.FLOATING else aten.eq(self, -math.inf)


@register_decomposition(aten.isfinite)
def isfinite(self):
    if self.dtype.category < D.FLOATING:
        return full(self.shape, True, self, D.bool)
    return aten.eq(aten.sub(self, self), 0)


@register_decomposition(aten.isclose)
def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    if self.dtype is not other.dtype:
        raise RuntimeError(f"{self.dtype} did not match {other.dtype}")
    eq = aten.eq(self, other)
    if self.dtype is D.bool:
        return eq
    if equal_nan and self.dtype.category >= D.FLOATING:
        eq = aten.logical_or(eq, aten.logical_and(aten.isnan(self), aten.isnan(other)))
    dt = self.dtype if self.dtype.category >= D.FLOATING else _state.default_dtype
    a, b = to(self, dt), to(other, dt)
    tol = aten.add(aten.mul(aten.abs(b), rtol), atol)
    close = aten.le(aten.abs(aten.sub(a, b)), tol)
    if self.dtype.category >= D.FLOATING:
        close = aten.logical_and(close, aten.logical_and(aten.isfinite(a), aten.isfinite(b)))
    return aten.logical_or(eq, close)


@register_decomposition(aten.logical_xor)
def logical_xor(self, other):
    return aten.ne(aten.ne(self, 0), aten.ne(other, 0))


@register_decomposition(aten.nan_to_num)
def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
    if self.dtype.category < D.FLOATING:
        return aten.clone(self)
    if self.dtype.is_complex:
        return NotImplemented
    fi = _finfo(self.dtype)
    posinf = float(fi.max) if posinf is None else posinf
    neginf = float(fi.min) if neginf is None else neginf
    r = aten.where(aten.isnan(self), nan if nan is not None else 0.0, self)
    r = aten.where(aten.eq(self, math.inf), posinf, r)
    return to(aten.where(aten.eq(self, -math.inf), neginf, r), self.dtype)
