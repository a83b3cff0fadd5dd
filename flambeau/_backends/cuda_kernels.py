"""Fused CUDA kernels for ops that CuPy would run as several passes (compiled by CuPy's NVRTC at
first use and cached by CuPy).

softmax / log_softmax over the last dimension of a contiguous float32/float64 array: one thread block
per row computes the row's max and sum of exponentials with warp shuffles and writes the result in
the same kernel — one read of the input for rows that fit in registers/L1, instead of CuPy's five
kernels (max, subtract, exp, sum, divide) with their temporaries.
"""
from __future__ import annotations

_SOURCE = r"""
template <typename T> __device__ T neg_inf();
template <> __device__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ double neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ULL); }
template <typename T> __device__ T flm_exp(T x);
template <> __device__ float flm_exp<float>(float x) { return expf(x); }
template <> __device__ double flm_exp<double>(double x) { return exp(x); }
template <typename T> __device__ T flm_log(T x);
template <> __device__ float flm_log<float>(float x) { return logf(x); }
template <> __device__ double flm_log<double>(double x) { return log(x); }

template <typename T>
__device__ T block_reduce(T v, bool is_max, T* shared) {
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_down_sync(0xffffffffu, v, o);
        v = is_max ? (w > v ? w : v) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? shared[lane] : (is_max ? neg_inf<T>() : T(0));
        for (int o = 16; o > 0; o >>= 1) {
            T w = __shfl_down_sync(0xffffffffu, v, o);
            v = is_max ? (w > v ? w : v) : v + w;
        }
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    return shared[0];
}

template <typename T, bool LOG>
__device__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, long long cols) {
    __shared__ T shared[32];
    const T* xr = x + (long long)blockIdx.x * cols;
    T* yr = y + (long long)blockIdx.x * cols;
    T m = neg_inf<T>();
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
    m = block_reduce<T>(m, true, shared);
    T s = 0;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += flm_exp<T>(xr[j] - m);
    s = block_reduce<T>(s, false, shared);
    if (LOG) {
        const T ls = flm_log<T>(s);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] - m - ls;
    } else {
        const T inv = T(1) / s;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = flm_exp<T>(xr[j] - m) * inv;
    }
}

extern "C" __global__ void softmax_f32(const float* x, float* y, long long cols) { softmax_rows<float, false>(x, y, cols); }
extern "C" __global__ void log_softmax_f32(const float* x, float* y, long long cols) { softmax_rows<float, true>(x, y, cols); }
extern "C" __global__ void softmax_f64(const double* x, double* y, long long cols) { softmax_rows<double, false>(x, y, cols); }
extern "C" __global__ void log_softmax_f64(const double* x, double* y, long long cols) { softmax_rows<double, true>(x, y, cols); }
"""

_module = []


def _kernel(name):
    import cupy  # deferred: optional dependency, present only where cuda is used
    if not _module:
        _module.append(cupy.RawModule(code=_SOURCE, options=("--std=c++14",)))
    return _module[0].get_function(name)


def softmax_lastdim(x, log: bool):
    """softmax (or log_softmax) of CuPy array `x` over its last dim; None when not handled here."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if x.dtype not in (cupy.float32, cupy.float64) or x.ndim == 0 or x.size == 0 or not x.flags.c_contiguous:
        return None
    cols = x.shape[-1]
    rows = x.size // cols
    if rows >= 1 << 31:
        return None
    y = cupy.empty_like(x)
    threads = 32
    while threads < 1024 and threads < cols:
        threads *= 2
    threads = min(threads, 1024 if cols >= 4096 else 256 if cols >= 256 else threads)
    name = ("log_softmax_" if log else "softmax_") + ("f32" if x.dtype == cupy.float32 else "f64")
    _kernel(name)((rows,), (threads,), (x, y, cupy.int64(cols)))
    return y
