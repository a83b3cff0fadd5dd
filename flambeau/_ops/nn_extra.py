"""Composite nn.functional entries built from other operators: local_response_norm, lp_pool,
channel_shuffle, multi_margin_loss, multilabel_margin_loss, triplet_margin_with_distance_loss."""
from __future__ import annotations

from .._tensor import Tensor
from ._registry import export, autocast_policy, EXPORTS, NN_FUNCTIONAL, Tag
from .creation import full, tensor
from .masking import where
from .shape import stack


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
    if input.dim() > 3:
        return _local_response_norm_fp32_on_cpu(input, size, alpha, beta, k)
    return _local_response_norm(input, size, alpha, beta, k)


def _local_response_norm(input, size, alpha, beta, k):
    sq = (input * input).transpose(1, -1)                    # channels last
    padded = _F("pad")(sq, (size // 2, (size - 1) // 2))
    c = input.shape[1]
    win = padded.narrow(-1, 0, c)
    for j in range(1, size):
        win = win + padded.narrow(-1, j, c)
    div = (win.transpose(1, -1) * (alpha / size) + k) ** beta
    return input / div


# PyTorch averages over the channel window with avg_pool3d for 4D+ inputs: fp32 under cpu autocast
_local_response_norm_fp32_on_cpu = autocast_policy("avg_pool3d", (Tag.cpu_autocast_fp32,))(_local_response_norm)


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


@export("multi_margin_loss", namespace="nn.functional", function=False, tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
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


@export("multilabel_margin_loss", namespace="nn.functional", function=False, tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
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


_NEG = -1e30   # "log 0" for unreachable CTC states: finite, so no inf-inf NaNs reach the gradient


def _lengths(x, n, name):
    v = x.tolist() if isinstance(x, Tensor) else list(x)
    if len(v) != n:
        raise RuntimeError(f"ctc_loss: expected {name} to have {n} elements, got {len(v)}")
    return [int(i) for i in v]


@export("ctc_loss", namespace="nn.functional")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False):
    """Connectionist temporal classification loss: the negative log-likelihood of `targets` summed
    over all alignments, by the forward (alpha) recursion in log space over the extended label
    sequence (blank, l1, blank, l2, ..., blank), vectorised over the batch and the label positions."""
    unbatched = log_probs.dim() == 2
    lp = log_probs.unsqueeze(1) if unbatched else log_probs          # (T, N, C)
    T, N, C = lp.shape
    il = _lengths(input_lengths if not unbatched or not isinstance(input_lengths, int) else [input_lengths], N,
                  "input_lengths")
    tl = _lengths(target_lengths if not unbatched or not isinstance(target_lengths, int) else [target_lengths], N,
                  "target_lengths")
    if not 0 <= blank < C:
        raise RuntimeError("blank must be in label range")
    if max(il) > T:
        raise RuntimeError(f"Expected input_lengths to have value at most {T}, but got value {max(il)}")
    tg = targets.reshape(1, -1) if unbatched else targets
    if tg.dim() == 1:                                                # concatenated targets
        off, rows = 0, []
        for n in range(N):
            rows.append(tg[off:off + tl[n]].tolist())
            off += tl[n]
    else:
        rows = [tg[n, :tl[n]].tolist() for n in range(N)]
    S = max(max(tl), 0)
    ext = [[blank] * (2 * S + 1) for _ in range(N)]
    skip = [[False] * (2 * S + 1) for _ in range(N)]
    for n, r in enumerate(rows):
        for i, lab in enumerate(r):
            ext[n][2 * i + 1] = int(lab)
            if i > 0 and int(lab) != int(r[i - 1]):
                skip[n][2 * i + 1] = True
    dev = lp.device
    ext_t = tensor(ext, device=dev)                                   # (N, S')
    skip_t = tensor(skip, device=dev)
    lp_ext = lp.gather(2, ext_t.unsqueeze(0).expand(T, N, 2 * S + 1))  # (T, N, S')
    lp_ext = where(lp_ext == float("-inf"), _NEG, lp_ext)
    neg = full((N, 2 * S + 1), _NEG, dtype=lp.dtype, device=dev)
    pos = tensor(list(range(2 * S + 1)), device=dev).unsqueeze(0)
    alpha = where(pos < 2, lp_ext[0], neg)
    alpha = where((pos == 1) & (tensor(tl, device=dev).unsqueeze(1) == 0), neg, alpha)
    pad1 = full((N, 1), _NEG, dtype=lp.dtype, device=dev)
    pad2 = full((N, 2), _NEG, dtype=lp.dtype, device=dev)
    lens = tensor(il, device=dev).unsqueeze(1)
    for t in range(1, max(il) if il else 0):
        a1 = EXPORTS["cat"]([pad1, alpha[:, :-1]], 1)
        a2 = where(skip_t, EXPORTS["cat"]([pad2, alpha[:, :-2]], 1), neg)
        new = stack([alpha, a1, a2]).logsumexp(0) + lp_ext[t]
        alpha = where(lens > t, new, alpha)
    last = tensor([2 * x for x in tl], device=dev).unsqueeze(1)
    prev = tensor([max(2 * x - 1, 0) for x in tl], device=dev).unsqueeze(1)
    a_last = alpha.gather(1, last).squeeze(1)
    a_prev = where(tensor(tl, device=dev) > 0, alpha.gather(1, prev).squeeze(1), _NEG)
    ll = stack([a_last, a_prev]).logsumexp(0)
    loss = where(ll < _NEG / 2, float("inf"), -ll)
    if zero_infinity:
        loss = where(loss == float("inf"), 0.0, loss)
    if reduction == "mean":
        return (loss / tensor(tl, device=dev, dtype=loss.dtype).clamp(min=1)).mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss.squeeze(0) if unbatched else loss
    raise ValueError(f"{reduction} is not a valid value for reduction")
