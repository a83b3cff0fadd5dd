"""cuSPARSELt through ctypes: the 2:4 sparse x dense matmul of `SparseSemiStructuredTensor` on cuda.

The library (`libcusparseLt.so`, from the `nvidia-cusparselt-cu13` wheel or the system) is found and
loaded at the first call, never at import. Per weight, a compressed copy is made once (the pruned
matrix in cuSPARSELt's own layout) and per (weight, dense shape, order) one plan is kept, so repeated
products (an `nn.Linear` called again) pay only `cusparseLtMatmul`. Opaque cuSPARSELt structs are
passed as zeroed byte buffers larger than any version's struct.

Operands: W (m, k) row-major 2:4-sparse on the left (structured descriptor, 50% sparsity), B (k, n)
row- or column-major (whichever it is in memory), D (m, n) row-major, or column-major when the caller
wants D^T contiguous (nn.Linear's x @ W^T). float16/bfloat16 accumulate in float32, int8 in int32.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os

from .. import _dtype as D
from .._backends import get as backend_of
from .._tensor import Tensor

STRUCT_BYTES = 4096                     # cusparseLt{Handle,MatDescriptor,MatmulDescriptor,...}_t are <= 1.5 KiB
SUCCESS = 0
ORDER_COL, ORDER_ROW = 1, 2             # cusparseOrder_t
OP_NON_TRANSPOSE = 0                    # cusparseOperation_t
SPARSITY_50_PERCENT = 0                 # cusparseLtSparsity_t
ALG_DEFAULT = 0                         # cusparseLtMatmulAlg_t
COMPUTE_32I, COMPUTE_32F = 0, 2         # cusparseComputeType (cuSPARSELt >= 0.5.2)
CUDA_R_16F, CUDA_R_8I, CUDA_R_16BF = 2, 3, 14   # cudaDataType
ALIGNMENT = 16
_TYPES = {D.float16: (CUDA_R_16F, COMPUTE_32F), D.bfloat16: (CUDA_R_16BF, COMPUTE_32F), D.int8: (CUDA_R_8I, COMPUTE_32I)}
SUPPORTED = frozenset(_TYPES)

_lib = None
_load_error: str | None = None
_handle = None


def _candidates() -> list:
    paths = []
    spec = importlib.util.find_spec("nvidia")     # the NVIDIA wheels' namespace package, if installed
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        paths += sorted(glob.glob(os.path.join(root, "**", "libcusparseLt.so*"), recursive=True))
    return paths + ["libcusparseLt.so.0", "libcusparseLt.so"]


def library():
    """The loaded library, or None (the reason in `load_error()`)."""
    global _lib, _load_error
    if _lib is None and _load_error is None:
        for path in _candidates():
            try:
                _lib = ctypes.CDLL(path)
                break
            except OSError as e:
                _load_error = f"{path}: {e}"
        if _lib is not None:
            _load_error = None
        elif _load_error is None:
            _load_error = "libcusparseLt.so not found"
    return _lib


def load_error() -> str | None:
    library()
    return _load_error


def available() -> bool:
    return library() is not None


def _check(status: int, what: str) -> None:
    if status != SUCCESS:
        raise RuntimeError(f"cuSPARSELt {what} failed with cusparseStatus_t {status}")


def _struct():
    return ctypes.create_string_buffer(STRUCT_BYTES)


def _handle_ptr():
    global _handle
    if _handle is None:
        h = _struct()
        _check(library().cusparseLtInit(h), "cusparseLtInit")
        _handle = h
    return _handle


def _ptr(t: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t._data.data.ptr)


def _cupy():
    """CuPy, through the cuda backend (which imports it)."""
    return backend_of("cuda").xp


def _stream():
    cupy = _cupy()
    return ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)


class _Plan:
    """Descriptors, plan and workspace of one (W, B layout, D layout) product."""

    def __init__(self, lib, m: int, k: int, n: int, dtype, b_order: int, d_order: int) -> None:
        h = _handle_ptr()
        vt, ct = _TYPES[dtype]
        self.mat_a, self.mat_b, self.mat_c = _struct(), _struct(), _struct()
        self.matmul, self.alg, self.plan = _struct(), _struct(), _struct()
        u = ctypes.c_uint32
        i64 = ctypes.c_int64
        _check(lib.cusparseLtStructuredDescriptorInit(h, self.mat_a, i64(m), i64(k), i64(k), u(ALIGNMENT), vt,
                                                      ORDER_ROW, SPARSITY_50_PERCENT), "StructuredDescriptorInit")
        ldb = n if b_order == ORDER_ROW else k
        _check(lib.cusparseLtDenseDescriptorInit(h, self.mat_b, i64(k), i64(n), i64(ldb), u(ALIGNMENT), vt, b_order),
               "DenseDescriptorInit(B)")
        ldc = n if d_order == ORDER_ROW else m
        _check(lib.cusparseLtDenseDescriptorInit(h, self.mat_c, i64(m), i64(n), i64(ldc), u(ALIGNMENT), vt, d_order),
               "DenseDescriptorInit(C)")
        _check(lib.cusparseLtMatmulDescriptorInit(h, self.matmul, OP_NON_TRANSPOSE, OP_NON_TRANSPOSE, self.mat_a,
                                                  self.mat_b, self.mat_c, self.mat_c, ct), "MatmulDescriptorInit")
        _check(lib.cusparseLtMatmulAlgSelectionInit(h, self.alg, self.matmul, ALG_DEFAULT), "MatmulAlgSelectionInit")
        _check(lib.cusparseLtMatmulPlanInit(h, self.plan, self.matmul, self.alg), "MatmulPlanInit")
        ws = ctypes.c_size_t(0)
        _check(lib.cusparseLtMatmulGetWorkspace(h, self.plan, ctypes.byref(ws)), "MatmulGetWorkspace")
        cupy = _cupy()
        self.workspace = cupy.empty(max(ws.value, 1), dtype=cupy.uint8)

    def __del__(self) -> None:
        lib = _lib
        if lib is not None and _handle is not None:
            lib.cusparseLtMatmulPlanDestroy(self.plan)
            for d in (self.mat_a, self.mat_b, self.mat_c):
                lib.cusparseLtMatDescriptorDestroy(d)


def _compressed(w, lib, plan: _Plan):
    """W compressed into cuSPARSELt's layout (once per weight; any plan of W's shape serves)."""
    if w._cslt is None:
        cupy = _cupy()
        h = _handle_ptr()
        size, buf_size = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _check(lib.cusparseLtSpMMACompressedSize(h, plan.plan, ctypes.byref(size), ctypes.byref(buf_size)),
               "SpMMACompressedSize")
        dense = w.to_dense() if not w._transposed else w.t().to_dense()
        dense = Tensor._make(cupy.ascontiguousarray(dense._data), dense._device, dense._dtype)
        out = cupy.empty(size.value, dtype=cupy.uint8)
        scratch = cupy.empty(max(buf_size.value, 1), dtype=cupy.uint8)
        _check(lib.cusparseLtSpMMACompress(h, plan.plan, _ptr(dense), ctypes.c_void_p(out.data.ptr),
                                           ctypes.c_void_p(scratch.data.ptr), _stream()), "SpMMACompress")
        w._cslt = {"compressed": out, "plans": {}}
    return w._cslt["compressed"]


def matmul(w, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """W @ B (+ bias[:, None]) on cuda through cuSPARSELt; W an untransposed SparseSemiStructuredTensor."""
    cupy = _cupy()
    lib = library()
    m, k = w._shape
    n = b.shape[1]
    barr = b._data
    if barr.flags.c_contiguous:
        b_order = ORDER_ROW
    elif barr.T.flags.c_contiguous:
        b_order = ORDER_COL
    else:
        barr, b_order = cupy.ascontiguousarray(barr), ORDER_ROW
    d_order = ORDER_COL if b_order == ORDER_COL else ORDER_ROW      # linear: D^T (n, m) contiguous
    key = (n, b_order, d_order)
    cache = w._cslt["plans"] if w._cslt is not None else {}
    plan = cache.get(key)
    if plan is None:
        plan = _Plan(lib, m, k, n, w._dtype, b_order, d_order)
    compressed = _compressed(w, lib, plan)
    w._cslt["plans"][key] = plan
    npdt = barr.dtype
    out = cupy.empty((n, m) if d_order == ORDER_COL else (m, n), dtype=npdt)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)      # float scalars for every compute type
    _check(lib.cusparseLtMatmul(_handle_ptr(), plan.plan, ctypes.byref(alpha), ctypes.c_void_p(compressed.data.ptr),
                                ctypes.c_void_p(barr.data.ptr), ctypes.byref(beta),
                                ctypes.c_void_p(out.data.ptr), ctypes.c_void_p(out.data.ptr),
                                ctypes.c_void_p(plan.workspace.data.ptr), ctypes.byref(_stream()), 1), "Matmul")
    res = Tensor._make(out.T if d_order == ORDER_COL else out, b._device, b._dtype)
    if bias is not None:
        res = res + bias.unsqueeze(1)
    return res
