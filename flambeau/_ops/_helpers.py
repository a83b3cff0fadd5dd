"""Shared pieces of operator declarations: type promotion over arrays and tensors, broadcasting,
dim wrapping, and kernel builders for pointwise ops.

Kernels see arrays (NumPy/CuPy) and Python scalars; meta functions see Tensors. Both use
`result_type`, which classifies each operand as a dimensioned array, a 0-dim array or a Python
scalar exactly as PyTorch does.
"""
from __future__ import annotations

import builtins

import numpy as np

from .. import _dtype as D
from .. import _state
from .._tensor import Tensor
from ._registry import TensorSpec

_SCALARS = (builtins.bool, int, float, complex)


def dtype_of(x) -> D.dtype:
    """The flambeau dtype of an operand (tensor, array or Python scalar)."""
    if isinstance(x, Tensor):
        return x._dtype
    t = type(x)
    if t in _SCALARS:
        return D.scalar_dtype(x, _state.default_dtype)
    return D.FROM_NP[x.dtype]


def result_type(*xs) -> D.dtype:
    """PyTorch's result_type over tensors/arrays (by rank class) and Python scalars."""
    if len(xs) == 2:
        a, b = xs
        ta, tb = type(a), type(b)
        if ta is np.ndarray and tb is np.ndarray and a.dtype == b.dtype:
            return D.FROM_NP[a.dtype]
    dims, zeros, scalars = [], [], []
    for x in xs:
        if x is None:
            continue
        t = type(x)
        if t in _SCALARS:
            scalars.append(D.scalar_dtype(x, _state.default_dtype))
        elif isinstance(x, np.generic):
            zeros.append(D.FROM_NP[x.dtype])
        elif isinstance(x, Tensor):
            (dims if x._data.ndim else zeros).append(x._dtype)
        else:
            (dims if x.ndim else zeros).append(D.FROM_NP[x.dtype])
    return D.result_type_of(dims, zeros, scalars)


def opmath(dt: D.dtype) -> np.dtype:
    """The dtype a kernel computes in: float32 for half/bfloat16 (as PyTorch's CPU kernels do)."""
    if dt in D.LOW_PRECISION:
        return np.dtype(np.float32)
    return dt.np


def cast(xp, x, npdt):
    """Bring an operand to the compute dtype: arrays are converted, Python scalars stay scalars."""
    t = type(x)
    if t in _SCALARS:
        if npdt.kind in "fc" or (npdt.kind in "iu" and t is int) or npdt.kind == "b":
            return x
        return npdt.type(x)
    if x.dtype != npdt:
        return x.astype(npdt)
    return x


def round_to(x, dt: D.dtype):
    """Round an operand to dtype `dt` (PyTorch casts mixed operands to the common dtype first)."""
    if type(x) in _SCALARS:
        return x if type(x) is builtins.bool else type(x)(dt.np.type(x)) if type(x) is not complex else x
    if x.dtype != dt.np:
        return x.astype(dt.np)
    return x


def shape_of(x) -> tuple:
    if isinstance(x, Tensor):
        return x._data.shape
    if type(x) in _SCALARS:
        return ()
    return x.shape


def broadcast_shapes(*shapes) -> tuple:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        off = nd - len(s)
        for i, v in enumerate(s):
            o = out[off + i]
            if o == 1:
                out[off + i] = v
            elif v != 1 and v != o:
                a = [x for x in shapes if len(x) - (nd - off - i) >= 0]
                raise RuntimeError(_bcast_msg(shapes, nd))
    return tuple(out)


def _bcast_msg(shapes, nd):
    a, b = shapes[0], shapes[1] if len(shapes) > 1 else shapes[0]
    for i in range(1, nd + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            return (f"The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton "
                    f"dimension {nd - i}")
    return f"shapes {[list(s) for s in shapes]} cannot be broadcast together"


def wrap_dim(dim: int, ndim: int) -> int:
    n = ndim if ndim > 0 else 1
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, builtins.bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if dim < -n or dim >= n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


def wrap_dims(dims, ndim: int) -> tuple:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    out = tuple(wrap_dim(d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise RuntimeError(f"dim {out} appears multiple times in the list of dims")
    return out


def default_float() -> D.dtype:
    return _state.default_dtype


def float_result(dt: D.dtype) -> D.dtype:
    """Integral/bool inputs promote to the default float (true division, sqrt, exp, ...)."""
    return dt if dt.category >= 2 else _state.default_dtype


# ---- pointwise kernel builders ---------------------------------------------------------------
def binary_kernel(fn, *, to_float=False, out_dtype=None, name=""):
    """A promoted binary kernel: `fn(xp, a, b)` runs in the op-math dtype, result cast back."""
    def kernel(xp, a, b):
        dt = result_type(a, b)
        if to_float and dt.category < 2:
            dt = _state.default_dtype
        cd = opmath(dt)
        if cd is not dt.np and dt.np != cd:       # low precision: round operands to dt first
            a, b = round_to(a, dt), round_to(b, dt)
        try:
            r = fn(xp, cast(xp, a, cd), cast(xp, b, cd))
        except ValueError:
            broadcast_shapes(shape_of(a), shape_of(b))
            raise
        want = out_dtype.np if out_dtype is not None else dt.np
        if r.dtype != want:
            r = r.astype(want)
        return r
    kernel.__name__ = name or getattr(fn, "__name__", "binary")
    return kernel


def binary_meta(*, to_float=False, out_dtype=None):
    def meta(a, b, *rest, **kw):
        dt = result_type(a, b)
        if to_float and dt.category < 2:
            dt = _state.default_dtype
        return TensorSpec(broadcast_shapes(shape_of(a), shape_of(b)), out_dtype or dt)
    return meta


def unary_kernel(fn, *, to_float=False, out_dtype=None, name=""):
    def kernel(xp, a):
        dt = D.FROM_NP[a.dtype]
        if to_float and dt.category < 2:
            dt = _state.default_dtype
        cd = opmath(dt)
        r = fn(xp, a.astype(cd) if a.dtype != cd else a)
        want = out_dtype.np if out_dtype is not None else dt.np
        if r.dtype != want:
            r = r.astype(want)
        return r
    kernel.__name__ = name or getattr(fn, "__name__", "unary")
    return kernel


def unary_meta(*, to_float=False, out_dtype=None):
    def meta(a, *rest, **kw):
        dt = a._dtype
        if to_float and dt.category < 2:
            dt = _state.default_dtype
        return TensorSpec(a._data.shape, out_dtype or dt)
    return meta


def same_meta(a, *rest, **kw):
    return TensorSpec(a._data.shape, a._dtype)
