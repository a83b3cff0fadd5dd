"""Decompositions of the losses (cross_entropy / nll_loss with weights, ignore_index and label
smoothing, their backward ops, and the elementwise losses with theirs) and of the p-norm distances
(normalize, cosine_similarity, pairwise_distance, cdist, pdist and their backward ops).

cross_entropy and nll_loss go through one coefficient tensor A (class axis in place) with
loss_i = -sum_c A_ic * logp_ic, already divided by the 'mean' denominator; the backward is then
dx = g * (sum_c(A) * softmax - A) for cross_entropy and -g * A for nll_loss. The forward over
class-index targets without label smoothing gathers each target's value instead (`_picked_loss`),
and its backward takes one coefficient per target (`_picked_loss_backward`).
"""
from __future__ import annotations

import math

from .. import _dtype as D
from ._table import aten, register_decomposition, maximum, to, compute_dtype, full, reshape, wrap
from .decompositions_nn import _pointwise, _backward, _float_check, softplus_stable
from .._ops.loss import _ce_check
from .._ops._helpers import broadcast_shapes
from .._ops.activation import _cdist_check

# ---- cross entropy / nll ------------------------------------------------------------------------------


def _coefficients(x, target, weight, reduction, ignore_index, ls, cd):
    """(A, cdim, nan_if_empty): the coefficient tensor over x's shape, the class dim, and for a 'mean'
    over class indices den * 0 / den (NaN when every target is ignored: PyTorch's loss is 0/0 there
    while its gradient is zero, so A itself is zeroed at ignored targets), else None."""
    prob = target.dtype.category >= D.FLOATING
    _ce_check(x, target, weight, prob)
    cdim = 1 if x.ndim >= 2 else 0
    c = x.shape[cdim]
    wshape = [1] * x.ndim
    wshape[cdim] = c
    w = full((c,), 1, x, cd) if weight is None else to(weight, cd)
    wb = reshape(w, tuple(wshape))
    if prob:
        n = x.numel() // c if x.ndim > 1 else 1
        den = (n if n else 0.0) if reduction == 1 else 1
        a = aten.mul(aten.add(aten.mul(to(target, cd), 1 - ls), ls / c), wb)
        return aten.div(a, den), cdim, None
    t = to(target, D.int64)
    valid = aten.ne(t, ignore_index)
    ts = aten.where(valid, t, 0)
    wt = aten.mul(aten.index(w, [ts]), valid)
    classes = reshape(aten.arange(0, c, 1, dtype=D.int64, device=x.device), tuple(wshape))
    onehot = to(aten.eq(aten.unsqueeze(ts, cdim), classes), cd)
    a = aten.mul(onehot, aten.unsqueeze(wt, cdim))
    smooth = aten.div(aten.mul(wb, aten.unsqueeze(valid, cdim)), c) if ls else None
    nan_if_empty = None
    if reduction == 1:
        den = aten.sum(wt)
        vb = aten.unsqueeze(valid, cdim)
        a = aten.where(vb, aten.div(a, den), 0)
        if smooth is not None:
            smooth = aten.where(vb, aten.div(smooth, den), 0)
        nan_if_empty = aten.div(aten.mul(den, 0), den)
    if smooth is not None:
        a = aten.add(aten.mul(a, 1 - ls), aten.mul(smooth, ls))
    return a, cdim, nan_if_empty


def _reduce_coeff_loss(terms, cdim, reduction, nan_if_empty):
    if reduction == 0:
        return aten.neg(aten.sum(terms, [cdim]))
    loss = aten.neg(aten.sum(terms))
    return loss if nan_if_empty is None else aten.add(loss, nan_if_empty)


def _picked_loss(values, target, weight, reduction, ignore_index, cd):
    """The loss over class-index targets from `values` (log-probabilities for cross_entropy, the
    input for nll_loss) at each target: one gather per target instead of a class-wide one-hot,
    O(N) rather than O(N * C) (a compiled GPT-2 loss had reduced its 8192 x 50257 product in one
    GPU program), and no 0 * -inf where some other class has probability 0."""
    _ce_check(values, target, weight, False)
    cdim = 1 if values.ndim >= 2 else 0
    t = to(target, D.int64)
    valid = aten.ne(t, ignore_index)
    ts = aten.where(valid, t, 0)
    picked = reshape(aten.gather(values, cdim, aten.unsqueeze(ts, cdim)), tuple(target.shape))
    w = to(valid, cd) if weight is None else aten.mul(aten.index(to(weight, cd), [ts]), valid)
    terms = aten.where(valid, aten.mul(picked, w), 0)
    if reduction == 0:
        return aten.neg(terms)
    total = aten.neg(aten.sum(terms))
    return total if reduction == 2 else aten.div(total, aten.sum(w))


@register_decomposition(aten.cross_entropy_loss)
def cross_entropy_loss(self, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    dt = _float_check("cross_entropy", self)
    cd = compute_dtype(dt)
    x = to(self, cd)
    cdim = 1 if x.ndim >= 2 else 0
    if target.dtype.category < D.FLOATING and not label_smoothing:
        return to(_picked_loss(aten.log_softmax(x, cdim), target, weight, reduction, ignore_index, cd), dt)
    a, cdim, nan_if_empty = _coefficients(x, target, weight, reduction, ignore_index, label_smoothing, cd)
    logp = aten.log_softmax(x, cdim)
    return to(_reduce_coeff_loss(aten.mul(a, logp), cdim, reduction, nan_if_empty), dt)


def _grad_along(grad, cdim, reduction, cd):
    g = to(grad, cd)
    return aten.unsqueeze(g, cdim) if reduction == 0 else g


def _picked_loss_backward(grad, x, target, weight, reduction, ignore_index, cd):
    """cross_entropy's input gradient over class-index targets: g_i * w_i * (softmax_ic - [c == t_i])
    (divided by the weight total for 'mean'), one coefficient per target and the one-hot as a
    comparison, so no N x C coefficient tensor is made or read."""
    cdim = 1 if x.ndim >= 2 else 0
    t = to(target, D.int64)
    valid = aten.ne(t, ignore_index)
    ts = aten.where(valid, t, 0)
    w = to(valid, cd) if weight is None else aten.mul(aten.index(to(weight, cd), [ts]), valid)
    coef = aten.mul(w, to(grad, cd)) if reduction == 0 else aten.mul(w, to(grad, cd) if reduction == 2 else
                                                                     aten.div(to(grad, cd), aten.sum(w)))
    coef = aten.where(valid, coef, 0)
    wshape = [1] * x.ndim
    wshape[cdim] = x.shape[cdim]
    classes = reshape(aten.arange(0, x.shape[cdim], 1, dtype=D.int64, device=x.device), tuple(wshape))
    onehot = to(aten.eq(aten.unsqueeze(ts, cdim), classes), cd)
    return aten.mul(aten.sub(aten.softmax(x, cdim), onehot), aten.unsqueeze(coef, cdim))


@register_decomposition(aten.cross_entropy_loss_backward)
def cross_entropy_loss_backward(grad, self, target, weight, reduction, ignore_index, label_smoothing):
    dt = _float_check("cross_entropy", self)
    cd = compute_dtype(dt)
    x = to(self, cd)
    if target.dtype.category < D.FLOATING and not label_smoothing:
        return to(_picked_loss_backward(grad, x, target, weight, reduction, ignore_index, cd), dt), None, None
    a, cdim, _ = _coefficients(x, target, weight, reduction, ignore_index, label_smoothing, cd)
    g = _grad_along(grad, cdim, reduction, cd)
    sm = aten.softmax(x, cdim)
    dx = aten.sub(aten.mul(aten.sum(a, [cdim], True), sm), a)
    gx = to(aten.mul(dx, g), dt)
    if target.dtype.category < D.FLOATING:
        return gx, None, None
    c = x.shape[cdim]
    n = x.numel() // c if x.ndim > 1 else 1
    den = (n if n else 0.0) if reduction == 1 else 1
    glogp = aten.div(aten.neg(aten.mul(g, aten.log_softmax(x, cdim))), den)
    wshape = [1] * x.ndim
    wshape[cdim] = c
    wb = 1 if weight is None else reshape(to(weight, cd), tuple(wshape))
    gt = to(aten.mul(aten.mul(glogp, wb), 1 - label_smoothing), target.dtype)
    gw = None
    if weight is not None:
        tl = aten.add(aten.mul(to(target, cd), 1 - label_smoothing), label_smoothing / c)
        gw = to(aten.sum(aten.mul(glogp, tl), [d for d in range(x.ndim) if d != cdim]), weight.dtype)
    return gx, gt, gw


@register_decomposition(aten.nll_loss_nd)
def nll_loss_nd(self, target, weight=None, reduction=1, ignore_index=-100):
    if target.dtype.category >= D.FLOATING:
        return NotImplemented
    dt = _float_check("nll_loss", self)
    cd = compute_dtype(dt)
    return to(_picked_loss(to(self, cd), target, weight, reduction, ignore_index, cd), dt)


@register_decomposition(aten.nll_loss_nd_backward)
def nll_loss_nd_backward(grad, self, target, weight, reduction, ignore_index):
    if target.dtype.category >= D.FLOATING:
        return NotImplemented
    dt = _float_check("nll_loss", self)
    cd = compute_dtype(dt)
    a, cdim, _ = _coefficients(to(self, cd), target, weight, reduction, ignore_index, 0.0, cd)
    return to(aten.neg(aten.mul(a, _grad_along(grad, cdim, reduction, cd))), dt)


# ---- elementwise losses ----------------------------------------------------------------------------
@_pointwise(aten.mse_loss, nin=2)
def mse_loss(x, t):
    d = aten.sub(x, t)
    return aten.mul(d, d)


@_backward(aten.mse_loss_backward, nin=2)
def mse_loss_backward(g, x, t):
    r = aten.mul(aten.mul(aten.sub(x, t), 2), g)
    return r, aten.neg(r)


@_pointwise(aten.l1_loss, nin=2)
def l1_loss(x, t):
    return aten.abs(aten.sub(x, t))


@_backward(aten.l1_loss_backward, nin=2)
def l1_loss_backward(g, x, t):
    r = aten.mul(aten.sign(aten.sub(x, t)), g)
    return r, aten.neg(r)


@_pointwise(aten.smooth_l1_loss, nin=2)
def smooth_l1_loss(x, t, beta):
    d = aten.abs(aten.sub(x, t))
    if beta == 0:
        return d
    return aten.where(aten.lt(d, beta), aten.div(aten.mul(aten.mul(d, d), 0.5), beta), aten.sub(d, 0.5 * beta))


@_backward(aten.smooth_l1_loss_backward, nin=2)
def smooth_l1_loss_backward(g, x, t, beta):
    d = aten.sub(x, t)
    r = aten.sign(d) if beta == 0 else aten.where(aten.lt(aten.abs(d), beta), aten.div(d, beta), aten.sign(d))
    r = aten.mul(r, g)
    return r, aten.neg(r)


@_pointwise(aten.huber_loss, nin=2)
def huber_loss(x, t, delta):
    d = aten.abs(aten.sub(x, t))
    return aten.where(aten.lt(d, delta), aten.mul(aten.mul(d, d), 0.5), aten.mul(aten.sub(d, 0.5 * delta), delta))


@_backward(aten.huber_loss_backward, nin=2)
def huber_loss_backward(g, x, t, delta):
    d = aten.sub(x, t)
    r = aten.mul(aten.where(aten.lt(aten.abs(d), delta), d, aten.mul(aten.sign(d), delta)), g)
    return r, aten.neg(r)


@_pointwise(aten.soft_margin_loss, nin=2)
def soft_margin_loss(x, t):
    return softplus_stable(aten.neg(aten.mul(t, x)))


@_backward(aten.soft_margin_loss_backward, nin=2)
def soft_margin_loss_backward(g, x, t):
    s = aten.mul(aten.sigmoid(aten.neg(aten.mul(t, x))), g)
    return aten.neg(aten.mul(t, s)), aten.neg(aten.mul(x, s))


def _clamped_logs(x):
    return maximum(aten.log(x), -100), maximum(aten.log1p(aten.neg(x)), -100)


@_pointwise(aten.binary_cross_entropy, nin=2)
def binary_cross_entropy(x, t):
    lx, l1x = _clamped_logs(x)
    return aten.neg(aten.add(aten.mul(t, lx), aten.mul(aten.sub(1, t), l1x)))


@_backward(aten.binary_cross_entropy_backward, nin=2)
def binary_cross_entropy_backward(g, x, t):
    lx, l1x = _clamped_logs(x)
    gx = aten.div(aten.mul(g, aten.sub(x, t)), maximum(aten.mul(aten.sub(1, x), x), 1e-12))
    return gx, aten.mul(g, aten.sub(l1x, lx))


def _safe_log(t):
    return aten.log(aten.where(aten.gt(t, 0), t, 1.0))


@_pointwise(aten.kl_div_elementwise, nin=2)
def kl_div(x, t, log_target):
    if log_target:
        return aten.mul(aten.exp(t), aten.sub(t, x))
    return aten.sub(aten.where(aten.gt(t, 0), aten.mul(t, _safe_log(t)), 0.0), aten.mul(t, x))


@_backward(aten.kl_div_elementwise_backward, nin=2)
def kl_div_backward(g, x, t, log_target):
    if log_target:
        e = aten.exp(t)
        return aten.neg(aten.mul(e, g)), aten.mul(aten.mul(e, aten.add(aten.sub(t, x), 1)), g)
    return aten.neg(aten.mul(t, g)), aten.mul(aten.sub(aten.add(_safe_log(t), 1), x), g)


@_pointwise(aten.poisson_nll_loss_elementwise, nin=2)
def poisson_nll(x, t, log_input, full_, eps):
    if log_input:
        r = aten.sub(aten.exp(x), aten.mul(t, x))
    else:
        r = aten.sub(x, aten.mul(t, aten.log(aten.add(x, eps))))
    if full_:
        big = aten.gt(t, 1)
        ts = aten.where(big, t, 1.0)
        st = aten.add(aten.sub(aten.mul(t, aten.log(ts)), t), aten.mul(aten.log(aten.mul(ts, 2 * math.pi)), 0.5))
        r = aten.add(r, aten.where(big, st, 0.0))
    return r


@_backward(aten.poisson_nll_loss_elementwise_backward, nin=2)
def poisson_nll_backward(g, x, t, log_input, full_, eps):
    if log_input:
        gx, gt = aten.sub(aten.exp(x), t), aten.neg(x)
    else:
        gx = aten.sub(1, aten.div(t, aten.add(x, eps)))
        gt = aten.neg(aten.log(aten.add(x, eps)))
    if full_:
        big = aten.gt(t, 1)
        ts = aten.where(big, t, 1.0)
        gt = aten.add(gt, aten.where(big, aten.add(aten.log(ts), aten.div(0.5, ts)), 0.0))
    return aten.mul(gx, g), aten.mul(gt, g)


@_pointwise(aten.hinge_embedding_loss_elementwise, nin=2)
def hinge_embedding(x, t, margin):
    neg = aten.where(aten.ne(t, 1), maximum(aten.sub(margin, x), 0), 0.0)
    return aten.add(neg, aten.where(aten.ne(t, -1), x, 0.0))


@_backward(aten.hinge_embedding_loss_elementwise_backward, nin=2)
def hinge_embedding_backward(g, x, t, margin):
    d = aten.where(aten.ne(t, 1), aten.neg(to(aten.gt(aten.sub(margin, x), 0), x.dtype)), 0.0)
    return aten.mul(aten.add(d, aten.where(aten.ne(t, -1), 1.0, 0.0)), g), None


@_pointwise(aten.margin_ranking_loss_elementwise, nin=3)
def margin_ranking(x1, x2, t, margin):
    return maximum(aten.add(aten.neg(aten.mul(t, aten.sub(x1, x2))), margin), 0)


@_backward(aten.margin_ranking_loss_elementwise_backward, nin=3)
def margin_ranking_backward(g, x1, x2, t, margin):
    d = aten.sub(x1, x2)
    m = aten.gt(aten.add(aten.neg(aten.mul(t, d)), margin), 0)
    tm = aten.mul(aten.mul(t, m), g)
    return aten.neg(tm), tm, aten.neg(aten.mul(aten.mul(d, m), g))


@_pointwise(aten.gaussian_nll_loss_elementwise, nin=3)
def gaussian_nll(x, t, v, eps):
    v = maximum(v, eps)
    d = aten.sub(x, t)
    return aten.mul(aten.add(aten.log(v), aten.div(aten.mul(d, d), v)), 0.5)


@_backward(aten.gaussian_nll_loss_elementwise_backward, nin=3)
def gaussian_nll_backward(g, x, t, v, eps):
    v = maximum(v, eps)
    d = aten.div(aten.sub(x, t), v)
    gv = aten.mul(aten.mul(aten.sub(aten.div(1, v), aten.mul(d, d)), 0.5), g)
    return aten.mul(d, g), aten.neg(aten.mul(d, g)), gv


# ---- p-norm distances -------------------------------------------------------------------------------
def _pnorm(d, p, axis, keepdim=False):
    a = aten.abs(d)
    if p == 2:
        return aten.sqrt(aten.sum(aten.mul(a, a), [axis], keepdim))
    if p == 1:
        return aten.sum(a, [axis], keepdim)
    if p == math.inf:
        return aten.amax(a, [axis], keepdim) if d.shape[axis] else aten.sum(a, [axis], keepdim)
    if p == 0:
        return to(aten.sum(aten.ne(a, 0), [axis], keepdim), d.dtype)
    return aten.pow(aten.sum(aten.pow(a, p), [axis], keepdim), 1.0 / p)


def _pnorm_grad(d, n, p, axis):
    """d||d||_p / dd with the norm n kept over `axis`; zero where the norm is zero."""
    zero = aten.eq(n, 0)
    safe = aten.where(zero, 1.0, n)
    if p == 2:
        r = aten.div(d, safe)
    elif p == 1:
        r = aten.sign(d)
    elif p == math.inf:
        hit = aten.eq(aten.abs(d), n)
        r = aten.div(aten.mul(aten.sign(d), hit), aten.sum(hit, [axis], True))
    elif p == 0:
        r = aten.mul(d, 0)
    else:
        r = aten.div(aten.mul(aten.sign(d), aten.pow(aten.abs(d), p - 1)), aten.pow(safe, p - 1))
    return aten.where(zero, 0.0, r)


def _two(name, x1, x2):
    dt = _float_check(name, x1, x2)
    cd = compute_dtype(dt)
    return dt, to(x1, cd), to(x2, cd)


@register_decomposition(aten.normalize)
def normalize(self, p=2.0, dim=1, eps=1e-12):
    dt = _float_check("normalize", self)
    x = to(self, compute_dtype(dt))
    if self.ndim == 0:
        n = aten.abs(x)
    else:
        n = _pnorm(x, p, wrap(dim, self.ndim), True)
    return to(aten.div(x, maximum(n, eps)), dt)


@register_decomposition(aten.normalize_backward)
def normalize_backward(grad_output, self, p, dim, eps):
    if self.ndim == 0:
        return NotImplemented
    dt = _float_check("normalize", self)
    cd = compute_dtype(dt)
    x, g = to(self, cd), to(grad_output, cd)
    d = wrap(dim, self.ndim)
    n = _pnorm(x, p, d, True)
    big = aten.gt(n, eps)
    den = maximum(n, eps)
    gx = aten.div(g, den)
    corr = aten.div(aten.mul(aten.sum(aten.mul(g, x), [d], True), _pnorm_grad(x, n, p, d)), aten.mul(den, den))
    return to(aten.where(big, aten.sub(gx, corr), gx), dt)


@register_decomposition(aten.cosine_similarity)
def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    dt, a, b = _two("cosine_similarity", x1, x2)
    shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
    a, b = aten.expand(a, shape), aten.expand(b, shape)
    d = wrap(dim, len(shape))
    n1 = maximum(_pnorm(a, 2, d, True), eps)
    n2 = maximum(_pnorm(b, 2, d, True), eps)
    return to(aten.sum(aten.mul(aten.div(a, n1), aten.div(b, n2)), [d]), dt)


@register_decomposition(aten.cosine_similarity_backward)
def cosine_similarity_backward(grad_output, x1, x2, dim, eps):
    dt, a, b = _two("cosine_similarity", x1, x2)
    shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
    a, b = aten.expand(a, shape), aten.expand(b, shape)
    d = wrap(dim, len(shape))
    r1, r2 = _pnorm(a, 2, d, True), _pnorm(b, 2, d, True)
    n1, n2 = maximum(r1, eps), maximum(r2, eps)
    y = aten.sum(aten.mul(aten.div(a, n1), aten.div(b, n2)), [d], True)
    g = aten.unsqueeze(to(grad_output, a.dtype), d)
    n12 = aten.mul(n1, n2)
    ga = aten.sub(aten.div(b, n12), aten.where(aten.gt(r1, eps), aten.div(aten.mul(y, a), aten.mul(n1, n1)), 0.0))
    gb = aten.sub(aten.div(a, n12), aten.where(aten.gt(r2, eps), aten.div(aten.mul(y, b), aten.mul(n2, n2)), 0.0))
    return to(aten.mul(g, ga), dt), to(aten.mul(g, gb), dt)


@register_decomposition(aten.pairwise_distance)
def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    dt, a, b = _two("pairwise_distance", x1, x2)
    d = aten.add(aten.sub(a, b), eps)
    if d.ndim == 0:
        return to(aten.abs(d) if p != 0 else aten.ne(d, 0), dt)
    return to(_pnorm(d, p, d.ndim - 1, keepdim), dt)


@register_decomposition(aten.pairwise_distance_backward)
def pairwise_distance_backward(grad_output, x1, x2, p, eps, keepdim):
    dt, a, b = _two("pairwise_distance", x1, x2)
    d = aten.add(aten.sub(a, b), eps)
    g = to(grad_output, d.dtype)
    if d.ndim == 0:
        return NotImplemented
    n = _pnorm(d, p, d.ndim - 1, True)
    gd = aten.mul(g if keepdim else aten.unsqueeze(g, -1), _pnorm_grad(d, n, p, d.ndim - 1))
    return to(gd, dt), to(aten.neg(gd), dt)


def _cdist_diff(a, b):
    return aten.sub(aten.unsqueeze(a, -2), aten.unsqueeze(b, -3))


@register_decomposition(aten.cdist)
def cdist(x1, x2, p=2.0, compute_mode=None):
    _cdist_check(x1, x2, p)
    dt, a, b = _two("cdist", x1, x2)
    d = _cdist_diff(a, b)
    return to(_pnorm(d, p, d.ndim - 1), dt)


@register_decomposition(aten.cdist_backward)
def cdist_backward(grad_output, x1, x2, p):
    dt, a, b = _two("cdist", x1, x2)
    d = _cdist_diff(a, b)
    n = _pnorm(d, p, d.ndim - 1, True)
    gd = aten.mul(aten.unsqueeze(to(grad_output, d.dtype), -1), _pnorm_grad(d, n, p, d.ndim - 1))
    return to(aten.sum(gd, [-2]), dt), to(aten.neg(aten.sum(gd, [-3])), dt)


def _pairs(x):
    ij = aten.triu_indices(x.shape[0], x.shape[0], 1, dtype=D.int64, device=x.device)
    i, j = aten.select(ij, 0, 0), aten.select(ij, 0, 1)
    return i, j, aten.sub(aten.index(x, [i]), aten.index(x, [j]))


@register_decomposition(aten.pdist)
def pdist(self, p=2.0):
    if self.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {self.ndim}D")
    dt = _float_check("pdist", self)
    _, _, d = _pairs(to(self, compute_dtype(dt)))
    return to(_pnorm(d, p, 1), dt)


@register_decomposition(aten.pdist_backward)
def pdist_backward(grad, self, p):
    dt = _float_check("pdist", self)
    x = to(self, compute_dtype(dt))
    i, j, d = _pairs(x)
    n = _pnorm(d, p, 1, True)
    gd = aten.mul(aten.unsqueeze(to(grad, x.dtype), 1), _pnorm_grad(d, n, p, 1))
    zero = full(x.shape, 0, x)
    r = aten.index_put(aten.index_put(zero, [i], gd, True), [j], aten.neg(gd), True)
    return to(r, dt)
