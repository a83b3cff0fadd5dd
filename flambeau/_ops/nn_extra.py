"""Composite nn.functional entries built from other operators: local_response_norm, lp_pool,
channel_shuffle, multi_margin_loss, multilabel_margin_loss, triplet_margin_with_distance_loss."""
from __future__ import annotations

from ._registry import export, EXPORTS, NN_FUNCTIONAL


def _F(name):
    return NN_FUNCTIONAL.get(name) or EXPORTS[name]


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


@export("local_response_norm", namespace="nn.functional", function=False)
def local_response_norm(input, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
    """b_c = a_c / (k + alpha/size * sum of a^2 over the `size` channels around c) ** beta."""
    if input.dim() < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.dim()} dimensions)")
    if input.numel() == 0:
        return input
    sq = (input * input).transpose(1, -1)                    # channels last
    padded = _F("pad")(sq, (size // 2, (size - 1) // 2))
    c = input.shape[1]
    win = padded.narrow(-1, 0, c)
    for j in range(1, size):
        win = win + padded.narrow(-1, j, c)
    div = (win.transpose(1, -1) * (alpha / size) + k) ** beta
    return input / div


def _lp_pool(pool, input, norm_type, kernel_size, stride, ceil_mode, nd):
    ks = (kernel_size,) * nd if isinstance(kernel_size, int) else tuple(kernel_size)
    out = pool(input ** norm_type, ks, stride, 0, ceil_mode)
    n = 1
    for s in ks:
        n *= s
    return (out.sign() * _F("relu")(out.abs())).mul(n).pow(1.0 / norm_type)


@export("lp_pool1d", namespace="nn.functional", function=False)
def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(_F("avg_pool1d"), input, norm_type, kernel_size, stride, ceil_mode, 1)


@export("lp_pool2d", namespace="nn.functional", function=False)
def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(_F("avg_pool2d"), input, norm_type, kernel_size, stride, ceil_mode, 2)


@export("channel_shuffle", namespace="nn.functional")
def channel_shuffle(input, groups: int):
    n, c = input.shape[0], input.shape[1]
    if groups <= 0 or c % groups:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    rest = tuple(input.shape[2:])
    return input.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest)


@export("multi_margin_loss", namespace="nn.functional", function=False)
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x = input if input.dim() == 2 else input.unsqueeze(0)
    y = target.reshape(-1)
    c = x.shape[1]
    xy = x.gather(1, y.unsqueeze(1))
    m = (margin - xy + x).clamp(min=0)
    if p == 2:
        m = m * m
    if weight is not None:
        m = m * weight[y].unsqueeze(1)
    mask = _F("one_hot")(y, c).logical_not()
    loss = (m * mask).sum(1) / c
    if input.dim() == 1 and target.dim() == 0:
        loss = loss.squeeze(0)
    return _reduce(loss, reduction)


@export("multilabel_margin_loss", namespace="nn.functional", function=False)
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    x = input if input.dim() == 2 else input.unsqueeze(0)
    t = target if target.dim() == 2 else target.unsqueeze(0)
    c = x.shape[1]
    valid = (t >= 0).long().cumprod(1).bool()              # labels up to the first -1
    idx = t.clamp(min=0)
    is_target = (_F("one_hot")(idx, c) * valid.unsqueeze(-1).long()).sum(1) > 0
    xt = x.gather(1, idx)                                   # scores of the listed targets
    diff = (1 - (xt.unsqueeze(2) - x.unsqueeze(1))).clamp(min=0)
    pair = valid.unsqueeze(2) & is_target.logical_not().unsqueeze(1)
    loss = (diff * pair).sum((1, 2)) / c
    if input.dim() == 1:
        loss = loss.squeeze(0)
    return _reduce(loss, reduction)


@export("triplet_margin_with_distance_loss", namespace="nn.functional", function=False)
def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0,
                                      swap=False, reduction="mean"):
    dist = distance_function or _F("pairwise_distance")
    dp = dist(anchor, positive)
    dn = dist(anchor, negative)
    if swap:
        dn = _F("minimum")(dn, dist(positive, negative))
    return _reduce((dp - dn + margin).clamp(min=0), reduction)
