"""Decompositions of composite reductions: softmax / log_softmax / logsumexp, mean, var / std (and
the `_mean` pairs), max / min (full and along a dim), aminmax, nansum / nanmean, count_nonzero and
the vector norms, over sum / amax / amin / argmax / argmin.
"""
from __future__ import annotations

import math

from .. import _dtype as D, _state
from ._table import aten, register_decomposition, to, compute_dtype, dims_of, numel, wrap
from .._dispatch import type_name
from .._tensor import contiguous_format


def _sized(x, axes) -> bool:
    return all(x.shape[a] != 0 for a in axes)


def _softmax_input(self, dim, dtype):
    x = to(self, dtype) if dtype is not None else self
    if x.dtype.category < D.FLOATING and x.numel() != 0:
        raise RuntimeError(f"\"softmax_lastdim_kernel_impl\" not implemented for '{type_name(x.dtype)}'")
    d = wrap(dim, x.ndim)
    return x, to(x, compute_dtype(x.dtype)), [d] if x.ndim else []


def _shifted(x, d):
    if x.numel() == 0:
        return x
    return aten.sub(x, aten.amax(x, d, True))


def _contiguous(r):
    """The eager kernels' layout: softmax and log_softmax return a contiguous tensor (PyTorch's, for
    any input layout), where the pointwise ops of the decomposition would follow the input's (a later
    `view` of the result must succeed or fail as in eager)."""
    return r if r.is_contiguous() else aten.clone(r, memory_format=contiguous_format)


@register_decomposition(aten.softmax)
def softmax(self, dim, dtype=None):
    orig, x, d = _softmax_input(self, dim, dtype)
    e = aten.exp(_shifted(x, d))
    return _contiguous(to(aten.div(e, aten.sum(e, d, True)), orig.dtype))


@register_decomposition(aten.log_softmax)
def log_softmax(self, dim, dtype=None):
    orig, x, d = _softmax_input(self, dim, dtype)
    s = _shifted(x, d)
    return _contiguous(to(aten.sub(s, aten.log(aten.sum(aten.exp(s), d, True))), orig.dtype))


@register_decomposition(aten.logsumexp)
def logsumexp(self, dim, keepdim=False):
    dt = self.dtype if self.dtype.category >= D.FLOATING else _state.default_dtype
    x = to(self, compute_dtype(dt))
    axes = list(dims_of(dim, x.ndim)) if x.ndim else []
    if x.numel() == 0 or not _sized(x, axes):
        return to(aten.log(aten.sum(aten.exp(x), axes, keepdim)), dt)
    m = aten.amax(x, axes, True)
    m = aten.where(aten.eq(aten.abs(m), math.inf), 0.0, m)
    r = aten.add(aten.log(aten.sum(aten.exp(aten.sub(x, m)), axes, True)), m)
    if not keepdim:
        r = aten.squeeze(r, axes)
    return to(r, dt)


@register_decomposition(aten.mean.dim)
def mean(self, dim=None, keepdim=False, dtype=None):
    dt = dtype or self.dtype
    if dt.category < D.FLOATING:
        return NotImplemented
    axes = dims_of(dim, self.ndim)
    n = numel(self.shape, axes)
    s = aten.sum(self, list(axes), keepdim, dtype=compute_dtype(dt))
    return to(aten.div(s, n), dt)


def _var_mean(self, dim, correction, keepdim):
    if self.dtype.category != D.FLOATING:
        return NotImplemented
    dt = self.dtype
    x = to(self, compute_dtype(dt))
    axes = list(dims_of(dim, x.ndim))
    n = numel(x.shape, axes)
    m = aten.div(aten.sum(x, axes, True), n)
    xc = aten.sub(x, m)
    c = 1 if correction is None else correction
    var = aten.div(aten.sum(aten.mul(xc, xc), axes, keepdim), max(n - c, 0))
    if not keepdim:
        m = aten.squeeze(m, axes)
    return to(var, dt), to(m, dt)


@register_decomposition(aten.var.correction)
def var(self, dim=None, correction=None, keepdim=False):
    r = _var_mean(self, dim, correction, keepdim)
    return r if r is NotImplemented else r[0]


@register_decomposition(aten.std.correction)
def std(self, dim=None, correction=None, keepdim=False):
    r = _var_mean(self, dim, correction, keepdim)
    return r if r is NotImplemented else aten.sqrt(r[0])


@register_decomposition(aten.var_mean.correction)
def var_mean(self, dim=None, correction=None, keepdim=False):
    return _var_mean(self, dim, correction, keepdim)


@register_decomposition(aten.std_mean.correction)
def std_mean(self, dim=None, correction=None, keepdim=False):
    r = _var_mean(self, dim, correction, keepdim)
    return r if r is NotImplemented else (aten.sqrt(r[0]), r[1])


@register_decomposition(aten.max)
def max_(self):
    return aten.amax(self)


@register_decomposition(aten.min)
def min_(self):
    return aten.amin(self)


def _no_bool(x):
    return to(x, D.uint8) if x.dtype is D.bool else x


@register_decomposition(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return aten.amax(self, [dim], keepdim), aten.argmax(_no_bool(self), dim, keepdim)


@register_decomposition(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return aten.amin(self, [dim], keepdim), aten.argmin(_no_bool(self), dim, keepdim)


@register_decomposition(aten.aminmax)
def aminmax(self, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            return aten.amin(self, [], True), aten.amax(self, [], True)
        return aten.amin(self), aten.amax(self)
    return aten.amin(self, [dim], keepdim), aten.amax(self, [dim], keepdim)


def _zero_nans(x):
    return aten.where(aten.isnan(x), 0, x) if x.dtype.category >= D.FLOATING else x


@register_decomposition(aten.nansum)
def nansum(self, dim=None, keepdim=False, dtype=None):
    if self.dtype.is_complex:
        return NotImplemented
    return aten.sum(_zero_nans(self), dim, keepdim, dtype=dtype)


@register_decomposition(aten.nanmean)
def nanmean(self, dim=None, keepdim=False, dtype=None):
    if self.dtype.category != D.FLOATING:
        return NotImplemented
    count = aten.sum(aten.logical_not(aten.isnan(self)), dim, keepdim)
    return aten.div(nansum(self, dim, keepdim, dtype), count)


@register_decomposition(aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim=None):
    return aten.sum(aten.ne(self, 0), dim)


# ---- norms -------------------------------------------------------------------------------------
@register_decomposition(aten.linalg_vector_norm)
def vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    x = to(self, dtype) if dtype is not None else self
    if x.dtype.category != D.FLOATING:
        return NotImplemented
    axes = list(dims_of(dim, x.ndim)) if x.ndim else []
    cd = compute_dtype(x.dtype)
    a = aten.abs(to(x, cd))
    if ord == math.inf or ord == -math.inf:
        if not _sized(x, axes):
            return NotImplemented
        r = (aten.amax if ord > 0 else aten.amin)(a, axes, keepdim)
    elif ord == 0:
        r = aten.sum(to(aten.ne(a, 0), cd), axes, keepdim)
    elif ord == 1:
        r = aten.sum(a, axes, keepdim)
    elif ord == 2:
        r = aten.sqrt(aten.sum(aten.mul(a, a), axes, keepdim))
    else:
        r = aten.pow(aten.sum(aten.pow(a, ord), axes, keepdim), 1.0 / ord)
    return to(r, x.dtype)


@register_decomposition(aten.norm.ScalarOpt_dim_dtype)
def norm(self, p=2, dim=(), keepdim=False, dtype=None):
    return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype)

