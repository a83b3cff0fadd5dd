"""Linear algebra: matmul/mm/bmm/mv/dot/addmm/baddbmm/addmv/outer/einsum/tensordot/kron and the
`linalg` namespace (norms, solvers, decompositions). Products go to the array namespace's BLAS.
"""
from __future__ import annotations

from .. import _dtype as D
from ._registry import defop, TensorSpec
from ._helpers import broadcast_shapes, opmath


def _check_same_dtype(name, a, b):
    if a.dtype != b.dtype:
        from .._dispatch import type_name
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{type_name(D.FROM_NP[a.dtype]).lower()} != {type_name(D.FROM_NP[b.dtype]).lower()}")


def matmul_shape(a, b):
    if a == () or b == ():
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {len(a)}D and {len(b)}D")
    if len(a) == 1 and len(b) == 1:
        if a[0] != b[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{a[0]}] and src [{b[0]}] to have the "
                               "same number of elements, but got {a[0]} and {b[0]} elements respectively")
        return ()
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, a2[-2:]))} and "
                           f"{'x'.join(map(str, b2[-2:]))})")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@defop("matmul(Tensor self, Tensor other) -> Tensor", method=True)
def matmul(xp, self, other):
    _check_same_dtype("matmul", self, other)
    shape = matmul_shape(self.shape, other.shape)
    dt = D.FROM_NP[self.dtype]
    cd = opmath(dt)
    a = self.astype(cd, copy=False)
    b = other.astype(cd, copy=False)
    r = xp.matmul(a, b)
    return xp.asarray(r).astype(dt.np, copy=False).reshape(shape)


@matmul.def_meta
def _(self, other):
    if self.dtype is not other.dtype:
        from .._dispatch import type_name
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{type_name(self.dtype).lower()} != {type_name(other.dtype).lower()}")
    return TensorSpec(matmul_shape(self.shape, other.shape), self.dtype)


@matmul.def_derivative
def _(grad, self, other):
    a, b = self, other
    if a.ndim == 1 and b.ndim == 1:
        return grad * b.conj(), grad * a.conj()
    if a.ndim == 1:
        ga = (grad.unsqueeze(-2) @ b.mT.conj()).squeeze(-2)
        gb = a.conj().unsqueeze(-1) @ grad.unsqueeze(-2)
        return ga, gb
    if b.ndim == 1:
        ga = grad.unsqueeze(-1) @ b.conj().unsqueeze(-2)
        gb = (a.mT.conj() @ grad.unsqueeze(-1)).squeeze(-1)
        return ga, gb
    return grad @ b.mT.conj(), a.mT.conj() @ grad
