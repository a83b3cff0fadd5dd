"""flambeau.cuda: device queries, synchronisation, RNG seeding, memory statistics, streams and
events, over CuPy. Everything answers sensibly (False, 0) on a machine without a GPU."""
from __future__ import annotations

_current = 0


def _cupy():
    import cupy
    return cupy


def is_available() -> bool:
    from .._backends import cupy_available
    return cupy_available()


def device_count() -> int:
    try:
        return _cupy().cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def current_device() -> int:
    return _current


def set_device(device) -> None:
    global _current
    from .._device import device as Device
    idx = device.index if isinstance(device, Device) else (int(str(device).split(":")[-1]) if isinstance(device, str) else int(device))
    _current = idx or 0
    _cupy().cuda.Device(_current).use()


def synchronize(device=None) -> None:
    _cupy().cuda.Device(_current if device is None else int(str(device).split(":")[-1]) if not isinstance(device, int) else device).synchronize()


def is_initialized() -> bool:
    return is_available()
