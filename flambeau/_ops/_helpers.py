"""Shared pieces of operator declarations: type promotion over arrays and tensors, broadcasting,
dim wrapping, and kernel builders for pointwise ops.

Kernels see arrays (NumPy/CuPy) and Python scalars; meta functions see Tensors. Both use
`result_type`, which classifies each operand as a dimensioned array, a 0-dim array or a Python
scalar exactly as PyTorch does.
"""
from __future__ import annotations

import builtins
import operator
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _dtype as D
from .. import _fp_errors
from .. import _state
from .._device import QUANTIZED_CPU
from .._tensor import Tensor
from .._dispatch import WRAPPER_DEVICE, device_array_types
from .._backends import triton_launch, cuda_binary, cpu_kernels, is_cupy, array_namespaces
from . import _registry
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


_SAME_WIDTH_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def zero_where(xp, cond, v):
    """`where(cond, 0, v)` in `v`'s dtype. On NumPy with `cond` of `v`'s shape, the select is a
    bitwise AND of `v`'s bits with a mask (NumPy's `where` branches per element, ~10x slower on
    data-dependent masks such as relu's); -0.0 and NaN in `v` are kept as they are."""
    if xp is np and isinstance(v, np.ndarray) and v.ndim and v.dtype.kind in "fiu" and cond.shape == v.shape:
        ity = _SAME_WIDTH_INT.get(v.dtype.itemsize)
        if ity is not None:
            mask = np.subtract(cond, 1, dtype=ity)      # keep: 0 - 1 = all ones, zero: 1 - 1 = all zeros
            return np.bitwise_and(v.view(ity), mask, out=mask).view(v.dtype)
    return xp.where(cond, 0, v)


def zero_where_negative(xp, x, v, inclusive: bool):
    """`zero_where(xp, x <= 0 if inclusive else x < 0, v)` (ReLU's select: forward with v = x, backward
    with v the gradient); float32/float64 NumPy arrays of one shape and layout in one C++ pass
    (`cpu_kernels.zero_where_negative`) instead of a compare, a mask and a select."""
    if xp is np and type(x) is np.ndarray and type(v) is np.ndarray:
        r = cpu_kernels.zero_where_negative(x, v, inclusive)
        if r is not None:
            return r
    return zero_where(xp, x <= 0 if inclusive else x < 0, v)


def cast(xp, x, npdt):
    """Bring an operand to the compute dtype: arrays are converted, Python scalars stay scalars."""
    t = type(x)
    if t in _SCALARS:
        if npdt.kind in "iu" and t is int:
            lo, hi = _int_range(npdt)
            if lo <= x <= hi:
                return x
            return np.array(x & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(npdt)[()]   # wraps like C
        if npdt.kind in "fc" or npdt.kind == "b":
            return x
        return npdt.type(x)
    if x.dtype != npdt:
        return x.astype(npdt)
    return x


_RANGES: dict = {}


def _int_range(npdt):
    r = _RANGES.get(npdt)
    if r is None:
        i = np.iinfo(npdt)
        r = _RANGES[npdt] = (int(i.min), int(i.max))
    return r


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
    return dt if dt.category >= D.FLOATING else _state.default_dtype


def accumulate(xp, ufunc: str, x, axis: int):
    """`xp.<ufunc>.accumulate(x, axis)`; CuPy lacks it for maximum/minimum, so on other
    namespaces run a log-step (Hillis-Steele) scan: ceil(log2 n) vectorised passes."""
    if xp is np:
        return getattr(np, ufunc).accumulate(x, axis=axis)
    f = getattr(xp, ufunc)
    out = xp.moveaxis(x, axis, -1).copy()
    n, k = out.shape[-1], 1
    while k < n:
        out[..., k:] = f(out[..., k:], out[..., :-k].copy())
        k *= 2
    return xp.moveaxis(out, -1, axis)


# ---- parallel elementwise execution (NumPy is single-threaded; ufunc loops release the GIL) ----
PAR_MIN = 1 << 18            # elements; below this, threads cost more than they save
_NTHREADS = min(os.cpu_count() or 1, 16)
_pool = None


def _threads():
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_NTHREADS, thread_name_prefix="flambeau-elementwise")
    return _pool


def parallel_ok(xp, *xs) -> bool:
    """Same-shape C-contiguous NumPy operands (or Python scalars), large enough to split."""
    if xp is not np or _NTHREADS < 2:
        return False
    shape = None
    for x in xs:
        if type(x) in _SCALARS:
            continue
        if type(x) is not np.ndarray or not x.flags.c_contiguous:
            return False
        if shape is None:
            shape = x.shape
        elif x.shape != shape:
            return False
    return shape is not None and np.prod(shape) >= PAR_MIN


def parallel_blocks(fn, n: int) -> None:
    """Run `fn(start, stop)` over `_NTHREADS` contiguous blocks of range(n) on the thread pool
    (for kernels whose rows are independent, e.g. softmax over the last dim)."""
    per = -(-n // _NTHREADS)
    list(_threads().map(lambda i: fn(i * per, min(n, (i + 1) * per)), range(_NTHREADS)))


def parallel_map(fn, xs, out_dtype, ufunc=None):
    """Evaluate `fn(np, *xs)` (or `ufunc(*xs, out=...)`) over contiguous chunks on threads."""
    ref = next(x for x in xs if type(x) not in _SCALARS)
    out = np.empty(ref.shape, dtype=out_dtype)
    flat_out = out.reshape(-1)
    flats = [x if type(x) in _SCALARS else x.reshape(-1) for x in xs]
    n = flat_out.size
    per = -(-n // _NTHREADS)
    block = 1 << 16

    def part(i):
        s0, e0 = i * per, min(n, (i + 1) * per)
        token = _fp_errors.quiet()        # a worker thread does not inherit the dispatcher's error state
        try:
            if ufunc is not None:
                ufunc(*[f if type(f) in _SCALARS else f[s0:e0] for f in flats], out=flat_out[s0:e0])
                return
            for s in range(s0, e0, block):
                e = min(e0, s + block)
                flat_out[s:e] = fn(np, *[f if type(f) in _SCALARS else f[s:e] for f in flats])
        finally:
            _fp_errors.restore(token)

    list(_threads().map(part, range(_NTHREADS)))
    return out


# ---- pointwise kernel builders ---------------------------------------------------------------
_FAST = {np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.int32)}
_FAST_FLOAT = {np.dtype(np.float32), np.dtype(np.float64)}


_FUSED_BINARY = ("add", "sub", "mul", "div")     # triton_pointwise.BINARY_OPS (not imported: it loads Triton)
_HALF = (D.bfloat16.np, D.float16.np)


def _fused_binary(a, b, out):
    """`_backends.triton_pointwise` when its one-kernel `binary` takes these CuPy operands into
    dtype `out`, else None."""
    if not triton_launch.available():
        return None
    from .._backends import triton_pointwise  # deferred: imports Triton, optional (cuda only)
    return triton_pointwise if triton_pointwise.binary_supported(a, b, out) else None


_RAW_BINARY = tuple(cuda_binary.OPS)



def binary_kernel(fn, *, to_float=False, out_dtype=None, name="", ufunc=None):
    """A promoted binary kernel: `fn(xp, a, b)` runs in the op-math dtype, result cast back, laid out
    as PyTorch lays out a pointwise result (`lay_out_pointwise`). Large same-shape NumPy operands
    are split across threads. `ufunc`, when given, is the NumPy ufunc that `fn` calls: the threads
    write in place with it, and NumPy operands of one fast dtype call it directly."""
    fast = _FAST_FLOAT if to_float else _FAST

    raw = name in _RAW_BINARY and out_dtype is None

    def kernel(xp, a, b):
        if raw and xp is not np and is_cupy(xp) and (r := cuda_binary.binary(xp, a, b, name)) is not None:
            return r
        if out_dtype is None and type(a) is type(b) is np.ndarray and (dt := a.dtype) == b.dtype and dt in fast:
            if a.size >= PAR_MIN and parallel_ok(xp, a, b):
                r = parallel_map(fn, (a, b), dt, ufunc)
            else:
                try:
                    r = fn(xp, a, b) if ufunc is None else ufunc(a, b)
                except ValueError:
                    broadcast_shapes(a.shape, b.shape)
                    raise
            if r.ndim < 2 or a.flags.c_contiguous and b.flags.c_contiguous:     # lay_out_pointwise's own tests
                return r
            return lay_out_pointwise(xp, r, a, b)
        if out_dtype is None and type(a) is np.ndarray and _keeps_dtype(a.dtype, b, fast):
            # an array and a Python number that leaves its dtype (`i + block`, `x * 0.5`): what the
            # general path below computes, without its promotion and casts
            if a.ndim == 0 and (scalar_op := _SCALAR_OPS.get(ufunc)) is not None:
                # NumPy's scalar arithmetic: the ufunc's rules (NEP 50) and rounding without its machinery
                return np.asarray(scalar_op(a[()], b))
            r = fn(xp, a, b) if ufunc is None else ufunc(a, b)
            return r if a.ndim < 2 or a.flags.c_contiguous else lay_out_pointwise(xp, r, a, b)
        dt = result_type(a, b)
        if to_float and dt.category < D.FLOATING:
            dt = _state.default_dtype
        cd = opmath(dt)
        if cd is not dt.np and dt.np != cd:       # low precision: round operands to dt first
            a, b = round_to(a, dt), round_to(b, dt)
            if name in _FUSED_BINARY and out_dtype is None and is_cupy(xp) and (fused := _fused_binary(a, b, dt.np)):
                return fused.binary(a, b, name, dt.np)
        elif (name in _FUSED_BINARY and out_dtype is None and is_cupy(xp) and cd == np.float32
              and (getattr(a, "dtype", None) in _HALF or getattr(b, "dtype", None) in _HALF)
              and (fused := _fused_binary(a, b, cd))):              # float32 with a half-precision operand
            return fused.binary(a, b, name, cd)
        try:
            r = fn(xp, cast(xp, a, cd), cast(xp, b, cd))
        except ValueError:
            broadcast_shapes(shape_of(a), shape_of(b))
            raise
        want = out_dtype.np if out_dtype is not None else dt.np
        if r.dtype != want:
            r = r.astype(want)
        if getattr(a, "flags", _C).c_contiguous and getattr(b, "flags", _C).c_contiguous:
            return r
        return lay_out_pointwise(xp, r, a, b)
    kernel.__name__ = name or getattr(fn, "__name__", "binary")
    return kernel


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
# `binary_kernel`'s ufuncs whose NumPy-scalar operator computes what the ufunc does on a 0-dim array
_SCALAR_OPS = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul,
               np.true_divide: operator.truediv}


def _keeps_dtype(dt: np.dtype, x, fast) -> bool:
    """Whether a Python number `x` meeting an array of dtype `dt` (one of `fast`) leaves the result
    in `dt` with `x` taken as is: a float or int with a float array, an int in int32 range with an
    integer array. NumPy's weak scalars then compute what PyTorch does."""
    t = type(x)
    if dt not in fast:
        return False
    if t is float:
        return dt.kind == "f"
    if t is int:
        return dt.kind == "f" or _INT32_MIN <= x <= _INT32_MAX
    return False


class _C:
    """Stands for a Python scalar's layout in the contiguity test of `binary_kernel`."""
    c_contiguous = True


def _estrides(x) -> list:
    return list(x.stride()) if isinstance(x, Tensor) else [b // x.itemsize for b in x.strides]


def _contiguous(x) -> bool:
    return x.is_contiguous() if isinstance(x, Tensor) else x.flags.c_contiguous


def _c_ordered(shape, strides) -> bool:
    """Whether these strides, over the dims of size > 1 not broadcast (stride 0), decrease strictly:
    such an input asks for C order (TensorIterator's sort leaves those dims in place)."""
    prev = None
    for n, st in zip(shape, strides):
        if n == 1 or st == 0:
            continue
        if prev is not None and st >= prev:
            return False
        prev = st
    return True


def pointwise_perm(shape, *inputs):
    """The dim order of a pointwise op's output, as PyTorch's TensorIterator chooses it: dims ordered
    like the inputs' strides (the first input that orders two dims decides; broadcast dims are
    ignored). Fastest-moving dim first; None when the result is simply contiguous (every input is).
    Inputs are Tensors or arrays; anything else (Python scalars) is ignored. With symbolic sizes or
    strides the result is contiguous, as before: ordering symbols would add shape guards."""
    shape = tuple(shape)
    nd = len(shape)
    arrays = [x for x in inputs if getattr(x, "ndim", 0) and hasattr(x, "shape") and not isinstance(x, (int, float))]
    if nd < 2 or not arrays:
        return None
    all_strides = [_estrides(x) for x in arrays]
    if not all(type(v) is int for v in shape) or not all(type(v) is int for st in all_strides for v in st):
        return None
    if all(_contiguous(x) or _c_ordered(x.shape, st) for x, st in zip(arrays, all_strides)):
        return None                       # (an expanded gradient: no input orders the dims otherwise)
    strides = []
    for x, xs in zip(arrays, all_strides):
        lead = nd - x.ndim
        strides.append([0] * lead + [0 if x.shape[j] == 1 and shape[lead + j] != 1 else xs[j] for j in range(x.ndim)])

    def should_swap(d0, d1):
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return 1 if s0 > s1 else -1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(nd - 1, -1, -1))
    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return None if perm == list(range(nd - 1, -1, -1)) else perm


def pointwise_strides(shape, *inputs):
    """Element strides of a pointwise op's output (see `pointwise_perm`); None for contiguous."""
    perm = pointwise_perm(shape, *inputs)
    if perm is None:
        return None
    out = [0] * len(shape)
    acc = 1
    for d in perm:
        out[d] = acc
        acc *= max(shape[d], 1)
    return out


def lay_out_pointwise(xp, r, *inputs):
    """`r` (a kernel's result) in the layout `pointwise_perm` gives for these inputs: NumPy picks
    C order when inputs' layouts disagree, PyTorch follows the first input's."""
    if getattr(r, "ndim", 0) < 2:
        return r
    perm = pointwise_perm(r.shape, *inputs)
    if perm is None:
        return r
    want = pointwise_strides(r.shape, *inputs)
    if all(a == b for a, b, n in zip(_estrides(r), want, r.shape) if n != 1):
        return r
    order = perm[::-1]                                   # slowest-moving dim first
    buf = xp.empty([r.shape[d] for d in order], dtype=r.dtype)
    out = buf.transpose(np.argsort(order))
    out[...] = r
    return out


def undefined_grad(t) -> bool:
    """True for the zeros the autograd engine passes a derivative for an output that received no
    gradient (PyTorch's undefined tensor): a derivative may skip the work such a term would add."""
    return t is None or getattr(t, "_undefined_grad", False)


_DIRECT_DEVICE_TYPES = ("cpu", "cuda")


def direct_device(*tensors):
    """The device of `tensors` when a derivative may run op kernels on their arrays directly
    (`direct_call`), else None. That is when nothing would see the dispatched calls: grad mode off
    (a backward without create_graph records nothing), no dispatch mode (tracing, fake tensors,
    vmap, functionalization) and no FX hook, and every tensor (None entries skipped) a dense one
    without a forward-mode tangent on one cpu or cuda device (NumPy or CuPy arrays: a derivative may
    reshape or transpose them as arrays). The kernels are the ones the dispatcher would run, so the
    results are the same, bit for bit."""
    if (_state.interposed and _state.tls.modes) or _registry._fx_hook is not None or _state.tls.grad_enabled:
        return None
    dev = None
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, Tensor) or t._fw_grad is not None:
            return None
        if dev is None:
            dev = t._device
        elif t._device is not dev and t._device != dev:
            return None
    if dev is None or dev is WRAPPER_DEVICE or dev is QUANTIZED_CPU or dev.type not in _DIRECT_DEVICE_TYPES:
        return None
    return dev


def direct_call(op, dev, *arrays, **kwargs) -> Tensor:
    """`op`'s kernel on arrays of `dev` (see `direct_device`), its result as a new Tensor; NumPy's
    floating-point errors silenced on the cpu, as the dispatcher runs kernels."""
    xp = array_namespaces[dev.type]
    if xp is np:
        token = _fp_errors.quiet()
        try:
            r = op.kernel(xp, *arrays, **kwargs)
        finally:
            _fp_errors.restore(token)
    else:
        r = op.kernel(xp, *arrays, **kwargs)
    tr = type(r)
    # an array as it is (CuPy's asarray is a Python function); a NumPy scalar or other result through asarray
    return Tensor._make(r if tr is np.ndarray or tr in device_array_types else xp.asarray(r), dev)


def binary_meta(*, to_float=False, out_dtype=None):
    def meta(a, b, *rest, **kw):
        dt = result_type(a, b)
        if to_float and dt.category < D.FLOATING:
            dt = _state.default_dtype
        shape = broadcast_shapes(shape_of(a), shape_of(b))
        return TensorSpec(shape, out_dtype or dt, pointwise_strides(shape, a, b))
    return meta


def unary_kernel(fn, *, to_float=False, out_dtype=None, name="", ufunc=None):
    def kernel(xp, a):
        dt = D.FROM_NP[a.dtype]
        if to_float and dt.category < D.FLOATING:
            dt = _state.default_dtype
        cd = opmath(dt)
        a = a.astype(cd) if a.dtype != cd else a
        if a.size >= PAR_MIN and parallel_ok(xp, a):
            r = parallel_map(fn, (a,), cd, ufunc)
        else:
            r = fn(xp, a)
        want = out_dtype.np if out_dtype is not None else dt.np
        if r.dtype != want:
            r = r.astype(want)
        return r
    kernel.__name__ = name or getattr(fn, "__name__", "unary")
    return kernel


def unary_meta(*, to_float=False, out_dtype=None):
    def meta(a, *rest, **kw):
        dt = a._dtype
        if to_float and dt.category < D.FLOATING:
            dt = _state.default_dtype
        return TensorSpec(a._data.shape, out_dtype or dt, pointwise_strides(a.shape, a))
    return meta


def same_meta(a, *rest, **kw):
    return TensorSpec(a._data.shape, a._dtype, pointwise_strides(a.shape, a))
