"""dtype casts between float32/float64/float16/bfloat16 on cuda as one cached raw-kernel launch
(issue 11, item 6: per-op host cost).

`Tensor.to(dtype)` (`_to_copy`) went through `cupy.array(x, dtype=..., copy=True)`: about 14 us of
host time per call on an H200 (`bench/cuda_host_profile.py ops`), and autocast casts every weight
and many activations each step (GPT-2: 273 casts a step, ResNet-50: 113). CuPy's copy kernels also
run with -ftz=true, flushing float32 subnormals (`x.double()` gave 0 for 1e-38), and its float32 to
bfloat16 copies took 4.2 ms of GPU time a GPT-2 step. `cast` takes a C-contiguous CuPy array of
one of the four float dtypes into another one, on the current device, and launches one
kernel compiled once per (source, target) pair. Conversions as PyTorch's cuda copy kernels: widening
is exact, narrowing rounds to nearest-even once (float64 to a half type goes through float32, as
`c10::Half(float)`/`c10::BFloat16(float)` do), NaN becomes bfloat16's 0x7fc0, subnormals are kept
(every conversion is written as PTX without .ftz). NaN payloads are not kept (PyTorch's bfloat16
conversion on sm_80+ makes its own canonical NaN too). A copy into the same dtype (bits kept) and
anything else returns None and takes CuPy.
"""
from __future__ import annotations

import numpy as np

from . import triton_launch as TL
from .cuda_binary import TYPES, THREADS, MAX_BLOCKS, _HEADER as _BINARY_HEADER, dense_strides, new_in_layout

_HEADER = _BINARY_HEADER + r"""
__device__ __forceinline__ float narrow(double v) { float f; asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(v)); return f; }
__device__ __forceinline__ double widen(float v) { double d; asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(v)); return d; }
__device__ __forceinline__ void st(double* p, float v) { *p = widen(v); }
__device__ __forceinline__ void st(float* p, double v) { *p = narrow(v); }
__device__ __forceinline__ void st(f16_t* p, double v) { st(p, narrow(v)); }
__device__ __forceinline__ void st(bf16_t* p, double v) { st(p, narrow(v)); }
template <typename S, typename D>
__device__ __forceinline__ void cast(const S* x, D* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        st(y + i, ld(x[i]));
}
"""


def _source() -> str:
    lines = [_HEADER]
    for src_suffix, s, _, _ in TYPES.values():
        for dst_suffix, d, _, _ in TYPES.values():
            lines.append(f'extern "C" __global__ void flm_cast_{src_suffix}_{dst_suffix}(const {s}* x, {d}* y, '
                         f'long long n) {{ cast<{s}, {d}>(x, y, n); }}')
    return "\n".join(lines)


_module: list = []            # the compiled RawModule, per process (CuPy caches the binary on disk)
_functions: dict = {}         # (source dtype, target dtype, device id) -> its kernel (triton_launch.Kernel)
_device_id: list = []         # CuPy's cached current-device query
_namespace: list = [None, None]   # the CuPy namespace `cast` last checked, and its ndarray type


def _function(cupy, src: np.dtype, dst: np.dtype, dev: int) -> TL.Kernel:
    """The kernel casting `src` to `dst` (two different types of TYPES) on device `dev`, made once."""
    key = (src, dst, dev)
    f = _functions.get(key)
    if f is None:
        if not _module:
            _module.append(cupy.RawModule(code=_source(), options=("--std=c++14",)))
        fn = _module[0].get_function(f"flm_cast_{TYPES[src][0]}_{TYPES[dst][0]}").kernel    # the loaded Function
        f = _functions[key] = TL.raw_kernel(fn, ("*", "*", "i64"), THREADS)
    return f


def cast(cupy, a, dtype, device_index=None):
    """A new copy of CuPy array `a` in NumPy dtype `dtype`, in a's layout, or None when `a` (a dense
    float32/float64/float16/bfloat16 array on the current device: C-contiguous, or any one dense stride
    order such as channels-last, which the kernel walks as memory) or `dtype` is not handled here, or `device_index` (where the copy must go; None: the current device) is another
    device. `cupy` is the cuda array namespace (this module imports no CuPy)."""
    if cupy is not _namespace[0]:
        _ndarray = getattr(cupy, "ndarray", None)
        if type(a) is not _ndarray or getattr(cupy, "__name__", None) != "cupy":   # not a third-party device's
            return None
        _namespace[:] = [cupy, _ndarray]
    elif type(a) is not _namespace[1]:
        return None
    src = a.dtype
    n = a.size
    if not n:
        return None
    # CuPy's own attribute: `a.flags` makes a Flags object per call
    strides = None if a._c_contiguous else dense_strides(a)
    if strides is False:
        return None
    if not _device_id:
        _device_id.append(getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice))
    dev = _device_id[0]()
    data = a.data
    if data.device_id != dev or (device_index is not None and device_index != dev):
        return None
    # one lookup for a pair seen before: only pairs of two different float types get a kernel
    kernel = _functions.get((src, dtype, dev))
    if kernel is None:
        if src == dtype or src not in TYPES or dtype not in TYPES:
            return None
        kernel = _function(cupy, src, dtype, dev)
    out = _namespace[1](a.shape, dtype) if strides is None else new_in_layout(cupy, a.shape, dtype, strides)
    blocks = (n + THREADS - 1) // THREADS
    # the kernel's (pointer, pointer, int64) parameters as their slots take them: no per-argument conversion
    TL.launch_values(kernel, (blocks if blocks < MAX_BLOCKS else MAX_BLOCKS,), (data.ptr, out.data.ptr, n))
    return out
