"""The host side of `cublaslt.gemm` on CPU, against a fake cuBLASLt library and a fake CuPy namespace
(issue 11: per-call host cost). The cuBLASLt objects of one layout (matmul descriptor, matrix layouts,
the heuristic's algorithm) are made once; each later call of that layout makes one cublasLtMatmul call
with the operands' pointers (cuBLAS's A is our b: D^T = B^T A^T), the cached descriptors and algorithm,
the stream's workspace and the current stream, and sets the bias pointer attribute only when it
changed. The products themselves are checked on the GPU (tests/test_cublaslt.py, `cuda` marks)."""
import ctypes
import importlib.machinery
import math
import sys
import types

import ml_dtypes
import numpy as np
import pytest

from flambeau import _state
from flambeau._backends import cublaslt as L

STREAM = 0x5EA


class _Memory:
    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class _Flags:
    def __init__(self, c):
        self.c_contiguous = c


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.insert(0, acc)
        acc *= max(s, 1)
    return tuple(strides)


class FakeArray:
    """A CuPy array's metadata: shape, byte strides, dtype, data pointer (no memory behind it)."""

    def __init__(self, shape, dtype=np.float32, strides=None, ptr=None):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        contiguous = _c_strides(shape, dtype.itemsize)
        self.shape, self.dtype, self.itemsize = shape, dtype, dtype.itemsize
        self.strides = contiguous if strides is None else tuple(strides)
        self.ndim, self.size = len(shape), math.prod(shape)
        self.flags = _Flags(strides is None or all(st == c for st, c, n in zip(self.strides, contiguous, shape)
                                                   if n != 1))
        self.data = _Memory(_CUPY[0].allocate(self.size * self.itemsize) if ptr is None else ptr)

    @property
    def T(self):
        return FakeArray(self.shape[::-1], self.dtype, self.strides[::-1], self.data.ptr)

    def reshape(self, *shape):
        assert self.flags.c_contiguous
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        shape = tuple(self.size // -int(np.prod(shape)) if s == -1 else s for s in shape)
        return FakeArray(shape, self.dtype, None, self.data.ptr)


_CUPY: list = [None]


class FakeCupy(types.ModuleType):
    """What gemm uses of CuPy: new arrays at fresh 256-byte aligned addresses, the current stream."""

    uint8 = np.uint8

    def __init__(self):
        super().__init__("cupy")
        self.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
        self.__spec__._initializing = False            # as an imported module's (`import cupy` reads it)
        self.next_ptr = 0x10000
        self.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=STREAM))
        self.ndarray = FakeArray
        _CUPY[0] = self

    def allocate(self, nbytes):
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + ((nbytes + 255) // 256 + 1) * 256
        return ptr

    def empty(self, shape, dtype=np.float32):
        return FakeArray(shape, dtype)


class FakeLib:
    """cuBLASLt's entry points as gemm calls them, recording every call with the values behind its
    by-reference arguments; objects are numbered as they are created."""

    def __init__(self):
        self.calls, self.count = [], 0

    def _new(self, ref):
        self.count += 1
        ref._obj.value = self.count

    def __getattr__(self, name):
        def fn(*args):
            if name in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate",
                        "cublasLtMatmulPreferenceCreate"):
                self._new(args[0])
            elif name == "cublasLtMatmulAlgoGetHeuristic":
                res, got = args[8]._obj, args[9]._obj
                res.algo.data[0], res.workspaceSize, got.value = 4242, 1 << 20, 1
            self.calls.append((name,) + tuple(_value(a) for a in args))
            return 0
        fn.__name__ = name
        return fn

    def named(self, name):
        return [c[1:] for c in self.calls if c[0] == name]


def _value(a):
    obj = getattr(a, "_obj", a)                     # a ctypes.byref(...)
    if isinstance(obj, L._Algo):
        return ("algo", obj.data[0])
    return getattr(obj, "value", obj)


@pytest.fixture
def fake(monkeypatch):
    cupy, lib = FakeCupy(), FakeLib()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(L._lib_state, "lib", lib)
    monkeypatch.setitem(L._lib_state, "tried", True)
    for name in ("_handles", "_workspaces", "_plans", "_plan_cache", "_misaligned_cache"):
        monkeypatch.setattr(L, name, {})
    monkeypatch.setattr(L, "calls", dict.fromkeys(L.calls, 0))
    return cupy, lib


BF16 = np.dtype(ml_dtypes.bfloat16)


def _operands(cupy, m=64, k=96, n=80, dtype=BF16):
    x = FakeArray((m, k), dtype)
    w = FakeArray((n, k), dtype)                         # a Linear weight, used transposed
    return x, w


def test_descriptors_are_made_once_per_layout(fake):
    cupy, lib = fake
    outs = []
    for _ in range(3):
        x, w = _operands(cupy)
        outs.append((x, w, L.gemm(x, w.T)))
    assert len(lib.named("cublasLtMatmulDescCreate")) == 1
    assert len(lib.named("cublasLtMatmulAlgoGetHeuristic")) == 1
    assert len(lib.named("cublasLtMatrixLayoutCreate")) == 3
    runs = lib.named("cublasLtMatmul")
    assert len(runs) == 3 and L.calls["gemm"] == 3
    (desc,) = lib.named("cublasLtMatmulDescCreate")
    la, lb, ld = (c[0] for c in lib.named("cublasLtMatrixLayoutCreate"))
    # the layouts: cuBLAS's A = w.T read as OP_T (k x n stored n-major), B = x (k x m), D (n x m)
    assert [c[1:] for c in lib.named("cublasLtMatrixLayoutCreate")] == \
        [(L.CUDA_R_16BF, 96, 80, 96), (L.CUDA_R_16BF, 96, 64, 96), (L.CUDA_R_16BF, 80, 64, 80)]
    ws = L._workspaces[(0, STREAM)]
    for (x, w, d), run in zip(outs, runs):
        assert d.shape == (64, 80) and d.dtype == BF16 and d.flags.c_contiguous
        handle, dsc, alpha, pa, a_lay, pb, b_lay, beta, pc, c_lay, pd, d_lay, algo, wsp, wss, stream = run
        assert (dsc, a_lay, b_lay, c_lay, d_lay) == (desc[0], la, lb, ld, ld)
        assert (pa, pb, pc, pd) == (w.data.ptr, x.data.ptr, d.data.ptr, d.data.ptr)
        assert (alpha, beta, algo, wsp, wss, stream) == (1.0, 0.0, ("algo", 4242), ws.data.ptr, 1 << 20, STREAM)
    trans = {c[1]: c[2] for c in lib.named("cublasLtMatmulDescSetAttribute")}
    assert trans[L.DESC_TRANSA] == L.OP_T and trans[L.DESC_TRANSB] == L.OP_N
    assert trans[L.DESC_EPILOGUE] == L.EPILOGUE_DEFAULT


def test_bias_pointer_is_set_only_when_it_changes(fake):
    cupy, lib = fake
    x, w = _operands(cupy)
    b1, b2 = FakeArray(80, BF16), FakeArray(80, BF16)
    for bias in (b1, b1, b2, b2, b1):
        L.gemm(x, w.T, bias=bias)
    sets = [c[2] for c in lib.named("cublasLtMatmulDescSetAttribute") if c[1] == L.DESC_BIAS_POINTER]
    # the first set is the heuristic's (a pointer of the bias's alignment), then one per change
    assert sets[1:] == [b1.data.ptr, b2.data.ptr, b1.data.ptr]
    assert L.calls["bias_epilogue"] == 5 and len(lib.named("cublasLtMatmul")) == 5
    epi = [c[2] for c in lib.named("cublasLtMatmulDescSetAttribute") if c[1] == L.DESC_EPILOGUE]
    assert epi == [L.EPILOGUE_BIAS]


def test_a_new_dtype_precision_or_alignment_makes_new_descriptors(fake, monkeypatch):
    cupy, lib = fake
    x, w = _operands(cupy, dtype=np.dtype(np.float32))
    L.gemm(x, w.T)
    monkeypatch.setattr(_state, "float32_matmul_precision", "high")
    L.gemm(x, w.T)
    L.gemm(x, w.T)
    computes = [c[1] for c in lib.named("cublasLtMatmulDescCreate")]
    assert computes == [L.COMPUTE_32F, L.COMPUTE_32F_FAST_TF32]
    xo = FakeArray(x.shape, x.dtype, None, x.data.ptr + 64)               # a view 64 bytes in: its own alignment
    L.gemm(xo, w.T)
    assert len(lib.named("cublasLtMatmulDescCreate")) == 3
    align_b = [c[2] for c in lib.named("cublasLtMatmulPreferenceSetAttribute") if c[1] == L.PREF_MIN_ALIGNMENT["b"]]
    assert align_b == [256, 256, 64]
    xb, wb = _operands(cupy, dtype=BF16)
    L.gemm(xb, wb.T)
    assert len(lib.named("cublasLtMatmulDescCreate")) == 4
    assert len(lib.named("cublasLtMatmul")) == 5


def test_batched_and_folded_layouts(fake):
    cupy, lib = fake
    x = FakeArray((4, 16, 32), BF16)
    w = FakeArray((24, 32), BF16)
    d = L.gemm(x, w.T)                                   # folded: one 64 x 32 @ 32 x 24 product
    assert d.shape == (4, 16, 24)
    q = FakeArray((3, 8, 16), BF16)
    k = FakeArray((3, 16, 8), BF16)
    d2 = L.gemm(q, k)
    assert d2.shape == (3, 8, 8)
    d3 = L.gemm(q, k)
    assert d3.data.ptr != d2.data.ptr
    lays = lib.named("cublasLtMatrixLayoutCreate")
    assert [c[1:] for c in lays] == [(L.CUDA_R_16BF, 32, 24, 32), (L.CUDA_R_16BF, 32, 64, 32),
                                     (L.CUDA_R_16BF, 24, 64, 24), (L.CUDA_R_16BF, 8, 16, 8),
                                     (L.CUDA_R_16BF, 16, 8, 16), (L.CUDA_R_16BF, 8, 8, 8)]
    batch = [c[1:] for c in lib.named("cublasLtMatrixLayoutSetAttribute")]
    assert (L.LAYOUT_BATCH_COUNT, 3) in [(a, v) for a, v, _ in batch]
    assert sorted(v for a, v, _ in batch if a == L.LAYOUT_STRIDED_BATCH_OFFSET) == [64, 128, 128]
    assert len(lib.named("cublasLtMatmul")) == 3 and len(lib.named("cublasLtMatmulDescCreate")) == 2


def test_preload_makes_the_handle_once_in_a_background_thread(fake, monkeypatch):
    """`preload` (started by the inductor backend when a graph's inputs are on cuda) loads cuBLASLt and makes the
    device's handle in a thread of its own, so a compiled graph's first product finds them made (~0.5 s of a
    cold first step on the H100 host); once per device, and the product then uses that handle: one
    cublasLtCreate in all."""
    import threading
    cupy, lib = fake
    devices = []

    class _Device:
        def __init__(self, d):
            devices.append((d, threading.current_thread().name))

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False
    cupy.cuda.Device = _Device
    cupy.cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
    monkeypatch.setattr(L, "_preloading", {})
    t = L.preload()
    assert t is not None
    t.join(5)
    assert devices == [(0, "flambeau-cublaslt-preload")]
    assert len(lib.named("cublasLtCreate")) == 1 and 0 in L._handles
    assert L.preload() is None and L.preload(0) is None          # once per device
    x, w = _operands(cupy)
    L.gemm(x, w.T)
    assert len(lib.named("cublasLtCreate")) == 1                 # the product took the preloaded handle
    assert lib.named("cublasLtMatmul")[0][0] == L._handles[0].value


def test_a_failed_bias_pointer_set_raises_naming_the_call(fake):
    """The bias pointer's attribute call (made per changed pointer through a slot kept on the descriptor's
    entry) still checks its status: a failure is PyTorch's CUDA error message naming the call."""
    cupy, lib = fake
    x, w = _operands(cupy)
    L.gemm(x, w.T, bias=FakeArray(80, BF16))
    real = lib.__getattr__("cublasLtMatmulDescSetAttribute")

    def refuse_bias(desc, attr, *rest):
        return 7 if attr == L.DESC_BIAS_POINTER else real(desc, attr, *rest)
    lib.cublasLtMatmulDescSetAttribute = refuse_bias
    with pytest.raises(RuntimeError, match=r"CUBLAS_STATUS_INVALID_VALUE when calling `cublasLtMatmulDescSetAttribute"):
        L.gemm(x, w.T, bias=FakeArray(80, BF16))
