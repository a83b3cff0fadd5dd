"""add/sub/mul/div on cuda as one cached raw kernel launch (issue 11, item 6: per-op host cost).

CuPy's ufunc machinery costs about 13.6 us of host time per call on an H200 (type resolution,
broadcasting, output allocation, argument packing; `bench/cuda_host_profile.py micro`), two thirds of
flambeau's whole 8x8 add. A `RawKernel` launch with a given output costs about 6.4 us. `binary` takes
the common case of a training step — two C-contiguous arrays of one shape and dtype, or one array and
a Python number on the right — for float32/float64 arrays and float16/bfloat16 arrays of at most
`MAX_ELEMENTS` (and int64 add/sub/mul with an int64 array or a Python int, wrapping around as
PyTorch's: BatchNorm's `num_batches_tracked += 1` each step), and launches a kernel compiled
once per (op, dtype, operand kind). Arithmetic as PyTorch's cuda kernels: float32 for the half types
(the Python number taken as float32; a division by it is a product with its reciprocal, as
PyTorch's), rounded once to nearest-even into the storage type; float64 in float64. Anything else returns None and takes the general path.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

from . import triton_launch as TL

_HEADER = r"""
struct f16_t { unsigned short b; };
struct bf16_t { unsigned short b; };
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ double ld(double v) { return v; }
__device__ __forceinline__ float ld(f16_t v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.b)); return f; }
__device__ __forceinline__ float ld(bf16_t v) { return __uint_as_float(((unsigned int)v.b) << 16); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(double* p, double v) { *p = v; }
__device__ __forceinline__ void st(f16_t* p, float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p->b = h; }
__device__ __forceinline__ void st(bf16_t* p, float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { p->b = 0x7fc0u; return; }   /* NaN, as c10::BFloat16 */
    u += 0x7fffu + ((u >> 16) & 1u);
    p->b = (unsigned short)(u >> 16);
}
/* CuPy compiles with -ftz=true, which flushes float32 subnormals in compiler-emitted arithmetic;
   PyTorch keeps them, so the float32 operations are written as PTX without .ftz */
template <int OP> __device__ __forceinline__ float apply(float x, float y) {
    float r;
    if (OP == 0) asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    else if (OP == 1) asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    else if (OP == 2) asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    else asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}
template <int OP> __device__ __forceinline__ double apply(double x, double y) {
    return OP == 0 ? x + y : OP == 1 ? x - y : OP == 2 ? x * y : x / y;
}
template <int OP, typename S, typename C>
__device__ __forceinline__ void binary_tt(const S* x, const S* y, S* z, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        st(z + i, apply<OP>(ld(x[i]), ld(y[i])));
}
template <int OP, typename S, typename C>
__device__ __forceinline__ void binary_ts(const S* x, C s, S* z, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        st(z + i, apply<OP>(ld(x[i]), s));
}
"""
_INT_HEADER = r"""
/* int64 arithmetic wraps around, as PyTorch's (unsigned: signed overflow is undefined in C++) */
template <int OP> __device__ __forceinline__ long long apply_int(long long x, long long y) {
    const unsigned long long a = (unsigned long long)x, b = (unsigned long long)y;
    return (long long)(OP == 0 ? a + b : OP == 1 ? a - b : a * b);
}
template <int OP> __device__ __forceinline__ void int_tt(const long long* x, const long long* y, long long* z, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        z[i] = apply_int<OP>(x[i], y[i]);
}
template <int OP> __device__ __forceinline__ void int_ts(const long long* x, long long s, long long* z, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        z[i] = apply_int<OP>(x[i], s);
}
"""
OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}
INT_OPS = ("add", "sub", "mul")      # int64 division is true division (a float result): the general path
# storage dtype -> (kernel suffix, C storage type, C compute type, NumPy type of the scalar argument)
TYPES = {np.dtype(np.float32): ("f32", "float", "float", np.float32),
         np.dtype(np.float64): ("f64", "double", "double", np.float64),
         np.dtype(np.float16): ("f16", "f16_t", "float", np.float32),
         np.dtype(ml_dtypes.bfloat16): ("bf16", "bf16_t", "float", np.float32)}
INT64 = np.dtype(np.int64)
_INT_SPEC = ("i64", "long long", "long long", np.int64)     # as TYPES (not among them: no int64 casts)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
THREADS = 256
MAX_BLOCKS = 1 << 16          # grid-stride loop beyond this many blocks
# Larger float16/bfloat16 arrays take the general path: these one-element-per-thread kernels move 2 bytes
# a thread (a GPT-2 step, bf16 activations of 6.3M elements, was not faster with them on an H200). Float32,
# float64 and int64 arrays of any size take the kernel: CuPy's own elementwise kernels walk them the same
# way, one element a thread, after ~14 us of ufunc host time (GPT-2's residual-gradient sums: 25 float32
# adds of 6.3M elements a step)
MAX_ELEMENTS = 1 << 20
_SCALAR_LIMIT = 1 << 53       # a Python int beyond this is not exactly a float: the general path takes it
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _source() -> str:
    lines = [_HEADER, _INT_HEADER]
    for op in INT_OPS:
        code = OPS[op]
        lines.append(f'extern "C" __global__ void flm_{op}_tt_i64(const long long* x, const long long* y, long long* z, '
                     f'long long n) {{ int_tt<{code}>(x, y, z, n); }}')
        lines.append(f'extern "C" __global__ void flm_{op}_ts_i64(const long long* x, long long s, long long* z, '
                     f'long long n) {{ int_ts<{code}>(x, s, z, n); }}')
    for op, code in OPS.items():
        for suffix, s, c, _ in TYPES.values():
            lines.append(f'extern "C" __global__ void flm_{op}_tt_{suffix}(const {s}* x, const {s}* y, {s}* z, '
                         f'long long n) {{ binary_tt<{code}, {s}, {c}>(x, y, z, n); }}')
            lines.append(f'extern "C" __global__ void flm_{op}_ts_{suffix}(const {s}* x, {c} s, {s}* z, '
                         f'long long n) {{ binary_ts<{code}, {s}, {c}>(x, s, z, n); }}')
    return "\n".join(lines)


_module: list = []            # the compiled RawModule, per process (CuPy caches the binary on disk)
_functions: dict = {}         # (op, dtype, "tt"/"ts", device id) -> its kernel (triton_launch.Kernel)
_device_id: list = []         # CuPy's cached current-device query (the runtime's where CuPy lacks it)


_SCALAR_TYPES = {np.float32: "fp32", np.float64: "fp64", np.int64: "i64"}   # the scalar parameter's type in a launch


def _function(cupy, name: str, dt: np.dtype, kind: str, dev: int) -> TL.Kernel:
    key = (name, dt, kind, dev)
    f = _functions.get(key)
    if f is None:
        if not _module:
            _module.append(cupy.RawModule(code=_source(), options=("--std=c++14",)))
        spec = TYPES.get(dt) or _INT_SPEC
        fn = _module[0].get_function(f"flm_{name}_{kind}_{spec[0]}").kernel      # the loaded Function
        second = "*" if kind == "tt" else _SCALAR_TYPES[spec[3]]
        f = _functions[key] = TL.raw_kernel(fn, ("*", second, "*", "i64"), THREADS)
    return f


def _launch(f, n: int, args: tuple) -> None:
    """One launch of a grid-stride kernel over n elements (through the driver: `triton_launch.launch`)."""
    blocks = (n + THREADS - 1) // THREADS
    TL.launch(f, (blocks if blocks < MAX_BLOCKS else MAX_BLOCKS,), *args)


def dense_strides(a):
    """a's element strides when they cover exactly a.size elements from the first, none twice (a
    channels-last activation: a kernel may walk it as memory); else False."""
    it = a.itemsize
    strides = tuple(b // it for b in a.strides)
    acc = 1
    for st, n in sorted((st, n) for n, st in zip(a.shape, strides) if n != 1):
        if st != acc:
            return False
        acc *= n
    return strides


def new_in_layout(cupy, shape, dtype, strides):
    """A new CuPy array of `shape` with these dense element strides."""
    n = 1
    for d in shape:
        n *= d
    it = np.dtype(dtype).itemsize
    return cupy.lib.stride_tricks.as_strided(cupy.ndarray((n,), dtype), tuple(shape), tuple(s * it for s in strides))


def binary(cupy, a, b, name: str, into=None):
    """`a <name> b` for CuPy array `a` and a CuPy array `b` of its shape and dtype, or a Python
    int/float `b`, both C-contiguous or of one dense layout (channels-last), on the current device;
    the result in that layout; None when these operands are not handled here (the caller computes it the general way). `cupy` is the cuda array namespace the
    dispatcher passes to kernels (this module imports no CuPy, so CPU-only machines load it too).
    `into=a`: the result written over `a` itself (each element reads and writes its own position, so the
    kernel may alias them; BatchNorm's num_batches_tracked += 1), `a` returned; any other array: None."""
    _ndarray = getattr(cupy, "ndarray", None)
    if type(a) is not _ndarray or (into is not None and into is not a):
        return None
    dt = a.dtype
    spec = TYPES.get(dt)
    if spec is None and dt == INT64 and name in INT_OPS:
        spec = _INT_SPEC
    n = a.size
    if spec is None or not n or (n > MAX_ELEMENTS and a.itemsize < 4):
        return None
    strides = None if a._c_contiguous else dense_strides(a)      # CuPy's attribute (`flags`: a new object)
    if strides is False:
        return None
    if not _device_id:
        _device_id.append(getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice))
    dev = _device_id[0]()
    if a.data.device_id != dev:
        return None
    tb = type(b)
    if tb is _ndarray:
        if b.dtype != dt or b.shape != a.shape or b.data.device_id != dev or \
                not (b._c_contiguous if strides is None else dense_strides(b) == strides):
            return None
        out = into if into is not None else _ndarray(a.shape, dt) if strides is None else \
            new_in_layout(cupy, a.shape, dt, strides)
        _launch(_function(cupy, name, dt, "tt", dev), n, (a, b, out, n))
        return out
    if spec is _INT_SPEC:             # an int64 array with a Python int in its range (a float promotes)
        if tb is not int or not _INT64_MIN <= b <= _INT64_MAX:
            return None
        out = into if into is not None else _ndarray(a.shape, dt) if strides is None else \
            new_in_layout(cupy, a.shape, dt, strides)
        _launch(_function(cupy, name, dt, "ts", dev), n, (a, b, out, n))
        return out
    if tb is float or (tb is int and -_SCALAR_LIMIT <= b <= _SCALAR_LIMIT):
        c = spec[3]
        if name == "div":
            if b == 0:
                return None
            # PyTorch divides by a Python number as a product with its reciprocal (BinaryDivTrueKernel.cu),
            # which rounds differently from x / s; the reciprocal of the number as a double, then
            # rounded to the op-math type, is what PyTorch 2.11 gives on cuda (1 / 0.001 -> 1000.0f)
            try:
                v = 1.0 / b
            except OverflowError:
                return None
            name = "mul"
        else:
            v = b
        # a number beyond float32 (or inf/nan) takes the general path: NumPy's cast of it warns, and
        # the dispatcher does not silence NumPy's FP errors around cuda kernels
        if c is np.float32 and not -_FLOAT32_MAX <= v <= _FLOAT32_MAX:
            return None
        s = c(v)
        out = into if into is not None else _ndarray(a.shape, dt) if strides is None else \
            new_in_layout(cupy, a.shape, dt, strides)
        _launch(_function(cupy, name, dt, "ts", dev), n, (a, s, out, n))
        return out
    return None
