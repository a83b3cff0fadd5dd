"""torch.distributions, the part model libraries use: `constraints`, `Categorical` (sampling
from logits, log-probabilities, entropy) and `MultivariateNormal` (sampling new embedding rows
near the old ones' mean and covariance). Other distributions are not built yet."""
from __future__ import annotations

from . import constraints  # noqa: F401
from .distribution import Distribution  # noqa: F401
from .categorical import Categorical  # noqa: F401
from .multivariate_normal import MultivariateNormal  # noqa: F401
from . import categorical, multivariate_normal  # noqa: F401

__all__ = ["Distribution", "Categorical", "MultivariateNormal", "constraints"]
