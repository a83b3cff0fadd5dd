"""Element-wise ops and softmax on sparse tensors (the unary ones keep any layout, CSC/BSR/BSC too): zero-preserving unary operators (abs, sqrt, sin,
tanh, relu, ..., as PyTorch's sparse kernels list them), `pow` by a positive scalar, `Tensor.sparse_mask`, and `sparse.softmax` /
`sparse.log_softmax` (over the stored entries of each slice; unstored ones count as -inf).

A non-linear op runs on coalesced values (f(a) + f(b) is not f(a + b) for duplicates); each result
keeps its input's pattern and is built by `with_values` from differentiable operators, so gradients
follow as in `_ops.py`.
"""
from __future__ import annotations

import numpy as np

from .._tensor import Tensor, sparse_coo
from .._ops.creation import tensor as _tensor, zeros
from ._ops import coalesce, dense_to_sparse, to_sparse_csr
from ._tensor import SparsePattern, SparseTensor, gather_at, values_of, with_values

# PyTorch's zero-preserving unary operators with sparse COO/CSR kernels (f(0) == 0)
ZERO_PRESERVING_UNARY = ("abs", "sqrt", "sin", "tan", "tanh", "relu", "sign", "square", "expm1", "log1p", "asin",
                         "arcsin", "atan", "arctan", "sinh", "asinh", "arcsinh", "atanh", "arctanh", "trunc", "fix",
                         "floor", "ceil", "round", "sgn", "erf", "erfinv", "deg2rad", "rad2deg", "nan_to_num", "frac",
                         "signbit", "isnan", "isinf", "isposinf", "isneginf", "positive", "conj_physical")


def _coalesced(s: SparseTensor) -> SparseTensor:
    return coalesce(s) if s._pattern.layout is sparse_coo else s


def _unary_handler(op, a, *args, **kwargs):
    s = _coalesced(a)
    return with_values(op(values_of(s), *args, **kwargs), s._pattern)


def _pow_handler(op, a, exponent):
    if not isinstance(a, SparseTensor) or isinstance(exponent, Tensor) or not exponent > 0:
        raise NotImplementedError("pow: flambeau raises a sparse tensor to a positive scalar power only (a zero or "
                                  "negative power would fill the unstored entries)")
    return _unary_handler(op, a, exponent)


def sparse_mask(self: Tensor, mask: SparseTensor) -> SparseTensor:
    """`Tensor.sparse_mask(mask)`: the entries of dense `self` at `mask`'s pattern (coalesced)."""
    if not isinstance(mask, SparseTensor):
        raise RuntimeError("sparse_mask: expected a sparse mask (to_sparse() it first)")
    if isinstance(self, SparseTensor):
        raise NotImplementedError("sparse_mask: flambeau masks a dense tensor only; call to_dense() first")
    if tuple(self.shape) != tuple(mask.shape):
        raise RuntimeError(f"sparse_mask(): operands have incompatible sizes; self has size {list(self.shape)} but "
                           f"mask has size {list(mask.shape)}")
    m = _coalesced(mask)
    return with_values(gather_at(self, m._pattern), m._pattern)


def _slices(p: SparsePattern, dim: int) -> np.ndarray:
    """For each stored entry, the id of its slice along `dim` (entries equal in every other coordinate)."""
    other = np.delete(p.idx, dim, axis=0)
    if other.shape[0] == 0 or p.nnz == 0:
        return np.zeros(p.nnz, np.int64)
    dims = tuple(s for i, s in enumerate(p.shape[:p.sparse_dim]) if i != dim)
    return np.unique(np.ravel_multi_index(tuple(other), dims), return_inverse=True)[1].reshape(-1)


def _softmax_parts(input: SparseTensor, dim: int, dtype):
    if not isinstance(input, SparseTensor):
        raise RuntimeError("sparse.softmax: expected a sparse tensor")
    layout = input._pattern.layout
    s = _coalesced(dense_to_sparse(input))
    p = s._pattern
    if p.sparse_dim != len(p.shape):
        raise NotImplementedError("sparse.softmax: flambeau supports tensors without dense dimensions")
    dim = dim % len(p.shape)
    slices = _slices(p, dim)
    n = int(slices.max()) + 1 if slices.size else 0
    ids = _tensor(slices)
    v = values_of(s)
    if dtype is not None:
        v = v.to(dtype)
    top = zeros(n, dtype=v.dtype).scatter_reduce(0, ids, v.detach(), "amax", include_self=False)
    shifted = v - top[ids]
    total = zeros(n, dtype=v.dtype).index_add(0, ids, shifted.exp())
    return s, layout, shifted, total[ids]


def softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """`torch.sparse.softmax`: softmax over each slice's stored entries, the pattern kept."""
    s, layout, shifted, total = _softmax_parts(input, dim, dtype)
    out = with_values(shifted.exp() / total, s._pattern)
    return to_sparse_csr(out) if layout is not sparse_coo else out


def log_softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """`torch.sparse.log_softmax`: log of `softmax`, computed as v - max - log(sum exp(v - max))."""
    s, layout, shifted, total = _softmax_parts(input, dim, dtype)
    out = with_values(shifted - total.log(), s._pattern)
    return to_sparse_csr(out) if layout is not sparse_coo else out


SparseTensor._handlers.update({name: _unary_handler for name in ZERO_PRESERVING_UNARY})
SparseTensor._handlers["pow"] = _pow_handler
SparseTensor._value_only_handlers.update(ZERO_PRESERVING_UNARY + ("pow",))


def install_methods() -> None:
    """Tensor.sparse_mask."""
    Tensor.sparse_mask = sparse_mask
