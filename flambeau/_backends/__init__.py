"""Device backends: where a tensor's memory lives and which array namespace runs its kernels.

`cpu` uses NumPy, `cuda` uses CuPy (imported lazily), `meta` holds shapes only. A backend is a
small record; a third-party device registers one with `register_backend` (PrivateUse1 story).
"""
from __future__ import annotations

import numpy as np


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


class CupyBackend(Backend):
    def __init__(self):
        import cupy
        super().__init__("cuda", cupy)
        from .. import cuda, _dispatch
        cuda._install_allocator()
        _dispatch._XP["cuda"] = cupy

    def asarray(self, data, np_dtype):
        return self.xp.asarray(data, dtype=np_dtype)

    def to_numpy(self, arr):
        return arr.get()


_backends: dict = {"cpu": Backend("cpu", np), "meta": Backend("meta", None, is_meta=True)}


def get(device_type: str) -> Backend:
    b = _backends.get(device_type)
    if b is None:
        if device_type == "cuda":
            try:
                b = _backends["cuda"] = CupyBackend()
            except ImportError as e:
                raise RuntimeError("Torch not compiled with CUDA enabled: flambeau's cuda device "
                                   "needs CuPy (pip install 'flambeau[cuda]')") from e
        else:
            raise RuntimeError(f"no backend registered for device type '{device_type}'")
    return b


def register_backend(name: str, backend: Backend) -> None:
    _backends[name] = backend


def cupy_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
