"""Third-party devices (PyTorch's PrivateUse1): name the device type, give it an array backend,
and generate the `Tensor.is_<name>` / `Tensor.<name>()` / `Module.<name>()` methods.

    flambeau.utils.rename_privateuse1_backend("npu")
    flambeau.utils.register_privateuse1_array_backend(xp)      # the device's array namespace
    flambeau.utils.generate_methods_for_privateuse1_backend()
    x = flambeau.randn(2, 3, device="npu"); y = x + x          # every kernel runs over `xp`

A device is what cpu (NumPy) and cuda (CuPy) are: an array namespace that every operator kernel
is written against (`xp.add`, `xp.matmul`, ...), plus how host data become device arrays (the
allocator, `asarray`) and come back (`to_numpy`). Kernels of single operators are replaced per
device with `flambeau.library.Library("aten", "IMPL").impl("add.Tensor", fn, "PrivateUse1")`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _backends, _device
from .._tensor import Tensor
from ..nn.modules.module import Module
from ..storage import UntypedStorage

__all__ = ["rename_privateuse1_backend", "register_privateuse1_array_backend",
           "generate_methods_for_privateuse1_backend"]


def rename_privateuse1_backend(backend_name: str) -> None:
    """Name the PrivateUse1 device type: `flambeau.device(backend_name)` becomes valid."""
    _device.rename_privateuse1(backend_name)


class ArrayBackend(_backends.Backend):
    """A third-party device: its array namespace, allocator and copy to the host."""

    def __init__(self, name: str, xp, asarray: Callable | None, to_numpy: Callable | None):
        super().__init__(name, xp)
        self._asarray, self._to_numpy = asarray, to_numpy

    def asarray(self, data, np_dtype):
        if self._asarray is not None:
            return self._asarray(data, np_dtype)
        return self.xp.asarray(data, dtype=np_dtype)

    def to_numpy(self, arr):
        return self._to_numpy(arr) if self._to_numpy is not None else np.asarray(arr)


def register_privateuse1_array_backend(xp, *, asarray: Callable | None = None,
                                       to_numpy: Callable | None = None) -> None:
    """Run the renamed PrivateUse1 device's tensors over the array namespace `xp`.

    `asarray(data, numpy_dtype)` makes a device array from host data (default `xp.asarray`),
    `to_numpy(array)` copies one back (default `numpy.asarray`)."""
    name = _device.privateuse1_name()
    if name == "privateuseone":
        raise RuntimeError("register_privateuse1_array_backend: call "
                           "flambeau.utils.rename_privateuse1_backend(name) first")
    _backends.register_backend(name, ArrayBackend(name, xp, asarray, to_numpy))


def _tensor_methods(name: str) -> None:
    def is_device(self) -> bool:
        return self.device.type == name

    def to_device(self, device=None, non_blocking: bool = False, **kwargs) -> Tensor:
        if isinstance(device, int):
            device = f"{name}:{device}"
        target = _device.device(device if device is not None else name)
        if target.type != name:
            raise RuntimeError(f"Invalid device, must be {name} device")
        return self.to(target, non_blocking=non_blocking)
    _set_once(Tensor, f"is_{name}", property(is_device))
    _set_once(Tensor, name, to_device)


def _module_methods(name: str) -> None:
    def to_device(self, device=None) -> Module:
        target = _device.device(f"{name}:{device}" if isinstance(device, int) else device or name)
        return self._apply(lambda t: t.to(target))
    _set_once(Module, name, to_device)


def _storage_methods(name: str) -> None:
    def is_device(self) -> bool:
        return self.device.type == name
    _set_once(UntypedStorage, f"is_{name}", property(is_device))


def _set_once(cls, attr: str, value) -> None:
    if attr in cls.__dict__:
        raise RuntimeError(f"The custom device module of {cls.__name__} has already been registered with {attr}")
    setattr(cls, attr, value)


def generate_methods_for_privateuse1_backend(for_tensor: bool = True, for_module: bool = True,
                                             for_packed_sequence: bool = True, for_storage: bool = False,
                                             unsupported_dtype=None) -> None:
    """Add `Tensor.is_<name>`, `Tensor.<name>()`, `Module.<name>()` (and `UntypedStorage.is_<name>`
    with `for_storage`) for the renamed PrivateUse1 device."""
    name = _device.privateuse1_name()
    if for_tensor:
        _tensor_methods(name)
    if for_module:
        _module_methods(name)
    if for_storage:
        _storage_methods(name)

