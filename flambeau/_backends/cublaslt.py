"""cuBLASLt matrix products for the cuda device, bound with ctypes (CuPy ships no cuBLASLt bindings).

`gemm(a, b, bias=, c=, alpha=, beta=)` computes D = alpha * a @ b + beta * c (+ bias as a cuBLASLt
epilogue) for CuPy arrays of float16, bfloat16 or float32, batched over leading dimensions, with
fp32 accumulation and no up-cast copies: float16/bfloat16 run on the tensor cores with
CUBLAS_COMPUTE_32F; float32 uses CUBLAS_COMPUTE_32F_FAST_TF32 only when
`_state.float32_matmul_precision` is not "highest" (`flambeau.backends.cuda.matmul.allow_tf32`,
`flambeau.set_float32_matmul_precision`, PyTorch's defaults: exact float32).

Row-major operands are handed to column-major cuBLAS as their transposes: D^T = B^T A^T. Each
operand is read in place when one of its two matrix strides is 1 (a transposed view is an
OP_T); batch dimensions collapse into one batch stride where they can (a batch broadcast against
the other operand has stride 0); anything else is copied to a contiguous array first. When the
second operand has no batch, the first's batch folds into its rows (one GEMM, as PyTorch's matmul).
A large 2-D product whose sizes or leading dimensions are not multiples of 16 bytes (an odd
vocabulary) runs on zero-padded copies, its output copied out (`_padded_gemm`, 2-D copies at
memory speed): cuBLASLt has only slow align1 kernels for those.
The layout logic (`matrix_operand`, `collapse`, `plan`) is pure Python and tested on CPU.

The library is found at first use: FLAMBEAU_CUBLASLT_LIB, else nvidia/cublas/lib in a site-packages
folder on sys.path, else the system loader. Descriptors, the heuristic's algorithm and its workspace
need are cached per layout key (shapes, strides, dtype, epilogue, pointer alignments; at most
MAX_CACHED, then the cache starts over), found per call by one lookup of the operands' layout
(`_Layout`) and one of the call's flags and alignments: a call then sets only the bias pointer, when
it changed, and makes the cublasLtMatmul call (tests/test_cublaslt_host.py checks this on CPU); a 32 MiB
workspace is kept per (device, stream). Calls go on CuPy's current stream. `calls` counts the
cuBLASLt products run; `available()` is False (and callers keep CuPy's matmul) without the library.
"""
from __future__ import annotations

import ctypes
import glob
import math
import os
import sys
import threading

import ml_dtypes
import numpy as np

from .. import _state

# cudaDataType_t, cublasComputeType_t, cublasOperation_t (library_types.h, cublas_api.h)
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
OP_N, OP_T = 0, 1
# cublasLt.h attribute ids
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES, PREF_REDUCTION_SCHEME_MASK = 1, 3
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
EPILOGUE_DEFAULT, EPILOGUE_BIAS = 1, 4
REDUCTION_SCHEME_COMPUTE_TYPE, REDUCTION_SCHEME_MASK = 2, 7
STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
          7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
          13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
          15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}

DATA_TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
WORKSPACE_BYTES = 32 << 20      # as PyTorch's cuBLASLt workspace on Hopper
MAX_ALIGNMENT = 256             # bytes: cuBLASLt's default assumption for every pointer
MAX_DIM = (1 << 31) - 1         # rows, cols and leading dimensions must fit in int32 for the kernels
PAD_BYTES = 16                  # a row length or leading dimension off this leaves cuBLASLt only align1 kernels
PAD_MIN_MACS = 1 << 30          # 2-D products this large are computed on zero-padded copies then (GPT-2's lm_head,
#   vocab 50257: cutlass_75 align1 kernels took 6.7 + 4.5 + 4.3 ms of a compiled step on an H100)

enabled = True
allow_fp16_reduced_precision_reduction = True
allow_bf16_reduced_precision_reduction = True
calls = {"gemm": 0, "bias_epilogue": 0, "copies": 0, "padded": 0}


# ---- layout logic (pure Python) --------------------------------------------------------------------
def matrix_operand(rows: int, cols: int, rstride: int, cstride: int):
    """How column-major cuBLAS reads the transpose of a row-major rows x cols matrix with element
    strides (rstride, cstride): (op, stored_rows, stored_cols, ld), or None when neither stride is 1
    (the matrix must be copied). OP_N: the stored column-major matrix is cols x rows with
    ld = rstride; OP_T: it is rows x cols with ld = cstride (a transposed view read in place)."""
    if cols == 1:
        cstride = 1
    if rows == 1:
        rstride = max(cols, 1)
    if cstride == 1 and max(cols, 1) <= rstride <= MAX_DIM:
        return OP_N, cols, rows, rstride
    if rstride == 1 and max(rows, 1) <= cstride <= MAX_DIM:
        return OP_T, rows, cols, cstride
    return None


def collapse(shape, strides):
    """(count, stride) of batch dimensions that one stride walks (size-1 dims ignored), else None."""
    count, stride = 1, 0
    for size, st in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if size == 1:
            continue
        if count == 1:
            stride = st
        elif st != stride * count:
            return None
        count *= size
    return count, stride


class Plan:
    """One cuBLASLt call for D (batch x m x n, contiguous) = A (batch x m x k) @ B (batch x k x n):
    `a`/`b` are (op, stored_rows, stored_cols, ld, batch_stride) of the cuBLAS operands (B^T first)."""
    __slots__ = ("batch", "m", "n", "k", "a", "b", "fold", "out", "key")

    def __init__(self, batch, m, n, k, a, b, fold, out):
        self.batch, self.m, self.n, self.k, self.a, self.b, self.fold = batch, m, n, k, a, b, fold
        self.out = out                                  # the output's shape (batch dims, rows, n)
        self.key = (batch, m, n, k, a, b)


def plan(a_shape, a_strides, b_shape, b_strides):
    """The GEMM plan for row-major a (..., m, k) @ b (..., k, n) with element strides, or a string
    naming the operand ("a", "b" or "ab") that must be made contiguous first. Batch shapes must
    broadcast; the output is batch x m x n, contiguous."""
    m, k = a_shape[-2], a_shape[-1]
    n = b_shape[-1]
    a_batch, b_batch = tuple(a_shape[:-2]), tuple(b_shape[:-2])
    if math.prod(b_batch) == 1 and len(a_batch) > 0:
        rows = collapse(a_shape[:-1], a_strides[:-1])           # fold a's batch into its rows
        if rows is not None:
            mb = math.prod(a_shape[:-1])
            aop = matrix_operand(mb, k, rows[1] if mb > 1 else k, a_strides[-1])
            bop = matrix_operand(k, n, b_strides[-2], b_strides[-1])
            if aop is not None and bop is not None:
                return Plan(1, mb, n, k, bop + (0,), aop + (0,), True, _broadcast(a_batch, b_batch) + (m, n))
    batch = _broadcast(a_batch, b_batch)
    need = ""
    ops = []
    for name, shape, strides, rc in (("b", b_shape, b_strides, (k, n)), ("a", a_shape, a_strides, (m, k))):
        pad = len(batch) - (len(shape) - 2)
        bshape = (1,) * pad + tuple(shape[:-2])
        bstrides = (0,) * pad + tuple(strides[:-2])
        bstrides = tuple(0 if s == 1 and t != 1 else st for s, t, st in zip(bshape, batch, bstrides))
        col = collapse(batch, bstrides)
        op = matrix_operand(rc[0], rc[1], strides[-2], strides[-1])
        if col is None or op is None or col[1] < 0:
            need = name + need
            continue
        ops.append(op + (col[1],))
    if need:
        return need
    return Plan(math.prod(batch), m, n, k, ops[0], ops[1], False, batch + (m, n))


def _broadcast(a, b):
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton "
                               f"dimension {len(out)}")
        out.append(y if x == 1 else x)
    return tuple(out)


def compute_type(dtype_name: str) -> int:
    """cublasComputeType_t for a product of `dtype_name` operands under the current precision."""
    if dtype_name == "float32" and _state.float32_matmul_precision != "highest":
        return COMPUTE_32F_FAST_TF32
    return COMPUTE_32F


def reduction_mask(dtype_name: str) -> int:
    """Split-K reduction schemes allowed: all, unless reduced-precision reduction is disallowed for
    the dtype (then only reductions in the fp32 compute type)."""
    allowed = {"float16": allow_fp16_reduced_precision_reduction,
               "bfloat16": allow_bf16_reduced_precision_reduction}.get(dtype_name, True)
    return REDUCTION_SCHEME_MASK if allowed else REDUCTION_SCHEME_COMPUTE_TYPE


def alignment(ptr: int, *byte_strides: int) -> int:
    """The largest power of two (at most MAX_ALIGNMENT) dividing the pointer and the batch strides."""
    g = MAX_ALIGNMENT
    for v in (ptr,) + byte_strides:
        if v:
            g = math.gcd(g, v)
    return g


# ---- library ---------------------------------------------------------------------------------------
_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_SIGNATURES = {
    "cublasLtCreate": (_P,), "cublasLtMatmulDescCreate": (_P, _I, _I),
    "cublasLtMatmulDescSetAttribute": (_P, _I, _P, _S), "cublasLtMatrixLayoutCreate": (_P, _I, ctypes.c_uint64,
                                                                                      ctypes.c_uint64, ctypes.c_int64),
    "cublasLtMatrixLayoutSetAttribute": (_P, _I, _P, _S), "cublasLtMatmulPreferenceCreate": (_P,),
    "cublasLtMatmulPreferenceSetAttribute": (_P, _I, _P, _S), "cublasLtMatmulPreferenceDestroy": (_P,),
    "cublasLtMatmulAlgoGetHeuristic": (_P, _P, _P, _P, _P, _P, _P, _I, ctypes.POINTER(_Heuristic),
                                       ctypes.POINTER(_I)),
    "cublasLtMatmul": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.POINTER(_Algo), _P, _S, _P),
    "cublasLtGetVersion": (), "cublasLtMatmulDescDestroy": (_P,), "cublasLtMatrixLayoutDestroy": (_P,),
}
_lib_state = {"lib": None, "tried": False, "error": None, "path": None}
_lock = threading.Lock()
_handles: dict = {}         # device -> cublasLtHandle_t
_workspaces: dict = {}      # (device, stream) -> CuPy allocation
_plans: dict = {}           # layout key -> _Compiled
_plan_cache: dict = {}      # (shapes, byte strides) -> Plan or the operands to copy
MAX_CACHED = 4096


def _candidates():
    env = os.environ.get("FLAMBEAU_CUBLASLT_LIB")
    if env:
        yield from (sorted(glob.glob(os.path.join(env, "libcublasLt.so*"))) if os.path.isdir(env) else [env])
    for p in sys.path:
        d = os.path.join(p or ".", "nvidia", "cublas", "lib")
        if os.path.isdir(d):
            yield from sorted(glob.glob(os.path.join(d, "libcublasLt.so*")), key=len)
    yield from ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")


def _load():
    errors = []
    for cand in _candidates():
        try:
            lib = ctypes.CDLL(cand, mode=getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0))
            for name, args in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_size_t if name == "cublasLtGetVersion" else ctypes.c_int
            _lib_state["path"] = cand
            return lib
        except (OSError, AttributeError) as e:
            errors.append(f"{cand}: {e}")
    _lib_state["error"] = "; ".join(errors[-4:])
    return None


def _lib():
    if not _lib_state["tried"]:
        with _lock:
            if not _lib_state["tried"]:
                try:
                    import cupy  # noqa: F401  deferred: cuBLASLt needs CuPy's device arrays
                    _lib_state["lib"] = _load()
                except ImportError as e:
                    _lib_state["error"] = f"CuPy is not installed ({e})"
                _lib_state["tried"] = True
    return _lib_state["lib"]


def available() -> bool:
    """Whether products go through cuBLASLt: `enabled`, CuPy importable and libcublasLt loaded."""
    return enabled and _lib() is not None


def version():
    """cuBLASLt's version as an int (e.g. 130100), None when it is not available."""
    lib = _lib()
    return int(lib.cublasLtGetVersion()) if lib is not None else None


def load_error():
    return _lib_state["error"]


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"CUDA error: {STATUS.get(status, f'CUBLAS_STATUS {status}')} when calling `{what}`")


def _handle(dev):
    h = _handles.get(dev)
    if h is None:
        with _lock:                 # (`preload` may be making it in its thread)
            h = _handles.get(dev)
            if h is None:
                h = ctypes.c_void_p()
                _check(_lib_state["lib"].cublasLtCreate(ctypes.byref(h)), "cublasLtCreate(&handle)")
                _handles[dev] = h
    return h


_preloading: dict = {}      # device -> the thread of `preload`


def preload(dev: int | None = None):
    """Load libcublasLt and make device `dev`'s (None: the current device's) handle in a background thread
    (the library's load and the handle's creation, ~0.5 s of a cold compiled step's first product on the H100
    host, release the GIL), so they overlap what the caller does next (a cuda graph's capture, AOT autograd
    and lowering). Once per device; the thread, or None where nothing is to do."""
    if not enabled:
        return None
    cupy = sys.modules.get("cupy")    # (imported by then: the caller holds cuda tensors)
    if cupy is None:
        return None
    if dev is None:
        dev = cupy.cuda.runtime.getDevice()
    if dev in _preloading or dev in _handles:
        return None

    def run():
        try:
            if _lib() is None:
                return
            with cupy.cuda.Device(dev):
                _handle(dev)
        except Exception:           # the first product then loads or fails the usual way, and says why
            pass
    t = _preloading[dev] = threading.Thread(target=run, name="flambeau-cublaslt-preload", daemon=True)
    t.start()
    return t


def _after_fork_in_child() -> None:
    """A forked child has no `preload` thread: a lock it held would never be released there."""
    global _lock
    _lock = threading.Lock()
    _preloading.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _workspace(cupy, dev, stream):
    ws = _workspaces.get((dev, stream))
    if ws is None:
        ws = _workspaces[(dev, stream)] = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
    return ws


def _set(fn, obj, attr, value):
    _check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), f"{fn.__name__}(attr={attr})")


class _Compiled:
    """Descriptors and the heuristic's algorithm for one layout key."""
    __slots__ = ("desc", "la", "lb", "ld", "algo", "ws", "bias_ptr", "by_algo", "bias_slot", "by_bias")

    def __init__(self, lib, handle, p: Plan, dtype_name, epilogue, aligns, mask):
        dt = DATA_TYPES[dtype_name]
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute_type(dtype_name), CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        sd = lib.cublasLtMatmulDescSetAttribute
        _set(sd, self.desc, DESC_TRANSA, ctypes.c_int32(p.a[0]))
        _set(sd, self.desc, DESC_TRANSB, ctypes.c_int32(p.b[0]))
        _set(sd, self.desc, DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        self.bias_ptr = None
        self.bias_slot = ctypes.c_void_p()              # the bias pointer attribute's value, written in place
        self.by_bias = ctypes.byref(self.bias_slot)
        layouts = []
        for op in (p.a, p.b, (OP_N, p.n, p.m, p.n, p.n * p.m)):
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dt, op[1], op[2], op[3]),
                   "cublasLtMatrixLayoutCreate")
            if p.batch > 1:
                _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_BATCH_COUNT, ctypes.c_int32(p.batch))
                _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(op[4]))
            layouts.append(lay)
        self.la, self.lb, self.ld = layouts
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            sp = lib.cublasLtMatmulPreferenceSetAttribute
            _set(sp, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES))
            _set(sp, pref, PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(mask))
            for name, al in zip("abcd", aligns):
                _set(sp, pref, PREF_MIN_ALIGNMENT[name], ctypes.c_uint32(al))
            if epilogue != EPILOGUE_DEFAULT:
                self.set_bias(sd, aligns[4])         # a pointer of the bias's alignment, for the heuristic
            res, got = _Heuristic(), ctypes.c_int(0)
            _check(lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.la, self.lb, self.ld, self.ld, pref,
                                                      1, ctypes.byref(res), ctypes.byref(got)),
                   "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if got.value == 0:
            raise RuntimeError(f"CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmulAlgoGetHeuristic` "
                               f"(no algorithm for {dtype_name} batch={p.batch} m={p.m} n={p.n} k={p.k})")
        self.algo = res.algo
        self.by_algo = ctypes.byref(self.algo)          # made once: cublasLtMatmul takes it by reference
        self.ws = res.workspaceSize

    def destroy(self, lib):
        for lay in (self.la, self.lb, self.ld):
            lib.cublasLtMatrixLayoutDestroy(lay)
        lib.cublasLtMatmulDescDestroy(self.desc)

    def set_bias(self, sd, ptr):
        """Point the descriptor's bias epilogue at `ptr` when it changed: one attribute call with the slot
        made once (layers of one layout share the descriptor, so the pointer changes at every layer)."""
        if ptr != self.bias_ptr:
            self.bias_slot.value = ptr
            status = sd(self.desc, DESC_BIAS_POINTER, self.by_bias, _POINTER_BYTES)
            if status:
                _check(status, f"cublasLtMatmulDescSetAttribute(attr={DESC_BIAS_POINTER})")
            self.bias_ptr = ptr


_POINTER_BYTES = ctypes.sizeof(ctypes.c_void_p)


_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)
_BY_ONE, _BY_ZERO = ctypes.byref(_ONE), ctypes.byref(_ZERO)
_ALIGNED = (MAX_ALIGNMENT,) * 4 + (0,)
_ALIGNED_BIAS = (MAX_ALIGNMENT,) * 5


_NAMES: dict = {}       # numpy dtype -> its name in DATA_TYPES (dict lookup: dtype.name is slow in NumPy)


def _names() -> dict:
    if not _NAMES:
        _NAMES.update({np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
                       np.dtype(ml_dtypes.bfloat16): "bfloat16"})
    return _NAMES


def handles(a, b) -> bool:
    """Whether `gemm` takes this pair (CuPy arrays of one supported dtype, at least 2-D, non-empty)."""
    return (a.dtype == b.dtype and a.dtype in (_NAMES or _names()) and a.ndim >= 2 and b.ndim >= 2
            and a.size > 0 and b.size > 0 and available())


def _plan_for(a, b):
    pkey = (a.shape, a.strides, b.shape, b.strides)
    p = _plan_cache.get(pkey)
    if p is None:
        p = plan(a.shape, _estrides(a), b.shape, _estrides(b))
        if len(_plan_cache) < MAX_CACHED:
            _plan_cache[pkey] = p
    return p


class _Layout:
    """What `gemm` derives from its operands' shapes, strides and dtype alone, once per layout: whether
    the product runs on zero-padded copies (`_padded_gemm`), the plan (or the operands to copy), the
    dtype's name, and the cuBLASLt objects made for it so far (`_Compiled` per device, precision flags,
    epilogue and pointer alignments)."""
    __slots__ = ("padded", "plan", "name", "compiled")

    def __init__(self, a, b):
        self.padded = b.ndim == 2 and (a.ndim == 2 or a.flags.c_contiguous) and \
            a.size * b.shape[1] >= PAD_MIN_MACS and _misaligned_2d(a, b)
        self.plan = _plan_for(a, b)
        self.name = (_NAMES or _names())[a.dtype]
        self.compiled = {}


_layouts: dict = {}         # (shapes, byte strides, dtype) of gemm's operands -> _Layout


def gemm(a, b, *, bias=None, c=None, alpha=1.0, beta=0.0):
    """alpha * a @ b + beta * c (+ bias over the last dim) as a new contiguous CuPy array of a's dtype.

    `a` (..., m, k) and `b` (..., k, n) must pass `handles`; `c` broadcasts to the output; `bias` is
    a 1-D array of length n (added after alpha's scaling, through the epilogue when it can). A layout
    seen before costs a dictionary lookup for its plan and cuBLASLt objects, then one cublasLtMatmul
    call (and one attribute set when the bias pointer changed)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    dtype = a.dtype
    lay = _layouts.get((a.shape, a.strides, b.shape, b.strides, dtype))
    if lay is None:
        lay = _Layout(a, b)
        if len(_layouts) < MAX_CACHED:
            _layouts[(a.shape, a.strides, b.shape, b.strides, dtype)] = lay
    if lay.padded and c is None:
        return _padded_gemm(cupy, a.reshape(-1, a.shape[-1]), b, bias, alpha).reshape(a.shape[:-1] + b.shape[-1:])
    p = lay.plan
    if type(p) is str:
        calls["copies"] += 1
        batch = _broadcast(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        if "a" in p:
            a = cupy.ascontiguousarray(cupy.broadcast_to(a, batch + a.shape[-2:]))
        if "b" in p:
            b = cupy.ascontiguousarray(cupy.broadcast_to(b, batch + b.shape[-2:]))
        p = _plan_for(a, b)
        if isinstance(p, str):
            raise RuntimeError(f"cuBLASLt gemm: no layout for contiguous operands {a.shape} and {b.shape}")
    epilogue = EPILOGUE_DEFAULT
    bias_ptr = 0
    if bias is not None:
        if c is None and bias.dtype == dtype and bias.ndim == 1 and \
                (bias.strides[0] == bias.itemsize or bias.size == 1):
            epilogue = EPILOGUE_BIAS
            bias_ptr = bias.data.ptr
        else:
            c, beta = (bias if c is None else c * beta + bias), 1.0    # bias through C
    if c is None or beta == 0:
        d = cupy.ndarray(p.out, dtype)
        beta = 0.0
    else:
        d = cupy.array(cupy.broadcast_to(c.astype(dtype, copy=False), p.out), order="C")
    it = a.itemsize
    ptr_a, ptr_b, ptr_d = b.data.ptr, a.data.ptr, d.data.ptr        # cuBLAS's A is our b (D^T = B^T A^T)
    sa, sb, sd = p.a[4] * it, p.b[4] * it, p.m * p.n * it
    if (ptr_a | ptr_b | ptr_d | bias_ptr | sa | sb | sd) % MAX_ALIGNMENT == 0:
        aligns = _ALIGNED_BIAS if bias_ptr else _ALIGNED
    else:
        aligns = (alignment(ptr_a, sa), alignment(ptr_b, sb), alignment(ptr_d, sd), alignment(ptr_d, sd),
                  alignment(bias_ptr) if bias_ptr else 0)
    dev = d.data.device_id
    ckey = (dev, _state.float32_matmul_precision, allow_fp16_reduced_precision_reduction,
            allow_bf16_reduced_precision_reduction, epilogue, aligns)
    comp = lay.compiled.get(ckey) if p is lay.plan else None
    lib = _lib_state["lib"]
    handle = _handles.get(dev) or _handle(dev)
    if comp is None:
        comp = _compiled(lib, handle, p, lay.name, ckey)
        if p is lay.plan:
            lay.compiled[ckey] = comp
    if bias_ptr:
        if bias_ptr != comp.bias_ptr:
            comp.set_bias(lib.cublasLtMatmulDescSetAttribute, bias_ptr)
        calls["bias_epilogue"] += 1
    stream = cupy.cuda.get_current_stream().ptr
    ws = _workspaces.get((dev, stream))
    if ws is None:
        ws = _workspace(cupy, dev, stream)
    status = lib.cublasLtMatmul(handle, comp.desc, _BY_ONE if alpha == 1 else ctypes.byref(ctypes.c_float(alpha)),
                                ptr_a, comp.la, ptr_b, comp.lb,
                                _BY_ZERO if beta == 0 else _BY_ONE if beta == 1 else ctypes.byref(ctypes.c_float(beta)),
                                ptr_d, comp.ld, ptr_d, comp.ld, comp.by_algo, ws.data.ptr, comp.ws, stream)
    if status:
        _check(status, "cublasLtMatmul")
    calls["gemm"] += 1
    return d


def _compiled(lib, handle, p: Plan, name: str, ckey: tuple) -> "_Compiled":
    """The cuBLASLt objects of plan `p` under `ckey` (device, precision flags, epilogue, alignments),
    made on a miss; at most MAX_CACHED are kept, then all are destroyed and made again as used."""
    dev, precision, fp16, bf16, epilogue, aligns = ckey
    key = (dev, name, precision, fp16, bf16, p.key, epilogue, aligns)
    comp = _plans.get(key)
    if comp is None:
        if len(_plans) >= MAX_CACHED:                   # many shapes (dynamic lengths): start over
            for old in _plans.values():
                old.destroy(lib)
            _plans.clear()
            _layouts.clear()                            # (their `compiled` entries were just destroyed)
        comp = _plans[key] = _Compiled(lib, handle, p, name, epilogue, aligns, reduction_mask(name))
    return comp


def _estrides(x):
    it = x.itemsize
    return tuple(s // it for s in x.strides)


def _rowmajor(x) -> bool:
    return x.strides[-1] == x.itemsize


def _ld(x) -> int:
    return x.strides[-2] if _rowmajor(x) else x.strides[-1]


_misaligned_cache: dict = {}    # (shapes, byte strides, itemsize) -> `_misaligned` of the 2-D product


def _misaligned_2d(a, b) -> bool:
    """`_misaligned` of a (rows folded) with 2-D b, remembered per layout (it runs for every large product)."""
    key = (a.shape, a.strides, b.shape, b.strides, a.itemsize)
    r = _misaligned_cache.get(key)
    if r is None:
        r = _misaligned(a.reshape(-1, a.shape[-1]), b)
        if len(_misaligned_cache) < MAX_CACHED:
            _misaligned_cache[key] = r
    return r


def _misaligned(a, b) -> bool:
    """Whether a 2-D product has a size along a contiguous dimension, or a leading dimension, off PAD_BYTES."""
    it = a.itemsize
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if not all(_rowmajor(x) or x.strides[-2] == x.itemsize for x in (a, b)):
        return False                                   # (a copy to contiguous comes first anyway)
    return any(v * it % PAD_BYTES for v in (k, n)) or any(_ld(x) % PAD_BYTES for x in (a, b)) or \
        (not _rowmajor(a) and m * it % PAD_BYTES)


def _copy2d(cupy, dst, src):
    """dst[...] = src for 2-D arrays whose last stride is their itemsize: one strided memory copy."""
    it = src.itemsize
    cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr, dst.strides[0], src.data.ptr, src.strides[0], src.shape[1] * it,
                                    src.shape[0], cupy.cuda.runtime.memcpyDeviceToDevice,
                                    cupy.cuda.get_current_stream().ptr)


def _zero_padded(cupy, x, rows: int, cols: int):
    """A rows x cols copy of 2-D x in the same orientation, zeros beyond x, leading dimension a
    multiple of PAD_BYTES."""
    if not _rowmajor(x):
        return _zero_padded(cupy, x.T, cols, rows).T
    al = PAD_BYTES // x.itemsize
    base = cupy.zeros((rows, -(-cols // al) * al), dtype=x.dtype)
    _copy2d(cupy, base, x)
    return base[:, :cols]


def _padded_gemm(cupy, a, b, bias, alpha):
    """a @ b (+ bias) computed with m, k, n rounded up to multiples of PAD_BYTES on zero-padded copies."""
    al = PAD_BYTES // a.itemsize
    up = lambda v: -(-v // al) * al                    # noqa: E731
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    mp = up(m) if not _rowmajor(a) else m
    ap = _zero_padded(cupy, a, mp, up(k))
    bp = _zero_padded(cupy, b, up(k), up(n))
    if bias is not None and up(n) != n:
        bias = cupy.concatenate([bias.reshape(-1), cupy.zeros(up(n) - n, dtype=bias.dtype)])
    calls["padded"] += 1
    d = gemm(ap, bp, bias=bias, alpha=alpha)
    if d.shape == (m, n):
        return d
    out = cupy.empty((m, n), dtype=d.dtype)
    _copy2d(cupy, out, d[:m, :n])
    return out
