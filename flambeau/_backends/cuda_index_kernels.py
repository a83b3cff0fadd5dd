"""CUDA kernels for index-driven reductions that CuPy would run with host synchronisations.

`embedding_backward(grad, indices, num_weights, padding_idx, counts)`: the weight gradient of an
embedding, one thread per gradient element adding into its row with atomicAdd in float32 (float64
for float64 gradients): no `bincount` (CuPy's reads max(indices) on the host, and the old path
accumulated a float64 copy of the gradient). Rows outside [0, num_weights) are skipped (the forward's
device-side check reports them); `padding_idx` rows get no gradient; with `scale_grad_by_freq`, each
contribution is divided by its row's count from `row_counts`. Atomic accumulation makes the order of
float additions, hence the last bits, vary between runs (PyTorch's CUDA kernel sorts instead).

`scatter_add(index, values, length)`: `bincount(index, weights=values, minlength=length)` for a length
known in advance (every index in range), one atomicAdd per value in values' dtype (float32/float64):
the adjoint of the pooling/resampling gathers without CuPy's host read of max(index).
"""
from __future__ import annotations

_SOURCE = r"""
template <typename T, bool SCALE>
__device__ void embedding_backward(const T* __restrict__ g, const long long* __restrict__ idx, T* out,
                                   const int* __restrict__ counts, long long n, long long dim, long long rows,
                                   long long padding_idx) {
    const long long total = n * dim;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / dim;
        const long long r = idx[i];
        if (r < 0 || r >= rows || r == padding_idx) continue;
        T v = g[e];
        if (SCALE) v /= (T)counts[r];
        atomicAdd(out + r * dim + (e - i * dim), v);
    }
}

extern "C" __global__ void row_counts(const long long* idx, int* counts, long long n, long long rows) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = idx[i];
        if (r >= 0 && r < rows) atomicAdd(counts + r, 1);
    }
}

template <typename T>
__device__ void scatter_add(const long long* __restrict__ idx, const T* __restrict__ v, T* out, long long n,
                            long long length) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = idx[i];
        if (r >= 0 && r < length) atomicAdd(out + r, v[i]);
    }
}
extern "C" __global__ void scatter_add_f32(const long long* idx, const float* v, float* out, long long n,
                                           long long length) { scatter_add<float>(idx, v, out, n, length); }
extern "C" __global__ void scatter_add_f64(const long long* idx, const double* v, double* out, long long n,
                                           long long length) { scatter_add<double>(idx, v, out, n, length); }

#define EMB(NAME, T, S) extern "C" __global__ void NAME(const T* g, const long long* idx, T* out, const int* counts, \
    long long n, long long dim, long long rows, long long padding_idx) { \
    embedding_backward<T, S>(g, idx, out, counts, n, dim, rows, padding_idx); }
EMB(embedding_backward_f32, float, false)
EMB(embedding_backward_f32_scaled, float, true)
EMB(embedding_backward_f64, double, false)
EMB(embedding_backward_f64_scaled, double, true)
"""
THREADS = 256
MAX_BLOCKS = 4096

_module: list = []


def _kernel(name):
    import cupy  # deferred: optional dependency, present only where cuda is used
    if not _module:
        _module.append(cupy.RawModule(code=_SOURCE, options=("--std=c++14",)))
    return _module[0].get_function(name)


def _grid(n):
    return (max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)),), (THREADS,)


def embedding_backward(grad, indices, num_weights: int, padding_idx: int, scale_grad_by_freq: bool):
    """(num_weights, dim) gradient of an embedding's weight from CuPy `grad` (..., dim) and `indices`."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    dim = grad.shape[-1]
    idx = cupy.ascontiguousarray(indices.reshape(-1)).astype(cupy.int64, copy=False)
    wide = cupy.float64 if grad.dtype == cupy.float64 else cupy.float32
    g = cupy.ascontiguousarray(grad.reshape(idx.size, dim)).astype(wide, copy=False)
    out = cupy.zeros((num_weights, dim), dtype=wide)
    n = idx.size
    counts = cupy.zeros(num_weights if scale_grad_by_freq else 1, dtype=cupy.int32)
    if scale_grad_by_freq:
        _kernel("row_counts")(*_grid(n), (idx, counts, cupy.int64(n), cupy.int64(num_weights)))
    name = "embedding_backward_" + ("f64" if wide == cupy.float64 else "f32") + ("_scaled" if scale_grad_by_freq else "")
    if n * dim:
        _kernel(name)(*_grid(n * dim), (g, idx, out, counts, cupy.int64(n), cupy.int64(dim), cupy.int64(num_weights),
                                        cupy.int64(padding_idx)))
    return out.astype(grad.dtype, copy=False)


def scatter_add(index, values, length: int):
    """A new (length,) array of values' dtype (float32 or float64) with out[index[i]] += values[i]."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    idx = cupy.ascontiguousarray(index.reshape(-1)).astype(cupy.int64, copy=False)
    wide = cupy.float32 if values.dtype == cupy.float32 else cupy.float64
    v = cupy.ascontiguousarray(values.reshape(-1)).astype(wide, copy=False)
    out = cupy.zeros(length, dtype=wide)
    n = idx.size
    if n:
        _kernel("scatter_add_" + ("f32" if wide == cupy.float32 else "f64"))(
            *_grid(n), (idx, v, out, cupy.int64(n), cupy.int64(length)))
    return out
