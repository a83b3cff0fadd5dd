"""Linear algebra products: matmul/mm/bmm/mv/dot/vdot/inner/outer, the add* family
(addmm/addmv/addr/addbmm/baddbmm), einsum, tensordot, kron, multi_dot/chain_matmul and cross.
Products go to the array namespace's BLAS (`xp.matmul`, `xp.einsum(optimize=True)`); half and
bfloat16 compute in float32. On cuda, float16/bfloat16/float32 matmul/mm/bmm/addmm/baddbmm (and
`linear`) run through cuBLASLt (`_backends.cublaslt`: low-precision operands on the tensor cores,
fp32 accumulation, a 1-D addmm bias as the epilogue). The `linalg` namespace's norms, solvers and decompositions live in
`linalg_decomp`.

Like PyTorch, the matrix products require operands of one dtype (no promotion), accept integer
dtypes on CPU and refuse bool; shape errors name both shapes.
"""
from __future__ import annotations

import numpy as np

import string
import warnings

from .. import _dtype as D, _state
from .._backends import cpu_kernels, cublaslt
from .._backends.cpu_kernels import matmul_for
from ._registry import defop, export, autocast_policy, TensorSpec, LINALG, Tag
from ._helpers import broadcast_shapes, opmath, wrap_dim
from .._dispatch import type_name as tn
from .creation import ones, eye
from . import _batching, _sharding


def type_name(dt) -> str:
    return tn(dt)


def _dt(x) -> D.dtype:
    """dtype of an array (kernels) or a Tensor (meta functions)."""
    d = x.dtype
    return d if isinstance(d, D.dtype) else D.FROM_NP[d]


def _check_same_dtype(a, b):
    if _dt(a) is not _dt(b):
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{type_name(_dt(a)).lower()} != {type_name(_dt(b)).lower()}")


def _check_not_bool(name, x, *empty_ok):
    """Bool has no product kernel. The matrix products (`empty_ok`: their operands) return before
    choosing a kernel when an operand is empty, so empty bool operands multiply, as in PyTorch."""
    if _dt(x) is D.bool and not any(0 in tuple(o.shape) for o in empty_ok):
        raise NotImplementedError(f"\"{name}\" not implemented for 'Bool'")


_FAST_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _prod(xp, fn, *arrays):
    """Run a product in the op-math dtype and cast back to the operands' dtype (bfloat16 products on
    the CPU's BF16 dot products where it has them, `cpu_kernels.matmul_bf16`)."""
    dt = _dt(arrays[0])
    if dt is D.bfloat16 and fn is cpu_kernels.matmul and len(arrays) == 2:
        r = cpu_kernels.matmul_bf16(*arrays)
        if r is not None:
            return r
    cd = opmath(dt)
    r = fn(*(a.astype(cd, copy=False) for a in arrays))
    return xp.asarray(r).astype(dt.np, copy=False)


def lt_gemm(xp, a, b, **kw):
    """a @ b (with `cublaslt.gemm`'s bias/c/alpha/beta) through cuBLASLt for CuPy arrays of a dtype it
    takes; None when the product is not for cuBLASLt (the caller runs its own path)."""
    if xp is np or getattr(xp, "__name__", "") != "cupy" or not cublaslt.handles(a, b):
        return None
    return cublaslt.gemm(a, b, **kw)


def _lt_add(xp, self, a, b, beta, alpha):
    """beta * self + alpha * (a @ b) through cuBLASLt: beta == 0 ignores self, a 1-D self of length
    n with beta == 1 is the bias epilogue, anything else is copied into the output as C."""
    if getattr(xp, "__name__", "") != "cupy" or self.dtype != a.dtype or isinstance(beta, complex) \
            or isinstance(alpha, complex):
        return None
    if beta == 0:
        return lt_gemm(xp, a, b, alpha=alpha)
    if beta == 1 and self.ndim == 1 and self.shape[0] == b.shape[-1]:
        return lt_gemm(xp, a, b, bias=self, alpha=alpha)
    return lt_gemm(xp, a, b, c=self, alpha=alpha, beta=beta)


def _mshape(s) -> str:
    return "x".join(map(str, s))


def matmul_shape(a, b):
    if len(b) == 2 and len(a) >= 2 and a[-1] == b[0]:
        return tuple(a[:-1]) + (b[1],)         # x @ W (linear's gradients): the general case's result, directly
    if a == () or b == ():
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {len(a)}D and {len(b)}D")
    if len(a) == 1 and len(b) == 1:
        if a[0] != b[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{a[0]}] and src [{b[0]}] to have the "
                               f"same number of elements, but got {a[0]} and {b[0]} elements respectively")
        return ()
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({_mshape(a2[-2:])} and {_mshape(b2[-2:])})")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@defop("matmul(Tensor self, Tensor other) -> Tensor", method=True,
       tags=(Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def matmul(xp, self, other):
    if (type(self) is np.ndarray and type(other) is np.ndarray and self.ndim == 2 == other.ndim
            and self.dtype == other.dtype and self.dtype in _FAST_FLOATS and self.shape[1] == other.shape[0]):
        if self.shape[0] * self.shape[1] * other.shape[1] < cpu_kernels.MIN_MACS and self.shape[1] != 1:
            return np.matmul(self, other)                   # fast path: small 2-D float product
        return cpu_kernels.matmul(self, other)
    _check_same_dtype(self, other)
    _check_not_bool("addmm_impl_cpu_", self, self, other)
    shape = matmul_shape(self.shape, other.shape)
    if self.ndim + other.ndim > 2:
        r = lt_gemm(xp, self.reshape(1, -1) if self.ndim == 1 else self,
                    other.reshape(-1, 1) if other.ndim == 1 else other)
        if r is not None:
            return r if r.shape == shape else r.reshape(shape)     # (a CuPy reshape is a new view object)
    return _prod(xp, matmul_for(xp), self, other).reshape(shape)


@matmul.def_meta
def _(self, other):
    _check_same_dtype(self, other)
    return TensorSpec(matmul_shape(self.shape, other.shape), self.dtype)


@matmul.def_derivative
def _matmul_derivative(grad, self, other, output_mask):
    """Only the gradients `output_mask` asks for (no product for an operand without grad)."""
    a, b = self, other
    ga = gb = None
    if a.ndim == 1 and b.ndim == 1:
        return grad * b.conj() if output_mask[0] else None, grad * a.conj() if output_mask[1] else None
    if a.ndim == 1:
        if output_mask[0]:
            ga = (grad.unsqueeze(-2) @ b.mT.conj()).squeeze(-2)
        if output_mask[1]:
            gb = a.conj().unsqueeze(-1) @ grad.unsqueeze(-2)
        return ga, gb
    if b.ndim == 1:
        if output_mask[0]:
            ga = grad.unsqueeze(-1) @ b.conj().unsqueeze(-2)
        if output_mask[1]:
            gb = (a.mT.conj() @ grad.unsqueeze(-1)).squeeze(-1)
        return ga, gb
    if output_mask[0]:
        ga = (b.conj() @ grad.mT).mT if _column_major(a) else grad @ b.mT.conj()
    if output_mask[1]:
        if b.ndim == 2 and a.ndim > 2:         # a folded product (PyTorch's matmul: one mm, no batch sum)
            a, grad = a.reshape(-1, a.shape[-1]), grad.reshape(-1, grad.shape[-1])
        gb = (grad.mT @ a.conj()).mT if _column_major(b) else a.mT.conj() @ grad
    return ga, gb


def _column_major(t) -> bool:
    """Whether matrix operand `t` is stored column by column (a transposed view: `weight.T`, an expanded
    parameter under vmap(grad)): its gradient is then computed transposed, so the product writes it
    in the operand's own layout (PyTorch's mm_mat2_backward). Sizes and strides must be known ints."""
    st, sh = t.stride()[-2:], tuple(t.shape[-2:])
    if not all(type(v) is int for v in st + sh):
        return False
    return st[0] == 1 and st[1] >= sh[0] > 1 and sh[1] > 1


# ---- fixed-rank products ---------------------------------------------------------------------
def _mm_shape(a, b):
    if len(a.shape) != 2:
        raise RuntimeError("self must be a matrix")
    if len(b.shape) != 2:
        raise RuntimeError("mat2 must be a matrix")
    _check_same_dtype(a, b)
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({_mshape(a.shape)} and {_mshape(b.shape)})")
    return (a.shape[0], b.shape[1])


def _bmm_shape(a, b):
    if len(a.shape) != 3:
        raise RuntimeError("batch1 must be a 3D tensor")
    if len(b.shape) != 3:
        raise RuntimeError("batch2 must be a 3D tensor")
    _check_same_dtype(a, b)
    if b.shape[:2] != (a.shape[0], a.shape[2]):
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}].")
    return (a.shape[0], a.shape[1], b.shape[2])


def _mv_shape(a, v):
    if len(a.shape) != 2 or len(v.shape) != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {len(a.shape)}, {len(v.shape)}")
    if _dt(a) is not _dt(v):
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{type_name(_dt(a)).lower()} != {type_name(_dt(v)).lower()}")
    if a.shape[1] != v.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({a.shape[0]}), mat ({_mshape(a.shape)}), vec ({v.shape[0]})")
    return (a.shape[0],)


def _dot_shape(a, b, name="dot"):
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise RuntimeError(f"1D tensors expected, but got {len(a.shape)}D and {len(b.shape)}D tensors")
    if _dt(a) is not _dt(b):
        raise RuntimeError(f"{name} : expected both vectors to have same dtype, but found "
                           f"{type_name(_dt(a))} and {type_name(_dt(b))}")
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src [{b.shape[0]}] to "
                           f"have the same number of elements, but got {a.shape[0]} and {b.shape[0]} elements "
                           "respectively")
    return ()


@defop("mm(Tensor self, Tensor mat2) -> Tensor", method=True,
       tags=(Tag.core, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def mm(xp, self, mat2):
    _mm_shape(self, mat2)
    _check_not_bool("addmm_impl_cpu_", self, self, mat2)
    r = lt_gemm(xp, self, mat2)
    return r if r is not None else _prod(xp, matmul_for(xp), self, mat2)


mm.def_meta(lambda self, mat2: TensorSpec(_mm_shape(self, mat2), self.dtype))


@mm.def_derivative
def _mm_derivative(grad, self, mat2, output_mask):
    return grad.mm(mat2.mH) if output_mask[0] else None, self.mH.mm(grad) if output_mask[1] else None


@defop("bmm(Tensor self, Tensor mat2) -> Tensor", method=True,
       tags=(Tag.core, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def bmm(xp, self, mat2):
    _bmm_shape(self, mat2)
    _check_not_bool("bmm", self, self, mat2)
    r = lt_gemm(xp, self, mat2)
    return r if r is not None else _prod(xp, matmul_for(xp), self, mat2)


bmm.def_meta(lambda self, mat2: TensorSpec(_bmm_shape(self, mat2), self.dtype))


@bmm.def_derivative
def _bmm_derivative(grad, self, mat2, output_mask):
    return grad.bmm(mat2.mH) if output_mask[0] else None, self.mH.bmm(grad) if output_mask[1] else None


@defop("mv(Tensor self, Tensor vec) -> Tensor", method=True, tags=(Tag.extern, Tag.autocast_lower_precision))
def mv(xp, self, vec):
    _mv_shape(self, vec)
    _check_not_bool("addmv_impl_cpu", self, self, vec)
    return _prod(xp, matmul_for(xp), self, vec)


mv.def_meta(lambda self, vec: TensorSpec(_mv_shape(self, vec), self.dtype))


@mv.def_derivative
def _(grad, self, vec):
    return grad.unsqueeze(-1) * vec.conj().unsqueeze(0), self.mH.mv(grad)


@defop("dot(Tensor self, Tensor tensor) -> Tensor", method=True, tags=(Tag.extern, Tag.autocast_promote))
def dot(xp, self, tensor):
    _dot_shape(self, tensor)
    _check_not_bool("dot", self)
    return _prod(xp, lambda a, b: xp.sum(a * b), self, tensor)


dot.def_meta(lambda self, tensor: TensorSpec(_dot_shape(self, tensor), self.dtype))


@dot.def_derivative
def _(grad, self, tensor):
    return grad * tensor.conj(), grad * self.conj()


@defop("vdot(Tensor self, Tensor other) -> Tensor", method=True, tags=(Tag.autocast_promote,))
def vdot(xp, self, other):
    _dot_shape(self, other, "vdot")
    _check_not_bool("vdot", self)
    return _prod(xp, lambda a, b: xp.sum(xp.conj(a) * b), self, other)


vdot.def_meta(lambda self, other: TensorSpec(_dot_shape(self, other, "vdot"), self.dtype))


@vdot.def_derivative
def _(grad, self, other):
    return grad.conj() * other, grad * self


# ---- beta * self + alpha * product ----------------------------------------------------------
def _check_self(name, self, other, out):
    if _dt(self) is not _dt(other):
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {type_name(_dt(self))} and "
                           f"{type_name(_dt(other))}")
    shp = tuple(self.shape)
    if len(shp) > len(out) or any(s not in (1, o) for s, o in zip(shp[::-1], out[::-1])):
        raise RuntimeError(f"{name}: The expanded size of the tensor must match the existing size. "
                           f"Target sizes: {list(out)}. Tensor sizes: {list(shp)}")


def _combine(xp, self, prod, beta, alpha):
    """beta * self + alpha * prod with PyTorch's rule that beta == 0 ignores self (nan included)."""
    dt = _dt(prod)
    cd = opmath(dt)
    if dt.category <= D.INTEGER:
        beta, alpha = int(beta), int(alpha)
    p = prod.astype(cd, copy=False)
    r = p if alpha == 1 else p * alpha
    if beta != 0:
        s = self.astype(cd, copy=False)
        r = r + (s if beta == 1 else s * beta)
    return xp.broadcast_to(r, prod.shape).astype(dt.np)


def _add_family(name, schema_tail, shape_fn, prod_fn, grad_fn, *, tags=(), gemm=False):
    @defop(f"{name}(Tensor self, {schema_tail}, *, Scalar beta=1, Scalar alpha=1) -> Tensor", method=True,
           inplace=True, tags=tags)
    def op(xp, self, a, b, *, beta=1, alpha=1):
        out = shape_fn(a, b)
        _check_self(name, self, b, out)
        _check_not_bool(name, self)
        if gemm:
            r = _lt_add(xp, self, a, b, beta, alpha)
            if r is not None:
                return r
        return _combine(xp, self, _prod(xp, lambda x, y: prod_fn(xp, x, y), a, b), beta, alpha)

    @op.def_meta
    def _(self, a, b, *, beta=1, alpha=1):
        out = shape_fn(a, b)
        _check_self(name, self, b, out)
        return TensorSpec(out, b.dtype)

    argnames = [p.split()[-1] for p in schema_tail.split(", ")]
    src = (f"def deriv(grad, {argnames[0]}, {argnames[1]}, beta, alpha):\n"
           f"    return (grad if beta == 1 else grad * beta,) + _g(grad, {argnames[0]}, {argnames[1]}, alpha)\n")
    env = {"_g": grad_fn}
    exec(src, env)
    op.def_derivative(env["deriv"])
    return op


def _scale(t, alpha):
    return t if alpha == 1 else t * alpha


addmm = _add_family("addmm", "Tensor mat1, Tensor mat2", _mm_shape, lambda xp, a, b: matmul_for(xp)(a, b),
                    lambda g, a, b, al: (_scale(g.mm(b.mH), al), _scale(a.mH.mm(g), al)),
                    tags=(Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision), gemm=True)
addmv = _add_family("addmv", "Tensor mat, Tensor vec", _mv_shape, lambda xp, a, b: matmul_for(xp)(a, b),
                    lambda g, a, b, al: (_scale(g.unsqueeze(-1) * b.conj().unsqueeze(0), al),
                                         _scale(a.mH.mv(g), al)), tags=(Tag.autocast_lower_precision,))
baddbmm = _add_family("baddbmm", "Tensor batch1, Tensor batch2", _bmm_shape, lambda xp, a, b: matmul_for(xp)(a, b),
                      lambda g, a, b, al: (_scale(g.bmm(b.mH), al), _scale(a.mH.bmm(g), al)),
                      tags=(Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision), gemm=True)
addbmm = _add_family("addbmm", "Tensor batch1, Tensor batch2", lambda a, b: _bmm_shape(a, b)[1:],
                     lambda xp, a, b: matmul_for(xp)(a, b).sum(0),
                     lambda g, a, b, al: (_scale(g.unsqueeze(0).expand(a.shape[0], *g.shape).bmm(b.mH), al),
                                          _scale(a.mH.bmm(g.unsqueeze(0).expand(a.shape[0], *g.shape)), al)),
                                          tags=(Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))


def _outer_shape(a, b):
    if len(a.shape) != 1:
        raise RuntimeError(f"outer: Expected 1-D argument self, but got {len(a.shape)}-D")
    if len(b.shape) != 1:
        raise RuntimeError(f"outer: Expected 1-D argument vec2, but got {len(b.shape)}-D")
    return (a.shape[0], b.shape[0])


addr = _add_family("addr", "Tensor vec1, Tensor vec2", _outer_shape,
                   lambda xp, a, b: a[:, None] * b[None, :],
                   lambda g, a, b, al: (_scale(g.mv(b.conj()), al), _scale(g.mT.mv(a.conj()), al)),
                   tags=(Tag.autocast_lower_precision,))


@export("outer", method=True)
def outer(input, vec2, *, out=None):
    _outer_shape(input, vec2)
    r = input.unsqueeze(-1) * vec2.unsqueeze(0)
    return r if out is None else out.resize_(r.shape).copy_(r)


export("ger", method=True)(outer)


# ---- einsum ----------------------------------------------------------------------------------
def _einsum_parse(eq: str, shapes):
    """Explicit per-operand subscripts and output subscripts, with '...' expanded to letters and
    size-1 dims that broadcast against a larger size renamed so they are summed away."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) > len(shapes):
        raise RuntimeError("einsum(): fewer operands were provided than specified in the equation")
    if len(subs) < len(shapes):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation")
    used = set(c for c in eq if c.isalpha())
    for c in eq:
        if not (c.isalpha() or c in ".,->"):
            raise RuntimeError(f"einsum(): invalid subscript given at index {eq.index(c)} in the equation "
                               f"string, subscripts must be in [a-zA-Z]")
    free = [c for c in string.ascii_letters if c not in used]
    n_ell = 0
    for s, shp in zip(subs, shapes):
        named = len(s.replace("...", ""))
        if "..." in s:
            n_ell = max(n_ell, len(shp) - named)
        elif named != len(shp):
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) does not match the "
                               f"number of dimensions ({len(shp)}) for operand {subs.index(s)} and no ellipsis "
                               "was given")
    ell, free = "".join(free[:n_ell]), free[n_ell:]
    out_subs = []
    for s, shp in zip(subs, shapes):
        k = len(shp) - len(s.replace("...", ""))
        out_subs.append(s.replace("...", ell[n_ell - k:] if k else ""))
    if arrow:
        out = rhs.replace("...", ell)
        for c in out:
            if out.count(c) > 1:
                raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the output")
            if not any(c in s for s in out_subs):
                raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation for any "
                                   "input operand")
    else:
        joined = "".join(s for s in out_subs)
        out = ell + "".join(sorted(c for c in set(joined) if joined.count(c) == 1 and c not in ell))
    sizes = {}
    for i, (s, shp) in enumerate(zip(out_subs, shapes)):
        for c, n in zip(s, shp):
            if n != 1 and sizes.get(c, 1) not in (1, n):
                raise RuntimeError(f"einsum(): subscript {c} has size {n} for operand {i} which does not broadcast "
                                   f"with previously seen size {sizes[c]}")
            if n != 1 or c not in sizes:
                sizes[c] = n
    final = []
    for s, shp in zip(out_subs, shapes):
        t = ""
        for c, n in zip(s, shp):
            if n == 1 and sizes[c] != 1:
                c = free.pop(0)
                sizes[c] = 1
            t += c
        final.append(t)
    return final, out, sizes, free


def _einsum_eq(eq, shapes):
    subs, out, sizes, _ = _einsum_parse(eq, shapes)
    return ",".join(subs) + "->" + out, tuple(sizes[c] for c in out)


@defop("einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor", function=False,
       tags=(Tag.autocast_lower_precision,),
       no_decomposition="the contraction order (and hence the mm/bmm sequence) is a path-optimisation "
                        "choice; the compiler calls it as an extern like mm",
       eager_fallback="contracted through the eager kernel (no lowering)")
def _einsum(xp, equation, tensors, *, path=None):
    eq, _ = _einsum_eq(equation, [t.shape for t in tensors])
    for t in tensors[1:]:
        if t.dtype != tensors[0].dtype:
            raise RuntimeError(f"expected scalar type {type_name(_dt(tensors[0]))} but found {type_name(_dt(t))}")
    return _prod(xp, lambda *a: xp.einsum(eq, *a, optimize=len(a) > 2), *tensors)


@_einsum.def_meta
def _(equation, tensors, *, path=None):
    _, shape = _einsum_eq(equation, [t.shape for t in tensors])
    return TensorSpec(shape, tensors[0].dtype)


@_einsum.def_derivative
def _(grad, equation, tensors):
    subs, out, sizes, free = _einsum_parse(equation, [t.shape for t in tensors])
    grads = []
    for i, t in enumerate(tensors):
        if not (t.requires_grad and (t.is_floating_point() or t.is_complex())):
            grads.append(None)
            continue
        terms, ops = [out], [grad]
        for j, o in enumerate(tensors):
            if j != i:
                terms.append(subs[j])
                ops.append(o.conj())
        avail = set("".join(terms))
        spare = list(free)
        target, seen = "", set()
        for c in subs[i]:
            kw = {"dtype": grad.dtype, "device": grad.device}
            if c in seen:                      # repeated subscript: the gradient lives on the diagonal
                n = spare.pop(0)
                terms.append(c + n)
                ops.append(eye(sizes[c], **kw))
                c = n
            elif c not in avail:               # summed only in this operand: broadcast the gradient
                terms.append(c)
                ops.append(ones(sizes[c], **kw))
            seen.add(c)
            avail.add(c)
            target += c
        grads.append(_einsum(",".join(terms) + "->" + target, ops))
    return grads


@export()
def einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        equation, operands = _sublist_equation(equation, operands)
    if _contracts(equation, operands):
        return _einsum_bmm(equation, list(operands))
    return _einsum(equation, list(operands))


def _contracts(equation, operands) -> bool:
    """Whether some index is summed over two or more operands: PyTorch's cpu einsum then runs bmm
    (lower precision under cpu autocast); otherwise only sums, products and views (float32)."""
    if len(operands) < 2:
        return False
    subs, out, _, _ = _einsum_parse(equation, [t.shape for t in operands])
    return any(sum(c in s for s in subs) >= 2 and c not in out for c in set("".join(subs)))


@autocast_policy("einsum", (Tag.cpu_autocast_lower_precision,))
def _einsum_bmm(equation, operands):
    return _einsum(equation, operands)


# tensordot is a promote op on cuda; on cpu PyTorch runs it as mm (lower precision) unless it
# contracts everything into a 0-dim result (a dot, float32)
@autocast_policy("tensordot", (Tag.autocast_promote, Tag.cpu_autocast_lower_precision))
def _tensordot_mm(equation, a, b):
    return _einsum(equation, [a, b])


@autocast_policy("tensordot", (Tag.autocast_promote,))
def _tensordot_dot(equation, a, b):
    return _einsum(equation, [a, b])


def _sublist_equation(first, rest):
    """einsum(op0, sublist0, op1, sublist1, ..., [out_sublist]) -> (equation, operands)."""
    items = (first,) + tuple(rest)
    ops, subs = list(items[0::2]), list(items[1::2])
    out = None
    if len(ops) > len(subs):
        out = ops.pop()
    letters = lambda sl: "".join("..." if x is Ellipsis else string.ascii_letters[x] for x in sl)
    eq = ",".join(letters(s) for s in subs) + ("" if out is None else "->" + letters(out))
    return eq, ops


@export(method=True)
def tensordot(a, b, dims=2, out=None):
    if isinstance(dims, int) or (hasattr(dims, "ndim") and dims.ndim == 0):
        n = int(dims)
        if n < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={n}")
        da, db = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(da) != len(db):
        raise RuntimeError(f"both dimension lists should have same length")
    if a.dtype is not b.dtype and (a.device.type == "cpu" or a.device.type not in _state.tls.autocast):
        raise RuntimeError("both inputs should have same dtype")     # (cuda autocast promotes them first)
    da = [wrap_dim(d, a.ndim) for d in da]
    db = [wrap_dim(d, b.ndim) for d in db]
    sa = string.ascii_letters[:a.ndim]
    sb = list(string.ascii_letters[a.ndim:a.ndim + b.ndim])
    for x, y in zip(da, db):
        if a.shape[x] != b.shape[y]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[x]} in dim {x} "
                               f"and second has size {b.shape[y]} in dim {y}")
        sb[y] = sa[x]
    sb = "".join(sb)
    res = "".join(c for i, c in enumerate(sa) if i not in da) + "".join(c for i, c in enumerate(sb) if i not in db)
    r = (_tensordot_mm if res else _tensordot_dot)(f"{sa},{sb}->{res}", a, b)
    return r if out is None else out.resize_(r.shape).copy_(r)


@export(method=True)
def inner(input, other, *, out=None):
    if input.ndim == 0 or other.ndim == 0:
        r = input * other
    else:
        if input.shape[-1] != other.shape[-1]:
            raise RuntimeError(f"inner() the last dimension must match on both input tensors but got shapes "
                               f"{list(input.shape)} and {list(other.shape)}")
        r = tensordot(input, other, ([-1], [-1]))
    return r if out is None else out.resize_(r.shape).copy_(r)


@export(method=True)
def kron(input, other, *, out=None):
    n = max(input.ndim, other.ndim)
    a = input.reshape((1,) * (n - input.ndim) + tuple(input.shape))
    b = other.reshape((1,) * (n - other.ndim) + tuple(other.shape))
    sa = [x for s in a.shape for x in (s, 1)]
    sb = [x for s in b.shape for x in (1, s)]
    r = (a.reshape(sa) * b.reshape(sb)).reshape([x * y for x, y in zip(a.shape, b.shape)])
    return r if out is None else out.resize_(r.shape).copy_(r)


def _multi_dot(tensors, name):
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"{name}(): expected at least 2 tensors but got {len(tensors)}")
    first_vec, last_vec = tensors[0].ndim == 1, tensors[-1].ndim == 1
    if first_vec:
        tensors[0] = tensors[0].unsqueeze(0)
    if last_vec:
        tensors[-1] = tensors[-1].unsqueeze(-1)
    for i, t in enumerate(tensors):
        if t.ndim != 2:
            raise RuntimeError(f"{name}(): tensor {i} must be 2D but got {t.ndim}D")
    r = tensors[0]
    for t in tensors[1:]:
        r = r.mm(t)
    if first_vec:
        r = r.squeeze(0)
    if last_vec:
        r = r.squeeze(-1)
    return r


@export("multi_dot", function=False, namespace="linalg")
def multi_dot(tensors, *, out=None):
    r = _multi_dot(tensors, "multi_dot")
    return r if out is None else out.resize_(r.shape).copy_(r)


@export()
def chain_matmul(*matrices, out=None):
    if len(matrices) == 1 and isinstance(matrices[0], (list, tuple)):
        matrices = matrices[0]
    if len(matrices) == 1:
        return matrices[0].clone()
    for i, m in enumerate(matrices):
        if m.ndim != 2:
            raise RuntimeError(f"Tensor dimension is {m.ndim}, expected 2 instead.")
    r = _multi_dot(matrices, "chain_matmul")
    return r if out is None else out.resize_(r.shape).copy_(r)


# ---- cross -----------------------------------------------------------------------------------
def _cross_shape(a, b, dim):
    if len(a.shape) != len(b.shape):
        raise RuntimeError(f"linalg.cross: inputs must have the same number of dimensions.")
    shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
    d = wrap_dim(dim, len(shape))
    if a.shape[d] != 3 or b.shape[d] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {a.shape[d]} and "
                           f"{b.shape[d]}")
    return shape, d


@defop("linalg_cross(Tensor self, Tensor other, *, int dim=-1) -> Tensor", tags=(Tag.autocast_promote,))
def linalg_cross(xp, self, other, *, dim=-1):
    _, d = _cross_shape(self, other, dim)
    if self.dtype != other.dtype:
        raise RuntimeError(f"expected scalar type {type_name(_dt(self))} but found {type_name(_dt(other))}")
    _check_not_bool("linalg_cross", self)
    return xp.ascontiguousarray(_prod(xp, lambda a, b: xp.cross(a, b, axis=d), self, other))  # torch: C order


@linalg_cross.def_meta
def _(self, other, *, dim=-1):
    shape, _ = _cross_shape(self, other, dim)
    return TensorSpec(shape, self.dtype)


@linalg_cross.def_derivative
def _(grad, self, other, dim):
    return linalg_cross(other.conj(), grad, dim=dim), linalg_cross(grad, self.conj(), dim=dim)


LINALG["cross"] = linalg_cross


@export(method=True)
def cross(input, other, dim=None, *, out=None):
    if dim is None:
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated.", UserWarning)
        shape = broadcast_shapes(tuple(input.shape), tuple(other.shape))
        dim = next((i for i, s in enumerate(shape) if s == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    r = linalg_cross(input, other, dim=dim)
    return r if out is None else out.resize_(r.shape).copy_(r)


# ---- vmap batching rules ----------------------------------------------------------------------------
for _op in (matmul, mm, bmm, mv, dot):
    _op.def_batching_rule(_batching.matmul_rule(_op))


# ---- DTensor sharding rules -------------------------------------------------------------------------
mm.def_sharding_rule(_sharding.mm_rule)
addmm.def_sharding_rule(_sharding.addmm_rule)
bmm.def_sharding_rule(_sharding.bmm_rule)
baddbmm.def_sharding_rule(_sharding.baddbmm_rule)
matmul.def_sharding_rule(_sharding.matmul_rule)
