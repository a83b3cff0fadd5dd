"""Compile a `@triton.jit` function with `triton.compile` and launch it through CuPy, without PyTorch.

Triton's own launcher (`kernel[grid](...)`) asks its active driver for the current device and
stream, and that driver imports torch. We never use it: `compile_kernel` builds a cubin for the
current device's compute capability from an explicit signature (argument types, constexpr values,
16-byte divisibility hints), loads it as a CuPy module, and `launch` calls it on CuPy's current
stream with Triton's calling convention: the non-constexpr arguments in order, then the two
scratch pointers Triton 3.x appends (global and profile scratch, null when the kernel needs none).
Compiled kernels are cached per (function, signature, constexprs, options) in this process, and
Triton's on-disk cache makes a second process cheap.

Pointer arguments are passed as CuPy arrays (CuPy hands the kernel their data pointers), `Ptr(address)`
or None (a null pointer); integers and floats by their signature type. The conversion of each
argument is chosen once per compiled kernel, so a launch costs little more than CuPy's own
`Function` call (about 8 us of host time on an H200 against 15.6 before; `bench/cuda_host_profile.py ops`).
"""
from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

_SMEM_STATIC_LIMIT = 48 * 1024     # bytes of shared memory a launch may use without opting in
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_THREADS_PER_WARP = 32
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _fp32(v):
    """A float32 argument; a number beyond float32 becomes +-inf without NumPy's overflow warning (the
    dispatcher does not silence NumPy's FP errors around cuda kernels)."""
    if -_FLOAT32_MAX <= v <= _FLOAT32_MAX:
        return np.float32(v)
    with np.errstate(over="ignore"):
        return np.float32(v)


_SCALARS = {"i32": np.int32, "i64": np.int64, "u32": np.uint32, "u64": np.uint64, "fp32": _fp32,
            "fp64": np.float64}
_MULTIPROCESSOR_COUNT = 16          # cudaDevAttrMultiProcessorCount
_cache: dict = {}
_sm_counts: dict = {}
_lock = threading.Lock()


class Ptr(NamedTuple):
    """A device address passed to a pointer parameter."""
    address: int


class Kernel(NamedTuple):
    function: Any           # cupy.cuda.Function
    module: Any             # the cupy.cuda.Module holding it (kept alive with it)
    arg_types: tuple        # signature types of the runtime arguments, in order
    num_warps: int
    shared: int
    scratch: int            # number of trailing scratch pointers (global, profile)
    global_scratch: int     # bytes of global scratch each program needs (0: none)
    converters: tuple       # per runtime argument: the function making what CuPy's launch takes


_NULL = np.uint64(0)


def _pointer(a):
    """A pointer argument: a CuPy array as it is (CuPy passes its data pointer), `Ptr`, or None."""
    if a is None:
        return _NULL
    if type(a) is Ptr:
        return np.uint64(a.address)
    return a


def converters(arg_types: tuple) -> tuple:
    """What `launch` applies to each runtime argument of a kernel with these signature types."""
    return tuple(_pointer if ty.startswith("*") else _SCALARS[ty] for ty in arg_types)


def type_of(dtype) -> str:
    """The Triton pointer element type of a NumPy dtype (float32 -> "fp32"), from a table keyed by the
    dtype object (NumPy's `dtype.name` costs a few microseconds per read)."""
    t = _TYPE_OF.get(dtype)
    if t is None:
        t = _TYPE_OF[dtype] = _TYPE_NAMES.get(np.dtype(dtype).name)
        if t is None:
            del _TYPE_OF[dtype]
            raise KeyError(f"no Triton type for dtype {dtype}")
    return t


_TYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int32": "i32",
               "int64": "i64", "int8": "i8", "uint8": "u8", "int16": "i16", "bool": "i1"}
_TYPE_OF: dict = {}
_device_id: list = []       # CuPy's current-device query, looked up once


def current_device() -> int:
    """The current cuda device index through CuPy's cached query (`cupy.cuda.Device()` builds an object)."""
    if not _device_id:
        import cupy  # deferred: optional dependency, present only where cuda is used
        _device_id.append(getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice))
    return _device_id[0]()


def available() -> bool:
    """Whether Triton and CuPy can be imported (no GPU is touched)."""
    try:
        import triton  # noqa: F401  deferred: optional dependency, present only where cuda is used
        import cupy  # noqa: F401  deferred: optional dependency, present only where cuda is used
    except ImportError:
        return False
    return True


def multiprocessors() -> int:
    """The current device's multiprocessor count, read once per device (CuPy's `Device.attributes`
    queries every attribute on each use)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    dev = cupy.cuda.runtime.getDevice()
    n = _sm_counts.get(dev)
    if n is None:
        n = _sm_counts[dev] = cupy.cuda.runtime.deviceGetAttribute(_MULTIPROCESSOR_COUNT, dev)
    return n


def _target():
    import cupy  # deferred: optional dependency, present only where cuda is used
    from triton.backends.compiler import GPUTarget  # deferred: optional dependency (cuda only)
    dev = cupy.cuda.Device()
    major, minor = dev.compute_capability[:-1], dev.compute_capability[-1]
    return GPUTarget("cuda", int(major) * 10 + int(minor), _THREADS_PER_WARP)


def compile_kernel(fn, signature: dict, constexprs: dict, *, num_warps: int = 4, num_stages: int = 3,
                   aligned: tuple = ()) -> Kernel:
    """Compile `fn` for the current device. `signature` maps every parameter name to a Triton type
    (`*bf16`, `i32`, `fp32`, ... or `constexpr`); `constexprs` gives the constexpr values; the
    parameters named in `aligned` are promised to be multiples of 16 (pointers: 16-byte aligned)."""
    key = (fn, tuple(signature.items()), tuple(sorted(constexprs.items())), num_warps, num_stages, aligned,
           current_device())
    k = _cache.get(key)
    if k is not None:
        return k
    with _lock:
        k = _cache.get(key)
        if k is None:
            k = _cache[key] = _build(fn, signature, constexprs, num_warps, num_stages, aligned)
    return k


def _build(fn, signature, constexprs, num_warps, num_stages, aligned) -> Kernel:
    import cupy  # deferred: optional dependency, present only where cuda is used
    import triton  # deferred: optional dependency, present only where cuda is used
    from triton.compiler import ASTSource  # deferred: optional dependency, present only where cuda is used
    names = list(fn.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn, dict(signature), dict(constexprs), attrs)
    compiled = triton.compile(src, target=_target(), options={"num_warps": num_warps, "num_stages": num_stages})
    md = compiled.metadata
    module = cupy.cuda.Module()
    module.load(compiled.asm["cubin"])
    function = module.get_function(md.name)
    if md.shared > _SMEM_STATIC_LIMIT:
        cupy.cuda.driver.funcSetAttribute(function.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, md.shared)
    arg_types = tuple(signature[n] for n in names if signature[n] != "constexpr")
    return kernel_of(function, module, arg_types, md.num_warps, md.shared, md.global_scratch_size)


def kernel_of(function, module, arg_types: tuple, num_warps: int, shared: int, global_scratch: int) -> Kernel:
    """The one way to make a `Kernel` from a loaded cubin's function (this module's kernels and the
    inductor's): its argument converters derive from its signature types."""
    return Kernel(function, module, arg_types, num_warps, shared, 2, global_scratch, converters(arg_types))


def pack(kernel: Kernel, args: tuple) -> list:
    """The runtime arguments as CuPy's launch takes them (see `converters`)."""
    return [f(a) for f, a in zip(kernel.converters, args)]


def launch(kernel: Kernel, grid: tuple, *args) -> None:
    """Run `kernel` over `grid` (up to 3 dims) on CuPy's current stream."""
    if len(args) != len(kernel.arg_types):
        raise TypeError(f"{kernel.function} takes {len(kernel.arg_types)} runtime arguments, got {len(args)}")
    n = len(grid)
    g0 = int(grid[0])
    g1 = int(grid[1]) if n > 1 else 1
    g2 = int(grid[2]) if n > 2 else 1
    if not (g0 and g1 and g2):
        return
    packed = pack(kernel, args)
    if kernel.global_scratch:
        import cupy  # deferred: optional dependency, present only where cuda is used
        packed.append(cupy.empty(kernel.global_scratch * g0 * g1 * g2, dtype=np.uint8))
    else:
        packed.append(_NULL)
    packed.append(_NULL)                # profile scratch: no instrumentation
    kernel.function((g0, g1, g2), (kernel.num_warps * _THREADS_PER_WARP, 1, 1), tuple(packed),
                    shared_mem=kernel.shared)
