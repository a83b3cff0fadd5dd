"""Device backends: where a tensor's memory lives and which array namespace runs its kernels.

`cpu` uses NumPy, `cuda` uses CuPy (imported lazily), `meta` holds shapes only. A backend is a
small record; a third-party device registers one with `register_backend` (PrivateUse1 story).
`array_namespaces` (device type -> array namespace) is what the dispatcher reads on its hot path;
a backend enters it when registered or first created. The cuda backend routes CuPy's allocations
through a pool that records the peak in use per device (`peak_bytes`, read by `flambeau.cuda`).

Layer: above `_dtype`/`_device`/`_state` and `_cpp_builder`, below the tensor and the dispatcher; it
imports nothing above it.
"""
from __future__ import annotations

import numpy as np

from . import device_checks
from .._device import canonical


class MetaArray:
    """Stand-in for an array on the meta device: shape, dtype, strides (elements) and offset."""
    __slots__ = ("shape", "dtype", "estrides", "offset")

    def __init__(self, shape, dtype, estrides=None, offset=0):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.estrides = tuple(estrides) if estrides is not None else contiguous_strides(self.shape)
        self.offset = offset

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self):
        return self.dtype.itemsize


def contiguous_strides(shape) -> tuple:
    st = []
    acc = 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1) if not isinstance(s, int) else (s if s > 1 else 1)
    return tuple(reversed(st))


class Backend:
    def __init__(self, name, xp, is_meta=False):
        self.name = name
        self.xp = xp
        self.is_meta = is_meta

    def asarray(self, data, np_dtype):
        return self.xp.asarray(data, dtype=np_dtype)

    def to_numpy(self, arr):
        return arr


class OutOfMemoryError(RuntimeError):
    """A device allocation that failed even after the pool released its cached blocks and the garbage
    collector ran (PyTorch's `torch.OutOfMemoryError`, also `torch.cuda.OutOfMemoryError`)."""


peak_bytes: dict[int, int] = {}     # cuda device index -> most bytes in use at once
extra_bytes: dict[int, int] = {}    # cuda device index -> bytes held by CUDA graph pools (cuda_graphs.py)
_cupy_namespace: list = [None]      # the cupy module once the cuda backend exists (`is_cupy`)
_allocator_installed = []


def install_cuda_allocator() -> None:
    """Route CuPy allocations through its default pool while tracking the peak in use (per device)."""
    if _allocator_installed:
        return
    import cupy  # deferred: optional dependency, present only where cuda is used
    pool = cupy.get_default_memory_pool()
    # CuPy's thread-local current device (no driver call); the runtime query where CuPy lacks it
    device_id = getattr(cupy.cuda.device, "get_device_id", cupy.cuda.runtime.getDevice)

    # bound once: this runs for every allocation (about 1200 a ResNet-50 training step)
    pool_malloc, used_bytes, extra, peak = pool.malloc, pool.used_bytes, extra_bytes.get, peak_bytes.get
    out_of_memory = cupy.cuda.memory.OutOfMemoryError

    def malloc(size):
        try:
            p = pool_malloc(size)
        except out_of_memory as e:
            _out_of_memory(cupy, pool, size, e)
        dev = device_id()
        used = used_bytes() + extra(dev, 0)
        if used > peak(dev, 0):
            peak_bytes[dev] = used
        return p

    cupy.cuda.set_allocator(malloc)
    _allocator_installed.append(True)


def _out_of_memory(cupy, pool, size: int, error):
    """CuPy's pool could not allocate `size` bytes (`error`), having released its cached blocks and run the
    garbage collector first (its `SingleDeviceMemoryPool._try_malloc`: cyclic garbage holding device arrays,
    which flambeau's raised collector threshold (`_gc`) lets live longer, is freed there): raise PyTorch's
    OutOfMemoryError, worded as PyTorch words it."""
    dev = cupy.cuda.runtime.getDevice()
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
    except Exception:               # (the message does without them)
        free = total = None
    held = f"GPU {dev} has a total capacity of {_gib(total)} of which {_gib(free)} is free. " if total else ""
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {_gib(size)}. {held}Of the allocated memory "
        f"{_gib(pool.used_bytes())} is allocated by flambeau, and {_gib(pool.total_bytes() - pool.used_bytes())} "
        f"is reserved by flambeau but unallocated. Free tensors you no longer need (del, then "
        f"flambeau.cuda.empty_cache()), or use a smaller batch.") from error


def _gib(n: int) -> str:
    """`n` bytes as PyTorch's out-of-memory message writes sizes (bytes, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def reset_peak_bytes(device_index: int, used: int) -> None:
    """Start a new peak for `device_index` from `used` bytes (`flambeau.cuda.reset_peak_memory_stats`)."""
    peak_bytes[device_index] = used


class CupyBackend(Backend):
    def __init__(self):
        import cupy  # deferred: optional dependency, present only where cuda is used
        super().__init__("cuda", cupy)
        _cupy_namespace[0] = cupy
        install_cuda_allocator()

    def asarray(self, data, np_dtype):
        return self.xp.asarray(data, dtype=np_dtype)

    def to_numpy(self, arr):
        host = arr.get()
        device_checks.raise_pending()           # a synchronisation: report failed device-side checks
        return host


_backends: dict = {"cpu": Backend("cpu", np), "meta": Backend("meta", None, is_meta=True)}
array_namespaces: dict = {"cpu": np}      # device type -> array namespace, for the dispatcher's hot path


def get(device_type: str) -> Backend:
    b = _backends.get(device_type)
    if b is None:
        if device_type == "cuda":
            try:
                b = _backends["cuda"] = CupyBackend()
                array_namespaces["cuda"] = b.xp
            except ImportError as e:
                raise RuntimeError("Torch not compiled with CUDA enabled: flambeau's cuda device "
                                   "needs CuPy (pip install 'flambeau[cuda]')") from e
        else:
            raise RuntimeError(f"no backend registered for device type '{device_type}'")
    return b


def register_backend(name: str, backend: Backend) -> None:
    """Make `backend` the one of device type `name` (a third-party device: PrivateUse1)."""
    _backends[name] = backend
    if backend.xp is not None:
        array_namespaces[name] = backend.xp


def is_cupy(xp) -> bool:
    """Is `xp` CuPy (the cuda backend's namespace)? Kernels take their GPU-only paths (cuDNN, Triton,
    device-side checks) on CuPy only: a third-party device runs the generic code over its namespace."""
    return xp is _cupy_namespace[0]


def namespace_device(xp):
    """The device (type) whose array namespace is `xp`."""
    return canonical(namespace_backend(xp).name)


def namespace_backend(xp) -> Backend:
    """The registered backend whose array namespace is `xp`."""
    for b in _backends.values():
        if b.xp is xp:
            return b
    raise RuntimeError(f"no backend is registered with the array namespace {xp!r}")


def cuda_device_count() -> int:
    """How many cuda devices CuPy sees (0 without CuPy or a driver); `flambeau.cuda.device_count`."""
    try:
        import cupy  # deferred: optional dependency: its absence means no cuda
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def cupy_available() -> bool:
    return cuda_device_count() > 0
