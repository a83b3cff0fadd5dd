"""torch.distributions.Distribution: batch and event shapes, sample/rsample, the shape rules."""
from __future__ import annotations

from .._tensor import Size, Tensor
from ..autograd.grad_mode import no_grad


class Distribution:
    """Base class: `batch_shape` indexes independent distributions, `event_shape` one draw."""
    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, batch_shape=Size(), event_shape=Size(), validate_args: bool | None = None) -> None:
        self._batch_shape, self._event_shape = Size(batch_shape), Size(event_shape)

    @property
    def batch_shape(self) -> Size:
        return self._batch_shape

    @property
    def event_shape(self) -> Size:
        return self._event_shape

    def _extended_shape(self, sample_shape=Size()) -> Size:
        return Size(tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape))

    def sample(self, sample_shape=Size()) -> Tensor:
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=Size()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterized sampling")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
