"""Decompositions of activations (and their `*_backward` ops), normalisation (layer/rms/batch/group
norm forward and backward), dropout and the matrix-product composites (linear, matmul, addmm, ...).

Activations compute in float32 for half/bfloat16 inputs and cast back, as their kernels do.
batch_norm's running statistics are written with `copy_` into the buffers, which functionalization
turns into extra outputs.
"""
from __future__ import annotations

import math

from .. import _dtype as D
from .._ops._helpers import result_type, broadcast_shapes
from ._table import aten, register_decomposition, maximum, minimum, to, upcast, compute_dtype, full, reshape, wrap
from .._dispatch import type_name
from .._ops.norm_loss import _ln_check, _bn_check, _gn_check
from .decompositions_pointwise import _finfo


def _float_check(name, *xs):
    dt = result_type(*xs)
    if dt.category < D.FLOATING:
        raise RuntimeError(f"\"{name}\" not implemented for '{type_name(dt)}'")
    return dt


def _pointwise(op, ints=False, nin=1):
    """Register `fn(*upcast tensors, *params)` as the decomposition of `op`: checks the dtype, computes in the
    op-math dtype and casts to the op's result dtype."""
    def wrap_fn(fn):
        def decomposition(*args, **kwargs):
            ins, params = args[:nin], args[nin:]
            dt = result_type(*ins) if ints else _float_check(op.__name__, *ins)
            if dt.category < D.INTEGER:
                _float_check(op.name, *ins)
            cd = compute_dtype(dt)
            ups = [to(x, cd) if hasattr(x, "dtype") else x for x in ins]
            return to(fn(*ups, *params, **kwargs), dt)
        decomposition.__name__ = fn.__name__
        register_decomposition(op)(decomposition)
        return fn
    return wrap_fn


def _backward(op, ints=False, nin=1):
    """Like `_pointwise` for `name_backward(grad, *inputs, *params)`: the dtype is the inputs'."""
    def wrap_fn(fn):
        def decomposition(grad, *args, **kwargs):
            ins, params = args[:nin], args[nin:]
            dt = result_type(*ins) if ints else _float_check(op.__name__.split("_backward")[0], *ins)
            cd = compute_dtype(dt)
            ups = [to(x, cd) if hasattr(x, "dtype") else x for x in ins]
            r = fn(to(grad, cd), *ups, *params, **kwargs)
            return to(r, dt) if nin == 1 else tuple(None if g is None else to(g, dt) for g in r)
        decomposition.__name__ = fn.__name__
        register_decomposition(op)(decomposition)
        return fn
    return wrap_fn


def softplus_stable(x):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return aten.add(maximum(x, 0), aten.log1p(aten.exp(aten.neg(aten.abs(x)))))


# ---- activations ---------------------------------------------------------------------------------
@_pointwise(aten.relu, ints=True)
def relu(x):
    return aten.where(aten.lt(x, 0), 0, x)          # relu(-0.0) is -0.0, as PyTorch's


@_backward(aten.relu_backward, ints=True)
def relu_backward(g, x):
    return aten.where(aten.le(x, 0), 0, g)          # a select: an inf gradient where x <= 0 gives 0


@_pointwise(aten.threshold, ints=True)
def threshold(x, th, value):
    return aten.where(aten.le(x, th), value, x)   # NaN kept


@_backward(aten.threshold_backward, ints=True)
def threshold_backward(g, x, th, value):
    return aten.where(aten.le(x, th), 0, g)


@_pointwise(aten.leaky_relu)
def leaky_relu(x, negative_slope=0.01):
    return aten.where(aten.gt(x, 0), x, aten.mul(x, negative_slope))


@_backward(aten.leaky_relu_backward)
def leaky_relu_backward(g, x, negative_slope=0.01):
    return aten.where(aten.gt(x, 0), g, aten.mul(g, negative_slope))


@_pointwise(aten.elu)
def elu(x, alpha=1, scale=1, input_scale=1):
    neg = aten.mul(aten.expm1(aten.mul(aten.where(aten.gt(x, 0), 0, x), input_scale)), alpha)
    return aten.mul(aten.where(aten.gt(x, 0), x, neg), scale)


@_backward(aten.elu_backward)
def elu_backward(g, x, alpha=1, scale=1, input_scale=1):
    d = aten.mul(aten.exp(aten.mul(minimum(x, 0), input_scale)), alpha * input_scale)
    return aten.mul(aten.mul(g, scale), aten.where(aten.gt(x, 0), 1.0, d))


_SQRT1_2 = 1 / math.sqrt(2)
_K = math.sqrt(2 / math.pi)


def _gelu_tanh_inner(x):
    return aten.mul(aten.add(x, aten.mul(aten.mul(aten.mul(x, x), x), 0.044715)), _K)


@_pointwise(aten.gelu)
def gelu(x, approximate="none"):
    if approximate == "tanh":
        return aten.mul(aten.mul(x, 0.5), aten.add(aten.tanh(_gelu_tanh_inner(x)), 1))
    return aten.mul(aten.mul(x, 0.5), aten.add(aten.erf(aten.mul(x, _SQRT1_2)), 1))


@_backward(aten.gelu_backward)
def gelu_backward(g, x, approximate="none"):
    if approximate == "tanh":
        t = aten.tanh(_gelu_tanh_inner(x))
        left = aten.mul(aten.add(t, 1), 0.5)
        dinner = aten.mul(aten.add(aten.mul(aten.mul(x, x), 3 * 0.044715), 1), _K)
        right = aten.mul(aten.mul(aten.mul(x, 0.5), aten.sub(1, aten.mul(t, t))), dinner)
        return aten.mul(g, aten.add(left, right))
    cdf = aten.mul(aten.add(aten.erf(aten.mul(x, _SQRT1_2)), 1), 0.5)
    pdf = aten.mul(aten.exp(aten.mul(aten.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return aten.mul(g, aten.add(cdf, aten.mul(x, pdf)))


@_pointwise(aten.silu)
def silu(x):
    return aten.div(x, aten.add(aten.exp(aten.neg(x)), 1))       # as eager's: one rounding less than x * sigmoid(x)


@_backward(aten.silu_backward)
def silu_backward(g, x):
    s = aten.sigmoid(x)
    return aten.mul(aten.mul(g, s), aten.add(aten.mul(x, aten.sub(1, s)), 1))


@_pointwise(aten.mish)
def mish(x):
    return aten.mul(x, aten.tanh(softplus_stable(x)))


@_backward(aten.mish_backward)
def mish_backward(g, x):
    t = aten.tanh(softplus_stable(x))
    return aten.mul(g, aten.add(t, aten.mul(aten.mul(x, aten.sigmoid(x)), aten.sub(1, aten.mul(t, t)))))


@_pointwise(aten.hardtanh)
def hardtanh(x, min_val=-1, max_val=1):
    x = aten.where(aten.lt(x, min_val), min_val, x)         # a tie keeps x (+-0.0), as clamp
    return aten.where(aten.gt(x, max_val), max_val, x)


@_backward(aten.hardtanh_backward)
def hardtanh_backward(g, x, min_val=-1, max_val=1):
    return aten.where(aten.logical_or(aten.le(x, min_val), aten.ge(x, max_val)), 0, g)      # NaN x passes g


@_pointwise(aten.hardsigmoid)
def hardsigmoid(x):
    return minimum(maximum(aten.add(aten.div(x, 6), 0.5), 0), 1)


@_backward(aten.hardsigmoid_backward)
def hardsigmoid_backward(g, x):
    return aten.where(aten.logical_and(aten.gt(x, -3), aten.lt(x, 3)), aten.div(g, 6), 0)


@_pointwise(aten.hardswish)
def hardswish(x):
    return aten.div(aten.mul(x, minimum(maximum(aten.add(x, 3), 0), 6)), 6)


@_backward(aten.hardswish_backward)
def hardswish_backward(g, x):
    mid = aten.mul(g, aten.add(aten.div(x, 3), 0.5))
    return aten.where(aten.le(x, -3), 0.0, aten.where(aten.lt(x, 3), mid, g))     # 0 at -3, g at 3, as ATen


@_pointwise(aten.softplus)
def softplus(x, beta=1, threshold=20):
    bx = aten.mul(x, beta)
    return aten.where(aten.gt(bx, threshold), x, aten.div(softplus_stable(bx), beta))


@_backward(aten.softplus_backward)
def softplus_backward(g, x, beta=1, threshold=20):
    bx = aten.mul(x, beta)
    return aten.where(aten.gt(bx, threshold), g, aten.mul(g, aten.sigmoid(bx)))


@_pointwise(aten.softshrink)
def softshrink(x, lambd=0.5):
    """0 (+0.0) on [-lambd, lambd], NaN kept: PyTorch's formula, CUDA kernel and CPU vector blocks. Its
    CPU scalar loop (a vector block's tail, strided inputs) writes x * 0, -0.0 for a negative x: a sign
    that depends on where an element falls, not a semantic (tests/fuzz/check.py follows the formula)."""
    return aten.where(aten.le(aten.abs(x), lambd), 0.0,
                      aten.where(aten.gt(x, lambd), aten.sub(x, lambd), aten.add(x, lambd)))


@_backward(aten.softshrink_backward)
def softshrink_backward(g, x, lambd=0.5):
    return aten.where(aten.logical_and(aten.ge(x, -lambd), aten.le(x, lambd)), 0, g)


@_pointwise(aten.hardshrink)
def hardshrink(x, lambd=0.5):
    return aten.where(aten.logical_and(aten.ge(x, -lambd), aten.le(x, lambd)), 0.0, x)   # NaN kept


@_backward(aten.hardshrink_backward)
def hardshrink_backward(g, x, lambd=0.5):
    return aten.where(aten.logical_and(aten.ge(x, -lambd), aten.le(x, lambd)), 0, g)


@_pointwise(aten.log_sigmoid)
def log_sigmoid(x):
    return aten.sub(minimum(x, 0), aten.log1p(aten.exp(aten.neg(aten.abs(x)))))    # +0.0 at inf


@_backward(aten.log_sigmoid_backward)
def log_sigmoid_backward(g, x):
    return aten.mul(g, aten.sigmoid(aten.neg(x)))


def _halves(x, dim):
    if x.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    d = wrap(dim, x.ndim)
    n = x.shape[d]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    return d, aten.slice(x, d, 0, n // 2), aten.slice(x, d, n // 2, n)


@register_decomposition(aten.glu)
def glu(self, dim=-1):
    dt = _float_check("glu", self)
    d, a, b = _halves(upcast(self), dim)
    return to(aten.mul(a, aten.sigmoid(b)), dt)


@register_decomposition(aten.glu_backward)
def glu_backward(grad_output, self, dim):
    dt = _float_check("glu", self)
    d, a, b = _halves(upcast(self), dim)
    g = upcast(grad_output)
    s = aten.sigmoid(b)
    gs = aten.mul(g, s)
    return to(aten.cat([gs, aten.mul(aten.mul(gs, a), aten.sub(1, s))], d), dt)


def _prelu_w(x, w):
    if w.ndim > 1 or (w.numel() != 1 and (x.ndim < 2 or w.numel() != x.shape[1])):
        return None
    if w.numel() == 1 or x.ndim < 2:
        return reshape(w, ())
    return reshape(w, (-1,) + (1,) * (x.ndim - 2))


@register_decomposition(aten.prelu)
def prelu(self, weight):
    dt = _float_check("prelu", self, weight)
    x, w = to(self, compute_dtype(dt)), to(weight, compute_dtype(dt))
    wb = _prelu_w(x, w)
    if wb is None:
        return NotImplemented
    return to(aten.where(aten.gt(x, 0), x, aten.mul(wb, x)), dt)


@register_decomposition(aten._prelu_kernel_backward)
def prelu_backward(grad_output, self, weight):
    dt = _float_check("prelu", self, weight)
    cd = compute_dtype(dt)
    x, w, g = to(self, cd), to(weight, cd), to(grad_output, cd)
    wb = _prelu_w(x, w)
    if wb is None:
        return NotImplemented
    pos = aten.gt(x, 0)
    gx = aten.where(pos, g, aten.mul(wb, g))
    gw = aten.where(pos, 0.0, aten.mul(g, x))
    if w.numel() == 1 or x.ndim < 2:
        gw = reshape(aten.sum(gw), tuple(weight.shape))
    else:
        gw = reshape(aten.sum(gw, [i for i in range(x.ndim) if i != 1]), tuple(weight.shape))
    return to(gx, dt), to(gw, weight.dtype)


@register_decomposition(aten.rrelu_with_noise_functional)
def rrelu_with_noise(self, lower, upper):
    dt = _float_check("rrelu", self)
    x = upcast(self)
    u = aten.rand(tuple(x.shape), dtype=x.dtype, device=x.device)
    slope = aten.add(aten.mul(u, upper - lower), lower)
    noise = to(aten.where(aten.gt(x, 0), 1.0, slope), dt)
    return to(aten.mul(x, noise), dt), noise


# ---- normalisation -------------------------------------------------------------------------------
def _stats(x, axes, eps):
    """mean, biased variance and rstd over `axes` (kept as size-1 dims)."""
    mean, var, rstd, _ = _centered_stats(x, axes, eps)
    return mean, var, rstd


def _centered_stats(x, axes, eps):
    """_stats and x - mean, the centred values the variance was taken of."""
    n = 1
    for a in axes:
        n *= x.shape[a]
    mean = aten.div(aten.sum(x, list(axes), True), n)
    xc = aten.sub(x, mean)
    var = aten.div(aten.sum(aten.mul(xc, xc), list(axes), True), n)
    return mean, var, aten.rsqrt(aten.add(var, eps)), xc


def _mean(x, axes):
    n = 1
    for a in axes:
        n *= x.shape[a]
    return aten.div(aten.sum(x, list(axes), True), n)


def _norm_backward(g, xhat, rstd, axes, gamma=None):
    gh = g if gamma is None else aten.mul(g, gamma)
    return aten.mul(rstd, aten.sub(aten.sub(gh, _mean(gh, axes)), aten.mul(xhat, _mean(aten.mul(gh, xhat), axes))))


def _ln_axes(input, normalized_shape, weight, bias):
    return _ln_check(tuple(input.shape), normalized_shape, weight, bias)


@register_decomposition(aten.native_layer_norm)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axes = _ln_axes(input, normalized_shape, weight, bias)
    dt = _float_check("LayerNorm", input)
    x = upcast(input)
    mean, _, rstd = _stats(x, axes, eps)
    y = aten.mul(aten.sub(x, mean), rstd)
    if weight is not None:
        y = aten.mul(y, upcast(weight))
    if bias is not None:
        y = aten.add(y, upcast(bias))
    return to(y, dt), to(mean, dt), to(rstd, dt)


@register_decomposition(aten.native_layer_norm_backward)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    axes = _ln_axes(input, normalized_shape, weight, bias)
    dt = _float_check("LayerNorm", input)
    cd = compute_dtype(dt)
    g, r = to(grad_out, cd), to(rstd, cd)
    xhat = aten.mul(aten.sub(to(input, cd), to(mean, cd)), r)
    gx = _norm_backward(g, xhat, r, axes, None if weight is None else to(weight, cd))
    outer = list(range(input.ndim - len(axes)))
    gw = None if weight is None else to(aten.sum(aten.mul(g, xhat), outer), weight.dtype)
    gb = None if bias is None else to(aten.sum(g, outer), bias.dtype)
    return to(gx, dt), gw, gb


def _rms_eps(eps, dt):
    return float(_finfo(dt).eps) if eps is None else eps


@register_decomposition(aten._fused_rms_norm)
def fused_rms_norm(input, normalized_shape, weight, eps):
    axes = _ln_axes(input, normalized_shape, weight, None)
    dt = _float_check("rms_norm", input)
    x = upcast(input)
    rstd = aten.rsqrt(aten.add(_mean(aten.mul(x, x), axes), _rms_eps(eps, dt)))
    y = aten.mul(x, rstd)
    if weight is not None:
        y = aten.mul(y, upcast(weight))
    return to(y, dt), rstd


@register_decomposition(aten._fused_rms_norm_backward)
def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight):
    axes = _ln_axes(input, normalized_shape, weight, None)
    dt = _float_check("rms_norm", input)
    cd = compute_dtype(dt)
    g = to(grad_out, cd)
    xhat = aten.mul(to(input, cd), rstd)
    gh = g if weight is None else aten.mul(g, to(weight, cd))
    gx = aten.mul(rstd, aten.sub(gh, aten.mul(xhat, _mean(aten.mul(gh, xhat), axes))))
    outer = list(range(input.ndim - len(axes)))
    gw = None if weight is None else to(aten.sum(aten.mul(g, xhat), outer), weight.dtype)
    return to(gx, dt), gw


def _channel(t, ndim):
    return None if t is None else reshape(t, (1, -1) + (1,) * (ndim - 2))


@register_decomposition(aten.native_batch_norm)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    _bn_check(input, weight, bias, running_mean, running_var)
    dt = _float_check("batch_norm", input)
    cd = compute_dtype(dt)
    x = to(input, cd)
    axes = (0,) + tuple(range(2, x.ndim))
    xc = None
    if training:            # y from the centred values the variance used: one x - mean, one saved for the backward
        mean, var, rstd, xc = _centered_stats(x, axes, eps)
        batch_norm_update_running(x, running_mean, running_var, reshape(mean, (-1,)), reshape(var, (-1,)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
        mean = _channel(to(running_mean, cd), x.ndim)
        rstd = aten.rsqrt(aten.add(_channel(to(running_var, cd), x.ndim), eps))
    y = aten.mul(aten.sub(x, mean) if xc is None else xc, rstd)
    if weight is not None:
        y = aten.mul(y, _channel(to(weight, cd), x.ndim))
    if bias is not None:
        y = aten.add(y, _channel(to(bias, cd), x.ndim))
    return to(y, dt), reshape(mean, (-1,)), reshape(rstd, (-1,))


def batch_norm_update_running(x, running_mean, running_var, mean, var, momentum):
    """Write BatchNorm's running statistics (`copy_`) from the batch's per-channel mean and biased
    variance of `x`; the running variance takes the unbiased one, as PyTorch."""
    n = x.numel() // x.shape[1] if x.shape[1] else 0
    if running_mean is not None:
        new = aten.add(aten.mul(running_mean, 1 - momentum), aten.mul(mean, momentum))
        aten.copy_(running_mean, to(new, running_mean.dtype))
    if running_var is not None:
        if n <= 1:
            unbiased = aten.mul(var, math.nan)
        elif isinstance(n, int):
            unbiased = aten.mul(var, n / (n - 1))
        else:                               # a symbolic count: no Python float of it exists
            unbiased = aten.div(aten.mul(var, n), n - 1)
        new = aten.add(aten.mul(running_var, 1 - momentum), aten.mul(unbiased, momentum))
        aten.copy_(running_var, to(new, running_var.dtype))


@register_decomposition(aten.native_batch_norm_backward)
def native_batch_norm_backward(grad_out, input, weight, save_mean, save_invstd, train, bias):
    dt = _float_check("batch_norm", input)
    cd = compute_dtype(dt)
    x, g = to(input, cd), to(grad_out, cd)
    axes = (0,) + tuple(range(2, x.ndim))
    rstd = _channel(to(save_invstd, cd), x.ndim)
    xhat = aten.mul(aten.sub(x, _channel(to(save_mean, cd), x.ndim)), rstd)
    gamma = _channel(None if weight is None else to(weight, cd), x.ndim)
    scale = rstd if gamma is None else aten.mul(rstd, gamma)
    if not train:
        gx = aten.mul(g, scale)
        gw = None if weight is None else to(aten.sum(aten.mul(g, xhat), list(axes)), weight.dtype)
        gb = None if bias is None else to(aten.sum(g, list(axes)), bias.dtype)
        return to(gx, dt), gw, gb
    # the two per-channel sums (one pass over g and x) serve dx and the parameter gradients alike:
    # dx = rstd * gamma * (g - mean(g) - x_hat * mean(g * x_hat)), gamma being constant per channel
    sg = aten.sum(g, list(axes), True)
    sgx = aten.sum(aten.mul(g, xhat), list(axes), True)
    n = x.numel() // x.shape[1] if x.shape[1] else 1
    gx = aten.mul(scale, aten.sub(aten.sub(g, aten.div(sg, n)), aten.mul(xhat, aten.div(sgx, n))))
    gw = None if weight is None else to(reshape(sgx, (-1,)), weight.dtype)
    gb = None if bias is None else to(reshape(sg, (-1,)), bias.dtype)
    return to(gx, dt), gw, gb


@register_decomposition(aten.native_group_norm)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    _gn_check(input, group, weight, bias)
    dt = _float_check("group_norm", input)
    cd = compute_dtype(dt)
    x = reshape(to(input, cd), (N, group, C // group, -1))
    mean, _, rstd = _stats(x, (2, 3), eps)
    y = aten.mul(aten.sub(x, mean), rstd)
    if weight is not None:
        y = aten.mul(y, reshape(to(weight, cd), (1, group, -1, 1)))
    if bias is not None:
        y = aten.add(y, reshape(to(bias, cd), (1, group, -1, 1)))
    return (to(reshape(y, tuple(input.shape)), dt), to(reshape(mean, (N, group)), dt),
            to(reshape(rstd, (N, group)), dt))


@register_decomposition(aten.native_group_norm_backward)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, bias):
    dt = _float_check("group_norm", input)
    cd = compute_dtype(dt)
    x = reshape(to(input, cd), (N, group, C // group, -1))
    g = reshape(to(grad_out, cd), (N, group, C // group, -1))
    r = reshape(to(rstd, cd), (N, group, 1, 1))
    xhat = aten.mul(aten.sub(x, reshape(to(mean, cd), (N, group, 1, 1))), r)
    gamma = None if weight is None else reshape(to(weight, cd), (1, group, -1, 1))
    gx = reshape(_norm_backward(g, xhat, r, (2, 3), gamma), tuple(input.shape))
    gw = None if weight is None else to(reshape(aten.sum(aten.mul(g, xhat), [0, 3]), (C,)), weight.dtype)
    gb = None if bias is None else to(reshape(aten.sum(g, [0, 3]), (C,)), bias.dtype)
    return to(gx, dt), gw, gb


# ---- dropout ---------------------------------------------------------------------------------------
@register_decomposition(aten.native_dropout)
def native_dropout(input, p, train):
    shape = tuple(input.shape)
    if train is False:
        return aten.clone(input), full(shape, True, input, D.bool)
    if p > 0:
        keep = aten.ge(aten.rand(shape, dtype=compute_dtype(input.dtype) if input.dtype.category >= D.FLOATING
                                 else D.float32, device=input.device), p)
    else:
        keep = full(shape, True, input, D.bool)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return to(aten.mul(aten.mul(upcast(input), keep), scale), input.dtype), keep


# ---- matrix products -------------------------------------------------------------------------------
def _matmul(a, b):
    """flambeau.matmul's semantics over mm / bmm and views."""
    if a.ndim == 0 or b.ndim == 0:
        return NotImplemented
    if a.ndim == 1 and b.ndim == 1:
        return reshape(aten.mm(reshape(a, (1, -1)), reshape(b, (-1, 1))), ())
    if a.ndim <= 2 and b.ndim <= 2:
        r = aten.mm(reshape(a, (1, -1)) if a.ndim == 1 else a, reshape(b, (-1, 1)) if b.ndim == 1 else b)
        if a.ndim == 1:
            return reshape(r, (r.shape[1],))
        return reshape(r, (r.shape[0],)) if b.ndim == 1 else r
    if b.ndim <= 2 and a.ndim >= 3:
        bb = reshape(b, (-1, 1)) if b.ndim == 1 else b
        lead = tuple(a.shape[:-1])
        r = aten.mm(reshape(a, (math.prod(lead), a.shape[-1])), bb)      # no -1: ambiguous when empty
        return reshape(r, lead if b.ndim == 1 else lead + (bb.shape[1],))
    aa = reshape(a, (1, -1)) if a.ndim == 1 else a
    bb = reshape(b, (-1, 1)) if b.ndim == 1 else b
    batch = broadcast_shapes(tuple(aa.shape[:-2]), tuple(bb.shape[:-2]))
    n, k, m = aa.shape[-2], aa.shape[-1], bb.shape[-1]
    if bb.shape[-2] != k:
        return NotImplemented
    nb = math.prod(batch)                  # not -1, which is ambiguous for an empty (n, k) or (k, m)
    a3 = reshape(aten.expand(aa, batch + (n, k)), (nb, n, k))
    b3 = reshape(aten.expand(bb, batch + (k, m)), (nb, k, m))
    r = reshape(aten.bmm(a3, b3), batch + (n, m))
    if a.ndim == 1:
        r = aten.squeeze(r, [-2])
    if b.ndim == 1:
        r = aten.squeeze(r, [-1])
    return r


register_decomposition(aten.matmul)(_matmul)


def _t(w):
    return aten.permute(w, [1, 0]) if w.ndim == 2 else w


@register_decomposition(aten.linear)
def linear(input, weight, bias=None):
    r = _matmul(input, _t(weight))
    if r is NotImplemented or bias is None:
        return r
    return aten.add(r, bias)


def _scaled_sum(self, prod, beta, alpha):
    dt = result_type(self, prod)
    if dt.category < D.FLOATING:          # integral tensors take the scalars in their own dtype
        beta, alpha = int(beta), int(alpha)
    return to(_scaled_sum_any(self, prod, beta, alpha), dt)


def _scaled_sum_any(self, prod, beta, alpha):
    if alpha != 1:
        prod = aten.mul(prod, alpha)
    if beta == 0:
        return prod
    return aten.add(prod, self if beta == 1 else aten.mul(self, beta))


@register_decomposition(aten.addmm)
def addmm(self, mat1, mat2, beta=1, alpha=1):
    return _scaled_sum(self, aten.mm(mat1, mat2), beta, alpha)


@register_decomposition(aten.baddbmm)
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled_sum(self, aten.bmm(batch1, batch2), beta, alpha)


@register_decomposition(aten.addbmm)
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled_sum(self, aten.sum(aten.bmm(batch1, batch2), [0]), beta, alpha)


@register_decomposition(aten.addmv)
def addmv(self, mat, vec, beta=1, alpha=1):
    if mat.ndim != 2 or vec.ndim != 1:
        return NotImplemented
    return _scaled_sum(self, _matmul(mat, vec), beta, alpha)


@register_decomposition(aten.addr)
def addr(self, vec1, vec2, beta=1, alpha=1):
    if vec1.ndim != 1 or vec2.ndim != 1:
        return NotImplemented
    outer = aten.mul(aten.unsqueeze(vec1, 1), aten.unsqueeze(vec2, 0))
    if outer.dtype is D.bool:
        return NotImplemented
    return _scaled_sum(self, outer, beta, alpha)


@register_decomposition(aten.mv)
def mv(self, vec):
    if self.ndim != 2 or vec.ndim != 1:
        return NotImplemented
    return _matmul(self, vec)


@register_decomposition(aten.dot)
def dot(self, tensor):
    if self.ndim != 1 or tensor.ndim != 1 or self.dtype is not tensor.dtype or self.dtype.is_complex:
        return NotImplemented
    return aten.sum(aten.mul(self, tensor))


@register_decomposition(aten.vdot)
def vdot(self, other):
    return dot(self, other)

