"""flambeau._numpy.linalg: NumPy's `numpy.linalg` functions over flambeau's linear algebra.

Integer and boolean inputs are computed in float64, as NumPy does; results are ndarrays.
"""
from __future__ import annotations

import numpy as np

from .. import linalg as _linalg
from .._ops import functions as F
from ._ndarray import ndarray, to_tensor, fl_dtype, np_dtype

LinAlgError = _linalg.LinAlgError


def _float(a):
    t = to_tensor(a)
    if np_dtype(t).kind in "biu":
        t = t.to(fl_dtype(np.float64))
    return t


def norm(x, ord=None, axis=None, keepdims=False) -> ndarray:
    t = _float(x)
    if ord is None and axis is None:
        r = F.linalg_vector_norm(t.reshape(-1), 2)
        return ndarray(r.reshape((1,) * t.dim()) if keepdims else r)
    if isinstance(axis, int) or (axis is None and t.dim() == 1):
        return ndarray(F.linalg_vector_norm(t, 2 if ord is None else ord, axis if axis is not None else 0,
                                            keepdim=keepdims))
    if ord in (None, "fro"):
        dims = tuple(axis) if axis is not None else (0, 1)
        return ndarray(F.sqrt(F.sum(F.abs(t) ** 2, dims, keepdim=keepdims)))
    raise NotImplementedError(f"np.linalg.norm(ord={ord!r}) of a matrix is not supported by flambeau._numpy")


def inv(a) -> ndarray:
    return ndarray(_linalg.inv(_float(a)))


def det(a) -> ndarray:
    return ndarray(_linalg.det(_float(a)))


def solve(a, b) -> ndarray:
    return ndarray(_linalg.solve(_float(a), _float(b)))


def cholesky(a) -> ndarray:
    return ndarray(_linalg.cholesky(_float(a)))


def slogdet(a) -> tuple:
    sign, logabsdet = _linalg.slogdet(_float(a))
    return ndarray(sign), ndarray(logabsdet)


def eigh(a, UPLO="L") -> tuple:
    w, v = _linalg.eigh(_float(a), UPLO)
    return ndarray(w), ndarray(v)


def qr(a, mode="reduced") -> tuple:
    q, r = _linalg.qr(_float(a), mode)
    return ndarray(q), ndarray(r)


def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    t = _float(a)
    if not compute_uv:
        return ndarray(_linalg.svdvals(t))
    u, s, vh = _linalg.svd(t, full_matrices=full_matrices)
    return ndarray(u), ndarray(s), ndarray(vh)


def pinv(a, rcond=None, hermitian=False) -> ndarray:
    return ndarray(_linalg.pinv(_float(a)))


def matrix_rank(A, tol=None, hermitian=False) -> ndarray:
    return ndarray(_linalg.matrix_rank(_float(A)))
