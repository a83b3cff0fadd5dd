"""cuDNN convolutions for the cuda device, bound with ctypes (CuPy ships no cuDNN bindings).

The library is found at first use: the file or folder named by FLAMBEAU_CUDNN_LIB, else
nvidia/cudnn/lib inside any site-packages folder on sys.path (PyTorch's pip wheels put cuDNN 9
there), else the system loader. Without it (or without CuPy) `available()` is False and the
convolution kernels keep their im2col + cuBLAS path; importing this module never needs either.

We call cuDNN's graph (backend) API where the library has it (cuDNN 8+), as PyTorch does: an
operation graph of one convolution, engine configurations from the instant (then fallback)
heuristics filtered by the flags, the first that finalizes into an execution plan (with
`benchmark`, the fastest of the first eight, timed). Where that fails, or with
`use_graph_api = False`, the legacy API: tensor, filter and convolution descriptors, an algorithm
from the `_v7` heuristics (or, with `benchmark`, from timing them with the Find*Ex calls). 1-d
convolutions run as 2-d; workspaces are CuPy allocations; calls go on CuPy's current stream.
Descriptors and algorithms are cached per (shapes, layout, dtype, parameters, flags).
Layouts, as PyTorch's cuDNN convolutions: a call is channels-last when the caller asks for it (the
op's rule: input or weight channels-last) or an operand is; then x, w and y are all packed NHWC
(NDHWC) and the descriptors give those strides (the graph API's tensors, the legacy API's strided
tensors and NHWC filters), else all packed NCHW. An operand in the other layout, not packed or
misaligned is copied first; `copies` counts those copies. float16 and bfloat16 run as they are,
with float32 accumulation.

Flags, as torch.backends.cudnn (exported as flambeau.backends.cudnn):
- `enabled`: use cuDNN at all (default True).
- `allow_tf32`: let float32 convolutions use TF32 tensor cores (default True, as in PyTorch):
  inputs are rounded to a 10-bit mantissa, about 1e-3 relative error. False selects exact float32
  (CUDNN_FMA_MATH: on Ampere and later even CUDNN_DEFAULT_MATH may use TF32). The test suite turns
  it off (tests/conftest.py), as PyTorch's does, because it compares cuda against cpu at 1e-4.
- `deterministic`: only algorithms cuDNN reports as deterministic.
- `benchmark`: time the candidate algorithms once per shape and keep the fastest.
`flags(enabled=, benchmark=, deterministic=, allow_tf32=)` sets them for a `with` block.
`calls` counts the cuDNN convolutions run (forward, backward_data, backward_filter), `variant_packs` the
graph-API variant packs built (pointer sets no kept pack matched: each costs a descriptor, three attributes
and a finalize).
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os
import sys
import threading

from . import cublaslt
from .channels_last import empty as _empty_channels_last, strides as _channels_last_strides
from .cudnn_enums import (BackendAttributeName as A, BackendAttributeType as T, BackendDescriptorType as BE,
                          ConvolutionMode, DataType, Determinism, HeurMode, MathType, NumericalNote, Status,
                          TensorFormat)

enabled = True
allow_tf32 = True
deterministic = False
benchmark = False
workspace_limit = 1 << 30     # bytes an algorithm's workspace may take at most
calls = {"forward": 0, "backward_data": 0, "backward_filter": 0}
copies = {"forward": 0, "backward_data": 0, "backward_filter": 0}   # operands re-laid out before a call
variant_packs = {"built": 0}  # graph-API variant packs made (a call whose pointers no kept pack has)

_SUB_LIBS = ("libcudnn_engines_precompiled", "libcudnn_engines_runtime_compiled", "libcudnn_heuristic",
             "libcudnn_graph", "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv")
_DATA = {"float32": DataType.FLOAT, "float64": DataType.DOUBLE, "float16": DataType.HALF,
         "bfloat16": DataType.BFLOAT16}
_DATA_NAMES: dict = {}       # NumPy dtype -> its name, read once (`dtype.name` costs microseconds a call)
_MAX_ALGOS = 16
_VARIANT_PACKS = 16          # per plan: the layers sharing a geometry each bring their own pointers
_ALIGNMENT = 16              # bytes: the data alignment cuDNN's kernels assume


class _Perf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share one layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_P, _I, _S, _PI = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)
_PERF = ctypes.POINTER(_Perf)
_SIGNATURES = {
    "cudnnCreate": (_P,), "cudnnDestroy": (_P,), "cudnnSetStream": (_P, _P),
    "cudnnCreateTensorDescriptor": (_P,), "cudnnDestroyTensorDescriptor": (_P,),
    "cudnnSetTensorNdDescriptor": (_P, _I, _I, _PI, _PI),
    "cudnnCreateFilterDescriptor": (_P,), "cudnnDestroyFilterDescriptor": (_P,),
    "cudnnSetFilterNdDescriptor": (_P, _I, _I, _I, _PI),
    "cudnnCreateConvolutionDescriptor": (_P,), "cudnnDestroyConvolutionDescriptor": (_P,),
    "cudnnSetConvolutionNdDescriptor": (_P, _I, _PI, _PI, _PI, _I, _I),
    "cudnnSetConvolutionGroupCount": (_P, _I), "cudnnSetConvolutionMathType": (_P, _I),
    "cudnnGetConvolutionForwardAlgorithm_v7": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    "cudnnFindConvolutionForwardAlgorithmEx": (_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S),
    "cudnnFindConvolutionBackwardDataAlgorithmEx": (_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S),
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": (_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S),
    "cudnnGetConvolutionForwardWorkspaceSize": (_P, _P, _P, _P, _P, _I, ctypes.POINTER(_S)),
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_P, _P, _P, _P, _P, _I, ctypes.POINTER(_S)),
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_P, _P, _P, _P, _P, _I, ctypes.POINTER(_S)),
    "cudnnConvolutionForward": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    "cudnnConvolutionBackwardData": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    "cudnnConvolutionBackwardFilter": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    "cudnnBackendCreateDescriptor": (_I, _P), "cudnnBackendDestroyDescriptor": (_P,),
    "cudnnBackendFinalize": (_P,), "cudnnBackendSetAttribute": (_P, _I, _I, ctypes.c_int64, _P),
    "cudnnBackendGetAttribute": (_P, _I, _I, ctypes.c_int64, _P, _P), "cudnnBackendExecute": (_P, _P, _P),
}

_state = {"lib": None, "tried": False, "error": None, "path": None, "plan_error": None}
_lock = threading.Lock()
_local = threading.local()
_plans: dict = {}
_ONE = {"f": ctypes.c_float(1.0), "d": ctypes.c_double(1.0)}
_ZERO = {"f": ctypes.c_float(0.0), "d": ctypes.c_double(0.0)}


# ---- loading -------------------------------------------------------------------------------------
@contextlib.contextmanager
def flags(enabled=None, benchmark=None, deterministic=None, allow_tf32=None):
    """Set cuDNN flags for the duration of a `with` block (torch.backends.cudnn.flags)."""
    mod = sys.modules[__name__]
    names = ("enabled", "benchmark", "deterministic", "allow_tf32")
    saved = {n: getattr(mod, n) for n in names}
    for n, v in zip(names, (enabled, benchmark, deterministic, allow_tf32)):
        if v is not None:
            setattr(mod, n, bool(v))
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(mod, n, v)


def _candidates():
    """Paths (or bare names for the system loader) of libcudnn to try, in order."""
    env = os.environ.get("FLAMBEAU_CUDNN_LIB")
    if env:
        yield from (sorted(glob.glob(os.path.join(env, "libcudnn.so*"))) if os.path.isdir(env) else [env])
    for p in sys.path:
        d = os.path.join(p or ".", "nvidia", "cudnn", "lib")
        if os.path.isdir(d):
            yield from sorted(glob.glob(os.path.join(d, "libcudnn.so*")), key=len)
    yield from ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so")


def _sibling_dirs(libdir):
    """The nvidia/*/lib folders beside a pip-installed cuDNN (cuBLAS and friends it may need)."""
    return sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(libdir)), "*", "lib")))


def _open(path):
    """dlopen `path` globally; when a dependency is missing, preload it from the nvidia/*/lib folders
    beside it and try again."""
    mode = getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0)
    libdir = os.path.dirname(path)
    for _ in range(8):
        try:
            return ctypes.CDLL(path, mode=mode)
        except OSError as e:
            missing = str(e).split(":")[0].strip()
            found = [f for d in (_sibling_dirs(libdir) if libdir else []) for f in glob.glob(os.path.join(d, missing))]
            if not found or missing == os.path.basename(path):
                raise
            ctypes.CDLL(found[0], mode=mode)
    return ctypes.CDLL(path, mode=mode)


def _load():
    errors = []
    for cand in _candidates():
        libdir = os.path.dirname(cand)
        if libdir:
            for sub in _SUB_LIBS:     # the cuDNN 9 shim dlopens these by name: load them from its folder
                for f in sorted(glob.glob(os.path.join(libdir, sub + ".so*")), key=len)[:1]:
                    try:
                        _open(f)
                    except OSError as e:
                        errors.append(f"{f}: {e}")
        try:
            lib = _open(cand)
            for name, args in _SIGNATURES.items():
                if name.startswith("cudnnBackend") and not hasattr(lib, name):
                    continue                      # cuDNN 7: legacy API only
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, ctypes.c_int
            lib.cudnnGetErrorString.argtypes, lib.cudnnGetErrorString.restype = (ctypes.c_int,), ctypes.c_char_p
            lib.cudnnGetVersion.argtypes, lib.cudnnGetVersion.restype = (), ctypes.c_size_t
            _state["path"] = cand
            return lib
        except (OSError, AttributeError) as e:
            errors.append(f"{cand}: {e}")
    _state["error"] = "; ".join(errors[-4:])
    return None


def _lib():
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    import cupy  # noqa: F401  deferred: optional dependency, present only where cuda is used
                    _state["lib"] = _load()
                except ImportError as e:
                    _state["error"] = f"CuPy is not installed ({e})"
                _state["tried"] = True
    return _state["lib"]


def available() -> bool:
    """Whether cuDNN convolutions will be used: `enabled`, CuPy importable and libcudnn loaded."""
    return enabled and _lib() is not None


def is_available() -> bool:
    """Whether libcudnn could be loaded (as torch.backends.cudnn.is_available)."""
    return _lib() is not None


def version():
    """cuDNN's version as an int (e.g. 90800), None when it is not available."""
    lib = _lib()
    return int(lib.cudnnGetVersion()) if lib is not None else None


def load_error():
    """Why libcudnn could not be loaded (None when it was, or was not tried yet)."""
    return _state["error"]


def _check(status, what):
    if status != Status.SUCCESS:
        msg = _state["lib"].cudnnGetErrorString(status).decode(errors="replace")
        raise RuntimeError(f"cuDNN error: {msg} (status {status}) in {what}")


def _handle(dev=None, stream=None):
    """This thread's cuDNN handle of device `dev` (the current one by default), bound to `stream` (a
    stream pointer; the current stream by default)."""
    if dev is None:
        dev = _device_id()
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(dev)
    if h is None:
        h = ctypes.c_void_p()
        _check(_state["lib"].cudnnCreate(ctypes.byref(h)), "cudnnCreate")
        handles[dev] = h
        h.stream = None
    if stream is None:
        stream = _current_stream()
    if h.stream != stream:
        _check(_state["lib"].cudnnSetStream(h, stream), "cudnnSetStream")
        h.stream = stream
    return h


def _current_stream() -> int:
    """The current CuPy stream's pointer."""
    if not _stream_query:
        import cupy  # deferred: optional dependency, present only where cuda is used
        _stream_query.append(cupy.cuda.get_current_stream)
    return _stream_query[0]().ptr


_stream_query: list = []


# ---- descriptors and plans -----------------------------------------------------------------------
def _workspace_limit() -> int:
    """Bytes an algorithm's workspace may take: `workspace_limit`, and no more than is free."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    try:
        return min(workspace_limit, cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes())
    except Exception:
        return workspace_limit


def _ints(vals):
    return (ctypes.c_int * len(vals))(*vals)


def _packed_strides(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def tensor_strides(shape, channels_last: bool):
    """The strides a descriptor of this operand gives: packed NCHW, or packed NHWC for a channels-last call."""
    return _channels_last_strides(shape) if channels_last else _packed_strides(shape)


class _Plan:
    """Descriptors of one convolution geometry, plus the chosen algorithm and its workspace size."""

    def __init__(self, x_shape, w_shape, y_shape, st, pad, dil, groups, dtype, kind, channels_last=False):
        lib = self.lib = _state["lib"]
        self.algo, self.ws = None, 0
        self.scalar = "d" if dtype == "float64" else "f"
        dt = _DATA[dtype]
        self.x, self.y = ctypes.c_void_p(), ctypes.c_void_p()
        self.w, self.conv = ctypes.c_void_p(), ctypes.c_void_p()
        for d in (self.x, self.y):
            _check(lib.cudnnCreateTensorDescriptor(ctypes.byref(d)), "cudnnCreateTensorDescriptor")
        _check(lib.cudnnCreateFilterDescriptor(ctypes.byref(self.w)), "cudnnCreateFilterDescriptor")
        _check(lib.cudnnCreateConvolutionDescriptor(ctypes.byref(self.conv)), "cudnnCreateConvolutionDescriptor")
        for d, shape in ((self.x, x_shape), (self.y, y_shape)):
            _check(lib.cudnnSetTensorNdDescriptor(d, dt, len(shape), _ints(shape),
                                                  _ints(tensor_strides(shape, channels_last))),
                   f"cudnnSetTensorNdDescriptor({list(shape)})")
        fmt = TensorFormat.NHWC if channels_last else TensorFormat.NCHW
        _check(lib.cudnnSetFilterNdDescriptor(self.w, dt, fmt, len(w_shape), _ints(w_shape)),
               f"cudnnSetFilterNdDescriptor({list(w_shape)})")
        compute = _DATA["float64"] if dtype == "float64" else _DATA["float32"]
        _check(lib.cudnnSetConvolutionNdDescriptor(self.conv, len(st), _ints(pad), _ints(st), _ints(dil),
                                                   ConvolutionMode.CROSS_CORRELATION, compute),
               "cudnnSetConvolutionNdDescriptor")
        _check(lib.cudnnSetConvolutionGroupCount(self.conv, groups), "cudnnSetConvolutionGroupCount")
        if dtype == "float32":
            self.math = MathType.DEFAULT_MATH if allow_tf32 else MathType.FMA_MATH
        else:
            self.math = MathType.DEFAULT_MATH if dtype == "float64" else MathType.TENSOR_OP_MATH
        _check(lib.cudnnSetConvolutionMathType(self.conv, self.math), "cudnnSetConvolutionMathType")
        self.kind = kind

    def _descs(self):
        """The four descriptors in the argument order of this kind's cuDNN calls."""
        if self.kind == "forward":
            return self.x, self.w, self.conv, self.y
        if self.kind == "backward_data":
            return self.w, self.y, self.conv, self.x
        return self.x, self.y, self.conv, self.w

    def choose(self, h, ptrs=None):
        """Pick the algorithm: the heuristics' list (or, given data pointers, the measured one) in
        order, keeping the first that succeeds, fits the workspace limit and meets the flags."""
        import cupy  # deferred: optional dependency, present only where cuda is used
        lib, kind = _state["lib"], self.kind
        perfs, n = (_Perf * _MAX_ALGOS)(), ctypes.c_int()
        limit = _workspace_limit()
        name = {"forward": "Forward", "backward_data": "BackwardData", "backward_filter": "BackwardFilter"}[kind]
        if ptrs is None:
            fn = getattr(lib, f"cudnnGetConvolution{name}Algorithm_v7")
            _check(fn(h, *self._descs(), _MAX_ALGOS, ctypes.byref(n), perfs), fn.__name__)
        else:
            ws = cupy.empty(max(limit, 0), dtype=cupy.uint8)
            a, b, c, d = self._descs()
            p = ptrs
            fn = getattr(lib, f"cudnnFind{'Convolution' + name}AlgorithmEx")
            _check(fn(h, a, p[0], b, p[1], c, d, p[2], _MAX_ALGOS, ctypes.byref(n), perfs, ws.data.ptr, ws.nbytes),
                   fn.__name__)
            del ws
        wsfn = getattr(lib, f"cudnnGetConvolution{name}WorkspaceSize")
        for perf in perfs[:n.value]:
            if (perf.status != Status.SUCCESS or perf.memory > limit
                    or (deterministic and perf.determinism != Determinism.DETERMINISTIC)):
                continue
            math_type = self.math if self.math == MathType.FMA_MATH else perf.mathType
            _check(lib.cudnnSetConvolutionMathType(self.conv, math_type), "cudnnSetConvolutionMathType")
            size = ctypes.c_size_t()
            if wsfn(h, *self._descs(), perf.algo, ctypes.byref(size)) != Status.SUCCESS or size.value > limit:
                continue
            self.algo, self.ws = perf.algo, size.value
            return True
        return False

    def __del__(self):
        try:      # at interpreter exit the module's globals may already be gone
            if sys.is_finalizing():
                return
            lib = self.lib
            lib.cudnnDestroyTensorDescriptor(self.x)
            lib.cudnnDestroyTensorDescriptor(self.y)
            lib.cudnnDestroyFilterDescriptor(self.w)
            lib.cudnnDestroyConvolutionDescriptor(self.conv)
        except Exception:
            pass


# ---- the graph (backend) API ---------------------------------------------------------------------
# cuDNN 8+ exposes its engines through descriptors: tensors and a convolution descriptor make an
# operation, the operation an operation graph; heuristics rank engine configurations for it; a
# configuration that finalizes into an execution plan is run with a "variant pack" of data pointers.
# This reaches the engines PyTorch uses (the legacy API above picks from an older set and is ~2x
# slower for 3x3 TF32 convolutions on an H100). The enums are in cudnn_enums.py.
# Per kind: the operation's descriptor type, its alpha, beta and convolution-descriptor attributes,
# then its three tensor attributes by role (x, w, y as in the forward convolution).
_OPERATIONS = {
    "forward": (BE.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, A.OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A.OPERATION_CONVOLUTION_FORWARD_BETA, A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                {"x": A.OPERATION_CONVOLUTION_FORWARD_X, "w": A.OPERATION_CONVOLUTION_FORWARD_W,
                 "y": A.OPERATION_CONVOLUTION_FORWARD_Y}),
    "backward_data": (BE.OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                      A.OPERATION_CONVOLUTION_BWD_DATA_BETA, A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                      {"w": A.OPERATION_CONVOLUTION_BWD_DATA_W, "x": A.OPERATION_CONVOLUTION_BWD_DATA_DX,
                       "y": A.OPERATION_CONVOLUTION_BWD_DATA_DY}),
    "backward_filter": (BE.OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                        A.OPERATION_CONVOLUTION_BWD_FILTER_BETA, A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                        {"x": A.OPERATION_CONVOLUTION_BWD_FILTER_X, "y": A.OPERATION_CONVOLUTION_BWD_FILTER_DY,
                         "w": A.OPERATION_CONVOLUTION_BWD_FILTER_DW}),
}
use_graph_api = True          # False: always the legacy API
heuristic_modes = (HeurMode.INSTANT, HeurMode.FALLBACK)   # tried in order until one yields a plan


# `_GraphPlan._variant_pack`'s constant arguments: attribute ids, descriptor type, attribute types, array types
_PACK_ARGS = (int(A.VARIANT_PACK_UNIQUE_IDS), int(A.VARIANT_PACK_DATA_POINTERS), int(A.VARIANT_PACK_WORKSPACE), int(BE.VARIANT_PACK_DESCRIPTOR),
              int(T.INT64), int(T.VOID_PTR), ctypes.c_void_p * 3, ctypes.c_void_p * 1)


class _GraphPlan:
    """One convolution geometry as a cuDNN graph-API execution plan (`None` engines -> RuntimeError)."""
    packs = None          # pointers (x, w, y, workspace) -> variant pack, least recently used first (`execute`)

    def __init__(self, x_shape, w_shape, y_shape, st, pad, dil, dtype, kind, h, ptrs=None, channels_last=False):
        self.lib = _state["lib"]
        self.kind, self.descs = kind, []
        dt = _DATA[dtype]
        compute = _DATA["float64"] if dtype == "float64" else _DATA["float32"]
        self.scalar = "d" if dtype == "float64" else "f"
        uid = {"x": 1, "w": 2, "y": 3}
        tensors = {}
        for role, shape in (("x", x_shape), ("w", w_shape), ("y", y_shape)):
            t = self._new(BE.TENSOR_DESCRIPTOR)
            self._set(t, A.TENSOR_DATA_TYPE, T.DATA_TYPE, ctypes.c_int, [dt])
            self._set(t, A.TENSOR_DIMENSIONS, T.INT64, ctypes.c_int64, shape)
            self._set(t, A.TENSOR_STRIDES, T.INT64, ctypes.c_int64, tensor_strides(shape, channels_last))
            self._set(t, A.TENSOR_UNIQUE_ID, T.INT64, ctypes.c_int64, [uid[role]])
            self._set(t, A.TENSOR_BYTE_ALIGNMENT, T.INT64, ctypes.c_int64, [_ALIGNMENT])
            self._finalize(t, f"tensor {role} {list(shape)}")
            tensors[role] = t
        conv = self._new(BE.CONVOLUTION_DESCRIPTOR)
        nd = len(st)
        self._set(conv, A.CONVOLUTION_SPATIAL_DIMS, T.INT64, ctypes.c_int64, [nd])
        self._set(conv, A.CONVOLUTION_COMP_TYPE, T.DATA_TYPE, ctypes.c_int, [compute])
        self._set(conv, A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, ctypes.c_int, [ConvolutionMode.CROSS_CORRELATION])
        self._set(conv, A.CONVOLUTION_DILATIONS, T.INT64, ctypes.c_int64, dil)
        self._set(conv, A.CONVOLUTION_FILTER_STRIDES, T.INT64, ctypes.c_int64, st)
        self._set(conv, A.CONVOLUTION_POST_PADDINGS, T.INT64, ctypes.c_int64, pad)
        self._set(conv, A.CONVOLUTION_PRE_PADDINGS, T.INT64, ctypes.c_int64, pad)
        self._finalize(conv, "convolution descriptor")
        op_type, a_alpha, a_beta, a_conv, roles = _OPERATIONS[kind]
        op = self._new(op_type)
        for role, attr in roles.items():
            self._set(op, attr, T.BACKEND_DESCRIPTOR, ctypes.c_void_p, [tensors[role].value])
        self._set(op, a_conv, T.BACKEND_DESCRIPTOR, ctypes.c_void_p, [conv.value])
        scalar_t, ctype = (T.DOUBLE, ctypes.c_double) if dtype == "float64" else (T.FLOAT, ctypes.c_float)
        self._set(op, a_alpha, scalar_t, ctype, [1.0])
        self._set(op, a_beta, scalar_t, ctype, [0.0])
        self._finalize(op, f"{kind} operation")
        graph = self._new(BE.OPERATIONGRAPH_DESCRIPTOR)
        self._set(graph, A.OPERATIONGRAPH_OPS, T.BACKEND_DESCRIPTOR, ctypes.c_void_p, [op.value])
        self._set(graph, A.OPERATIONGRAPH_HANDLE, T.HANDLE, ctypes.c_void_p, [h.value])
        self._finalize(graph, "operation graph")
        self.uids = (ctypes.c_int64 * 3)(uid["x"], uid["w"], uid["y"])
        self.plan, self.ws = self._choose(graph, h, dtype, ptrs)

    # descriptor helpers
    def _new(self, kind: BE):
        d = ctypes.c_void_p()
        _check(self.lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(d)),
               f"cudnnBackendCreateDescriptor({kind.name})")
        self.descs.append(d)
        return d

    def _set(self, d, attr, typ, ctype, values):
        arr = (ctype * len(values))(*values)
        _check(self.lib.cudnnBackendSetAttribute(d, attr, typ, len(values), arr), f"cudnnBackendSetAttribute({attr})")

    def _finalize(self, d, what):
        _check(self.lib.cudnnBackendFinalize(d), f"cudnnBackendFinalize({what})")

    def _configs(self, graph, mode):
        lib = self.lib
        heur = self._new(BE.ENGINEHEUR_DESCRIPTOR)
        self._set(heur, A.ENGINEHEUR_OPERATION_GRAPH, T.BACKEND_DESCRIPTOR, ctypes.c_void_p, [graph.value])
        self._set(heur, A.ENGINEHEUR_MODE, T.HEUR_MODE, ctypes.c_int, [mode])
        if lib.cudnnBackendFinalize(heur) != Status.SUCCESS:
            return []
        n = ctypes.c_int64()
        if (lib.cudnnBackendGetAttribute(heur, A.ENGINEHEUR_RESULTS, T.BACKEND_DESCRIPTOR, 0, ctypes.byref(n), None)
                != Status.SUCCESS or n.value <= 0):
            return []
        cfgs = [self._new(BE.ENGINECFG_DESCRIPTOR) for _ in range(min(n.value, 64))]
        arr = (ctypes.c_void_p * len(cfgs))(*[c.value for c in cfgs])
        got = ctypes.c_int64()
        if (lib.cudnnBackendGetAttribute(heur, A.ENGINEHEUR_RESULTS, T.BACKEND_DESCRIPTOR, len(cfgs), ctypes.byref(got),
                                         arr) != Status.SUCCESS):
            return []
        return cfgs[:got.value]

    def _allowed(self, cfg, dtype):
        """The flags' filter on an engine's numerical notes (TF32 only with allow_tf32, no
        down-conversion of float32 inputs, determinism when asked)."""
        lib = self.lib
        eng = self._new(BE.ENGINE_DESCRIPTOR)
        arr = (ctypes.c_void_p * 1)(eng.value)
        got = ctypes.c_int64()
        if lib.cudnnBackendGetAttribute(cfg, A.ENGINECFG_ENGINE, T.BACKEND_DESCRIPTOR, 1, ctypes.byref(got),
                                        arr) != Status.SUCCESS:
            return False
        count = NumericalNote.TYPE_COUNT
        notes = (ctypes.c_int * count)()
        if lib.cudnnBackendGetAttribute(eng, A.ENGINE_NUMERICAL_NOTE, T.NUMERICAL_NOTE, count, ctypes.byref(got),
                                        notes) != Status.SUCCESS:
            return False
        notes = set(notes[:got.value])
        if dtype != "float16" and NumericalNote.DOWN_CONVERT_INPUTS in notes:
            return False
        if dtype in ("float32", "float64") and not allow_tf32 and NumericalNote.TENSOR_CORE in notes:
            return False
        if deterministic and NumericalNote.NONDETERMINISTIC in notes:
            return False
        return True

    def _choose(self, graph, h, dtype, ptrs):
        import cupy  # deferred: optional dependency, present only where cuda is used
        limit = _workspace_limit()
        plans = []
        for mode in heuristic_modes:
            for cfg in self._configs(graph, mode):
                if not self._allowed(cfg, dtype):
                    continue
                plan = self._new(BE.EXECUTION_PLAN_DESCRIPTOR)
                self._set(plan, A.EXECUTION_PLAN_HANDLE, T.HANDLE, ctypes.c_void_p, [h.value])
                self._set(plan, A.EXECUTION_PLAN_ENGINE_CONFIG, T.BACKEND_DESCRIPTOR, ctypes.c_void_p, [cfg.value])
                if self.lib.cudnnBackendFinalize(plan) != Status.SUCCESS:
                    continue
                ws, got = ctypes.c_int64(), ctypes.c_int64()
                if self.lib.cudnnBackendGetAttribute(plan, A.EXECUTION_PLAN_WORKSPACE_SIZE, T.INT64, 1,
                                                     ctypes.byref(got), ctypes.byref(ws)) != Status.SUCCESS:
                    continue
                if ws.value > limit:
                    continue
                plans.append((plan, ws.value))
                if ptrs is None or len(plans) >= 8:
                    break
            if plans:
                break
        if not plans:
            raise RuntimeError(f"cuDNN graph API: no engine for this {self.kind} convolution")
        if ptrs is None or len(plans) == 1:
            return plans[0]
        ptrs = self.roles(*ptrs)
        timed = []
        for plan, ws in plans:           # benchmark: time each candidate once after a warm-up
            self.plan, self.ws = plan, ws
            try:                         # (a candidate's workspace is not kept: see `_workspace`)
                self.execute(h, ptrs, keep=False)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                self.execute(h, ptrs, keep=False)
                end.record()
                end.synchronize()
                timed.append((cupy.cuda.get_elapsed_time(start, end), plan, ws))
            except RuntimeError:
                continue
        if not timed:
            raise RuntimeError(f"cuDNN graph API: no engine ran this {self.kind} convolution")
        _, plan, ws = min(timed, key=lambda t: t[0])
        return plan, ws

    def roles(self, a, b, out):
        """(x, w, y) -- the roles of the forward convolution -- from a call's (a, b, out) order."""
        if self.kind == "forward":
            return a, b, out
        return (out, a, b) if self.kind == "backward_data" else (a, out, b)

    def execute(self, h, ptrs, dev=None, stream=None, keep=True):
        """Run on data pointers (x, w, y) -- the roles of the forward convolution -- on stream `stream`
        of device `dev` (the current ones by default; `h` bound to them). Variant packs are kept for the
        last `_VARIANT_PACKS` pointer sets: in a training loop CuPy's pool hands the same blocks back,
        and the workspace is the stream's (`_workspace`), so most calls reuse one (six fewer cuDNN
        calls, about 20 us). `keep=False`: a workspace larger than cuBLASLt's is allocated for this
        call only (benchmarking candidates)."""
        if not self.ws:
            key = ptrs + (0,)
        else:
            ws = _workspace(self.ws, dev, stream, keep=keep)     # (referenced until the call has queued)
            key = ptrs + (ws.data.ptr,)
        packs = self.packs
        if packs is None:
            packs = self.packs = {}
        pack = packs.pop(key, None)
        if pack is None:
            pack = self._variant_pack(key)
            variant_packs["built"] += 1
            if len(packs) >= _VARIANT_PACKS:
                self.lib.cudnnBackendDestroyDescriptor(packs.pop(next(iter(packs))))
        packs[key] = pack             # most recently used last
        status = self.lib.cudnnBackendExecute(h, self.plan, pack)
        if status:
            _check(status, "cudnnBackendExecute")

    def _variant_pack(self, key):
        """A finalized variant pack of pointers `key` (x, w, y, workspace): the ids and enum values as
        plain ints and the pointer array types made once (`_PACK_ARGS`), statuses checked inline (a pack
        is built for each pointer set no kept pack has: ~40 a ResNet-50 step)."""
        lib = self.lib
        ids, ptrs, ws, vp_type, i64, vptr, ptrs3, ptr1 = _PACK_ARGS
        pack = ctypes.c_void_p()
        status = lib.cudnnBackendCreateDescriptor(vp_type, ctypes.byref(pack))
        if status:
            _check(status, "cudnnBackendCreateDescriptor(variant pack)")
        status = (lib.cudnnBackendSetAttribute(pack, ids, i64, 3, self.uids)
                  or lib.cudnnBackendSetAttribute(pack, ptrs, vptr, 3, ptrs3(key[0], key[1], key[2]))
                  or lib.cudnnBackendSetAttribute(pack, ws, vptr, 1, ptr1(key[3] or None))
                  or lib.cudnnBackendFinalize(pack))
        if status:
            lib.cudnnBackendDestroyDescriptor(pack)
            _check(status, "variant pack (ids, pointers, workspace, finalize)")
        return pack

    def __del__(self):
        try:
            if sys.is_finalizing():
                return
            for d in list((self.packs or {}).values()) + list(reversed(self.descs)):
                self.lib.cudnnBackendDestroyDescriptor(d)
        except Exception:
            pass


def _as_2d(shape):
    """1-d convolutions run as 2-d ones with a height of 1."""
    return tuple(shape[:2]) + (1,) + tuple(shape[2:])


def _dtype_name(dt) -> str:
    n = _DATA_NAMES.get(dt)
    if n is None:
        n = _DATA_NAMES[dt] = dt.name
    return n


def _device_id() -> int:
    """The current device through CuPy's cached query (no runtime call)."""
    if not _device_query:
        import cupy  # deferred: optional dependency, present only where cuda is used
        _device_query.append(getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice))
    return _device_query[0]()


_device_query: list = []


def _supported(a, b):
    """Whether cuDNN takes this pair: CuPy arrays of 3 to 5 dims on the current device, of one
    dtype it knows, non-empty, each under 2^31 elements."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if not (isinstance(a, cupy.ndarray) and isinstance(b, cupy.ndarray)):
        return False
    if a.ndim not in (3, 4, 5) or a.dtype != b.dtype or _dtype_name(a.dtype) not in _DATA:
        return False
    dev = _device_id()
    if a.data.device_id != dev or b.data.device_id != dev:
        return False
    return 0 < a.size < (1 << 31) and 0 < b.size < (1 << 31)


def _has_strides(a, want) -> bool:
    """Whether array `a` has these element strides (a dim of size 1 may have any)."""
    it = a.itemsize
    return all(b == w * it for b, w, n in zip(a.strides, want, a.shape) if n != 1)


def _is_channels_last(a) -> bool:
    return a.ndim in (4, 5) and not a.flags.c_contiguous and _has_strides(a, _channels_last_strides(a.shape))


def _empty(shape, dtype, channels_last: bool):
    """A new CuPy array packed in the call's layout (the `ndarray` constructor: `cupy.empty` is a Python
    function around it, one frame more per convolution; channels-last: one array, `_backends.channels_last.empty`)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if not channels_last:
        return cupy.ndarray(shape, dtype)
    return _empty_channels_last(cupy, shape, dtype)


def _ready(a, channels_last: bool, kind: str):
    """`a` packed in the call's layout with a 16-byte aligned data pointer (what cuDNN's kernels
    assume): `a` itself when it is, else a copy (counted in `copies`)."""
    if (a.flags.c_contiguous if not channels_last else _has_strides(a, _channels_last_strides(a.shape))) \
            and not a.data.ptr % _ALIGNMENT:
        return a
    copies[kind] += 1
    out = _empty(a.shape, a.dtype, channels_last)
    out[...] = a
    return out


def _plan(kind, x_shape, w_shape, y_shape, st, pad, dil, groups, dtype, ptrs_fn, channels_last=False):
    key = (kind, _device_id(), x_shape, w_shape, y_shape, channels_last, st, pad, dil, groups, dtype,
           allow_tf32, deterministic, benchmark, use_graph_api)
    plan = _plans.get(key, False)
    if plan is False:
        xs, ws, ys = x_shape, w_shape, y_shape
        if len(x_shape) == 3:         # (1-d convolutions are never channels-last)
            xs, ws, ys = _as_2d(x_shape), _as_2d(w_shape), _as_2d(y_shape)
            st, pad, dil = (1,) + st, (0,) + pad, (1,) + dil
        plan = None
        if use_graph_api and hasattr(_state["lib"], "cudnnBackendExecute"):
            try:
                plan = _GraphPlan(xs, ws, ys, st, pad, dil, dtype, kind, _handle(), ptrs_fn() if benchmark else None,
                                  channels_last)
            except (RuntimeError, AttributeError) as e:
                _state["plan_error"] = str(e)
                plan = None
        if plan is None:
            try:
                plan = _Plan(xs, ws, ys, st, pad, dil, groups, dtype, kind, channels_last)
                if not plan.choose(_handle(), ptrs_fn() if benchmark else None):
                    plan = None
            except RuntimeError as e:
                _state["plan_error"] = str(e)
                plan = None
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = plan
    return plan


def _out_shape(x_shape, w_shape, st, pad, dil):
    return (x_shape[0], w_shape[0]) + tuple((x_shape[2 + i] + 2 * pad[i] - dil[i] * (w_shape[2 + i] - 1) - 1) // st[i] + 1
                                            for i in range(len(st)))


_recorded: list = []     # the lists `record_calls` blocks collect into (innermost last)


@contextlib.contextmanager
def record_calls():
    """Collect (kind, plan, a, b, out) of each cuDNN convolution `_run` makes inside the block: a
    compiled graph plans its convolutions from their first call's (_inductor/extern_conv.py)."""
    seen: list = []
    _recorded.append(seen)
    try:
        yield seen
    finally:
        _recorded.remove(seen)


def _workspace(nbytes: int, dev=None, stream=None, keep: bool = True):
    """Scratch of `nbytes` for one convolution on stream `stream` of device `dev` (the current ones by
    default): the stream's cuBLASLt workspace (`cublaslt.WORKSPACE_BYTES`, made once per device and
    stream; the convolutions and products queued on one stream run one after another, so they may share
    it) when it is large enough, else the stream's large convolution workspace, kept and grown to the
    largest size asked for (`_large_workspaces`): its pointer stays the same call after call, so the
    plans' variant packs keep matching, and no call allocates. `release_workspaces` gives it back.
    `keep=False`: a scratch over cuBLASLt's size is a fresh allocation for this call only (benchmarking
    candidates)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if nbytes > cublaslt.WORKSPACE_BYTES and not keep:
        return cupy.empty(nbytes, dtype=cupy.uint8)
    if dev is None:
        dev = _device_id()
    if stream is None:
        stream = _current_stream()
    if nbytes <= cublaslt.WORKSPACE_BYTES:
        return cublaslt._workspace(cupy, dev, stream)
    ws = _large_workspaces.get((dev, stream))
    if ws is None or ws.nbytes < nbytes:
        _large_workspaces.pop((dev, stream), None)        # (the old one back to the pool first)
        ws = _large_workspaces[(dev, stream)] = cupy.empty(nbytes, dtype=cupy.uint8)
    return ws


_large_workspaces: dict = {}     # (device, stream) -> the largest convolution workspace over cuBLASLt's


def release_workspaces() -> None:
    """Drop the kept large convolution workspaces (`flambeau.cuda.empty_cache`): their memory goes back
    to CuPy's pool; a later convolution that needs one allocates it again."""
    _large_workspaces.clear()


def run_pointers(kind, plan, pa: int, pb: int, pout: int, dev: int, stream: int) -> None:
    """`_run` of a graph-API plan on data pointers, on stream `stream` of device `dev` (a compiled
    graph's planned convolution, _inductor/extern_conv.py: its operands checked there). This thread's
    handle of `dev`, when it is bound to `stream` already, is read here (`_handle` makes or rebinds it)."""
    handles = getattr(_local, "handles", None)
    h = handles.get(dev) if handles is not None else None
    if h is None or h.stream != stream:
        h = _handle(dev, stream)
    plan.execute(h, plan.roles(pa, pb, pout), dev, stream)
    calls[kind] += 1


def _run(kind, plan, a, b, out, dev=None):
    """Run one convolution call: `a`, `b` the two inputs in the call's order, `out` the result; `dev`
    the current device when the caller has read it."""
    if _recorded:
        _recorded[-1].append((kind, plan, a, b, out))
    if isinstance(plan, _GraphPlan):
        if dev is None:
            dev = _device_id()
        stream = _current_stream()
        plan.execute(_handle(dev, stream), plan.roles(a.data.ptr, b.data.ptr, out.data.ptr), dev, stream)
        calls[kind] += 1
        return out
    lib, h = _state["lib"], _handle()
    ws = _workspace(plan.ws) if plan.ws else None
    da, db, dc, dd = plan._descs()
    fn = {"forward": lib.cudnnConvolutionForward, "backward_data": lib.cudnnConvolutionBackwardData,
          "backward_filter": lib.cudnnConvolutionBackwardFilter}[kind]
    one, zero = ctypes.addressof(_ONE[plan.scalar]), ctypes.addressof(_ZERO[plan.scalar])
    _check(fn(h, one, da, a.data.ptr, db, b.data.ptr, dc, plan.algo, ws.data.ptr if ws is not None else None,
              plan.ws, zero, dd, out.data.ptr), fn.__name__)
    calls[kind] += 1
    return out


# ---- the three convolutions ----------------------------------------------------------------------
# A call's layout, result shape and plan follow from what `_call_key` holds (`_call` builds that key
# inline on its hit path); a training loop repeats
# each call every step, so the three entry points remember them (`_calls`) for a call that needed no
# copy, and a repeated call is one dict hit, the device and alignment checks on its operands, the
# result's allocation and `_run` (about a third of the full path's Python, bench/eager_conv_host.py).
_calls: dict = {}
_MAX_CALLS = 4096


def _call_key(kind, a, b, extra, stride, padding, dilation, groups, channels_last, dev):
    """What decides a call's layout, result shape and plan: both operands' types, shapes, strides and
    dtypes, the parameters (`extra`: the result's shape where it is not implied), the flags, the device."""
    return (kind, type(a), type(b), a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype, extra, stride,
            padding, dilation, groups, channels_last, allow_tf32, deterministic, benchmark, use_graph_api, dev)


def _remember(key, entry) -> None:
    try:
        hash(key)
    except TypeError:
        return
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    _calls[key] = entry


def _call_layout(channels_last, *arrays) -> bool:
    """Whether a call runs channels-last: asked for, or an operand is (4-d/5-d only)."""
    if arrays[0].ndim not in (4, 5):
        return False
    return bool(channels_last) or any(_is_channels_last(a) for a in arrays)


def _call(kind, a, b, extra, stride, padding, dilation, groups, channels_last, shapes, order):
    """One convolution call of `kind` on the operands `a`, `b` (forward: x, w; backward_data: gy, w;
    backward_filter: x, gy), its result made here, or None when cuDNN does not take the case. A call seen
    before (same operand types, shapes, strides, dtypes, parameters, flags, device: `_call_key`) reuses its
    layout, result shape and plan (a graph plan runs here, its pointers put in its roles' order without
    `order`, `_run` or `roles` calls); otherwise `shapes(a, b)` gives (x shape, w shape, y shape, result shape)
    or None for a case cuDNN refuses, `order(a, b, out)` the (input, input, output) order of `_run` and the
    plan's pointers. A call whose operands needed a copy (`_ready`) is planned again every time."""
    key = hit = None
    if _calls:
        dev = _device_id()
        key = (kind, type(a), type(b), a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype, extra, stride,
               padding, dilation, groups, channels_last, allow_tf32, deterministic, benchmark, use_graph_api, dev)
        try:
            hit = _calls.get(key)
        except TypeError:             # parameters given as lists
            pass
    if hit is not None:               # a call seen before: its operands on `dev` and aligned (layout: in `key`)
        da, db = a.data, b.data
        pa, pb = da.ptr, db.ptr
        if da.device_id == dev and db.device_id == dev and not (pa % _ALIGNMENT or pb % _ALIGNMENT):
            cl, out_shape, plan, graph = hit
            out = _empty(out_shape, a.dtype, cl)
            if not graph or _recorded:
                _run(kind, plan, *order(a, b, out), dev)
                return out
            po = out.data.ptr          # the plan's (x, w, y) pointers (`_GraphPlan.roles`) from (a, b, out)
            ptrs = (pa, pb, po) if kind == "forward" else ((po, pb, pa) if kind == "backward_data" else (pa, po, pb))
            stream = _current_stream()
            plan.execute(_handle(dev, stream), ptrs, dev, stream)
            calls[kind] += 1
            return out
    if not (available() and _supported(a, b)):
        return None
    shaped = shapes(a, b)
    if shaped is None:
        return None
    if key is None:
        key = _call_key(kind, a, b, extra, stride, padding, dilation, groups, channels_last, _device_id())
    x_shape, w_shape, y_shape, out_shape = shaped
    cl = _call_layout(channels_last, a, b)
    a0, b0 = a, b
    a, b = _ready(a, cl, kind), _ready(b, cl, kind)
    out = _empty(out_shape, a.dtype, cl)
    if kind != "forward":               # the backward kinds plan on the operands' (ready) shapes
        x_shape, w_shape, y_shape = ((x_shape, b.shape, a.shape) if kind == "backward_data"
                                     else (a.shape, w_shape, b.shape))
    else:
        x_shape, w_shape = a.shape, b.shape
    plan = _plan(kind, x_shape, w_shape, y_shape, tuple(stride), tuple(padding), tuple(dilation), groups,
                 _dtype_name(a.dtype), lambda: tuple(t.data.ptr for t in order(a, b, out)), cl)
    if plan is None:
        return None
    _run(kind, plan, *order(a, b, out))
    if a is a0 and b is b0:
        _remember(key, (cl, out_shape, plan, isinstance(plan, _GraphPlan)))
    return out


def forward(x, w, bias, stride, padding, dilation, groups, channels_last=False):
    """y = conv(x, w) + bias (cross-correlation, PyTorch's convolution), or None when cuDNN does not
    take this case (the caller then uses its own kernel). `channels_last`: y packed NHWC (see the
    module docstring)."""
    if not enabled:
        return None

    def shapes(x, w):
        if w.ndim != x.ndim:
            return None
        y_shape = _out_shape(x.shape, w.shape, tuple(stride), tuple(padding), tuple(dilation))
        return None if any(s <= 0 for s in y_shape[2:]) else (x.shape, w.shape, y_shape, y_shape)
    y = _call("forward", x, w, None, stride, padding, dilation, groups, channels_last, shapes, _in_order)
    if y is not None and bias is not None:
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


def backward_data(gy, w, stride, padding, dilation, groups, size, channels_last=False):
    """The input gradient of conv (the transposed convolution): gy (N, O, *out) with w (O, Cg, *k)
    -> (N, Cg*groups, *size), or None when cuDNN does not take this case."""
    if not enabled:
        return None

    def shapes(gy, w):
        if w.ndim != gy.ndim:
            return None
        x_shape = (gy.shape[0], w.shape[1] * groups) + tuple(size)
        if _out_shape(x_shape, w.shape, tuple(stride), tuple(padding), tuple(dilation)) != tuple(gy.shape) \
                or math.prod(x_shape) >= (1 << 31):
            return None
        return x_shape, w.shape, gy.shape, x_shape
    return _call("backward_data", gy, w, size, stride, padding, dilation, groups, channels_last, shapes,
                 _weight_first)


def backward_filter(x, gy, w_shape, stride, padding, dilation, groups, channels_last=False):
    """The weight gradient of conv: x (N, C, *S), gy (N, O, *out) -> (O, C/groups, *k), or None when
    cuDNN does not take this case."""
    if not enabled:
        return None

    def shapes(x, gy):
        shape = tuple(w_shape)
        if not len(shape) == x.ndim == gy.ndim or \
                _out_shape(x.shape, shape, tuple(stride), tuple(padding), tuple(dilation)) != tuple(gy.shape):
            return None
        return x.shape, shape, gy.shape, shape
    return _call("backward_filter", x, gy, w_shape, stride, padding, dilation, groups, channels_last, shapes,
                 _in_order)


def _in_order(a, b, out) -> tuple:
    return a, b, out


def _weight_first(gy, w, gx) -> tuple:
    """backward_data runs on (w, gy) -> gx."""
    return w, gy, gx
