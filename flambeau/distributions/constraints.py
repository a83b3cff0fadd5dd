"""torch.distributions.constraints: what values a parameter or sample may take. `check(value)`
answers elementwise (per event for the matrix constraints) with a bool tensor."""
from __future__ import annotations

from .. import linalg
from .._ops.creation import full_like
from .._tensor import Tensor

__all__ = ["Constraint", "real", "positive", "nonnegative", "unit_interval", "interval", "boolean",
           "simplex", "symmetric", "positive_definite", "nonnegative_integer", "independent"]

SYMMETRY_ATOL = 1e-6
SIMPLEX_ATOL = 1e-6


class Constraint:
    """A set of allowed values; `check` returns where `value` lies in it."""
    is_discrete = False
    event_dim = 0

    def check(self, value: Tensor) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__[1:] + "()"


class _Real(Constraint):
    def check(self, value: Tensor) -> Tensor:
        return value == value


class _GreaterThan(Constraint):
    def __init__(self, lower_bound) -> None:
        self.lower_bound = lower_bound

    def check(self, value: Tensor) -> Tensor:
        return value > self.lower_bound

    def __repr__(self) -> str:
        return f"GreaterThan(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    def check(self, value: Tensor) -> Tensor:
        return value >= self.lower_bound

    def __repr__(self) -> str:
        return f"GreaterThanEq(lower_bound={self.lower_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound, upper_bound) -> None:
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def check(self, value: Tensor) -> Tensor:
        return (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"Interval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _Boolean(Constraint):
    is_discrete = True

    def check(self, value: Tensor) -> Tensor:
        return (value == 0) | (value == 1)


class _IntegerGreaterThan(Constraint):
    is_discrete = True

    def __init__(self, lower_bound) -> None:
        self.lower_bound = lower_bound

    def check(self, value: Tensor) -> Tensor:
        return (value % 1 == 0) & (value >= self.lower_bound)


class _Simplex(Constraint):
    event_dim = 1

    def check(self, value: Tensor) -> Tensor:
        return (value >= 0).all(-1) & ((value.sum(-1) - 1).abs() < SIMPLEX_ATOL)


class _Symmetric(Constraint):
    event_dim = 2

    def check(self, value: Tensor) -> Tensor:
        if value.ndim < 2:
            return full_like(value, False, dtype=bool)
        return value.isclose(value.mT, atol=SYMMETRY_ATOL).all(-2).all(-1)


class _PositiveDefinite(_Symmetric):
    def check(self, value: Tensor) -> Tensor:
        symmetric = super().check(value)
        if not symmetric.all():
            return symmetric
        return linalg.eigvalsh(value).min(-1).values > 0


class _Independent(Constraint):
    def __init__(self, base: Constraint, reinterpreted_batch_ndims: int) -> None:
        self.base_constraint, self.reinterpreted_batch_ndims = base, reinterpreted_batch_ndims
        self.event_dim = base.event_dim + reinterpreted_batch_ndims

    def check(self, value: Tensor) -> Tensor:
        result = self.base_constraint.check(value)
        for _ in range(self.reinterpreted_batch_ndims):
            result = result.all(-1)
        return result


real = _Real()
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
unit_interval = _Interval(0.0, 1.0)
interval = _Interval
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
boolean = _Boolean()
nonnegative_integer = _IntegerGreaterThan(0)
simplex = _Simplex()
symmetric = _Symmetric()
positive_definite = _PositiveDefinite()
real_vector = _Independent(real, 1)
independent = _Independent
