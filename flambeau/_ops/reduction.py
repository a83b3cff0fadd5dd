"""Reductions: sum/nansum, mean/nanmean, prod, var/std (and *_mean), max/min/amax/amin/aminmax,
argmax/argmin, logsumexp, norm, all/any, count_nonzero, and softmax/log_softmax/softmin. Scans
(cumsum, cumprod, cummax, cummin, logcumsumexp, diff) live in `scans`, sorting and selection in
`sorting`.

Half and bfloat16 inputs accumulate in float32; integer and bool sums produce int64, as PyTorch.
Reductions over `dim=None` or `dim=[]` reduce every dimension. Gradients of value-selecting
reductions scatter into the selected positions; amax/amin and full max/min share the gradient
evenly among ties, as PyTorch does.
"""
from __future__ import annotations

import builtins
import math
import warnings

import numpy as np

from .. import _dtype as D
from .. import _state
from .._tensor import Tensor
from .._dispatch import type_name, resize_out
from .._backends import triton_launch, is_cupy, array_namespaces
from ._registry import defop, export, EXPORTS, LINALG, TensorSpec, Tag
from ._helpers import wrap_dim, wrap_dims, opmath, PAR_MIN, parallel_blocks, direct_device, direct_call
from .views import _expand, unsqueeze
from .._backends import cpu_kernels, cuda_kernels
from . import _batching, _sharding



# ---- shared pieces -------------------------------------------------------------------------
def reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _dims(dim, ndim):
    """Reduced dims, wrapped; None or [] means all. A 0-dim tensor accepts dim 0/-1 and reduces nothing."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = wrap_dims(dim, ndim)
    return dims if ndim else ()


def _count(shape, dims):
    n = 1
    for d in dims:
        n *= shape[d]
    return n


def _keep(r, dims, keepdim, xp):
    """A keepdims=True result reshaped for `keepdim`."""
    return r if keepdim or not dims else xp.squeeze(r, axis=dims)


def _fresh(xp, r, npdt):
    r = xp.asarray(r)
    return r.astype(npdt) if r.dtype != npdt else xp.ascontiguousarray(r) if r.ndim else r.copy()


def _check_empty(name, shape, dims):
    for d in dims:
        if shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def expand_reduced(grad, shape, dim, keepdim):
    """Broadcast a reduction's gradient back to the input shape; the unsqueeze and expand kernels on the
    arrays when nothing observes dispatch (`direct_device`: a backward without create_graph)."""
    dev = direct_device(grad)
    if not keepdim and len(shape):
        for d in sorted(_dims(dim, len(shape))):
            grad = direct_call(unsqueeze, dev, grad._data, d) if dev is not None else grad.unsqueeze(d)
    return direct_call(_expand, dev, grad._data, tuple(shape)) if dev is not None else grad.expand(shape)


def select_backward(grad, shape, dim, indices, keepdim):
    """Gradient of a value-selecting reduction: `grad` scattered at `indices` along `dim`."""
    if len(shape) == 0:
        return grad.reshape(())
    d = wrap_dim(dim, len(shape))
    if not keepdim:
        grad, indices = grad.unsqueeze(d), indices.unsqueeze(d)
    return EXPORTS["zeros"](shape, dtype=grad.dtype, device=grad.device).scatter(d, indices, grad)


def evenly_backward(grad, self, result, dim, keepdim, nan_matches=True):
    """Gradient of amax-like reductions: shared evenly among the elements equal to the result.
    A NaN result: with `nan_matches` (max()/min()/median() of a whole tensor, PyTorch's
    evenly_distribute_backward) the NaN elements share it; without (amax/amin/aminmax, PyTorch's
    scale_grad_by_count) no element equals it and the whole group's gradient is NaN (g / 0 * 0)."""
    shape = self.shape
    g = expand_reduced(grad, shape, dim, keepdim)
    r = expand_reduced(result, shape, dim, keepdim)
    mask = self == r
    if nan_matches:
        mask = mask.logical_or(self.isnan().logical_and(r.isnan()))
    dims = _dims(dim, len(shape))
    cnt = mask.sum(list(dims), keepdim=True) if dims else mask.to(g.dtype)
    return g * mask / cnt if nan_matches else g / cnt * mask


def _float_only(name, dt):
    if dt.category < D.FLOATING:
        raise RuntimeError(f"{name}(): expected input to have floating point or complex dtype but got "
                           f"{type_name(dt)}")


# ---- sum, nansum, mean, nanmean, prod ------------------------------------------------------
def _sum_dtype(dt, dtype):
    if dtype is not None:
        return dtype
    return D.int64 if dt.category <= D.INTEGER else dt


def _sum_like(fn):
    def kernel(xp, self, dim=None, keepdim=False, *, dtype=None):
        dims = _dims(dim, self.ndim)
        out = _sum_dtype(D.FROM_NP[self.dtype], dtype)
        if dtype is not None and self.dtype != out.np:
            self = self.astype(out.np)
        r = fn(xp, self, dims, keepdim, opmath(out))
        if dims and xp is not np and type(r) is xp.ndarray:    # a CuPy reduction's result is a new array:
            return r if r.dtype == out.np else r.astype(out.np)   # no copy of it (a launch) is needed
        return _fresh(xp, r, out.np)
    return kernel


def _sum_meta(self, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), _sum_dtype(self.dtype, dtype))


@defop("sum.dim_IntList(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True, tags=(Tag.core, Tag.autocast_fp32_opt))
def sum(xp, self, dim=None, keepdim=False, *, dtype=None):
    if dim is None and dtype is None and not keepdim and xp is np and self.dtype in _FAST_FLOATS:
        return np.asarray(np.add.reduce(self, None))     # fast path: full float sum
    if xp is not np and is_cupy(xp) and (r := _cuda_column_sum(self, dim, keepdim, dtype)) is not None:
        return r
    return _sum_kernel(xp, self, dim, keepdim, dtype=dtype)


def _cuda_column_sum(x, dim, keepdim, dtype):
    """A sum over the leading dims of a CuPy array (a bias gradient) through the Triton column sum
    (`_backends.triton_sum`), else None."""
    dims = _dims(dim, x.ndim)
    k = len(dims)
    if not 0 < k < x.ndim or dims != tuple(range(k)) or not triton_launch.available():
        return None
    out = _sum_dtype(D.FROM_NP[x.dtype], dtype)
    rows = math.prod(x.shape[:k])
    triton_sum = _triton_sum[0] if _triton_sum else _import_triton_sum()
    if not triton_sum.supported(x, rows, out.np):
        return None
    r = triton_sum.column_sum(x, rows, out.np)
    shape = ((1,) * k if keepdim else ()) + tuple(x.shape[k:])
    return r if r.shape == shape else r.reshape(shape)         # (a bias gradient: (N,) already)


def cuda_rows_sum(x):
    """The column sums of a 2-D CuPy array in its dtype (a linear layer's bias gradient: `x.sum(0)`) through
    the Triton column sum, or None where `_cuda_column_sum` would not take it: what `sum`'s cuda kernel
    computes for dim 0, without the dispatch of its arguments."""
    if not is_cupy(array_namespaces.get("cuda")) or not triton_launch.available():
        return None
    triton_sum = _triton_sum[0] if _triton_sum else _import_triton_sum()
    rows = x.shape[0]
    if not triton_sum.supported(x, rows, x.dtype):
        return None
    return triton_sum.column_sum(x, rows, x.dtype)


_triton_sum: list = []      # the module, imported at its first use (`from` inside a function costs ~0.4 us a call)


def _import_triton_sum():
    from .._backends import triton_sum  # deferred: imports Triton, optional (cuda only)
    _triton_sum.append(triton_sum)
    return triton_sum


_FAST_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


_sum_kernel = _sum_like(lambda xp, x, dims, keep, acc: xp.sum(x, axis=dims, keepdims=keep, dtype=acc))
sum.def_meta(_sum_meta)


@sum.def_derivative
def _(grad, self_meta, dim, keepdim):
    return expand_reduced(grad, self_meta.shape, dim, keepdim)


@defop("nansum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True)
def nansum(xp, self, dim=None, keepdim=False, *, dtype=None):
    return _nansum_kernel(xp, self, dim, keepdim, dtype=dtype)


_nansum_kernel = _sum_like(lambda xp, x, dims, keep, acc: xp.nansum(x.astype(acc), axis=dims, keepdims=keep))
nansum.def_meta(_sum_meta)


@nansum.def_derivative
def _(grad, self, dim, keepdim):
    g = expand_reduced(grad, self.shape, dim, keepdim)
    return g * self.isnan().logical_not()


def _mean_dtype(dt, dtype):
    out = dtype if dtype is not None else dt
    if out.category < D.FLOATING:
        which = "Optional dtype" if dtype is not None else "Input dtype"
        raise RuntimeError(f"mean(): could not infer output dtype. {which} must be either a floating point "
                           f"or complex dtype. Got: {type_name(out)}")
    return out


@defop("mean.dim(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True)
def mean(xp, self, dim=None, keepdim=False, *, dtype=None):
    out = _mean_dtype(D.FROM_NP[self.dtype], dtype)
    dims = _dims(dim, self.ndim)
    n = _count(self.shape, dims)
    s = xp.sum(self.astype(opmath(out), copy=False), axis=dims, keepdims=keepdim)
    r = s / n if n else s * math.nan
    if dims and xp is not np and type(r) is xp.ndarray:       # a new CuPy array: no copy of it
        return r if r.dtype == out.np else r.astype(out.np)
    return _fresh(xp, r, out.np)


@mean.def_meta
def _(self, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), _mean_dtype(self.dtype, dtype))


@mean.def_derivative
def _(grad, self_meta, dim, keepdim):
    n = _count(self_meta.shape, _dims(dim, self_meta.ndim))
    return expand_reduced(grad, self_meta.shape, dim, keepdim) / n


@defop("nanmean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True)
def nanmean(xp, self, dim=None, keepdim=False, *, dtype=None):
    _float_only("nanmean", D.FROM_NP[self.dtype])
    out = dtype or D.FROM_NP[self.dtype]
    dims = _dims(dim, self.ndim)
    x = self.astype(opmath(out))
    ok = ~xp.isnan(x)
    s = xp.sum(xp.where(ok, x, 0), axis=dims, keepdims=keepdim)
    return _fresh(xp, s / xp.sum(ok, axis=dims, keepdims=keepdim), out.np)


@nanmean.def_meta
def _(self, dim=None, keepdim=False, *, dtype=None):
    _float_only("nanmean", self.dtype)
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), dtype or self.dtype)


@nanmean.def_derivative
def _(grad, self, dim, keepdim):
    ok = self.isnan().logical_not()
    dims = _dims(dim, self.ndim)
    cnt = ok.sum(list(dims), keepdim=True) if dims else ok.to(grad.dtype)
    return expand_reduced(grad, self.shape, dim, keepdim) * ok / cnt


@defop("prod.dim_int(Tensor self, int? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True, tags=(Tag.core, Tag.autocast_fp32_opt, Tag.cpu_autocast_fp32))
def prod(xp, self, dim=None, keepdim=False, *, dtype=None):
    return _prod_kernel(xp, self, dim, keepdim, dtype=dtype)


_prod_kernel = _sum_like(lambda xp, x, dims, keep, acc: xp.prod(x, axis=dims, keepdims=keep, dtype=acc))
prod.def_meta(_sum_meta)


def _others_matrix(x):
    """For x (..., n): m (..., n, n) with m[..., k, j] = x_j for j != k and 1 on the diagonal
    (selected, not multiplied by a 0/1 mask: an infinite x_k times 0 would be NaN)."""
    n = x.shape[-1]
    eye = EXPORTS["eye"](n, dtype=D.bool, device=x.device)
    return EXPORTS["where"](eye, 1, x.unsqueeze(-2))


def _prod_of_others(x):
    """For x (..., n): out[..., k] = the product of x[..., j] for j != k, from exclusive cumulative
    products taken from both ends (no division: zeros, infinities and NaNs stay exact, as PyTorch's
    prod_safe_zeros_backward)."""
    n = x.shape[-1]
    if n <= 1:
        return EXPORTS["ones_like"](x)
    ones = EXPORTS["ones_like"](x.narrow(-1, 0, 1))
    left = EXPORTS["cat"]([ones, x.narrow(-1, 0, n - 1)], -1).cumprod(-1)
    right = EXPORTS["cat"]([ones, x.flip(-1).narrow(-1, 0, n - 1)], -1).cumprod(-1).flip(-1)
    return left * right


@prod.def_derivative
def _(grad, self, result, dim, keepdim):
    if self.ndim == 0:
        return grad
    if dim is None:
        return _prod_backward(grad.reshape(()), self.reshape(-1), result.reshape(()), 0, False).reshape(self.shape)
    return _prod_backward(grad, self, result, dim, keepdim)


def _prod_backward(grad, x, result, dim, keepdim):
    """grad * result / x where x has no zero, else the product of the other elements. A traced
    input (meta: no data) computes both and selects, so tracing never reads a value."""
    g = expand_reduced(grad, x.shape, dim, keepdim)
    traced = x._device.type == "meta"          # a fake or meta tensor (a FakeTensor reports its fake device)
    if not traced and not builtins.bool((x == 0).any()):
        return g * (expand_reduced(result, x.shape, dim, keepdim) / x).conj()
    d = wrap_dim(dim, x.ndim)
    safe = g * _prod_of_others(x.transpose(d, -1)).transpose(d, -1).conj()
    if not traced:
        return safe
    by_division = g * (expand_reduced(result, x.shape, dim, keepdim) / x).conj()
    return safe.where((x == 0).any(), by_division)


# ---- var / std -----------------------------------------------------------------------------
def _var_dtype(dt):
    if dt.category < D.FLOATING:
        raise RuntimeError("std and var only support floating point and complex dtypes")
    return dt.to_real() if dt.category == D.COMPLEX else dt


def _var_kernel(xp, x, dims, correction, keepdim):
    out = _var_dtype(D.FROM_NP[x.dtype])
    c = 1 if correction is None else correction
    x = x.astype(opmath(D.FROM_NP[x.dtype]))
    n = _count(x.shape, dims)
    m = xp.sum(x, axis=dims, keepdims=True) / n if n else xp.sum(x, axis=dims, keepdims=True) * math.nan
    d = x - m
    sq = (d.real * d.real + d.imag * d.imag) if d.dtype.kind == "c" else d * d
    v = xp.sum(sq, axis=dims, keepdims=keepdim) / builtins.max(n - c, 0)
    return v, (m if keepdim or not dims else xp.squeeze(m, axis=dims)), out


def _var_meta(self, dim=None, *, correction=None, keepdim=False):
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), _var_dtype(self.dtype))


@defop("var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
       function=False)
def _var(xp, self, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var_kernel(xp, self, _dims(dim, self.ndim), correction, keepdim)
    return _fresh(xp, v, out.np)


_var.def_meta(_var_meta)


def _var_grad(grad, self, dim, correction, keepdim):
    dims = _dims(dim, self.ndim)
    n = _count(self.shape, dims) - (1 if correction is None else correction)
    g = expand_reduced(grad, self.shape, dim, keepdim)
    centered = self - (self.mean(list(dims), keepdim=True) if dims else self)
    if not n > 0:
        return g * centered * math.inf
    if isinstance(n, int):
        return g * centered * (2.0 / n)
    return g * centered * 2.0 / n             # a symbolic count (dynamic=True) divides the tensor


@_var.def_derivative
def _(grad, self, dim, correction, keepdim):
    return _var_grad(grad, self, dim, correction, keepdim)


@defop("std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
       function=False)
def _std(xp, self, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var_kernel(xp, self, _dims(dim, self.ndim), correction, keepdim)
    return _fresh(xp, xp.sqrt(v), out.np)


_std.def_meta(_var_meta)


def _std_grad(grad, self, result, dim, correction, keepdim):
    r = expand_reduced(result, self.shape, dim, keepdim)
    g = expand_reduced(grad, self.shape, dim, keepdim)
    g = EXPORTS["where"](r == 0, 0, g / (2 * r))
    return _var_grad(g, self, dim, correction, True)


@_std.def_derivative
def _(grad, self, result, dim, correction, keepdim):
    return _std_grad(grad, self, result, dim, correction, keepdim)


@defop("var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) "
       "-> (Tensor, Tensor)", function=False)
def _var_mean(xp, self, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var_kernel(xp, self, _dims(dim, self.ndim), correction, keepdim)
    return _fresh(xp, v, out.np), _fresh(xp, m, self.dtype)


@_var_mean.def_meta
def _(self, dim=None, *, correction=None, keepdim=False):
    v = _var_meta(self, dim, correction=correction, keepdim=keepdim)
    return v, TensorSpec(v.shape, self.dtype)


def _mean_part(gm, self_shape, dim, keepdim):
    n = _count(self_shape, _dims(dim, len(self_shape)))
    return expand_reduced(gm, self_shape, dim, keepdim) / n


@_var_mean.def_derivative
def _(grad, self, dim, correction, keepdim):
    gv, gm = grad
    return _var_grad(gv, self, dim, correction, keepdim) + _mean_part(gm, self.shape, dim, keepdim)


@defop("std_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) "
       "-> (Tensor, Tensor)", function=False)
def _std_mean(xp, self, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var_kernel(xp, self, _dims(dim, self.ndim), correction, keepdim)
    return _fresh(xp, xp.sqrt(v), out.np), _fresh(xp, m, self.dtype)


_std_mean.def_meta(_var_mean.meta)


@_std_mean.def_derivative
def _(grad, self, result, dim, correction, keepdim):
    gs, gm = grad
    return (_std_grad(gs, self, result[0], dim, correction, keepdim) +
            _mean_part(gm, self.shape, dim, keepdim))


def _var_args(name, input, args, kwargs):
    """Parse torch.var's overloads: (dim, unbiased, keepdim), (unbiased), correction=, keepdim=."""
    dim, unbiased, keepdim = None, None, kwargs.pop("keepdim", False)
    correction = kwargs.pop("correction", None)
    args = list(args)
    if args and isinstance(args[0], builtins.bool):
        unbiased = args.pop(0)
    elif args:
        dim = args.pop(0)
        if args:
            unbiased = args.pop(0)
        if args:
            keepdim = args.pop(0)
    dim = kwargs.pop("dim", dim)
    unbiased = kwargs.pop("unbiased", unbiased)
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument '{next(iter(kwargs))}'")
    if unbiased is not None:
        if correction is not None:
            raise RuntimeError(f"{name}: can't specify both unbiased and correction")
        correction = 1 if unbiased else 0
    return dim, correction, keepdim


def _var_export(name, op, method):
    def fn(input, *args, out=None, **kwargs):
        dim, correction, keepdim = _var_args(name, input, args, kwargs)
        if out is not None:
            return op(input, dim, correction=correction, keepdim=keepdim, out=out)
        return op(input, dim, correction=correction, keepdim=keepdim)
    fn.__name__ = name
    export(name, method=method)(fn)
    return fn


var = _var_export("var", _var, True)
std = _var_export("std", _std, True)
var_mean = _var_export("var_mean", _var_mean, False)
std_mean = _var_export("std_mean", _std_mean, False)


# ---- max / min / amax / amin / aminmax / argmax / argmin --------------------------------------
def _extreme_all(name, pick):
    @defop(f"{name}(Tensor self) -> Tensor", function=False)
    def op(xp, self):
        if self.size == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        _no_complex(name, self)
        return _fresh(xp, pick(xp, self), self.dtype)

    @op.def_meta
    def _(self):
        if self.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        return TensorSpec((), self.dtype)

    @op.def_derivative
    def _(grad, self, result):
        return evenly_backward(grad, self, result, None, False)
    return op


def _no_complex(name, a):
    if a.dtype.kind == "c":
        raise RuntimeError(f"{name}(): does not support complex input")


def _extreme_dim(name, argfn):
    @defop(f"{name}.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
           function=False)
    def op(xp, self, dim, keepdim=False):
        d = wrap_dim(dim, self.ndim)
        _no_complex(name, self)
        if self.ndim == 0:
            return self.copy(), xp.zeros((), dtype=np.int64)
        _check_empty(name, self.shape, (d,))
        x = self.astype(np.float32) if D.FROM_NP[self.dtype] in D.LOW_PRECISION else self
        idx = argfn(xp)(x, axis=d, keepdims=True).astype(np.int64)
        vals = xp.take_along_axis(self, idx, axis=d)
        return _keep(vals, (d,), keepdim, xp).copy(), _keep(idx, (d,), keepdim, xp).copy()

    @op.def_meta
    def _(self, dim, keepdim=False):
        d = wrap_dim(dim, self.ndim)
        dims = (d,) if self.ndim else ()
        _check_empty(name, self.shape, dims)
        shape = reduced_shape(self.shape, dims, keepdim)
        return TensorSpec(shape, self.dtype), TensorSpec(shape, D.int64)

    @op.def_derivative
    def _extreme_dim_derivative(grad, self_meta, dim, keepdim, result1):
        """Saves the indices (`result1`) only, as PyTorch: an in-place op on the values afterwards is
        no error (fuzzer seed 2312)."""
        return select_backward(grad[0], self_meta.shape, dim, result1, keepdim)
    return op


_max_all = _extreme_all("max", lambda xp, a: xp.max(a))
_min_all = _extreme_all("min", lambda xp, a: xp.min(a))
_max_dim = _extreme_dim("max", lambda xp: xp.argmax)
_min_dim = _extreme_dim("min", lambda xp: xp.argmin)


def _extreme_export(name, all_op, dim_op, pairwise):
    def fn(input, dim=None, keepdim=False, *, other=None, out=None):
        if isinstance(dim, Tensor) or other is not None:
            o = dim if isinstance(dim, Tensor) else other
            f = EXPORTS[pairwise]
            return f(input, o) if out is None else f(input, o, out=out)
        if dim is None:
            return all_op(input) if out is None else all_op(input, out=out)
        return dim_op(input, dim, keepdim) if out is None else dim_op(input, dim, keepdim, out=out)
    fn.__name__ = name
    export(name, method=True)(fn)
    return fn


max = _extreme_export("max", _max_all, _max_dim, "maximum")
min = _extreme_export("min", _min_all, _min_dim, "minimum")


def _amax_like(name, fn, *, tags=()):
    @defop(f"{name}(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", method=True, tags=tags)
    def op(xp, self, dim=(), keepdim=False):
        dims = _dims(dim, self.ndim)
        _check_empty(name, self.shape, dims)
        _no_complex(name, self)
        return _fresh(xp, fn(xp)(self, axis=dims, keepdims=keepdim), self.dtype)

    @op.def_meta
    def _(self, dim=(), keepdim=False):
        dims = _dims(dim, self.ndim)
        _check_empty(name, self.shape, dims)
        return TensorSpec(reduced_shape(self.shape, dims, keepdim), self.dtype)

    @op.def_derivative
    def _(grad, self, result, dim, keepdim):
        return evenly_backward(grad, self, result, dim, keepdim, nan_matches=False)
    return op


amax = _amax_like("amax", lambda xp: xp.max, tags=(Tag.core,))
amin = _amax_like("amin", lambda xp: xp.min, tags=(Tag.core,))


@defop("aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)", method=True)
def aminmax(xp, self, *, dim=None, keepdim=False):
    dims = _aminmax_dims(self.shape, dim)
    return (_fresh(xp, xp.min(self, axis=dims, keepdims=keepdim), self.dtype),
            _fresh(xp, xp.max(self, axis=dims, keepdims=keepdim), self.dtype))


def _aminmax_dims(shape, dim):
    dims = _dims(dim, len(shape))
    if builtins.any(shape[d] == 0 for d in dims) or (dim is None and 0 in shape):
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has "
                           "no identity.")
    return dims


@aminmax.def_meta
def _(self, *, dim=None, keepdim=False):
    dims = _aminmax_dims(self.shape, dim)
    s = TensorSpec(reduced_shape(self.shape, dims, keepdim), self.dtype)
    return s, s


@aminmax.def_derivative
def _(grad, self, result, dim, keepdim):
    return (evenly_backward(grad[0], self, result[0], dim, keepdim, nan_matches=False) +
            evenly_backward(grad[1], self, result[1], dim, keepdim, nan_matches=False))


def _arg_like(name, fn, *, tags=()):
    @defop(f"{name}(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", method=True, tags=tags)
    def op(xp, self, dim=None, keepdim=False):
        _arg_check(name, self.dtype, self.shape, dim)
        x = self.astype(np.float32) if D.FROM_NP[self.dtype] in D.LOW_PRECISION else self
        if dim is None or self.ndim == 0:
            r = fn(xp)(x.reshape(-1)) if self.size else xp.zeros((), np.int64)
            return xp.full((1,) * self.ndim if keepdim else (), r, dtype=np.int64)
        d = wrap_dim(dim, self.ndim)
        return fn(xp)(x, axis=d, keepdims=keepdim).astype(np.int64)

    @op.def_meta
    def _(self, dim=None, keepdim=False):
        _arg_check(name, self.dtype, self.shape, dim)
        if dim is None:
            return TensorSpec((1,) * self.ndim if keepdim else (), D.int64)
        dims = _dims(dim, self.ndim)
        return TensorSpec(reduced_shape(self.shape, dims, keepdim), D.int64)
    return op


def _arg_check(name, dt, shape, dim):
    if isinstance(dt, np.dtype):
        dt = D.FROM_NP[dt]
    if dt is D.bool:
        raise RuntimeError(f"{name}(): does not support bool input")
    if dt.category == D.COMPLEX:
        raise RuntimeError(f"{name}(): does not support complex input")
    if dim is None:
        if 0 in shape:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        return
    dims = _dims(dim, len(shape))
    _check_empty(name, shape, dims)


argmax = _arg_like("argmax", lambda xp: xp.argmax, tags=(Tag.core, Tag.nondifferentiable))
argmin = _arg_like("argmin", lambda xp: xp.argmin, tags=(Tag.core, Tag.nondifferentiable))


# ---- logsumexp, norm -----------------------------------------------------------------------
@defop("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", method=True, tags=(Tag.autocast_fp32,))
def logsumexp(xp, self, dim, keepdim=False):
    dt = D.FROM_NP[self.dtype]
    out = dt if dt.category >= D.FLOATING else _state.default_dtype
    x = self.astype(opmath(out))
    dims = _dims(dim, self.ndim)
    if x.size:
        m = xp.max(x, axis=dims, keepdims=True)
        m = xp.where(xp.isinf(m), 0, m)
    else:
        m = xp.zeros(reduced_shape(x.shape, dims, True), x.dtype)
    r = xp.log(xp.sum(xp.exp(x - m), axis=dims, keepdims=True)) + m
    return _fresh(xp, _keep(r, dims, keepdim, xp), out.np)


@logsumexp.def_meta
def _(self, dim, keepdim=False):
    dims = _dims(dim, self.ndim)
    dt = self.dtype if self.dtype.category >= D.FLOATING else _state.default_dtype
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), dt)


@logsumexp.def_derivative
def _(grad, self, result, dim, keepdim):
    g = expand_reduced(grad, self.shape, dim, keepdim)
    return g * (self - expand_reduced(result, self.shape, dim, keepdim)).exp()


def _norm_dtype(dt, dtype):
    src = dtype if dtype is not None else dt
    if dt.category < D.FLOATING:
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. "
                           f"Got {type_name(dt)}")
    return src.to_real() if src.category == D.COMPLEX else src


@defop("norm.ScalarOpt_dim_dtype(Tensor self, Scalar? p=2, int[1] dim=[], bool keepdim=False, *, "
       "ScalarType? dtype=None) -> Tensor", function=False, tags=(Tag.autocast_fp32,))
def _norm(xp, self, p=2, dim=(), keepdim=False, *, dtype=None):
    out = _norm_dtype(D.FROM_NP[self.dtype], dtype)
    p = 2 if p is None else p
    dims = _dims(dim, self.ndim)
    x = self.astype(dtype.np) if dtype is not None else self
    a = xp.abs(x.astype(opmath(D.FROM_NP[x.dtype])))
    if math.isinf(p):
        if builtins.any(self.shape[d] == 0 for d in dims) or (not dims and self.size == 0):
            raise RuntimeError("linalg.vector_norm cannot compute the inf norm on an empty tensor because the "
                               "operation does not have an identity")
        r = (xp.max if p > 0 else xp.min)(a, axis=dims, keepdims=keepdim)
    elif p == 0:
        r = xp.sum(a != 0, axis=dims, keepdims=keepdim).astype(a.dtype)
    elif p == 1:
        r = xp.sum(a, axis=dims, keepdims=keepdim)
    elif p == 2:
        r = xp.sqrt(xp.sum(a * a, axis=dims, keepdims=keepdim))
    else:
        r = xp.sum(a ** p, axis=dims, keepdims=keepdim) ** (1.0 / p)
    return _fresh(xp, r, out.np)


@_norm.def_meta
def _(self, p=2, dim=(), keepdim=False, *, dtype=None):
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), _norm_dtype(self.dtype, dtype))


@_norm.def_derivative
def _(grad, self, result, p, dim, keepdim):
    p = 2 if p is None else p
    where = EXPORTS["where"]
    g = expand_reduced(grad, self.shape, dim, keepdim)
    r = expand_reduced(result, self.shape, dim, keepdim)
    if p == 0:
        return g * 0
    if p == 1:
        return g * self.sgn()
    if math.isinf(p):
        mask = self.abs() == r
        dims = _dims(dim, self.ndim)
        cnt = mask.sum(list(dims), keepdim=True) if dims else mask.to(g.dtype)
        return g * self.sgn() * mask / cnt
    if p == 2:
        return self * where(r == 0, 0, g / r)
    return self * self.abs().pow(p - 2) * where(r == 0, 0, g / r.pow(p - 1))


@export("norm", method=True)
def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    """torch.norm: vector p-norms over `dim` (all dims by default); 'fro' is the 2-norm, 'nuc' the
    nuclear norm of matrices (through linalg.matrix_norm)."""
    if isinstance(dim, int):
        dim = [dim]
    if isinstance(p, str):
        if p == "nuc":
            r = LINALG["matrix_norm"](input, "nuc", dim=tuple(dim) if dim is not None else (-2, -1),
                                      keepdim=keepdim, dtype=dtype)
            return r if out is None else _into(out, r)
        if p != "fro":
            raise RuntimeError(f"norm(): unsupported norm type {p!r}")
        p = 2
    kw = {"dtype": dtype} if out is None else {"dtype": dtype, "out": out}
    return _norm(input, p, [] if dim is None else list(dim), keepdim, **kw)


def _into(out, r):
    resize_out(out, r)
    return out


# ---- all / any / count_nonzero -------------------------------------------------------------
def _logical_reduce(name, fn, *, tags=()):
    @defop(f"{name}.dims(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", method=True, tags=tags)
    def op(xp, self, dim=None, keepdim=False):
        dims = _dims(dim, self.ndim)
        r = fn(xp)(self != 0, axis=dims, keepdims=keepdim)
        return _fresh(xp, r, np.dtype(np.uint8) if self.dtype == np.uint8 else np.dtype(bool))

    @op.def_meta
    def _(self, dim=None, keepdim=False):
        dims = _dims(dim, self.ndim)
        return TensorSpec(reduced_shape(self.shape, dims, keepdim), D.uint8 if self.dtype is D.uint8 else D.bool)
    return op


all = _logical_reduce("all", lambda xp: xp.all, tags=(Tag.core, Tag.nondifferentiable))
any = _logical_reduce("any", lambda xp: xp.any, tags=(Tag.core, Tag.nondifferentiable))


@defop("count_nonzero.dim_IntList(Tensor self, int[1]? dim=None) -> Tensor", method=True, tags=(Tag.nondifferentiable,))
def count_nonzero(xp, self, dim=None):
    dims = _dims(dim, self.ndim)
    return _fresh(xp, xp.sum(self != 0, axis=dims), np.dtype(np.int64))


@count_nonzero.def_meta
def _(self, dim=None):
    return TensorSpec(reduced_shape(self.shape, _dims(dim, self.ndim), False), D.int64)


# ---- softmax family ------------------------------------------------------------------------
def _softmax_dtype(name, dt, dtype, numel):
    """The result dtype; an integer or bool one raises as PyTorch's kernel, unless there are no elements
    (PyTorch returns the empty tensor before dispatching on the dtype)."""
    out = dtype if dtype is not None else dt
    if out.category < D.FLOATING and numel != 0:
        raise NotImplementedError(f'"{name}_lastdim_kernel_impl" not implemented for \'{type_name(out)}\'')
    return out


def _softmax_rows(xp, x, r, d, log):
    """softmax/log_softmax of `x` along `d` into `r` (same shape), with one temporary per pass."""
    m = xp.max(x, axis=d, keepdims=True)
    xp.subtract(x, m, out=r)
    if log:
        e = xp.exp(r)
        r -= xp.log(xp.sum(e, axis=d, keepdims=True))
    else:
        xp.exp(r, out=r)
        r /= xp.sum(r, axis=d, keepdims=True)


def _softmax_kernel(name, log):
    def kernel(xp, self, dim, dtype=None):
        out = _softmax_dtype(name, D.FROM_NP[self.dtype], dtype, self.size)
        d = wrap_dim(dim, self.ndim)
        x = self.astype(out.np) if self.dtype != out.np else self
        x = x.astype(opmath(out), copy=False)
        if self.ndim == 0:
            return _fresh(xp, x - x if log else x * 0 + 1, out.np)     # log_softmax(-1.0) is +0.0
        if x.size == 0:
            return _fresh(xp, x, out.np)
        if xp is np and d == x.ndim - 1 and x.flags.c_contiguous:
            r = cpu_kernels.softmax_lastdim(x, log)            # one fused C++ pass per row
            if r is not None:
                return _fresh(xp, r, out.np)
        if xp is np and d == x.ndim - 1 and x.flags.c_contiguous and x.size >= PAR_MIN:
            rows = x.reshape(-1, x.shape[-1])            # rows are independent: split them over threads
            r = np.empty(rows.shape, dtype=x.dtype)
            step = builtins.max(1, (1 << 18) // rows.shape[1])   # ~1 MB chunks: every pass stays in cache

            def block(a, b):
                for c in range(a, b, step):
                    e = builtins.min(b, c + step)
                    _softmax_rows(np, rows[c:e], r[c:e], 1, log)
            parallel_blocks(block, rows.shape[0])
            return _fresh(xp, r.reshape(x.shape), out.np)
        if xp is not np and d == x.ndim - 1 and getattr(xp, "__name__", "") == "cupy":
            r = cuda_kernels.softmax_lastdim(xp.ascontiguousarray(x), log)     # one fused kernel
            if r is not None:
                return _fresh(xp, r, out.np)
        r = xp.empty(x.shape, dtype=x.dtype)
        _softmax_rows(xp, x, r, d, log)
        return _fresh(xp, r, out.np)
    return kernel


def _softmax_meta(name):
    def meta(self, dim, dtype=None):
        wrap_dim(dim, self.ndim)
        return TensorSpec(self.shape, _softmax_dtype(name, self.dtype, dtype, self.numel()))
    return meta


softmax = defop("softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", method=True,
                tags=(Tag.autocast_fp32_opt,))(
    _softmax_kernel("softmax", False))
softmax.def_meta(_softmax_meta("softmax"))
log_softmax = defop("log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", method=True,
                    tags=(Tag.autocast_fp32_opt,))(
    _softmax_kernel("log_softmax", True))
log_softmax.def_meta(_softmax_meta("log_softmax"))


@softmax.def_derivative
def _(grad, result, dim):
    return result * (grad - (grad * result).sum(dim, keepdim=True))


@log_softmax.def_derivative
def _(grad, result, dim):
    return grad - result.exp() * grad.sum(dim, keepdim=True)


def _implicit_dim(name, ndim, stacklevel):
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include "
                  "dim=X as an argument.", UserWarning, stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


@export("softmax", function=False, namespace="nn.functional")
def _f_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _implicit_dim("softmax", input.ndim, _stacklevel)
    return softmax(input, dim, dtype)


@export("log_softmax", function=False, namespace="nn.functional")
def _f_log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _implicit_dim("log_softmax", input.ndim, _stacklevel)
    return log_softmax(input, dim, dtype)


@export("softmin", function=False, namespace="nn.functional")
def _f_softmin(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _implicit_dim("softmin", input.ndim, _stacklevel)
    return softmax(-input, dim, dtype)


# ---- vmap: reductions over logical dimensions (shifted past the batch dimension) --------------------
for _op in (sum, nansum, mean, nanmean, _var, _std, _var_mean, _std_mean, amax, amin, logsumexp, _norm, all, any,
            count_nonzero):
    _op.def_batching_rule(_batching.dim_rule(_op, "dim", all_when_none=True, scalar_examples=True))
for _op in (prod, argmax, argmin, aminmax, _max_dim, _min_dim, softmax, log_softmax):
    _op.def_batching_rule(_batching.dim_rule(_op, "dim", scalar_examples=True))
_max_all.def_batching_rule(_batching.full_reduction_rule(_max_all, amax))
_min_all.def_batching_rule(_batching.full_reduction_rule(_min_all, amin))


# ---- DTensor sharding rules -------------------------------------------------------------------------
sum.def_sharding_rule(_sharding.reduction_rule("sum", linear=True))
mean.def_sharding_rule(_sharding.reduction_rule("sum", linear=True, mean=True))
amax.def_sharding_rule(_sharding.reduction_rule("max"))
amin.def_sharding_rule(_sharding.reduction_rule("min"))
softmax.def_sharding_rule(_sharding.softmax_rule)
log_softmax.def_sharding_rule(_sharding.softmax_rule)
