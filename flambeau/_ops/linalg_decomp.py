"""The `linalg` namespace: vector/matrix norms, det/slogdet, inv, solve, cholesky, qr, eigh,
svd/svdvals, pinv, matrix_rank, lstsq. Kernels call the array namespace's LAPACK (`xp.linalg`);
derivatives are the standard matrix-calculus formulas written in flambeau ops.

Inputs must be floating or complex (float32/64, complex64/128); like PyTorch, failures of the
factorisation (singular, not positive-definite) raise `LinAlgError`, a RuntimeError.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D
from ._registry import defop, export, TensorSpec, LINALG, Tag
from ._helpers import wrap_dims, broadcast_shapes
from ._schema import return_type, parse
from .linalg import type_name, _dt
from .creation import eye
from .reduction import reduced_shape
from . import _batching


class LinAlgError(RuntimeError):
    """A linear-algebra routine failed on its input (torch.linalg.LinAlgError)."""


LINALG["LinAlgError"] = LinAlgError


def _check_float(name, A, low_ok=False):
    dt = _dt(A)
    if dt.category < D.FLOATING:
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got {type_name(dt)}")
    if dt in D.LOW_PRECISION and not low_ok:
        raise RuntimeError(f"{name}: Low precision dtypes not supported. Got {type_name(dt)}")


def _check_square(name, A, what="A", low_ok=False):
    _check_float(name, A, low_ok)
    if len(A.shape) < 2:
        raise RuntimeError(f"{name}: The input tensor {what} must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{name}: {what} must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")


def _lapack(xp, name, fn, *args, msg="The factorization could not be completed"):
    if xp is not np and len(args) == 2 and all(hasattr(a, "ndim") for a in args) \
            and max(args[0].ndim, args[1].ndim) > 2:
        # CuPy's batched solvers want equal batch dims: broadcast them explicitly
        a, b = args
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        args = (xp.broadcast_to(a, batch + a.shape[-2:]), xp.broadcast_to(b, batch + b.shape[-2:]))
    try:
        return fn(*args)
    except np.linalg.LinAlgError:
        raise LinAlgError(f"{name}: {msg}.") from None


def _eye_like(A):
    return eye(A.shape[-1], dtype=A.dtype, device=A.device)


def _lin(name, op):
    LINALG[name] = op
    return op


# ---- norms -----------------------------------------------------------------------------------
def _norm_dims(dim, ndim):
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    return wrap_dims(dim, ndim)


def _vnorm_dtype(A, dtype):
    _check_float("linalg.vector_norm", A, low_ok=True)
    dt = dtype if dtype is not None else _dt(A)
    return dt.to_real()


@defop("linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, "
       "ScalarType? dtype=None) -> Tensor", tags=(Tag.autocast_fp32_opt,))
def linalg_vector_norm(xp, self, ord=2, dim=None, keepdim=False, *, dtype=None):
    out = _vnorm_dtype(self, dtype)
    dims = _norm_dims(dim, self.ndim)
    cd = np.dtype(np.float32) if out in D.LOW_PRECISION else out.np
    a = xp.abs(self.astype(dtype.np, copy=False) if dtype is not None else self).astype(cd, copy=False)
    if ord in (math.inf, -math.inf):
        if any(self.shape[d] == 0 for d in dims) or (self.size == 0 and not dims):
            raise RuntimeError("linalg.vector_norm cannot compute the " + ("" if ord > 0 else "-") + "inf norm on "
                               "an empty tensor because the operation does not have an identity")
        r = (xp.max if ord > 0 else xp.min)(a, axis=dims, keepdims=keepdim)
    elif ord == 0:
        r = xp.sum(a != 0, axis=dims, keepdims=keepdim).astype(cd)
    elif ord == 1:
        r = xp.sum(a, axis=dims, keepdims=keepdim)
    elif ord == 2:
        r = xp.sqrt(xp.sum(a * a, axis=dims, keepdims=keepdim))
    else:
        r = xp.sum(a ** ord, axis=dims, keepdims=keepdim) ** (1.0 / ord)
    return xp.asarray(r).astype(out.np, copy=False)


@linalg_vector_norm.def_meta
def _(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    out = _vnorm_dtype(self, dtype)
    return TensorSpec(reduced_shape(tuple(self.shape), _norm_dims(dim, self.ndim), keepdim), out)


def _sgn(x):
    return x.sgn() if x.is_complex() else x.sign()


@linalg_vector_norm.def_derivative
def _(grad, self, ord, dim, keepdim, result):
    if ord == 0:
        return self * 0
    dims = _norm_dims(dim, self.ndim)
    g, r = grad, result
    if not keepdim:
        for d in sorted(dims):
            g, r = g.unsqueeze(d), r.unsqueeze(d)
    if ord == 1:
        return _sgn(self) * g
    if ord == 2:
        return self * (g / r).masked_fill(r == 0, 0)
    if ord in (math.inf, -math.inf):
        mask = (self.abs() == r).to(self.dtype.to_real())
        return _sgn(self) * mask * g / mask.sum(dims, keepdim=True)
    scale = (g / r.pow(ord - 1)).masked_fill(r == 0, 0)
    return _sgn(self) * self.abs().pow(ord - 1) * scale


_lin("vector_norm", linalg_vector_norm)


def _move_last(A, dim):
    d0, d1 = (x % A.ndim for x in dim)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different. Got ({dim[0]}, {dim[1]})")
    return A.movedim((d0, d1), (-2, -1)), (d0, d1)


def _restore(r, dims, keepdim):
    if keepdim:
        for d in sorted(dims):
            r = r.unsqueeze(d)
    return r


@export("matrix_norm", function=False, namespace="linalg")
def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    _check_float("linalg.matrix_norm", A, low_ok=True)
    if dtype is not None:
        A = A.to(dtype)
    dim = tuple(dim)
    if ord == "fro":
        r = linalg_vector_norm(A, 2, dim, keepdim)
    elif ord in ("nuc", 2, -2):
        B, dims = _move_last(A, dim)
        s = linalg_svdvals(B)
        r = s.sum(-1) if ord == "nuc" else s.amax(-1) if ord == 2 else s.amin(-1)
        r = _restore(r, dims, keepdim)
    elif ord in (1, -1, math.inf, -math.inf):
        d0, d1 = (x % A.ndim for x in dim)
        if ord in (math.inf, -math.inf):
            d0, d1 = d1, d0
        s = linalg_vector_norm(A, 1, (d0,), True)
        r = s.amax(d1, keepdim=True) if ord > 0 else s.amin(d1, keepdim=True)
        if not keepdim:
            r = r.squeeze((d0, d1))
    else:
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    return r if out is None else out.resize_(r.shape).copy_(r)


@export("norm", function=False, namespace="linalg")
def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):
    if dim is not None and isinstance(dim, int):
        dim = (dim,)
    if isinstance(ord, str) or (dim is not None and len(dim) == 2) or (ord is not None and dim is None and A.ndim == 2):
        if dim is None:
            dim = (-2, -1)
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype, out=out)
    if ord is not None and dim is None and A.ndim != 1:
        raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                           f"Got {A.ndim}D.")
    r = linalg_vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    return r if out is None else out.resize_(r.shape).copy_(r)


# ---- determinants and inverse ----------------------------------------------------------------
@defop("linalg_det(Tensor A) -> Tensor", tags=(Tag.core, Tag.extern))
def linalg_det(xp, A):
    _check_square("linalg.det", A, low_ok=_no_elements(A))
    a = A.astype(np.float32) if _dt(A) in D.LOW_PRECISION else A        # only empty ones get here
    return xp.asarray(xp.linalg.det(a)).astype(A.dtype, copy=False)


def _no_elements(A) -> bool:
    """An empty batch or 0x0 matrices: PyTorch answers det for them in any floating dtype (1 per 0x0)."""
    return 0 in tuple(A.shape)


linalg_det.def_meta(lambda A: (_check_square("linalg.det", A, low_ok=_no_elements(A)),
                               TensorSpec(tuple(A.shape)[:-2], A.dtype))[1])


@linalg_det.def_derivative
def _(grad, A, result):
    return (grad * result.conj()).unsqueeze(-1).unsqueeze(-1) * linalg_inv(A).mH


_lin("det", linalg_det)
export("det", method=True)(lambda input: linalg_det(input))


@defop("linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet)", tags=(Tag.core, Tag.extern))
def linalg_slogdet(xp, A):
    _check_square("linalg.slogdet", A)
    sign, logabs = xp.linalg.slogdet(A)
    return xp.asarray(sign).astype(A.dtype, copy=False), xp.asarray(logabs).astype(_dt(A).to_real().np, copy=False)


@linalg_slogdet.def_meta
def _(A):
    _check_square("linalg.slogdet", A)
    return TensorSpec(tuple(A.shape)[:-2], A.dtype), TensorSpec(tuple(A.shape)[:-2], A.dtype.to_real())


@linalg_slogdet.def_derivative
def _(grad, A):
    return grad[1].unsqueeze(-1).unsqueeze(-1) * linalg_inv(A).mH


_lin("slogdet", linalg_slogdet)
export("slogdet", method=True)(lambda input: linalg_slogdet(input))


@export("logdet", method=True)
def logdet(input):
    sign, logabs = linalg_slogdet(input)
    return logabs + sign.log()


@defop("linalg_inv(Tensor A) -> Tensor", tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_inv(xp, A):
    _check_square("linalg.inv", A)
    msg = "The diagonal element is zero, the inversion could not be completed because the input matrix is singular"
    return _lapack(xp, "linalg.inv", xp.linalg.inv, A, msg=msg).astype(A.dtype, copy=False)


linalg_inv.def_meta(lambda A: (_check_square("linalg.inv", A), TensorSpec(A.shape, A.dtype))[1])


@linalg_inv.def_derivative
def _(grad, result):
    return -(result.mH @ grad @ result.mH)


_lin("inv", linalg_inv)
export("inverse", method=True)(lambda input: linalg_inv(input))


# ---- solve -----------------------------------------------------------------------------------
def _is_vector_rhs(A_shape, B_shape):
    return len(B_shape) == 1 or (len(B_shape) == len(A_shape) - 1 and tuple(B_shape) == tuple(A_shape[:-1]))


def _solve_check(A, B):
    _check_square("linalg.solve", A)
    if _dt(A) is not _dt(B):
        raise RuntimeError(f"linalg.solve: Expected A and B to have the same dtype, but found A of type "
                           f"{type_name(_dt(A))} and B of type {type_name(_dt(B))} instead")
    vec = _is_vector_rhs(A.shape, B.shape)
    n = A.shape[-1]
    if (B.shape[-1] if vec else B.shape[-2] if len(B.shape) >= 2 else -1) != n:
        raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                           f"({_mshape(A.shape)} and {_mshape(B.shape)})")
    if vec:
        return broadcast_shapes(tuple(A.shape)[:-2], tuple(B.shape)[:-1]) + (n,), vec
    return broadcast_shapes(tuple(A.shape)[:-2], tuple(B.shape)[:-2]) + (n, B.shape[-1]), vec


def _mshape(s):
    return "x".join(map(str, s))


@defop("linalg_solve(Tensor A, Tensor B) -> Tensor", function=False, tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_solve(xp, A, B):
    shape, vec = _solve_check(A, B)
    msg = "The solver failed because the input matrix is singular"
    if vec:
        return _lapack(xp, "torch.linalg.solve", xp.linalg.solve, A, B[..., None], msg=msg)[..., 0]
    return _lapack(xp, "torch.linalg.solve", xp.linalg.solve, A, B, msg=msg)


linalg_solve.def_meta(lambda A, B: TensorSpec(_solve_check(A, B)[0], A.dtype))


@linalg_solve.def_derivative
def _(grad, A, B, result):
    gB = linalg_solve(A.mH, grad)
    if _is_vector_rhs(A.shape, B.shape):
        return -gB.unsqueeze(-1) * result.conj().unsqueeze(-2), gB
    return -(gB @ result.mH), gB


@export("solve", function=False, namespace="linalg")
def solve(A, B, *, left=True, out=None):
    r = linalg_solve(A, B) if left else linalg_solve(A.mT, B.mT).mT
    return r if out is None else out.resize_(r.shape).copy_(r)


# ---- factorisations --------------------------------------------------------------------------
@defop("linalg_cholesky(Tensor A, *, bool upper=False) -> Tensor", tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_cholesky(xp, A, *, upper=False):
    _check_square("linalg.cholesky", A)
    msg = "The factorization could not be completed because the input is not positive-definite"
    L = _lapack(xp, "linalg.cholesky", xp.linalg.cholesky, A, msg=msg)
    return xp.ascontiguousarray(xp.conj(xp.swapaxes(L, -1, -2))) if upper else L


linalg_cholesky.def_meta(lambda A, *, upper=False: (_check_square("linalg.cholesky", A),
                                                    TensorSpec(A.shape, A.dtype))[1])


@linalg_cholesky.def_derivative
def _(grad, upper, result):
    L, gL = (result.mH, grad.mH) if upper else (result, grad)
    eye = _eye_like(L)
    phi = (L.mH @ gL).tril() * (1 - 0.5 * eye)
    Linv = linalg_inv(L)
    gA = Linv.mH @ phi @ Linv
    return 0.5 * (gA + gA.mH)


_lin("cholesky", linalg_cholesky)
export("cholesky", method=True)(lambda input, upper=False: linalg_cholesky(input, upper=upper))


@defop("linalg_eigh(Tensor self, str UPLO=\"L\") -> (Tensor eigenvalues, Tensor eigenvectors)",
       tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_eigh(xp, self, UPLO="L"):
    _check_square("linalg.eigh", self)
    w, v = _lapack(xp, "linalg.eigh", xp.linalg.eigh, self, UPLO, msg="The algorithm failed to converge")
    return w.astype(_dt(self).to_real().np, copy=False), v


@linalg_eigh.def_meta
def _(self, UPLO="L"):
    _check_square("linalg.eigh", self)
    return TensorSpec(tuple(self.shape)[:-1], self.dtype.to_real()), TensorSpec(self.shape, self.dtype)


@linalg_eigh.def_derivative
def _(grad, result):
    gL, gV = grad
    L, V = result
    eye = _eye_like(V)
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    inner = (V.mH @ gV) / (E + eye) * (1 - eye) + gL.to(V.dtype).unsqueeze(-1) * eye
    return V @ inner @ V.mH


_lin("eigh", linalg_eigh)
LINALG["eigvalsh"] = lambda A, UPLO="L", *, out=None: linalg_eigh(A, UPLO)[0]


@defop("linalg_svd(Tensor A, bool full_matrices=True, *, str? driver=None) -> (Tensor U, Tensor S, Tensor Vh)",
       tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_svd(xp, A, full_matrices=True, *, driver=None):
    _check_float("linalg.svd", A)
    U, S, Vh = _lapack(xp, "linalg.svd", lambda a: xp.linalg.svd(a, full_matrices=full_matrices), A,
                       msg="The algorithm failed to converge because the input matrix is ill-conditioned or has "
                           "too many repeated singular values")
    return U, S.astype(_dt(A).to_real().np, copy=False), Vh


def _svd_shapes(A, full):
    if len(A.shape) < 2:
        raise RuntimeError("linalg.svd: The input tensor A must have at least 2 dimensions.")
    *b, m, n = A.shape
    k = min(m, n)
    b = tuple(b)
    return (b + (m, m if full else k), b + (k,), b + (n if full else k, n))


@linalg_svd.def_meta
def _(A, full_matrices=True, *, driver=None):
    _check_float("linalg.svd", A)
    u, s, vh = _svd_shapes(A, full_matrices)
    return TensorSpec(u, A.dtype), TensorSpec(s, A.dtype.to_real()), TensorSpec(vh, A.dtype)


@linalg_svd.def_derivative
def _(grad, A, full_matrices, result):
    gU, gS, gVh = grad
    U, S, Vh = result
    m, n = A.shape[-2:]
    k = min(m, n)
    if full_matrices and m != n:
        U, Vh, gU, gVh = U[..., :k], Vh[..., :k, :], gU[..., :k], gVh[..., :k, :]
    V, gV = Vh.mH, gVh.mH
    eye = _eye_like(S.unsqueeze(-1).expand(*S.shape, k))
    S2 = S.unsqueeze(-2) * S.unsqueeze(-2)
    F = (1 - eye) / (S2 - S2.mT + eye)
    UtgU, VtgV = U.mH @ gU, V.mH @ gV
    Sd = S.to(A.dtype)
    J = F * (UtgU - UtgU.mH)
    K = F * (VtgV - VtgV.mH)
    inner = (J * Sd.unsqueeze(-2) + Sd.unsqueeze(-1) * K) + gS.to(A.dtype).unsqueeze(-1) * eye
    gA = U @ inner @ Vh
    if m > k:
        gA = gA + (gU - U @ UtgU) / Sd.unsqueeze(-2) @ Vh
    if n > k:
        gA = gA + U @ ((gV - V @ VtgV) / Sd.unsqueeze(-2)).mH
    return gA


_lin("svd", linalg_svd)


@export("svd", method=True)
def svd(input, some=True, compute_uv=True):
    U, S, Vh = linalg_svd(input, full_matrices=not some)
    return _SVD(U, S, Vh.mH)


_SVD = return_type(parse("svd(Tensor self) -> (Tensor U, Tensor S, Tensor V)"))


@defop("linalg_svdvals(Tensor A, *, str? driver=None) -> Tensor", tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_svdvals(xp, A, *, driver=None):
    _check_float("linalg.svdvals", A)
    return xp.linalg.svd(A, compute_uv=False).astype(_dt(A).to_real().np, copy=False)


@linalg_svdvals.def_meta
def _(A, *, driver=None):
    _check_float("linalg.svdvals", A)
    return TensorSpec(_svd_shapes(A, False)[1], A.dtype.to_real())


@linalg_svdvals.def_derivative
def _(grad, A):
    U, _, Vh = linalg_svd(A, full_matrices=False)
    return (U * grad.to(A.dtype).unsqueeze(-2)) @ Vh


_lin("svdvals", linalg_svdvals)


@defop("linalg_qr(Tensor A, str mode=\"reduced\") -> (Tensor Q, Tensor R)",
       tags=(Tag.core, Tag.extern, Tag.cpu_autocast_fp32))
def linalg_qr(xp, A, mode="reduced"):
    _check_float("linalg.qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
                           "'r', or 'complete'")
    if mode == "r":
        return xp.empty((0,), dtype=A.dtype), xp.linalg.qr(A, mode="r")
    Q, R = xp.linalg.qr(A, mode=mode)
    return Q, R


@linalg_qr.def_meta
def _(A, mode="reduced"):
    _check_float("linalg.qr", A)
    *b, m, n = A.shape
    k = m if mode == "complete" else min(m, n)
    q = (0,) if mode == "r" else tuple(b) + (m, k)
    return TensorSpec(q, A.dtype), TensorSpec(tuple(b) + (k, n), A.dtype)


@linalg_qr.def_derivative
def _(grad, mode, result):
    gQ, gR = grad
    Q, R = result
    if mode == "r" or R.shape[-2] < R.shape[-1] or Q.shape[-1] != R.shape[-2]:
        raise NotImplementedError("The derivative of linalg.qr is implemented for mode='reduced' with m >= n")
    M = R @ gR.mH - gQ.mH @ Q
    M = M.tril()
    M = M - 0.5 * M * _eye_like(M)
    M = M + M.mH
    b = gQ + Q @ M
    return linalg_solve(R, b.mH).mH


_lin("qr", linalg_qr)
export("qr", method=True)(lambda input, some=True: linalg_qr(input, "reduced" if some else "complete"))


# ---- derived: pinv, matrix_rank, lstsq ------------------------------------------------------
def _tolerance(S, atol, rtol, shape):
    """The singular-value cut-off max(atol, rtol * sigma_max), PyTorch's defaults."""
    smax = S.amax(-1, keepdim=True) if S.shape[-1] else S.sum(-1, keepdim=True)
    if rtol is None:
        eps = float(np.finfo(S.dtype.np).eps)
        rtol = 0.0 if (atol is not None and (not hasattr(atol, "shape") and atol > 0)) else max(shape[-2:]) * eps
    tol = smax * rtol
    if atol is not None:
        tol = tol.clamp_min(atol) if not hasattr(atol, "shape") else tol.maximum(atol.unsqueeze(-1))
    return tol


@export("pinv", function=False, namespace="linalg")
def pinv(A, *, atol=None, rtol=None, hermitian=False, out=None, rcond=None):
    if rcond is not None:
        rtol = rcond
    U, S, Vh = linalg_svd(A, full_matrices=False)
    keep = (S > _tolerance(S, atol, rtol, A.shape)).to(S.dtype)
    Sinv = (keep / (S + (1 - keep))).to(A.dtype)
    r = (Vh.mH * Sinv.unsqueeze(-2)) @ U.mH
    return r if out is None else out.resize_(r.shape).copy_(r)


export("pinverse", method=True)(lambda input, rcond=1e-15: pinv(input, rtol=rcond))


@export("matrix_rank", function=False, namespace="linalg")
def matrix_rank(A, tol=None, *, atol=None, rtol=None, hermitian=False, out=None):
    if tol is not None:
        atol, rtol = tol, 0.0
    S = linalg_svdvals(A)
    r = (S > _tolerance(S, atol, rtol, A.shape)).sum(-1)
    return r if out is None else out.resize_(r.shape).copy_(r)


@export("lstsq", function=False, namespace="linalg")
def lstsq(A, B, rcond=None, *, driver=None):
    vec = B.ndim == A.ndim - 1
    Bm = B.unsqueeze(-1) if vec else B
    X = pinv(A, rtol=rcond) @ Bm
    X = X.squeeze(-1) if vec else X
    empty = A.new_zeros(0).to(A.dtype.to_real())
    return _LSTSQ(X, empty, A.new_zeros(0).long(), empty)


_LSTSQ = return_type(parse("lstsq(Tensor A, Tensor B) -> (Tensor solution, Tensor residuals, Tensor rank, "
                           "Tensor singular_values)"))


# ---- vmap batching rules: the factorizations take any leading batch dimensions ------------------------
for _op in (linalg_inv, linalg_det, linalg_slogdet, linalg_cholesky, linalg_eigh, linalg_svd, linalg_svdvals,
            linalg_qr):
    _op.def_batching_rule(_batching.dim_rule(_op))
linalg_vector_norm.def_batching_rule(_batching.dim_rule(linalg_vector_norm, "dim", all_when_none=True))
