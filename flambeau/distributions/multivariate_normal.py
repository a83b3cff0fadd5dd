"""torch.distributions.MultivariateNormal: a Gaussian over vectors, from a covariance matrix,
precision matrix or lower-triangular scale."""
from __future__ import annotations

import math

from .. import linalg
from .._tensor import Size, Tensor
from .._ops.random_ops import normal
from . import constraints
from .distribution import Distribution


class MultivariateNormal(Distribution):
    arg_constraints = {"loc": constraints.real_vector, "covariance_matrix": constraints.positive_definite}
    has_rsample = True

    def __init__(self, loc: Tensor, covariance_matrix: Tensor | None = None, precision_matrix: Tensor | None = None,
                 scale_tril: Tensor | None = None, validate_args: bool | None = None) -> None:
        if loc.ndim < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        if scale_tril is not None:
            self.scale_tril = scale_tril
        elif covariance_matrix is not None:
            self.scale_tril = linalg.cholesky(covariance_matrix)
        else:
            self.scale_tril = linalg.cholesky(linalg.inv(precision_matrix))
        self.loc = loc
        batch = Size(max(a, b) for a, b in zip((1,) * (self.scale_tril.ndim - 1 - loc.ndim) + tuple(loc.shape[:-1]),
                                               (1,) * (loc.ndim + 1 - self.scale_tril.ndim)
                                               + tuple(self.scale_tril.shape[:-2])))
        super().__init__(batch, loc.shape[-1:], validate_args=validate_args)

    @property
    def covariance_matrix(self) -> Tensor:
        return self.scale_tril @ self.scale_tril.mT

    @property
    def mean(self) -> Tensor:
        return self.loc

    def rsample(self, sample_shape=Size()) -> Tensor:
        shape = self._extended_shape(Size(sample_shape))
        eps = normal(0.0, 1.0, size=tuple(shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (self.scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def log_prob(self, value: Tensor) -> Tensor:
        diff = value - self.loc
        z = linalg.solve(self.scale_tril, diff.unsqueeze(-1)).squeeze(-1)
        half_log_det = self.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        k = self._event_shape[0]
        return -0.5 * (k * math.log(2 * math.pi) + (z * z).sum(-1)) - half_log_det
