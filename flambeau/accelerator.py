"""torch.accelerator: the device-generic questions (is there an accelerator, which, how many,
which index is current), answered by cuda when CuPy sees a GPU and by "no accelerator" otherwise.
`get_device_module(device)` is the module of a device type (`flambeau.cuda`, `flambeau.cpu`).
"""
from __future__ import annotations

from . import cpu, cuda
from ._device import device as Device

_DEVICE_MODULES = {"cpu": cpu, "cuda": cuda}


def current_accelerator(check_available: bool = False) -> Device | None:
    """`device("cuda")` when a GPU is usable, else None (as a CPU build of PyTorch answers)."""
    return Device("cuda") if cuda.is_available() else None


def is_available() -> bool:
    return current_accelerator() is not None


def device_count() -> int:
    return cuda.device_count() if is_available() else 0


def _require() -> None:
    if not is_available():
        raise RuntimeError("Cannot access accelerator device when none is available.")


def current_device_index() -> int:
    _require()
    return cuda.current_device()


current_device_idx = current_device_index


def set_device_index(device) -> None:
    _require()
    cuda.set_device(device)


set_device_idx = set_device_index


def synchronize(device=None) -> None:
    _require()
    cuda.synchronize(device)


def current_stream(device=None):
    _require()
    return cuda.current_stream(device)


def empty_cache() -> None:
    if is_available():
        cuda.empty_cache()


class device_index:
    """`with device_index(i)`: make accelerator device `i` current inside the block (None: no-op)."""

    def __init__(self, device: int | None) -> None:
        self.idx = device
        self.prev: int | None = None

    def __enter__(self) -> None:
        if self.idx is not None:
            self.prev = current_device_index()
            set_device_index(self.idx)

    def __exit__(self, *exc) -> None:
        if self.prev is not None:
            set_device_index(self.prev)


def get_device_module(device=None):
    """The module of `device`'s type; with None, the current accelerator's (cpu when none)."""
    if device is None:
        acc = current_accelerator()
        kind = "cpu" if acc is None else acc.type
    elif isinstance(device, (str, Device)):
        kind = Device(device).type
    else:
        raise RuntimeError(f"Invalid value of device '{device}', expect torch.device, str, or None")
    if kind not in _DEVICE_MODULES:
        raise RuntimeError(f"Device '{kind}' does not have a corresponding module registered as 'torch.{kind}'.")
    return _DEVICE_MODULES[kind]
