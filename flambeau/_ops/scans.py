"""Scans along a dimension: cumsum, cumprod, cummax/cummin (values and indices), logcumsumexp and
diff. Integer inputs accumulate in int64 like sum; half/bfloat16 in float32."""
from __future__ import annotations

import builtins
import math

import numpy as np

from .. import _dtype as D
from .. import _state
from ._registry import defop, export, EXPORTS, METHODS, TensorSpec, Tag
from ._helpers import accumulate, wrap_dim, opmath
from .reduction import _sum_dtype, _fresh, _others_matrix
from . import _batching


# ---- scans ---------------------------------------------------------------------------------
def _scan_kernel(fn):
    def kernel(xp, self, dim, *, dtype=None):
        d = wrap_dim(dim, self.ndim)
        out = _sum_dtype(D.FROM_NP[self.dtype], dtype)
        x = self.astype(out.np) if self.dtype != out.np else self
        x = x.astype(opmath(out))
        if self.ndim == 0:
            return _fresh(xp, x, out.np)
        return _fresh(xp, fn(xp, x, d), out.np)
    return kernel


def _scan_meta(self, dim, *, dtype=None):
    wrap_dim(dim, self.ndim)
    return TensorSpec(self.shape, _sum_dtype(self.dtype, dtype))


def reverse_cumsum(g, dim):
    """sum_{i >= k} g_i along `dim`, summed from the end as PyTorch's (a total minus a prefix sum
    would cancel: inf - inf is NaN where PyTorch's gradient is inf, and small terms lose bits)."""
    if g.ndim == 0:
        return g
    return g.flip([dim]).cumsum(dim).flip([dim])


@defop("cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.extern, Tag.autocast_fp32_opt))
def cumsum(xp, self, dim, *, dtype=None):
    return _cumsum_kernel(xp, self, dim, dtype=dtype)


def _cumsum(xp, x, d):
    """A running sum that starts from +0.0, as PyTorch's: 0.0 + -0.0 is 0.0, so no element is -0.0
    (NumPy's copies the first element)."""
    r = xp.cumsum(x, axis=d)
    if r.dtype.kind in "fc":
        r += 0.0
    return r


_cumsum_kernel = _scan_kernel(_cumsum)
cumsum.def_meta(_scan_meta)


@cumsum.def_derivative
def _(grad, dim):
    return reverse_cumsum(grad, dim)


@defop("cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", method=True, inplace=True,
       tags=(Tag.core, Tag.extern, Tag.autocast_fp32_opt))
def cumprod(xp, self, dim, *, dtype=None):
    return _cumprod_kernel(xp, self, dim, dtype=dtype)


_cumprod_kernel = _scan_kernel(lambda xp, x, d: xp.cumprod(x, axis=d))
cumprod.def_meta(_scan_meta)


@cumprod.def_derivative
def _(grad, self, result, dim):
    """By division in each slice along `dim` without a zero (PyTorch's formula, whose infinities and
    NaNs it keeps), through the products of the others in a slice with one; a traced self (meta: no
    data) computes both and selects, so tracing never reads a value."""
    if self.ndim == 0 or self.numel() == 0:
        return grad
    traced = self._device.type == "meta"          # a fake or meta tensor (a FakeTensor reports its fake device)
    divided = reverse_cumsum(grad * result.conj(), dim) / self.conj()
    if not traced and not builtins.bool((self == 0).any()):
        return divided
    if not _state.tls.grad_enabled:
        return _cumprod_backward_masked(grad, self, result, wrap_dim(dim, self.ndim))
    d = wrap_dim(dim, self.ndim)
    x, g = self.transpose(d, -1), grad.transpose(d, -1)
    eye = EXPORTS["eye"](x.shape[-1], dtype=D.bool, device=x.device)
    upper = eye.cumsum(-1) > 0                                  # i >= k
    c = EXPORTS["where"](upper, _others_matrix(x).cumprod(-1), 0)   # c[k, i] = prod_{j<=i, j!=k} x_j, i >= k
    safe = (c.conj() * g.unsqueeze(-2)).sum(-1).transpose(d, -1)
    return safe.where((self == 0).any(d, keepdim=True), divided)


def _cumprod_backward_masked(grad, self, result, d):
    """cumprod's gradient in O(n) where a slice holds a zero (PyTorch's formula without create_graph;
    with it, the products of the others above, differentiable again): before the first zero z1 by
    division of the products up to z1 only, at z1 through the products between z1 and the second zero
    times the product before z1, zero after it. Masks keep the infinities beyond a zero out of the sums
    (inf * 0 would be NaN where PyTorch gives a number), and nothing reads a value (traceable)."""
    where = EXPORTS["where"]
    x, y = self.conj(), result.conj()
    zeros = (self == 0).cumsum(d)                  # zeros up to each element
    before = zeros == 0
    out = where(before, reverse_cumsum((y * grad).masked_fill(~before, 0), d) / x, 0)
    first_run = zeros == 1                         # from the first zero up to the second
    z1 = first_run.long().argmax(d, keepdim=True)
    at_z1 = EXPORTS["zeros_like"](first_run).scatter(d, z1, True) & first_run
    after_z1 = first_run & ~at_z1
    through = (x.masked_fill(~after_z1, 1).cumprod(d) * grad.masked_fill(~first_run, 0)).sum(d, keepdim=True)
    before_z1 = y.gather(d, (z1 - 1).clamp(min=0)).masked_fill(z1 == 0, 1)
    return where(at_z1, through * before_z1, out)


def _scan_inplace(name, iop):
    """`Tensor.cumsum_`: computed in self's dtype; another dtype= is an error, as in PyTorch."""
    def method(self, dim, *, dtype=None):
        if dtype is not None and dtype is not self.dtype:
            raise RuntimeError(f"Bad in-place call: input tensor dtype {self.dtype.name} and output tensor "
                               f"dtype {dtype.name} should match")
        if self.dtype is D.bool and self.ndim and self.numel():
            raise NotImplementedError(f'"{name}_out_cpu" not implemented for \'Bool\'')
        return iop(self, dim, dtype=self.dtype)
    method.__name__ = name + "_"
    METHODS[name + "_"] = method


_scan_inplace("cumsum", cumsum.inplace)
_scan_inplace("cumprod", cumprod.inplace)


def _cumext(name, ufunc, *, tags=()):
    @defop(f"{name}(Tensor self, int dim) -> (Tensor values, Tensor indices)", method=True, tags=tags)
    def op(xp, self, dim):
        d = wrap_dim(dim, self.ndim)
        if self.ndim == 0 or self.size == 0:
            return self.copy(), xp.zeros(self.shape, np.int64)
        x = self.astype(np.float32) if D.FROM_NP[self.dtype] in D.LOW_PRECISION else self
        vals = accumulate(xp, ufunc, x, d)
        mask = x == vals
        if x.dtype.kind in "fc":
            mask = mask | xp.isnan(x)
        pos = xp.arange(x.shape[d], dtype=np.int64).reshape([-1 if i == d else 1 for i in range(x.ndim)])
        idx = accumulate(xp, "maximum", xp.where(mask, pos, 0), d)
        return _fresh(xp, vals, self.dtype), xp.ascontiguousarray(idx)    # PyTorch: both C order

    @op.def_meta
    def _(self, dim):
        wrap_dim(dim, self.ndim)
        return TensorSpec(self.shape, self.dtype), TensorSpec(self.shape, D.int64)

    @op.def_derivative
    def _(grad, self_meta, dim, result):
        g = grad[0]
        if self_meta.ndim == 0:
            return g
        z = EXPORTS["zeros"](self_meta.shape, dtype=g.dtype, device=g.device)
        return z.scatter_add(wrap_dim(dim, self_meta.ndim), result[1], g)
    return op


cummax = _cumext("cummax", "maximum", tags=(Tag.core, Tag.extern))
cummin = _cumext("cummin", "minimum", tags=(Tag.core, Tag.extern))


def _logcumsumexp(xp, x, d):
    """Running logaddexp from -inf, as PyTorch's: the first element is logaddexp(-inf, x0), +0.0 for -0.0."""
    r = np.logaddexp.accumulate(x, axis=d) if xp is np else accumulate(xp, "logaddexp", x, d)
    r += 0.0
    return r


@defop("logcumsumexp(Tensor self, int dim) -> Tensor", method=True, tags=(Tag.core, Tag.extern))
def logcumsumexp(xp, self, dim):
    d = wrap_dim(dim, self.ndim)
    dt = D.FROM_NP[self.dtype]
    out = dt if dt.category >= D.FLOATING else _state.default_dtype
    x = self.astype(opmath(out))
    if self.ndim == 0 or self.size == 0:
        return _fresh(xp, x, out.np)
    return _fresh(xp, _logcumsumexp(xp, x, d), out.np)


@logcumsumexp.def_meta
def _(self, dim):
    wrap_dim(dim, self.ndim)
    return TensorSpec(self.shape, self.dtype if self.dtype.category >= D.FLOATING else _state.default_dtype)


@logcumsumexp.def_derivative
def _(grad, self, result, dim):
    if self.ndim == 0:
        return grad
    d = wrap_dim(dim, self.ndim)

    def rev_lcse(y):
        return y.flip([d]).logcumsumexp(d).flip([d])
    where = EXPORTS["where"]

    def part(mask, g):     # log(g) where mask else -inf, with no log(0) in the graph
        return where(mask, where(mask, g, 1).log(), -math.inf) - result
    return ((self + rev_lcse(part(grad > 0, grad))).exp() -
            (self + rev_lcse(part(grad < 0, -grad))).exp())


@export("diff", method=True)
def diff(input, n=1, dim=-1, prepend=None, append=None):
    """n-th forward difference along `dim` (logical xor for bool), with optional prepend/append."""
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    dim = wrap_dim(dim, input.ndim)
    if prepend is not None or append is not None:
        parts = [t for t in (prepend, input, append) if t is not None]
        input = EXPORTS["cat"](parts, dim)
    for _ in range(n):
        size = input.shape[dim]
        if size == 0:
            break
        a, b = input.narrow(dim, 1, size - 1), input.narrow(dim, 0, size - 1)
        input = a.logical_xor(b) if input.dtype is D.bool else a - b
    return input


# ---- vmap batching rules ----------------------------------------------------------------------------
for _op in (cumsum, cumprod, cummax, cummin, logcumsumexp):
    _op.def_batching_rule(_batching.dim_rule(_op, "dim"))
