"""Normalisation and dropout: layer_norm, batch_norm (running statistics updated in place),
group_norm, instance_norm, rms_norm, and dropout / feature dropout / alpha dropout.

Each normalisation is one op returning its output with the statistics it saved (mean, rstd), and a
backward op that uses them (the fused formula
`dx = rstd * (dy*w - mean(dy*w) - xhat * mean(dy*w * xhat))` over the normalised axes). Losses are
in `loss.py`, scaled_dot_product_attention in `attention.py`.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .. import _dtype as D, _fp_errors, random as R
from .._device import canonical
from .._backends import array_namespaces, cpu_kernels, triton_launch
from ._registry import defop, export, TensorSpec, Tag
from .memory_format import as_format, meta_strides, in_layout_of, like_strides, suggest_memory_format
from ._helpers import direct_device, opmath, undefined_grad as _undefined_grad
from .._dispatch import device_array_types, type_name
from .._tensor import Tensor
from .activation import _rng as rng, pointwise_kernels
from .creation import ones_like, ones
from . import _batching, _sharding


def _float(name, x):
    dt = D.FROM_NP[x.dtype]
    if dt.category < D.FLOATING:
        raise RuntimeError(f"\"{name}\" not implemented for '{type_name(dt)}'")
    return dt, opmath(dt)


def _c(x, cd):
    return None if x is None else x.astype(cd, copy=False)


def _stats(xp, x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=axes, keepdims=True)
    return mean, var, 1 / xp.sqrt(var + eps)


def _norm_backward(xp, g, xhat, rstd, axes, gamma=None):
    gh = g if gamma is None else g * gamma
    return rstd * (gh - gh.mean(axis=axes, keepdims=True) - xhat * (gh * xhat).mean(axis=axes, keepdims=True))


# ---- layer_norm -------------------------------------------------------------------------------
def _ln_check(shape, normalized_shape, weight, bias):
    ns = tuple(normalized_shape)
    if not ns:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                           "least one element, but got normalized_shape = []")
    for w, n in ((weight, "weight"), (bias, "bias")):
        if w is not None and tuple(w.shape) != ns:
            raise RuntimeError(f"Expected {n} to be of same shape as normalized_shape, but got {n} of shape "
                               f"{list(w.shape)} and normalized_shape = {list(ns)}")
    if tuple(shape[len(shape) - len(ns):]) != ns or len(shape) < len(ns):
        raise RuntimeError(f"Given normalized_shape={list(ns)}, expected input with shape "
                           f"[*, {', '.join(map(str, ns))}], but got input of size{list(shape)}")
    return tuple(range(len(shape) - len(ns), len(shape)))


def _through_stats(input, mean, rstd, gmean, grstd, n):
    """The gradient of `input` that flows through a normalisation's returned statistics
    (mean = sum(x)/n, rstd = (sum((x - mean)^2)/n + eps)^-1/2 over the normalised elements; `mean`
    None for RMS norm, whose rstd uses x itself): non-zero only in double backward, where the first
    backward's use of mean/rstd is differentiated. `mean`, `rstd` and their grads broadcast against
    `input`. None when neither statistic received a gradient."""
    if _undefined_grad(gmean) and _undefined_grad(grstd):
        return None
    centred = input if mean is None else input - mean
    r = grstd * rstd * rstd * rstd * centred
    g = (0 - r) if mean is None else gmean - r
    return (g / n).to(input.dtype)


def _cols(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _stat_shape(shape, axes) -> tuple:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _contig(xp, a):
    return None if a is None else xp.ascontiguousarray(a)


def _cuda_norm(xp, x, ndims, *others):
    """The Triton LayerNorm module (`_backends.triton_norm`) when these CuPy arrays can go through it,
    else None (other devices, float64, no Triton, rows wider than it takes)."""
    if getattr(xp, "__name__", "") != "cupy" or not triton_launch.available():
        return None
    triton_norm = _triton_norm[0] if _triton_norm else _import_triton_norm()
    cols = math.prod(x.shape[x.ndim - ndims:])
    return triton_norm if triton_norm.supported(x, cols, *others) else None


_triton_norm: list = []     # the module, imported at its first use (`from` inside a function costs ~0.4 us a call)


def _import_triton_norm():
    from .._backends import triton_norm  # deferred: imports Triton, optional (cuda only)
    _triton_norm.append(triton_norm)
    return triton_norm


@defop("native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
       "-> (Tensor, Tensor, Tensor)", tags=(Tag.autocast_fp32, Tag.optional_output_grads))
def native_layer_norm(xp, input, normalized_shape, weight, bias, eps):
    axes = _ln_check(input.shape, normalized_shape, weight, bias)
    dt, cd = _float("LayerNorm", input)
    fused = _cuda_norm(xp, input, len(axes), weight, bias)
    if fused is not None:
        # mean and rstd made in their (..., 1) shape: the kernel writes one value per row either way
        return fused.forward(input, _contig(xp, weight), _contig(xp, bias), _cols(input, axes), eps,
                             _stat_shape(input.shape, axes))
    if xp is np and cd == input.dtype and (r := cpu_kernels.layer_norm(input, _cols(input, axes), weight, bias, eps)):
        st = _stat_shape(input.shape, axes)            # one C++ pass per row (float32/float64, contiguous)
        return r[0], r[1].reshape(st), r[2].reshape(st)
    x = input.astype(cd, copy=False)
    mean, _, rstd = _stats(xp, x, axes, eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _c(weight, cd)
    if bias is not None:
        y = y + _c(bias, cd)
    # C order as torch (the cast copies anyway; y followed a permuted input's layout)
    return y.astype(dt.np, order="C"), mean.astype(dt.np), rstd.astype(dt.np)


@native_layer_norm.def_meta
def _(input, normalized_shape, weight, bias, eps):
    axes = _ln_check(input.shape, normalized_shape, weight, bias)
    st = tuple(1 if i in axes else s for i, s in enumerate(input.shape))
    return TensorSpec(input.shape, input.dtype), TensorSpec(st, input.dtype), TensorSpec(st, input.dtype)


@defop("native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, "
       "Tensor rstd, Tensor? weight, Tensor? bias) -> (Tensor, Tensor, Tensor)", function=False)
def native_layer_norm_backward(xp, grad_out, input, normalized_shape, mean, rstd, weight, bias):
    axes = _ln_check(input.shape, normalized_shape, weight, bias)
    dt, cd = _float("LayerNorm", input)
    fused = _cuda_norm(xp, input, len(axes), weight, bias, grad_out, mean, rstd)
    if fused is not None:
        gx, part = fused.backward(grad_out, input, mean, rstd, _contig(xp, weight), _cols(input, axes))
        # float32 parameters take the rows of the fresh (2, cols) float32 sums as they are (no copy kernel)
        gw = None if weight is None else _as_param_grad(part[0], weight)
        gb = None if bias is None else _as_param_grad(part[1], bias)
        return gx, gw, gb
    if xp is np and cd == input.dtype and input.flags.c_contiguous and grad_out.dtype == input.dtype:
        r = cpu_kernels.layer_norm_backward(np.ascontiguousarray(grad_out), input, _cols(input, axes), mean, rstd,
                                            weight, (True, weight is not None, bias is not None))
        if r is not None:                              # one C++ pass per row (float32/float64, contiguous)
            gx, gw, gb = r
            return gx, None if gw is None else gw.reshape(weight.shape), None if gb is None else gb.reshape(bias.shape)
    g = grad_out.astype(cd, copy=False)
    rstd = _c(rstd, cd)
    xhat = (input.astype(cd, copy=False) - _c(mean, cd)) * rstd
    gx = _norm_backward(xp, g, xhat, rstd, axes, _c(weight, cd))
    outer = tuple(range(input.ndim - len(axes)))
    gw = None if weight is None else (g * xhat).sum(axis=outer).astype(weight.dtype)
    gb = None if bias is None else g.sum(axis=outer).astype(bias.dtype)
    return gx.astype(dt.np), gw, gb


def _as_param_grad(row, param):
    """A row of the fused backward's partial sums as the gradient of 1-D `param`: the row itself when it
    has the parameter's shape and dtype (a CuPy reshape or astype call costs a new array object)."""
    if row.shape != param.shape:
        row = row.reshape(param.shape)
    return row if row.dtype == param.dtype else row.astype(param.dtype)


@native_layer_norm_backward.def_meta
def _(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    def spec(t):
        return None if t is None else TensorSpec(t.shape, t.dtype)
    return spec(input), spec(weight), spec(bias)


@native_layer_norm.def_derivative
def _native_layer_norm_derivative(grad, input, normalized_shape, weight, bias, result1, result2):
    gx, gw, gb = native_layer_norm_backward(grad[0], input, normalized_shape, result1, result2, weight, bias)
    extra = _through_stats(input, result1, result2, grad[1], grad[2], math.prod(normalized_shape))
    return (gx if extra is None else gx + extra), gw, gb


@export("layer_norm", namespace="nn.functional")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return native_layer_norm(input, tuple(normalized_shape), weight, bias, eps)[0]


# ---- rms_norm ---------------------------------------------------------------------------------
def _rms_eps(eps, dt):
    return float(ml_dtypes.finfo(dt.np).eps) if eps is None else eps        # (numpy's finfo has no bfloat16)


@defop("_fused_rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)",
       function=False)
def _fused_rms_norm(xp, input, normalized_shape, weight, eps):
    axes = _ln_check(input.shape, normalized_shape, weight, None)
    dt, cd = _float("rms_norm", input)
    x = input.astype(cd, copy=False)
    rstd = 1 / xp.sqrt((x * x).mean(axis=axes, keepdims=True) + _rms_eps(eps, dt))
    y = x * rstd
    if weight is not None:
        y = y * _c(weight, cd)
    return y.astype(dt.np), rstd.astype(cd)


@_fused_rms_norm.def_meta
def _(input, normalized_shape, weight, eps):
    axes = _ln_check(input.shape, normalized_shape, weight, None)
    st = tuple(1 if i in axes else s for i, s in enumerate(input.shape))
    return TensorSpec(input.shape, input.dtype), TensorSpec(st, D.FROM_NP[opmath(input.dtype)])


@defop("_fused_rms_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, "
       "Tensor? weight) -> (Tensor, Tensor)", function=False)
def _fused_rms_norm_backward(xp, grad_out, input, normalized_shape, rstd, weight):
    axes = _ln_check(input.shape, normalized_shape, weight, None)
    dt, cd = _float("rms_norm", input)
    g = grad_out.astype(cd, copy=False)
    xhat = input.astype(cd, copy=False) * rstd
    gh = g if weight is None else g * _c(weight, cd)
    gx = rstd * (gh - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
    outer = tuple(range(input.ndim - len(axes)))
    gw = None if weight is None else (g * xhat).sum(axis=outer).astype(weight.dtype)
    return gx.astype(dt.np), gw


_fused_rms_norm_backward.def_meta(lambda grad_out, input, normalized_shape, rstd, weight: (
    TensorSpec(input.shape, input.dtype), None if weight is None else TensorSpec(weight.shape, weight.dtype)))


@_fused_rms_norm.def_derivative
def _fused_rms_norm_derivative(grad, input, normalized_shape, weight, result1):
    gx, gw = _fused_rms_norm_backward(grad[0], input, normalized_shape, result1, weight)
    extra = _through_stats(input, None, result1, None, grad[1], math.prod(normalized_shape))
    return (gx if extra is None else gx + extra), gw


@export("rms_norm", namespace="nn.functional")   # no cuda policy: PyTorch 2.11 keeps float16 in, float16 out
def rms_norm(input, normalized_shape, weight=None, eps=None):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return _fused_rms_norm(input, tuple(normalized_shape), weight, eps)[0]


# ---- batch_norm -------------------------------------------------------------------------------
def _bn_shape(x, t):
    return None if t is None else t.reshape((1, -1) + (1,) * (x.ndim - 2))


def _cuda_batch_norm(xp, x, per_channel, grad=None):
    """The Triton BatchNorm module (`_backends.triton_batch_norm`, training mode) when these CuPy
    arrays (input, per-channel arrays, the output gradient) can go through it, else None (other
    devices, float64, no Triton)."""
    if getattr(xp, "__name__", "") != "cupy" or not triton_launch.available():
        return None
    if grad is not None and (grad.shape != x.shape or grad.dtype != x.dtype):
        return None
    bn = _triton_batch_norm[0] if _triton_batch_norm else _import_triton_batch_norm()
    return bn if bn.supported(x, *per_channel) else None


_triton_batch_norm: list = []   # the module, imported at its first use (as `_triton_norm`: 212 calls a ResNet step)


def _import_triton_batch_norm():
    from .._backends import triton_batch_norm  # deferred: imports Triton, optional (cuda only)
    _triton_batch_norm.append(triton_batch_norm)
    return triton_batch_norm


def _bn_check(input, weight, bias, running_mean, running_var):
    if len(input.shape) < 2:
        raise RuntimeError(f"batch_norm: expected input to have at least 2 dims, got {len(input.shape)}")
    c = (input.shape[1],)
    for t, n in zip((weight, bias, running_mean, running_var), _BN_ARGS):   # (arrays' shapes are tuples)
        if t is not None and t.shape != c and tuple(t.shape) != c:
            raise RuntimeError(f"{n} should contain {c[0]} elements not {int(np.prod(t.shape))}")


_BN_ARGS = ("weight", "bias", "running_mean", "running_var")


@defop("native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
       "bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)", tags=(Tag.optional_output_grads,))
def native_batch_norm(xp, input, weight, bias, running_mean, running_var, training, momentum, eps):
    _bn_check(input, weight, bias, running_mean, running_var)
    dt, cd = _float("batch_norm", input)
    fused = (training and (running_mean is None) == (running_var is None)       # the kernel updates both or neither
             and _cuda_batch_norm(xp, input, (weight, bias, running_mean, running_var)))
    if fused:
        return fused.forward(input, weight, bias, running_mean, running_var, momentum, eps)
    x = input.astype(cd, copy=False)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var, rstd = _stats(xp, x, axes, eps)
        n = x.size // x.shape[1] if x.shape[1] else 0
        if running_mean is not None:
            running_mean[...] = (1 - momentum) * running_mean + momentum * mean.reshape(-1)
        if running_var is not None:
            unbiased = var.reshape(-1) * (n / (n - 1) if n > 1 else float("nan"))
            running_var[...] = (1 - momentum) * running_var + momentum * unbiased
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
        mean = _bn_shape(x, _c(running_mean, cd))
        rstd = 1 / xp.sqrt(_bn_shape(x, _c(running_var, cd)) + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _bn_shape(x, _c(weight, cd))
    if bias is not None:
        y = y + _bn_shape(x, _c(bias, cd))
    y = as_format(xp, y.astype(dt.np, copy=False), suggest_memory_format(input))     # PyTorch: input's format
    return y, mean.reshape(-1).astype(cd), rstd.reshape(-1).astype(cd)


@native_batch_norm.def_meta
def _(input, weight, bias, running_mean, running_var, training, momentum, eps):
    _bn_check(input, weight, bias, running_mean, running_var)
    sdt = D.FROM_NP[opmath(input.dtype)]
    c = (input.shape[1],)
    return (TensorSpec(input.shape, input.dtype, meta_strides(input.shape, suggest_memory_format(input))),
            TensorSpec(c, sdt), TensorSpec(c, sdt))


@defop("native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor save_mean, "
       "Tensor save_invstd, bool train, Tensor? bias) -> (Tensor, Tensor, Tensor)", function=False)
def native_batch_norm_backward(xp, grad_out, input, weight, save_mean, save_invstd, train, bias):
    dt, cd = _float("batch_norm", input)
    fused = train and _cuda_batch_norm(xp, input, (weight, bias, save_mean, save_invstd), grad_out)
    if fused:
        return fused.backward(grad_out, input, weight, bias, save_mean, save_invstd)
    x = input.astype(cd, copy=False)
    g = grad_out.astype(cd, copy=False)
    axes = (0,) + tuple(range(2, x.ndim))
    rstd = _bn_shape(x, _c(save_invstd, cd))
    xhat = (x - _bn_shape(x, _c(save_mean, cd))) * rstd
    gamma = _bn_shape(x, _c(weight, cd))
    if train:
        gx = _norm_backward(xp, g, xhat, rstd, axes, gamma)
    else:
        gx = g * rstd * (1 if gamma is None else gamma)
    gw = None if weight is None else (g * xhat).sum(axis=axes).astype(weight.dtype)
    gb = None if bias is None else g.sum(axis=axes).astype(bias.dtype)
    return as_format(xp, gx.astype(dt.np, copy=False), suggest_memory_format(input)), gw, gb


native_batch_norm_backward.def_meta(lambda grad_out, input, weight, save_mean, save_invstd, train, bias: (
    TensorSpec(input.shape, input.dtype, meta_strides(input.shape, suggest_memory_format(input))),
    None if weight is None else TensorSpec(weight.shape, weight.dtype),
    None if bias is None else TensorSpec(bias.shape, bias.dtype)))


@native_batch_norm.def_derivative
def _native_batch_norm_derivative(grad, input, weight, bias, training, result1, result2):
    dev = direct_device(grad[0], input, weight, result1, result2, bias)
    if dev is not None:      # nothing observes dispatch (a backward without create_graph): the kernel on the arrays
        gx, gw, gb = _direct_batch_norm_backward(dev, grad[0], input, weight, result1, result2, training, bias)
    else:
        gx, gw, gb = native_batch_norm_backward(grad[0], input, weight, result1, result2, training, bias)
    if training and not (_undefined_grad(grad[1]) and _undefined_grad(grad[2])):   # (reshape drops the mark)
        shape = (1, -1) + (1,) * (input.ndim - 2)
        extra = _through_stats(input, result1.reshape(shape), result2.reshape(shape), grad[1].reshape(shape),
                               grad[2].reshape(shape), input.numel() // max(input.shape[1], 1))
        gx = gx if extra is None else gx + extra
    return gx, gw, gb, None, None


def _direct_batch_norm_backward(dev, grad, input, weight, mean, rstd, train, bias) -> tuple:
    """native_batch_norm_backward's kernel on the tensors' arrays, its three results as Tensors (what
    `direct_call` does for one result): one dispatch fewer per BatchNorm in a backward."""
    xp = array_namespaces[dev.type]
    args = (grad._data, input._data, None if weight is None else weight._data, mean._data, rstd._data, train,
            None if bias is None else bias._data)
    if xp is np:
        token = _fp_errors.quiet()
        try:
            r = native_batch_norm_backward.kernel(xp, *args)
        finally:
            _fp_errors.restore(token)
    else:
        r = native_batch_norm_backward.kernel(xp, *args)
    return tuple(None if a is None else Tensor._make(a if type(a) is np.ndarray or type(a) in device_array_types
                                                     else xp.asarray(a), dev) for a in r)


def _size_check(input, training):
    if not training:
        return
    shape = tuple(input.shape)
    n = 1
    for i, s in enumerate(shape):
        if i != 1:
            n *= s
    if n == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"torch.Size({list(shape)})")


@export("batch_norm", namespace="nn.functional", function=False)
def F_batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    _size_check(input, training)
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


@export("batch_norm")
def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


# ---- group_norm / instance_norm ---------------------------------------------------------------
def _gn_check(input, num_groups, weight, bias):
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {len(shape)}")
    c = shape[1]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got "
                           f"input of shape {list(shape)} and num_groups={num_groups}")
    for t, n in ((weight, "weight"), (bias, "bias")):
        if t is not None and (len(t.shape) != 1 or t.shape[0] != c):
            raise RuntimeError(f"Expected {n} to be a vector of size equal to the number of channels in input, "
                               f"but got {n} of shape {list(t.shape)} and input of shape {list(shape)}")


def _grouped(x, N, C, group):
    return x.reshape(N, group, C // group, -1)


@defop("native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, "
       "float eps) -> (Tensor, Tensor, Tensor)", tags=(Tag.autocast_fp32,))
def native_group_norm(xp, input, weight, bias, N, C, HxW, group, eps):
    _gn_check(input, group, weight, bias)
    dt, cd = _float("group_norm", input)
    x = _grouped(input.astype(cd, copy=False), N, C, group)
    mean, _, rstd = _stats(xp, x, (2, 3), eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _c(weight, cd).reshape(1, group, -1, 1)
    if bias is not None:
        y = y + _c(bias, cd).reshape(1, group, -1, 1)
    return (y.reshape(input.shape).astype(dt.np, order="C"), mean.reshape(N, group).astype(dt.np),
            rstd.reshape(N, group).astype(dt.np))


@native_group_norm.def_meta
def _(input, weight, bias, N, C, HxW, group, eps):
    _gn_check(input, group, weight, bias)
    return (TensorSpec(input.shape, input.dtype), TensorSpec((N, group), input.dtype),
            TensorSpec((N, group), input.dtype))


@defop("native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, "
       "SymInt N, SymInt C, SymInt HxW, int group, Tensor? bias) -> (Tensor, Tensor, Tensor)", function=False)
def native_group_norm_backward(xp, grad_out, input, mean, rstd, weight, N, C, HxW, group, bias):
    dt, cd = _float("group_norm", input)
    x = _grouped(input.astype(cd, copy=False), N, C, group)
    g = _grouped(grad_out.astype(cd, copy=False), N, C, group)
    r = _c(rstd, cd).reshape(N, group, 1, 1)
    xhat = (x - _c(mean, cd).reshape(N, group, 1, 1)) * r
    gamma = None if weight is None else _c(weight, cd).reshape(1, group, -1, 1)
    gx = _norm_backward(xp, g, xhat, r, (2, 3), gamma).reshape(input.shape)
    gw = None if weight is None else (g * xhat).sum(axis=(0, 3)).reshape(C).astype(weight.dtype)
    gb = None if bias is None else g.sum(axis=(0, 3)).reshape(C).astype(bias.dtype)
    return gx.astype(dt.np), gw, gb


native_group_norm_backward.def_meta(lambda grad_out, input, mean, rstd, weight, N, C, HxW, group, bias: (
    TensorSpec(input.shape, input.dtype), None if weight is None else TensorSpec(weight.shape, weight.dtype),
    None if bias is None else TensorSpec(bias.shape, bias.dtype)))


@native_group_norm.def_derivative
def _native_group_norm_derivative(grad, input, weight, bias, N, C, HxW, group, result1, result2):
    gx, gw, gb = native_group_norm_backward(grad[0], input, result1, result2, weight, N, C, HxW, group, bias)
    stats = [t.reshape(N, group, 1) for t in (result1, result2, grad[1], grad[2])]
    extra = _through_stats(input.reshape(N, group, -1), *stats, (C // group) * HxW)
    return (gx if extra is None else gx + extra.reshape(input.shape)), gw, gb


@export("group_norm", namespace="nn.functional")
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {len(shape)}")
    hw = 1
    for s in shape[2:]:
        hw *= s
    return native_group_norm(input, weight, bias, shape[0], shape[1], hw, num_groups, eps)[0]


@export("instance_norm", namespace="nn.functional")
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5, cudnn_enabled=False):
    shape = tuple(input.shape)
    if not use_input_stats:
        return native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[0]
    if len(shape) < 2:
        raise ValueError(f"Expected 2D or higher input (got {len(shape)}D input)")
    n, c = shape[0], shape[1]
    hw = 1
    for s in shape[2:]:
        hw *= s
    if hw == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"torch.Size({list(shape)})")
    x = input.reshape(1, n * c, hw)

    def rep(t):
        return None if t is None else t.expand(n, c).reshape(n * c)
    rm, rv = rep(running_mean), rep(running_var)
    if rm is not None:
        rm = rm.detach().clone()
    if rv is not None:
        rv = rv.detach().clone()
    out = native_batch_norm(x, rep(weight), rep(bias), rm, rv, True, momentum, eps)[0].reshape(shape)
    for buf, new in ((running_mean, rm), (running_var, rv)):
        if buf is not None:
            buf.copy_((new.reshape(n, c).sum(0) / n).to(buf.dtype))      # an op, so tracing sees the write
    return out


# ---- dropout ----------------------------------------------------------------------------------
def _rng(xp):
    return rng(xp)


@defop("native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)", tags=(Tag.nondeterministic_seeded,))
def native_dropout(xp, input, p, train):
    dt = D.FROM_NP[input.dtype]
    if train is False:
        return input.copy(order="K"), in_layout_of(xp, xp.ones(input.shape, dtype=bool), input)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    cd = opmath(dt)
    if xp is not np:
        fused = _fused_dropout(input) if 0 < p < 1 else None
        if fused is not None:
            return fused.dropout_forward(input, p, int(_cuda_seeds().integers(0, _DROPOUT_SEED_BOUND)))
        keep = in_layout_of(xp, _rng(xp).random(input.shape) >= p if p > 0 else xp.ones(input.shape, dtype=bool),
                            input)
        return (input.astype(cd, copy=False) * keep * scale).astype(dt.np), keep
    # NumPy: float32 draws (24 random bits resolve p) at ~60% of a float64 draw's time, and the
    # product computed once in the op-math dtype, scaled in place
    keep = _rng(xp).random(input.shape, dtype=np.float32) >= p if p > 0 else np.ones(input.shape, dtype=bool)
    keep = in_layout_of(xp, keep, input)          # mask and output in input's layout (PyTorch's empty_like)
    out = np.multiply(input, keep, dtype=cd)
    out *= scale
    return out.astype(dt.np, copy=False), keep


@native_dropout.def_meta
def _native_dropout_meta(input, p, train):
    st = None if input.is_contiguous() else like_strides(input)     # output and mask as empty_like(input)
    return TensorSpec(input.shape, input.dtype, st), TensorSpec(input.shape, D.bool, st)


@native_dropout.def_derivative
def _(grad, p, train, result1):
    if train is False:
        return grad[0]
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    g = grad[0]
    if (dev := direct_device(g, result1)) is not None and dev.type == "cuda":
        fused = _fused_dropout(g._data)
        if fused is not None and fused.dropout_backward_supported(g._data, result1._data):
            return Tensor._make(fused.dropout_backward(g._data, result1._data, scale), dev, g.dtype)
    return g * result1 * scale


_DROPOUT_SEED_BOUND = 2 ** 62


def _cuda_seeds():
    """The host stream seeding cuda kernels: the cuda generator's (manual_seed replays it; no device read)."""
    return R.generator_for(canonical("cuda")).xp_generator(np)


def _fused_dropout(x):
    """`_backends.triton_pointwise` when its dropout kernels can take CuPy array `x`, else None."""
    if not type(x).__module__.startswith("cupy") or not triton_launch.available():
        return None
    tp = pointwise_kernels()
    return tp if tp.dropout_supported(x) else None


def _check_p(p):
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


@export("dropout", namespace="nn.functional", function=False)
def F_dropout(input, p=0.5, training=True, inplace=False):
    _check_p(p)
    return (dropout_ if inplace else dropout)(input, p, training)


@export("dropout")
def dropout(input, p, train):
    if not train or p == 0:             # PyTorch's _dropout: the input itself, no mask, no random draw
        return input
    return native_dropout(input, p, True)[0]


@export("dropout_")
def dropout_(input, p, train):
    if not train or p == 0:
        return input
    return input.mul_(native_dropout(ones_like(input), p, True)[0])


def _feature_noise_shape(shape, batched):
    k = 2 if batched else 1
    return tuple(shape[:k]) + (1,) * (len(shape) - k)


def _feature_dropout(input, p, training, inplace, batched, alpha=False):
    if not training or p == 0:
        return input
    keep = native_dropout(ones(_feature_noise_shape(input.shape, batched), dtype=input.dtype,
                               device=input.device), p, True)
    return _apply_noise(input, keep, p, inplace, alpha)


def _apply_noise(input, keep, p, inplace, alpha):
    if not alpha:
        return input.mul_(keep[0]) if inplace else input * keep[0]
    if p == 1:
        return input.mul_(0.0) if inplace else input * 0.0
    al = 1.7580993408473766
    a = 1.0 / ((al * al * p + 1) * (1 - p)) ** 0.5
    noise = keep[1].to(input.dtype)
    b = (noise - 1.0) * (al * a) + al * a * p
    if inplace:
        return input.mul_(noise * a).add_(b)
    return input * (noise * a) + b


def _feature_dropout_nd(name, nd):
    def f(input, p=0.5, training=True, inplace=False):
        _check_p(p)
        ndim = len(input.shape)
        if ndim not in (nd + 1, nd + 2):
            raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D input, but received a {ndim}D input. "
                               f"Note that {name} exists to provide channel-wise dropout on inputs with {nd} "
                               f"spatial dimension{'s' if nd > 1 else ''}, a channel dimension, and an optional "
                               f"batch dimension (i.e. {nd + 1}D or {nd + 2}D inputs).")
        return _feature_dropout(input, p, training, inplace, ndim == nd + 2)
    f.__name__ = name
    return f


for _n, _d in (("dropout1d", 1), ("dropout2d", 2), ("dropout3d", 3)):
    export(_n, namespace="nn.functional", function=False)(_feature_dropout_nd(_n, _d))


@export("alpha_dropout", namespace="nn.functional", function=False)
def F_alpha_dropout(input, p=0.5, training=False, inplace=False):
    _check_p(p)
    return (alpha_dropout_ if inplace else alpha_dropout)(input, p, training)


@export("alpha_dropout")
def alpha_dropout(input, p, train):
    if not train or p == 0:
        return input
    return _apply_noise(input, native_dropout(ones_like(input), p, True), p, False, True)


@export("alpha_dropout_")
def alpha_dropout_(input, p, train):
    if not train or p == 0:
        return input
    return _apply_noise(input, native_dropout(ones_like(input), p, True), p, True, True)


@export("feature_alpha_dropout", namespace="nn.functional", function=False)
def F_feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    _check_p(p)
    return _feature_dropout(input, p, training, inplace, True, alpha=True)


@export("feature_alpha_dropout")
def feature_alpha_dropout(input, p, train):
    return _feature_dropout(input, p, train, False, True, alpha=True)


@export("feature_dropout")
def feature_dropout(input, p, train):
    return _feature_dropout(input, p, train, False, True)
from . import loss, attention, attention_fused  # noqa: E402,F401  (losses; scaled_dot_product_attention)


# ---- vmap batching rule -----------------------------------------------------------------------------
@native_layer_norm.def_batching_rule
def _native_layer_norm_batching(in_dims, input, normalized_shape, weight, bias, eps):
    if in_dims[2] is not None or in_dims[3] is not None:
        return NotImplemented
    x = _batching.front(input, in_dims[0])
    return native_layer_norm(x, normalized_shape, weight, bias, eps), (0, 0, 0)


# ---- DTensor sharding rule --------------------------------------------------------------------------
native_layer_norm.def_sharding_rule(_sharding.layer_norm_rule)
