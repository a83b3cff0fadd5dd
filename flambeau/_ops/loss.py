"""Loss functions for `flambeau.nn.functional`: cross_entropy / nll_loss (class indices with weight,
ignore_index and label smoothing; probability targets; K-dim inputs), the elementwise losses
(mse, l1, smooth_l1, huber, binary cross entropy, kl_div, poisson/gaussian nll, margin losses) and
composites (bce with logits, multilabel soft margin, cosine embedding, triplet margin).

cross_entropy and nll_loss are fused ops over loss_i = -sum_c A_ic logp_ic (A already divided by the
'mean' denominator), backward dx = g * (sum(A) * softmax - A) (-g * A for nll_loss). For class-index
targets A_ic = alpha_i [c == t_i] + beta_i w_c is never built: the forward gathers the target column,
the backward scatters alpha at the targets into softmax, with one N x C array in each direction (the
shifted logits, then the gradient itself). Probability targets are dense already and use A. Target bounds are checked on the device on cuda
(`_backends.device_checks`: no synchronisation, the IndexError comes at the next one). Elementwise losses come from
`activation.pointwise_family` (forward + fused backward op) and are reduced with sum/div.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from .. import _dtype as D
from .._backends import cpu_kernels, device_checks, triton_launch
from ._registry import defop, export, TensorSpec, Tag
from ._helpers import opmath
from .activation import pointwise_family, _sigmoid, _softplus, relu, log_sigmoid, softplus, \
    cosine_similarity, pairwise_distance
from .._dispatch import type_name
from .creation import full_like
from . import _batching, _sharding

_RED = {"none": 0, "mean": 1, "sum": 2}


def _legacy(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "mean" if (size_average and reduce) else "sum" if reduce else "none"


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    if reduction == "mean":
        n = loss.numel()
        return loss.sum() / n if n else loss.sum() / 0.0
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _check_reduction(reduction):
    if reduction not in _RED:
        raise ValueError(f"{reduction} is not a valid value for reduction")


# ---- cross_entropy / nll_loss -----------------------------------------------------------------
def _dt(x):
    return x._dtype if hasattr(x, "_dtype") else D.FROM_NP[x.dtype]


def _prob_den(shape_last, reduction):
    n = int(np.prod(shape_last[:-1])) if len(shape_last) > 1 else 1
    return (n if n else 0.0) if reduction == 1 else 1


def _ce_check(x, target, weight, prob):
    xs, ts = tuple(x.shape), tuple(target.shape)
    if len(xs) == 0:
        raise RuntimeError("input tensor should be 1D or more")
    c = xs[1] if len(xs) >= 2 else xs[0]
    if weight is not None and (len(weight.shape) != 1 or weight.shape[0] != c):
        raise RuntimeError(f"weight tensor should be defined either for all {c} classes or no classes but got "
                           f"weight tensor of shape: {list(weight.shape)}")
    if prob:
        if xs != ts:
            raise RuntimeError(f"Expected target size {list(xs)}, got {list(ts)}")
        return c
    if _dt(target) not in (D.int64, D.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {type_name(_dt(target))}")
    if len(xs) == 2 and len(ts) != 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if len(xs) >= 2 and ts[:1] != xs[:1] and len(ts) >= 1:
        raise ValueError(f"Expected input batch_size ({xs[0]}) to match target batch_size ({ts[0]}).")
    want = xs[:1] + xs[2:] if len(xs) >= 2 else ()
    if ts != want:
        if len(xs) == 1:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        raise RuntimeError(f"Expected target size {list(want)}, got {list(ts)}")
    return c


def _last(xp, a):
    return xp.moveaxis(a, 1, -1) if a.ndim > 2 else a          # a 2-D array has its class axis last


def _prob_coeffs(xp, shape_last, target, weight, reduction, ls, cd):
    """Probability targets: the coefficient matrix A (class axis last) with loss_i = -sum_c A_ic logp_ic."""
    c = shape_last[-1]
    a = _last(xp, target).astype(cd) * (1 - ls) + ls / c
    if weight is not None:
        a = a * weight.astype(cd, copy=False)
    return a / _prob_den(shape_last, reduction)


def _class_coeffs(xp, shape_last, target, weight, reduction, ignore_index, ls, cd):
    """Class-index targets, without any N x C array: A_ic = alpha_i [c == t_i] + beta_i w_c.

    Returns (ts, valid, alpha, beta): the clamped flat targets, the not-ignored mask and the per-sample
    factors of the target term (weight, ignore mask, (1 - ls) and the 'mean' denominator) and of the
    smoothing term."""
    c = shape_last[-1]
    t = target.astype(np.int64, copy=False).reshape(-1)
    valid = t != ignore_index
    device_checks.check_range(xp, t, 0, c, IndexError, "Target {} is out of bounds.", skip=ignore_index)
    ts = xp.where(valid, t, 0)
    if xp is not np:          # NumPy's check_range raised already for any target outside [0, c); cuda's checks later
        ts = xp.clip(ts, 0, max(c - 1, 0))
    vf = valid.astype(cd)
    wt = vf if weight is None else weight.astype(cd, copy=False)[ts] * vf
    alpha, beta = wt, vf * (ls / c)
    if reduction == _RED["mean"]:
        den = wt.sum()
        alpha, beta = alpha / den, beta / den
    return ts, valid, alpha * (1 - ls) if ls else alpha, beta


def _rows(xp, a):
    """A C-contiguous (rows, C) view of the class-last array `a`."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _shifted(xp, x, out=None):
    """(s, m): s = x - max(x) along the class axis (a row whose max is -inf shifted by 0) as a fresh C-contiguous array, or in `out` (the one
    N x C temporary of the class-index path; callers overwrite it in place)."""
    m = x.max(axis=-1, keepdims=True) if x.shape[-1] else x.sum(axis=-1, keepdims=True)
    m = xp.where(m == -np.inf, 0, m)         # a row of -inf gives nan (as PyTorch's); +inf's row nan too
    s = xp.empty(x.shape, dtype=x.dtype) if out is None else out
    xp.subtract(x, m, out=s)
    return s, m


def _log_softmax(xp, x):
    s, _ = _shifted(xp, x)
    s -= xp.log(xp.exp(s).sum(axis=-1, keepdims=True))
    return s


def _class_forward(xp, x, target, weight, reduction, ignore_index, ls, fused_softmax, cd):
    """Per-sample losses for class-index targets: a gather of the target column, no one-hot."""
    ts, _, alpha, beta = _class_coeffs(xp, x.shape, target, weight, reduction, ignore_index, ls, cd)
    rows = xp.arange(ts.shape[0])
    if not fused_softmax:
        picked = xp.take_along_axis(x, ts.reshape(x.shape[:-1] + (1,)), axis=-1)
        return -alpha.reshape(x.shape[:-1]) * picked[..., 0]
    if not ls and weight is None and xp is np and (lp := cpu_kernels.ce_forward(x, ts)) is not None:
        return (-alpha * lp).reshape(x.shape[:-1])       # the path below in one C++ pass per row
    s, _ = _shifted(xp, x)
    s2 = _rows(xp, s)
    picked = s2[rows, ts]
    wsum = None
    if ls:
        wsum = s2.sum(axis=-1) if weight is None else s2 @ weight.astype(cd, copy=False)
    xp.exp(s2, out=s2)
    lse = xp.log(s2.sum(axis=-1))
    per = -alpha * (picked - lse)
    if ls:
        wtot = x.shape[-1] if weight is None else weight.astype(cd, copy=False).sum()
        per = per - beta * (wsum - wtot * lse)
    return per.reshape(x.shape[:-1])


def _class_backward(xp, g, x, target, weight, reduction, ignore_index, ls, fused_softmax, cd, out=None):
    """d loss / dx for class-index targets, written into one N x C array (the gradient itself; `out`,
    a class-last view of memory in the input's layout, where given):
    g * (sum_c(A) * softmax(x) - A) with A = alpha [c == t] + beta w, the target term scattered."""
    ts, valid, alpha, beta = _class_coeffs(xp, x.shape, target, weight, reduction, ignore_index, ls, cd)
    if reduction == _RED["mean"]:  # every target ignored: the loss is 0/0 but PyTorch's gradient is zero
        alpha, beta = xp.where(valid, alpha, 0), xp.where(valid, beta, 0)
    g = xp.broadcast_to(g, x.shape[:-1]).reshape(-1).astype(cd, copy=False)
    lead = x.shape[:-1]
    at_targets = (xp.unravel_index(xp.arange(ts.shape[0]), lead) if lead else ()) + (ts,)

    def per_row(v):
        return v.reshape(lead + (1,))
    if not fused_softmax:
        if out is None:
            gx = xp.zeros(x.shape, dtype=cd)
        else:
            gx = out
            gx[...] = 0
        gx[at_targets] = -g * alpha
        return gx
    if out is None and not ls and weight is None and xp is np:
        coef = g * alpha                       # alpha + beta * c is alpha without label smoothing
        if (gx := cpu_kernels.ce_backward(x, ts, coef, coef)) is not None:
            return gx                          # the path below in one C++ pass per row
    gx, _ = _shifted(xp, x, out)
    xp.exp(gx, out=gx)
    gx /= gx.sum(axis=-1, keepdims=True)
    c = x.shape[-1]
    if ls and weight is not None:
        # g (sumA p - beta w) = g beta (p sumA / beta - w); a row with beta == 0 is all zero
        w = weight.astype(cd, copy=False)
        gb = g * beta
        suma_over_beta = (alpha + beta * w.sum()) / xp.where(beta == 0, 1, beta)
        gx *= per_row(suma_over_beta)
        gx -= w
        gx *= per_row(gb)
    else:
        gx *= per_row(g * (alpha + beta * c))
        if ls:
            gx -= per_row(g * beta)
    gx[at_targets] -= g * alpha
    return gx


def _ce_forward(xp, self, target, weight, reduction, ignore_index, ls, fused_softmax):
    dt = D.FROM_NP[self.dtype]
    cd = opmath(dt)
    prob = _dt(target).category >= D.FLOATING
    _ce_check(self, target, weight, prob)
    x = _last(xp, self.astype(cd, copy=False))
    if prob:
        logp = _log_softmax(xp, x) if fused_softmax else x
        per = -(_prob_coeffs(xp, x.shape, target, weight, reduction, ls, cd) * logp).sum(axis=-1)
    else:
        per = _class_forward(xp, x, target, weight, reduction, ignore_index, ls, fused_softmax, cd)
    out = per if reduction == 0 else per.sum()
    return xp.asarray(out).astype(dt.np, copy=False)


def _ce_meta(self, target, weight, reduction, ignore_index, ls):
    _ce_check(self, target, weight, target.dtype.is_floating_point)
    shape = tuple(self.shape)
    out = (shape[:1] + shape[2:] if len(shape) >= 2 else ()) if reduction == 0 else ()
    return TensorSpec(out, self.dtype)


def _prob_backward(xp, g, x, target, weight, reduction, ls, fused_softmax, cd):
    """(dx, dtarget, dweight) for probability targets (dense: the target is N x C already)."""
    a = _prob_coeffs(xp, x.shape, target, weight, reduction, ls, cd)
    g = g[..., None]
    logp = _log_softmax(xp, x) if fused_softmax else x
    gx = g * (a.sum(axis=-1, keepdims=True) * xp.exp(logp) - a) if fused_softmax else -g * a
    w = 1 if weight is None else weight.astype(cd, copy=False)
    den = _prob_den(x.shape, reduction)
    gt = -g * logp * w * (1 - ls) / den
    gw = None
    if weight is not None:
        tl = _last(xp, target).astype(cd) * (1 - ls) + ls / x.shape[-1]
        gw = (-g * tl * logp / den).reshape(-1, x.shape[-1]).sum(axis=0)
    return gx, gt, gw


def _ce_backward(xp, grad, self, target, weight, reduction, ignore_index, ls, fused_softmax):
    dt = D.FROM_NP[self.dtype]
    cd = opmath(dt)
    x = _last(xp, self.astype(cd, copy=False))
    g = grad.astype(cd, copy=False)
    if _dt(target).category < D.FLOATING:
        # a K-dim input's gradient is computed in the input's layout (class axis 1), so it comes back with
        # the leaf's strides (AccumulateGrad would copy a class-last one)
        out = _last(xp, xp.empty(self.shape, dtype=cd)) if self.ndim > 2 else None
        gx = _class_backward(xp, g, x, target, weight, reduction, ignore_index, ls, fused_softmax, cd, out)
        gt = gw = None
    else:
        gx, gt, gw = _prob_backward(xp, g if reduction == 0 else xp.broadcast_to(g, x.shape[:-1]), x, target,
                                    weight, reduction, ls, fused_softmax, cd)
        gt = (xp.moveaxis(gt, -1, 1) if self.ndim >= 2 else gt).astype(target.dtype, copy=False)
        gw = None if gw is None else gw.astype(weight.dtype, copy=False)
    gx = (xp.moveaxis(gx, -1, 1) if self.ndim >= 2 else gx).astype(dt.np, copy=False)
    return gx, gt, gw


def _cuda_ce(xp, x, target, weight, label_smoothing):
    """`_backends.triton_cross_entropy` when cross_entropy of these CuPy arrays can run there, else None."""
    if getattr(xp, "__name__", "") != "cupy" or not triton_launch.available():
        return None
    from .._backends import triton_cross_entropy  # deferred: imports Triton, optional (cuda only)
    return triton_cross_entropy if triton_cross_entropy.supported(x, target, weight, label_smoothing) else None


@defop("cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, "
       "SymInt ignore_index=-100, float label_smoothing=0.0) -> Tensor", function=False,
       tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def cross_entropy_loss(xp, self, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    fused = _cuda_ce(xp, self, target, weight, label_smoothing)
    if fused is not None:
        _ce_check(self, target, weight, False)
        # mean and sum reduced there; targets outside [0, C) recorded by its kernel (`device_checks`)
        return fused.forward(self, target, ignore_index, reduction)
    return _ce_forward(xp, self, target, weight, reduction, ignore_index, label_smoothing, True)


cross_entropy_loss.def_meta(lambda self, target, weight=None, reduction=1, ignore_index=-100,
                            label_smoothing=0.0: _ce_meta(self, target, weight, reduction, ignore_index,
                                                          label_smoothing))


@defop("cross_entropy_loss_backward(Tensor grad, Tensor self, Tensor target, Tensor? weight, int reduction, "
       "SymInt ignore_index, float label_smoothing) -> (Tensor, Tensor, Tensor)", function=False)
def cross_entropy_loss_backward(xp, grad, self, target, weight, reduction, ignore_index, label_smoothing):
    fused = _cuda_ce(xp, self, target, weight, label_smoothing)
    if fused is not None:
        return fused.backward(grad, self, target, ignore_index, reduction), None, None
    return _ce_backward(xp, grad, self, target, weight, reduction, ignore_index, label_smoothing, True)


cross_entropy_loss_backward.def_meta(lambda grad, self, target, weight, reduction, ignore_index, label_smoothing: (
    TensorSpec(self.shape, self.dtype),
    TensorSpec(target.shape, target.dtype) if target.dtype.is_floating_point else None,
    TensorSpec(weight.shape, weight.dtype) if weight is not None and target.dtype.is_floating_point else None))


@cross_entropy_loss.def_derivative
def _(grad, self, target, weight, reduction, ignore_index, label_smoothing):
    return cross_entropy_loss_backward(grad, self, target, weight, reduction, ignore_index, label_smoothing)


@defop("nll_loss_nd(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100) "
       "-> Tensor", function=False, tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def nll_loss_nd(xp, self, target, weight=None, reduction=1, ignore_index=-100):
    if _dt(target).category >= D.FLOATING:
        _ce_check(self, target, weight, False)
    return _ce_forward(xp, self, target, weight, reduction, ignore_index, 0.0, False)


nll_loss_nd.def_meta(lambda self, target, weight=None, reduction=1, ignore_index=-100: _ce_meta(
    self, target, weight, reduction, ignore_index, 0.0) if not target.dtype.is_floating_point else
    _ce_check(self, target, weight, False))


@defop("nll_loss_nd_backward(Tensor grad, Tensor self, Tensor target, Tensor? weight, int reduction, "
       "SymInt ignore_index) -> Tensor", function=False)
def nll_loss_nd_backward(xp, grad, self, target, weight, reduction, ignore_index):
    return _ce_backward(xp, grad, self, target, weight, reduction, ignore_index, 0.0, False)[0]


nll_loss_nd_backward.def_meta(lambda grad, self, target, weight, reduction, ignore_index:
                              TensorSpec(self.shape, self.dtype))


@nll_loss_nd.def_derivative
def _(grad, self, target, weight, reduction, ignore_index):
    return nll_loss_nd_backward(grad, self, target, weight, reduction, ignore_index), None, None


@export("cross_entropy", namespace="nn.functional", function=False)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    reduction = _legacy(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    return cross_entropy_loss(input, target, weight, _RED[reduction], ignore_index, label_smoothing)


@export("nll_loss", namespace="nn.functional", function=False)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction)
    _check_reduction(reduction)
    return nll_loss_nd(input, target, weight, _RED[reduction], ignore_index)


# ---- elementwise losses -----------------------------------------------------------------------
def _same_size(input, target, name=""):
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"Using a target size ({_size(target)}) that is different to the input size "
                      f"({_size(input)}). This will likely lead to incorrect results due to broadcasting. "
                      f"Please ensure they have the same size.", UserWarning, stacklevel=3)


def _size(t):
    return f"torch.Size({list(t.shape)})"


_TT = ("self", "target")
mse_loss_op = pointwise_family("mse_loss", tensors=_TT, fwd=lambda xp, x, t: (x - t) * (x - t),
                               bwd=lambda xp, g, x, t: (2 * (x - t) * g, -2 * (x - t) * g),
                               tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
l1_loss_op = pointwise_family("l1_loss", tensors=_TT, fwd=lambda xp, x, t: xp.abs(x - t),
                              bwd=lambda xp, g, x, t: (xp.sign(x - t) * g, -xp.sign(x - t) * g),
                              tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _sl1_fwd(xp, x, t, beta):
    d = xp.abs(x - t)
    return d if beta == 0 else xp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


def _sl1_bwd(xp, g, x, t, beta):
    d = x - t
    r = xp.sign(d) if beta == 0 else xp.where(xp.abs(d) < beta, d / beta, xp.sign(d))
    return r * g, -r * g


smooth_l1_op = pointwise_family("smooth_l1_loss", "float beta", tensors=_TT, fwd=_sl1_fwd, bwd=_sl1_bwd,
                                tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _huber_fwd(xp, x, t, delta):
    d = xp.abs(x - t)
    return xp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


def _huber_bwd(xp, g, x, t, delta):
    d = x - t
    r = xp.where(xp.abs(d) < delta, d, delta * xp.sign(d))
    return r * g, -r * g


huber_op = pointwise_family("huber_loss", "float delta", tensors=_TT, fwd=_huber_fwd, bwd=_huber_bwd,
                            tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))

soft_margin_op = pointwise_family(
    "soft_margin_loss", tensors=_TT, fwd=lambda xp, x, t: _softplus(xp, -t * x),
    bwd=lambda xp, g, x, t: (-t * _sigmoid(xp, -t * x) * g, -x * _sigmoid(xp, -t * x) * g),
    tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _bce_fwd(xp, x, t):
    if bool(((x < 0) | (x > 1)).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")
    return -(t * xp.maximum(xp.log(x), -100) + (1 - t) * xp.maximum(xp.log1p(-x), -100))


def _bce_bwd(xp, g, x, t):
    gx = g * (x - t) / xp.maximum((1 - x) * x, 1e-12)
    gt = g * (xp.maximum(xp.log1p(-x), -100) - xp.maximum(xp.log(x), -100))
    return gx, gt


bce_op = pointwise_family("binary_cross_entropy", tensors=_TT, fwd=_bce_fwd, bwd=_bce_bwd,
                          tags=(Tag.autocast_banned, Tag.cpu_autocast_fp32))


def _kl_fwd(xp, x, t, log_target):
    if log_target:
        return xp.exp(t) * (t - x)
    return xp.where(t > 0, t * xp.log(xp.where(t > 0, t, 1)), 0) - t * x


def _kl_bwd(xp, g, x, t, log_target):
    if log_target:
        return -xp.exp(t) * g, xp.exp(t) * (t - x + 1) * g
    return -t * g, (xp.log(xp.where(t > 0, t, 1)) + 1 - x) * g


kl_div_op = pointwise_family("kl_div_elementwise", "bool log_target", tensors=_TT, fwd=_kl_fwd, bwd=_kl_bwd,
                             tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _pnll_fwd(xp, x, t, log_input, full, eps):
    r = xp.exp(x) - t * x if log_input else x - t * xp.log(x + eps)
    if full:
        st = t * xp.log(xp.where(t > 1, t, 1)) - t + 0.5 * xp.log(2 * math.pi * xp.where(t > 1, t, 1))
        r = r + xp.where(t > 1, st, 0)
    return r


def _pnll_bwd(xp, g, x, t, log_input, full, eps):
    if log_input:
        gx, gt = xp.exp(x) - t, -x
    else:
        gx, gt = 1 - t / (x + eps), -xp.log(x + eps)
    if full:
        ts = xp.where(t > 1, t, 1)
        gt = gt + xp.where(t > 1, xp.log(ts) + 0.5 / ts, 0)
    return gx * g, gt * g


poisson_op = pointwise_family("poisson_nll_loss_elementwise", "bool log_input, bool full, float eps",
                              tensors=_TT, fwd=_pnll_fwd, bwd=_pnll_bwd,
                              tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _hinge_fwd(xp, x, t, margin):
    return xp.where(t != 1, xp.maximum(margin - x, 0), 0) + xp.where(t != -1, x, 0)


def _hinge_bwd(xp, g, x, t, margin):
    return (xp.where(t != 1, -((margin - x) > 0).astype(x.dtype), 0) + xp.where(t != -1, 1, 0)) * g, None


hinge_op = pointwise_family("hinge_embedding_loss_elementwise", "float margin", tensors=_TT,
                            fwd=_hinge_fwd, bwd=_hinge_bwd, grads=("self",),
                            tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _mr_bwd(xp, g, x1, x2, t, margin):
    m = (-t * (x1 - x2) + margin) > 0
    return -t * m * g, t * m * g, -(x1 - x2) * m * g


margin_ranking_op = pointwise_family(
    "margin_ranking_loss_elementwise", "float margin", tensors=("input1", "input2", "target"),
    fwd=lambda xp, x1, x2, t, margin: xp.maximum(-t * (x1 - x2) + margin, 0), bwd=_mr_bwd,
    tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))


def _gnll_fwd(xp, x, t, v, eps):
    v = xp.maximum(v, eps)
    return 0.5 * (xp.log(v) + (x - t) ** 2 / v)


def _gnll_bwd(xp, g, x, t, v, eps):
    v = xp.maximum(v, eps)
    d = (x - t) / v
    return d * g, -d * g, 0.5 * (1 / v - d * d) * g


gaussian_op = pointwise_family("gaussian_nll_loss_elementwise", "float eps", tensors=("self", "target", "var"),
                               fwd=_gnll_fwd, bwd=_gnll_bwd)


@export("mse_loss", namespace="nn.functional", function=False)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    _same_size(input, target)
    loss = mse_loss_op(input, target)
    return _reduce(loss if weight is None else loss * weight, _legacy(size_average, reduce, reduction))


@export("l1_loss", namespace="nn.functional", function=False)
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    _same_size(input, target)
    loss = l1_loss_op(input, target)
    return _reduce(loss if weight is None else loss * weight, _legacy(size_average, reduce, reduction))


@export("smooth_l1_loss", namespace="nn.functional", function=False)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    _same_size(input, target)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    return _reduce(smooth_l1_op(input, target, float(beta)), _legacy(size_average, reduce, reduction))


@export("huber_loss", namespace="nn.functional", function=False)
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    _same_size(input, target)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    loss = huber_op(input, target, float(delta))
    return _reduce(loss if weight is None else loss * weight, reduction)


@export("soft_margin_loss", namespace="nn.functional", function=False)
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _reduce(soft_margin_op(input, target), _legacy(size_average, reduce, reduction))


@export("binary_cross_entropy", namespace="nn.functional", function=False)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({_size(target)}) that is different to the input size "
                         f"({_size(input)}) is deprecated. Please ensure they have the same size.")
    loss = bce_op(input, target)
    return _reduce(loss if weight is None else loss * weight, reduction)


@export("binary_cross_entropy_with_logits", namespace="nn.functional", tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _legacy(size_average, reduce, reduction) if not isinstance(reduce, int) else \
        {0: "none", 1: "mean", 2: "sum"}[reduce]
    _check_reduction(reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({_size(target)}) must be the same as input size ({_size(input)})")
    sp = softplus(-input)
    lw = sp if pos_weight is None else (1 + (pos_weight - 1) * target) * sp
    loss = (1 - target) * input + lw
    return _reduce(loss if weight is None else loss * weight, reduction)


@export("kl_div", namespace="nn.functional")
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    reduction = _legacy(size_average, reduce, reduction)
    loss = kl_div_op(input, target, bool(log_target))
    if reduction == "batchmean":
        return loss.sum() / (input.shape[0] if len(input.shape) else 1)
    return _reduce(loss, reduction)


@export("poisson_nll_loss", namespace="nn.functional")
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction)
    _check_reduction(reduction)
    return _reduce(poisson_op(input, target, bool(log_input), bool(full), float(eps)), reduction)


@export("gaussian_nll_loss", namespace="nn.functional", function=False,
        tags=(Tag.autocast_fp32,))   # on cuda PyTorch's composite runs log/pow in float32
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    if isinstance(var, (int, float)):
        var = full_like(input, var)
    ishape, vshape = tuple(input.shape), tuple(var.shape)
    if vshape != ishape:
        if ishape[:-1] == vshape:
            var = var.unsqueeze(-1)
        elif not (ishape[:-1] == vshape[:-1] and vshape[-1:] == (1,)):
            raise ValueError("var is of incorrect size")
    _check_reduction(reduction)
    if var.device.type != "meta" and bool((var.detach() < 0).any()):
        raise ValueError("var has negative entry/entries")
    loss = gaussian_op(input, target, var, float(eps))
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


@export("hinge_embedding_loss", namespace="nn.functional")
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction) if not isinstance(reduction, int) else \
        {0: "none", 1: "mean", 2: "sum"}[reduction]
    return _reduce(hinge_op(input, target, float(margin)), reduction)


@export("margin_ranking_loss", namespace="nn.functional")
def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction) if not isinstance(reduction, int) else \
        {0: "none", 1: "mean", 2: "sum"}[reduction]
    if len(input1.shape) != len(input2.shape) or len(input1.shape) != len(target.shape):
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
                           f"input1: {_size(input1)}, input2: {_size(input2)}, target: {_size(target)} ")
    return _reduce(margin_ranking_op(input1, input2, target, float(margin)), reduction)


@export("multilabel_soft_margin_loss", namespace="nn.functional", function=False)
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction)
    loss = -(target * log_sigmoid(input) + (1 - target) * log_sigmoid(-input))
    if weight is not None:
        loss = loss * weight
    c = input.shape[-1]
    loss = loss.sum(len(input.shape) - 1) / c
    return _reduce(loss, reduction)


@export("cosine_embedding_loss", namespace="nn.functional", tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction) if not isinstance(reduction, int) else \
        {0: "none", 1: "mean", 2: "sum"}[reduction]
    nd = len(input1.shape)
    if nd not in (1, 2) or len(target.shape) != nd - 1:
        raise RuntimeError(f"{nd - 1}D target tensor expects {nd}D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    cos = cosine_similarity(input1, input2, -1, 1e-12)
    pos = (target == 1).to(cos.dtype)
    neg = (target == -1).to(cos.dtype)
    return _reduce(pos * (1 - cos) + neg * relu(cos - margin), reduction)


@export("triplet_margin_loss", namespace="nn.functional", tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    reduction = _legacy(size_average, reduce, reduction) if not isinstance(reduction, int) else \
        {0: "none", 1: "mean", 2: "sum"}[reduction]
    a, po, n = len(anchor.shape), len(positive.shape), len(negative.shape)
    if not (a == po == n):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {a}D, positive {po}D, and negative {n}D inputs")
    d_ap = pairwise_distance(anchor, positive, float(p), eps)
    d_an = pairwise_distance(anchor, negative, float(p), eps)
    if swap:
        d_pn = pairwise_distance(positive, negative, float(p), eps)
        d_an = d_an - relu(d_an - d_pn)
    return _reduce(relu(margin + d_ap - d_an), reduction)


# ---- vmap batching rules ----------------------------------------------------------------------------
def _class_loss_batching(op):
    """cross_entropy / nll_loss with class-index targets: the examples' minibatches joined into one,
    reduction none, then each example reduced (mean over its non-ignored targets)."""
    def rule(in_dims, self, target, weight=None, reduction=1, ignore_index=-100, *rest):
        if in_dims[2] is not None or target.dtype.is_floating_point or (reduction == 1 and weight is not None):
            return NotImplemented
        size = _batching.batch_size((self, target), in_dims)
        x = _batching.materialize(self, in_dims[0], size)
        t = _batching.materialize(target, in_dims[1], size)
        if x.dim() == 2:                               # one unbatched example: the vmap batch is the minibatch
            loss = _batching.call(op, [x, t, weight, 0, ignore_index, *rest])
            if reduction == 1:
                loss = _mean_over_valid(loss, t != ignore_index)
            return loss, 0
        n = x.shape[1]
        loss = _batching.call(op, [x.reshape((size * n,) + tuple(x.shape[2:])),
                                   t.reshape((size * n,) + tuple(t.shape[2:])), weight, 0, ignore_index, *rest])
        loss = loss.reshape((size,) + tuple(t.shape[1:]))
        if reduction == 0:
            return loss, 0
        if t.numel() == size:                          # one target an example (a minibatch of one): no sums
            total, valid = loss.reshape(size), (t.reshape(size) != ignore_index)
        else:
            total, valid = loss.reshape(size, -1).sum(1), (t != ignore_index).reshape(size, -1).sum(1)
        if reduction == 2:
            return total, 0
        return _mean_over_valid(total, valid), 0
    rule.__name__ = f"_{op.__name__}_batching"
    return rule


def _mean_over_valid(total, valid):
    """Each example's sum over its count of non-ignored targets: nan (0/0) for an example with none, as
    PyTorch's mean, but with a zero gradient there as PyTorch's backward gives (a plain division's
    gradient would be 0 * inf = nan)."""
    none = valid == 0
    return (total / valid.to(total.dtype).clamp(min=1)).masked_fill(none, float("nan"))


for _op in (cross_entropy_loss, nll_loss_nd):
    _op.def_batching_rule(_class_loss_batching(_op))


# ---- DTensor sharding rule --------------------------------------------------------------------------
cross_entropy_loss.def_sharding_rule(_sharding.cross_entropy_rule)
