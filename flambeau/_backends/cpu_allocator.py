"""NumPy's allocation policy for compiled CPU graphs: the caching allocator of `cpu_allocator.cpp`.

`using_cache()` -> token sets NumPy's memory handler (a `PyDataMem_Handler` capsule; NumPy keeps the
current one in a context variable, so only this thread and context are affected) to flambeau's
caching allocator; `restore(token)` puts back the previous one. `CompiledGraph.__call__` brackets
each compiled call with them, so the arrays a compiled graph makes (its outputs, saved activations,
temporaries) take and return blocks of the cache wherever they die, and a training step reuses the
previous step's memory instead of faulting fresh pages in. Other code keeps NumPy's default policy.

Eager kernels run inside a context of their own (`_fp_errors.run_quiet`), where this policy is not
seen; `kernel_runner()` is a runner like `run_quiet` whose context has it (the dispatcher calls kernels
through it while vmap wants cached memory, `_dispatch.use_kernel_runner`).

`kept_bytes()` and `release()` (free everything kept) serve tests and memory-conscious users;
`set_limit(bytes)` bounds what is kept (1 GiB by default). Without a C++ compiler or NumPy's C-API
handler functions, `using_cache()` returns None and nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .. import _cpp_builder, _fp_errors

try:
    from numpy._core import _multiarray_umath as _NUMPY_CORE
except ImportError:      # NumPy 1.x
    from numpy.core import _multiarray_umath as _NUMPY_CORE

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_allocator.cpp")
# PyDataMem_SetHandler's slot in NumPy's C-API table (numpy/__multiarray_api.h; stable since 1.22)
SET_HANDLER_SLOT = 304
DEFAULT_LIMIT = 1 << 30    # bytes of freed blocks kept (cpu_allocator.cpp's initial limit)
_state: dict = {}
_load_lock = threading.Lock()


def _numpy_set_handler():
    """NumPy's PyDataMem_SetHandler as a ctypes function (handler) -> previous handler, or None."""
    try:
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.argtypes, get.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
        table = get(_NUMPY_CORE._ARRAY_API, None)
        addr = ctypes.c_void_p.from_address(table + SET_HANDLER_SLOT * ctypes.sizeof(ctypes.c_void_p)).value
        return ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(addr)
    except (AttributeError, ValueError, OSError):
        return None


def _load():
    """(set_handler, our handler capsule, library) or None (decided once, by one thread: threads
    making their first compiled calls at once share one handler and build the library once)."""
    with _load_lock:
        if "fns" not in _state:
            _state["fns"] = _make()
    return _state["fns"]


def _make():
    """The handler, its capsule and library, built from cpu_allocator.cpp; None without them."""
    fns = None
    setter = _numpy_set_handler() if np.lib.NumpyVersion(np.__version__) >= "1.22.0" else None
    if setter is not None:
        try:
            with open(_SRC) as f:
                lib, _ = _cpp_builder.load(f.read())
            lib.flm_pool_handler.restype = ctypes.c_void_p
            lib.flm_pool_kept.restype = ctypes.c_int64
            lib.flm_pool_set_limit.argtypes = [ctypes.c_int64]
            lib.flm_pool_capsule_name.restype = ctypes.c_void_p
            new = ctypes.pythonapi.PyCapsule_New
            new.argtypes, new.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.py_object
            capsule = new(lib.flm_pool_handler(), lib.flm_pool_capsule_name(), None)
            fns = (setter, capsule, lib)
        except (_cpp_builder.CppCompileError, _cpp_builder.NoCompilerError, OSError):
            fns = None
    return fns


def using_cache():
    """Make NumPy allocate through the cache in this context; returns the token for `restore`, or
    None where the cache is not available."""
    fns = _state.get("fns", 0)
    if fns == 0:
        fns = _load()
    return None if fns is None else fns[0](fns[1])


def restore(token) -> None:
    """Put back the allocation policy `using_cache` replaced."""
    if token is not None:
        _state["fns"][0](token)


def kernel_runner():
    """`_fp_errors.run_quiet`'s counterpart whose kernels allocate through the cache (made once), or None
    where the cache or a kernel context of its own is not available."""
    if "runner" not in _state:
        _state["runner"] = _fp_errors.quiet_runner_with(using_cache) if _load() is not None else None
    return _state["runner"]


def kept_bytes() -> int:
    """Bytes of freed blocks the cache holds for reuse."""
    fns = _load()
    return 0 if fns is None else int(fns[2].flm_pool_kept())


def set_limit(nbytes: int) -> None:
    """Keep at most `nbytes` of freed blocks (others go back to malloc)."""
    if _load() is not None:
        _state["fns"][2].flm_pool_set_limit(int(nbytes))


def release() -> None:
    """Give every kept block back to malloc."""
    if _load() is not None:
        _state["fns"][2].flm_pool_release()
