"""Pointwise operators: arithmetic, math functions, comparisons, logical and bitwise ops.

Binary ops promote their operands with PyTorch's rules (`_helpers.result_type`), compute in
float32 for half/bfloat16, and broadcast. Derivatives return the gradient for each Tensor
argument; the autograd engine sums it over broadcast dimensions and casts it to the input dtype.
"""
from __future__ import annotations

from ._registry import defop, export
from ._helpers import binary_kernel, binary_meta, unary_kernel, unary_meta


def _conj(x):
    return x.conj() if hasattr(x, "is_complex") and x.is_complex() else x


@defop("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", method=True, inplace=True)
def add(xp, self, other, *, alpha=1):
    return _add_kernel(xp, self, other if alpha == 1 else _scaled(other, alpha))


def _scaled(x, alpha):
    return x * alpha


_add_kernel = binary_kernel(lambda xp, a, b: xp.add(a, b), name="add")
add.def_meta(binary_meta())


@add.def_derivative
def _(grad, alpha):
    return grad, (grad if alpha == 1 else grad * alpha)


@defop("sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", method=True, inplace=True)
def sub(xp, self, other, *, alpha=1):
    from ._helpers import dtype_of
    if dtype_of(self).category == 0 and dtype_of(other).category == 0:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use "
                           "the `^` or `logical_xor()` operator instead.")
    return _sub_kernel(xp, self, other if alpha == 1 else _scaled(other, alpha))


_sub_kernel = binary_kernel(lambda xp, a, b: xp.subtract(a, b), name="sub")
sub.def_meta(binary_meta())


@sub.def_derivative
def _(grad, alpha):
    return grad, (-grad if alpha == 1 else grad * -alpha)


@defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", method=True, inplace=True)
def mul(xp, self, other):
    return _mul_kernel(xp, self, other)


_mul_kernel = binary_kernel(lambda xp, a, b: xp.multiply(a, b), name="mul")
mul.def_meta(binary_meta())


@mul.def_derivative
def _(grad, self, other):
    return grad * _conj(other), grad * _conj(self)


@defop("div.Tensor(Tensor self, Tensor other) -> Tensor", method=True, inplace=True)
def div(xp, self, other):
    return _div_kernel(xp, self, other)


_div_kernel = binary_kernel(lambda xp, a, b: xp.true_divide(a, b), to_float=True, name="div")
div.def_meta(binary_meta(to_float=True))


@div.def_derivative
def _(grad, self, other):
    g_self = grad / _conj(other)
    return g_self, -g_self * _conj(self) / _conj(other)


@defop("neg(Tensor self) -> Tensor", method=True, inplace=True)
def neg(xp, self):
    if self.dtype == bool:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you are "
                           "trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return xp.negative(self)


neg.def_meta(unary_meta())


@neg.def_derivative
def _(grad):
    return -grad


@defop("exp(Tensor self) -> Tensor", method=True, inplace=True)
def exp(xp, self):
    return _exp(xp, self)


_exp = unary_kernel(lambda xp, a: xp.exp(a), to_float=True)
exp.def_meta(unary_meta(to_float=True))


@exp.def_derivative
def _(grad, result):
    return grad * _conj(result)


@defop("conj_physical(Tensor self) -> Tensor", method=True, inplace=True)
def conj_physical(xp, self):
    return xp.conj(self) if self.dtype.kind == "c" else self.copy()


conj_physical.def_meta(unary_meta())


@conj_physical.def_derivative
def _(grad):
    return grad.conj_physical()


@export("conj", method=True)
def conj(self):
    """For real tensors `self`; for complex ones a conjugated copy (PyTorch returns a lazy view)."""
    return conj_physical(self) if self.is_complex() else self


@export("resolve_conj", method=True)
def resolve_conj(self):
    return self


@export("is_conj", method=True)
def is_conj(self):
    return False
