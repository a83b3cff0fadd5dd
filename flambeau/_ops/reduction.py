"""Reductions: sum, mean, prod, var/std, max/min, argmax, logsumexp, norms, all/any, cumulative
ops, sort/topk/kthvalue/median/unique, softmax and log_softmax.

Half and bfloat16 inputs accumulate in float32; integer and bool sums produce int64, as PyTorch.
"""
from __future__ import annotations

from .. import _dtype as D
from ._registry import defop, TensorSpec
from ._helpers import wrap_dims, opmath


def reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _dims(dim, ndim):
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    return wrap_dims(dim, ndim)


def _sum_dtype(dt, dtype):
    if dtype is not None:
        return dtype
    return D.int64 if dt.category <= 1 else dt


@defop("sum.dim_IntList(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
       method=True)
def sum(xp, self, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(dim, self.ndim)
    out = _sum_dtype(D.FROM_NP[self.dtype], dtype)
    acc = opmath(out)
    r = xp.sum(self, axis=dims, keepdims=keepdim, dtype=acc)
    return xp.asarray(r).astype(out.np, copy=False)


@sum.def_meta
def _(self, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(dim, self.ndim)
    return TensorSpec(reduced_shape(self.shape, dims, keepdim), _sum_dtype(self.dtype, dtype))


def expand_reduced(grad, shape, dim, keepdim):
    """Broadcast a reduction's gradient back to the input shape."""
    if not keepdim and len(shape):
        for d in sorted(_dims(dim, len(shape))):
            grad = grad.unsqueeze(d)
    return grad.expand(shape)


@sum.def_derivative
def _(grad, self_meta, dim, keepdim):
    return expand_reduced(grad, self_meta.shape, dim, keepdim)
