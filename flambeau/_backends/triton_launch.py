"""Compile a `@triton.jit` function with `triton.compile` and launch it through CuPy, without PyTorch.

Triton's own launcher (`kernel[grid](...)`) asks its active driver for the current device and
stream, and that driver imports torch. We never use it: `compile_kernel` builds a cubin for the
current device's compute capability from an explicit signature (argument types, constexpr values,
16-byte divisibility hints), loads it as a CuPy module, and `launch` calls it on CuPy's current
stream with Triton's calling convention: the non-constexpr arguments in order, then the two
scratch pointers Triton 3.x appends (global and profile scratch, null when the kernel needs none).
Compiled kernels are cached per (function, signature, constexprs, options) in this process, and their
cubins on disk (`cubin_cache`): a second process loads a kernel's cubin from there without calling Triton's
compiler, whose own cache lookup first hashes Triton's sources and libtriton (~0.4 s a process).

Pointer arguments are passed as CuPy arrays (their data pointers are taken), `Ptr(address)` or None
(a null pointer); integers and floats by their signature type. A launch goes straight to the driver's
cuLaunchKernel (`cupy.cuda.driver.launchKernel`) with a parameter block made once per kernel and
thread: one ctypes slot per parameter, of its C type, and the `void*[]` of their addresses; a launch
writes the arguments into the slots (the conversion chosen once per kernel) and hands the block's
address over. CuPy's `Function` call converts and boxes every argument on every launch (about 6 us
for four arguments on an H100 against 3.3 us for the bare driver call, `bench/cuda_host_profile.py
micro`). The blocks are per thread: another thread's launch must not overwrite the slots between
the writes and the driver call, which copies them.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, NamedTuple

import numpy as np

from . import compile_worker, cubin_cache

_SMEM_STATIC_LIMIT = 48 * 1024     # bytes of shared memory a launch may use without opting in
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_THREADS_PER_WARP = 32
_C_TYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
            "fp32": ctypes.c_float, "fp64": ctypes.c_double}
_POINTER = ctypes.c_uint64
_SCRATCH_POINTERS = 2               # Triton 3.x appends the global and the profile scratch pointers
_MULTIPROCESSOR_COUNT = 16          # cudaDevAttrMultiProcessorCount
_cache: dict = {}
_sm_counts: dict = {}
_capabilities: dict = {}            # device index -> compute capability (90)
stats = {"compiled": 0, "cache_hits": 0}    # kernels from triton.compile / from the disk cache (cubin_cache)
_lock = threading.Lock()


def _cupy():
    """CuPy, imported at its first use here (an optional dependency, present only where cuda is used)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    return cupy


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
    converters: tuple       # per runtime argument: the function making what its parameter slot takes
    blocks: dict            # thread id -> ParamBlock


class ParamBlock:
    """cuLaunchKernel's `kernelParams` for one kernel: a ctypes slot per parameter (its C type) and the
    array of the slots' addresses, made once and rewritten by each launch; with the kernel's function
    address, threads per block and shared memory bytes, read once (`_submit` takes them from here)."""
    __slots__ = ("slots", "array", "address", "function", "threads", "shared")

    def __init__(self, c_types: tuple, kernel=None):
        self.slots = tuple(t() for t in c_types)
        self.array = (ctypes.c_void_p * len(c_types))(*[ctypes.addressof(v) for v in self.slots])
        self.address = ctypes.addressof(self.array)
        if kernel is not None:
            self.function = kernel.function.ptr
            self.threads = kernel.num_warps * _THREADS_PER_WARP
            self.shared = kernel.shared


class PointerBlock:
    """`kernelParams` for a kernel whose runtime arguments are all pointers: the values in one
    `uint64[n + scratch]` array, written by a single slice assignment (`values[:n] = addresses`), and the
    array of its elements' addresses. A compiled graph's static launches use it (`triton_runtime`)."""
    __slots__ = ("values", "array", "address")

    def __init__(self, n: int):
        self.values = (_POINTER * (n + _SCRATCH_POINTERS))()
        base, size, total = ctypes.addressof(self.values), ctypes.sizeof(_POINTER), n + _SCRATCH_POINTERS
        self.array = (ctypes.c_void_p * total)(*[base + size * i for i in range(total)])
        self.address = ctypes.addressof(self.array)


def pointers_only(kernel: Kernel) -> bool:
    """Whether every runtime argument of `kernel` is a pointer and it needs no global scratch: what a
    `PointerBlock` launch takes."""
    return not kernel.global_scratch and all(t.startswith("*") for t in kernel.arg_types)


def _address(a) -> int:
    """A pointer argument: a CuPy array (its data pointer), `Ptr`, or None (null)."""
    if a is None:
        return 0
    if type(a) is Ptr:
        return a.address
    return a.data.ptr


def _same(v):
    return v


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def _int32(v):
    """An `i32` argument: ctypes would wrap a value beyond 32 bits silently, so refuse it (a size or
    stride that large needs the kernel compiled with an `i64` parameter)."""
    if _I32_MIN <= v <= _I32_MAX:
        return v
    raise OverflowError(f"triton launch: the integer argument {v} does not fit the kernel's 32-bit (i32) "
                        "parameter; the kernel must be specialised for 64-bit sizes")


def converters(arg_types: tuple) -> tuple:
    """What `launch` applies to each runtime argument of a kernel with these signature types before
    writing it into its slot (ctypes converts numbers; a float beyond float32 becomes +-inf; a 32-bit
    integer out of range raises rather than wrapping)."""
    return tuple(_address if ty.startswith("*") else _int32 if ty == "i32" else _same for ty in arg_types)


def c_types(arg_types: tuple) -> tuple:
    """The ctypes type of each parameter slot: the runtime arguments, then the scratch pointers."""
    return tuple(_POINTER if ty.startswith("*") else _C_TYPES[ty] for ty in arg_types) + \
        (_POINTER,) * _SCRATCH_POINTERS


_get_ident = threading.get_ident


def param_block(kernel: Kernel) -> ParamBlock:
    """The calling thread's parameter block of `kernel`."""
    tid = _get_ident()
    blk = kernel.blocks.get(tid)
    if blk is None:
        blk = kernel.blocks[tid] = ParamBlock(c_types(kernel.arg_types), kernel)
    return blk


_driver: list = []          # (cuLaunchKernel, current stream pointer), looked up at the first launch


def _driver_calls():
    if not _driver:
        cupy = _cupy()
        _driver[:] = [cupy.cuda.driver.launchKernel, lambda: cupy.cuda.get_current_stream().ptr]
    return _driver


def current_stream() -> int:
    """The pointer of CuPy's current stream (the one `launch` queues on)."""
    return (_driver or _driver_calls())[1]()


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
        cupy = _cupy()
        _device_id.append(getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice))
    return _device_id[0]()


def available() -> bool:
    """Whether Triton and CuPy can be imported (no GPU is touched). Answered once per process: the eager
    cuda ops ask before each fused kernel (about 240 times a ResNet-50 step), and where a package is
    missing each import attempt searches the whole path again."""
    if not _available:
        try:
            import triton  # noqa: F401  deferred: optional dependency, present only where cuda is used
            import cupy  # noqa: F401  deferred: optional dependency, present only where cuda is used
        except ImportError:
            _available.append(False)
        else:
            _available.append(True)
    return _available[0]


_available: list = []


def multiprocessors() -> int:
    """The current device's multiprocessor count, read once per device (CuPy's `Device.attributes`
    queries every attribute on each use)."""
    cupy = _cupy()
    dev = cupy.cuda.runtime.getDevice()
    n = _sm_counts.get(dev)
    if n is None:
        n = _sm_counts[dev] = cupy.cuda.runtime.deviceGetAttribute(_MULTIPROCESSOR_COUNT, dev)
    return n


def _capability() -> int:
    """The current device's compute capability as Triton numbers its targets (sm_90: 90), read once per
    device."""
    dev = current_device()
    cc = _capabilities.get(dev)
    if cc is None:
        cc = _capabilities[dev] = int(_cupy().cuda.Device(dev).compute_capability)
    return cc


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


def cubin_key(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: tuple,
              capability: int) -> str:
    """The disk-cache key (`cubin_cache`) of `fn` compiled with these facts: Triton's hash of its source
    and of the jit functions and global constexprs it uses (`JITFunction.cache_key`), the signature,
    constexprs, options, compute capability and the Triton version."""
    import triton  # deferred: optional dependency (already imported by the module defining `fn`)
    return cubin_cache.key("triton_launch", f"{fn.__module__}.{fn.__qualname__}", fn.cache_key,
                           list(signature.items()), sorted([n, repr(v)] for n, v in constexprs.items()),
                           num_warps, num_stages, sorted(aligned), capability, triton.__version__)


def _build(fn, signature, constexprs, num_warps, num_stages, aligned) -> Kernel:
    """The kernel's cubin from the disk cache (`cubin_cache`: no Triton compiler involved), else from
    `triton.compile`, stored there."""
    capability = _capability()
    ck = cubin_key(fn, signature, constexprs, num_warps, num_stages, aligned, capability)
    entry = cubin_cache.read(ck)
    if entry is None:
        entry = _triton_compile(fn, signature, constexprs, num_warps, num_stages, aligned, capability)
        cubin_cache.write(ck, *entry)
        stats["compiled"] += 1
    else:
        stats["cache_hits"] += 1
    arg_types = tuple(signature[n] for n in fn.arg_names if signature[n] != "constexpr")
    return load_cubin(*entry, arg_types)


def _triton_compile(fn, signature, constexprs, num_warps, num_stages, aligned, capability) -> tuple:
    """(cubin, launch metadata) of `fn` from `triton.compile` for sm_<capability>, Triton's own cache key
    kept on disk (`compile_worker.prime_triton_key`) rather than hashed again in each process."""
    compile_worker.prime_triton_key()
    return compile_worker.triton_compile(fn, signature, constexprs, num_warps, num_stages, aligned, capability)


def load_cubin(cubin: bytes, meta: dict, arg_types: tuple) -> Kernel:
    """Load a cubin (CuPy's module: cuModuleLoadData) and make the `Kernel` launching its function
    `meta["name"]` with `meta`'s warps, shared memory and global scratch (`cubin_cache`'s metadata)."""
    cupy = _cupy()
    module = cupy.cuda.Module()
    module.load(cubin)
    function = module.get_function(meta["name"])
    if meta["shared"] > _SMEM_STATIC_LIMIT:
        cupy.cuda.driver.funcSetAttribute(function.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, meta["shared"])
    return kernel_of(function, module, arg_types, meta["num_warps"], meta["shared"], meta["global_scratch"])


def kernel_of(function, module, arg_types: tuple, num_warps: int, shared: int, global_scratch: int) -> Kernel:
    """The one way to make a `Kernel` from a loaded cubin's function (this module's kernels and the
    inductor's): its argument converters derive from its signature types."""
    return Kernel(function, module, arg_types, num_warps, shared, _SCRATCH_POINTERS, global_scratch,
                  converters(arg_types), {})


def raw_kernel(function, arg_types: tuple, threads: int) -> Kernel:
    """A CUDA C kernel (a loaded `cupy.cuda.Function`: a RawModule kernel's `.kernel`) launched like a
    Triton one, `threads` per block (a multiple of 32). The two scratch slots after its parameters are
    never read: the driver takes as many parameters as the kernel declares."""
    return kernel_of(function, None, arg_types, threads // _THREADS_PER_WARP, 0, 0)


def launch(kernel: Kernel, grid: tuple, *args) -> None:
    """Run `kernel` over `grid` (up to 3 dims) on CuPy's current stream."""
    conv = kernel.converters
    if len(args) != len(conv):
        raise TypeError(f"{kernel.function} takes {len(kernel.arg_types)} runtime arguments, got {len(args)}")
    blk = kernel.blocks.get(_get_ident()) or param_block(kernel)
    slots = blk.slots
    i = 0
    for a in args:          # each argument straight into its slot: arrays' pointers and i32 checks inline
        f = conv[i]
        if f is _address:
            slots[i].value = a.data.ptr if a is not None and type(a) is not Ptr else _address(a)
        elif f is _int32 and not _I32_MIN <= a <= _I32_MAX:
            _int32(a)                   # raises
        else:
            slots[i].value = a
        i += 1
    _submit(kernel, grid, blk, i)


def takes_values(kernel: Kernel) -> bool:
    """Whether every runtime argument of `kernel` is a pointer or an int64, whose slots take a Python
    int as it is (`launch_values` then needs no conversion: a compiled graph's kernels)."""
    return all(t.startswith("*") or t == "i64" for t in kernel.arg_types)


def launch_values(kernel: Kernel, grid: tuple, values) -> None:
    """`launch` with the runtime arguments already as their slots take them (pointers as int addresses,
    integers in range), as many as the kernel's signature has."""
    blk = kernel.blocks.get(_get_ident()) or param_block(kernel)
    slots = blk.slots
    i = 0
    for v in values:
        slots[i].value = v
        i += 1
    _submit(kernel, grid, blk, i)


def _submit(kernel: Kernel, grid: tuple, blk: ParamBlock, nargs: int) -> None:
    """cuLaunchKernel of `kernel` over `grid` with its parameter block `blk`, whose first `nargs` slots
    hold this launch's arguments; an empty grid launches nothing."""
    n = len(grid)
    g0 = int(grid[0])
    g1 = int(grid[1]) if n > 1 else 1
    g2 = int(grid[2]) if n > 2 else 1
    if not (g0 and g1 and g2):
        return
    scratch = None
    if kernel.global_scratch:           # kept alive until the launch is queued (the pool orders reuse)
        cupy = _cupy()
        scratch = cupy.empty(kernel.global_scratch * g0 * g1 * g2, dtype=np.uint8)
        blk.slots[nargs].value = scratch.data.ptr
    # the profile scratch pointer stays null: no instrumentation
    run, stream = _driver or _driver_calls()
    run(blk.function, g0, g1, g2, blk.threads, 1, 1, blk.shared, stream(), blk.address, 0)
    del scratch
