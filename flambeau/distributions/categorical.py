"""torch.distributions.Categorical: one of K classes, from `probs` or `logits` (last dim)."""
from __future__ import annotations

from .._tensor import Size, Tensor
from .._ops.random_ops import multinomial
from ..nn import functional as F
from . import constraints
from .distribution import Distribution

FLOAT32_TINY = 1.17549435e-38   # probs are clamped here before the log (PyTorch's clamp_probs)
FLOAT32_MAX = 3.4028234663852886e38  # -inf logits (zero probs) count as -max in the entropy


class Categorical(Distribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}

    def __init__(self, probs: Tensor | None = None, logits: Tensor | None = None,
                 validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
            self.logits = self.probs.clamp_min(FLOAT32_TINY).log()
        else:
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - logits.logsumexp(-1, keepdim=True)
            self.probs = F.softmax(self.logits, -1)
        self._num_events = self.probs.shape[-1]
        super().__init__(self.probs.shape[:-1], validate_args=validate_args)

    def sample(self, sample_shape=Size()) -> Tensor:
        shape = Size(sample_shape)
        flat = self.probs.reshape(-1, self._num_events)
        draws = multinomial(flat, shape.numel(), replacement=True).T
        return draws.reshape(self._extended_shape(shape))

    def log_prob(self, value: Tensor) -> Tensor:
        value = value.long().unsqueeze(-1)
        value, log_pmf = _broadcast(value, self.logits)
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits.clamp_min(-FLOAT32_MAX)
        return -(logits * self.probs).sum(-1)


def _broadcast(value: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    shape = Size(max(a, b) for a, b in zip((1,) * (logits.ndim - value.ndim) + tuple(value.shape),
                                           (1,) * (value.ndim - logits.ndim) + tuple(logits.shape)))
    return value.expand(*shape[:-1], 1), logits.expand(shape)
