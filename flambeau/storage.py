"""torch.storage: the memory behind tensors, as `Tensor.untyped_storage()` and `Tensor.storage()`
show it. A storage here is the array that owns a tensor's memory (the end of its chain of NumPy or
CuPy bases), so every view of one tensor reports the same storage: same `data_ptr()`, same
`nbytes()`. Libraries use this to find tensors that share memory (tied weights) before saving.
"""
from __future__ import annotations

import numpy as np

from . import _dtype as D
from ._device import device as Device
from ._tensor import MetaArray, Tensor, _ptr, storage_owner

__all__ = ["UntypedStorage", "TypedStorage"]


class UntypedStorage:
    """The bytes owning a tensor's elements."""

    def __init__(self, owner, device: Device) -> None:
        self._owner = owner
        self.device = device

    @classmethod
    def from_file(cls, filename: str, shared: bool = False, nbytes: int = 0) -> UntypedStorage:
        """The first `nbytes` bytes of a file, memory-mapped (copy-on-write unless `shared`)."""
        mapped = np.memmap(filename, dtype=np.uint8, mode="r+" if shared else "c", shape=(nbytes,))
        return cls(mapped.view(np.ndarray), Device("cpu"))   # a plain array: kernels expect ndarray

    def untyped(self) -> UntypedStorage:
        return self

    def __getitem__(self, key):
        """A byte (int key) or the storage of a byte range (slice key, sharing memory)."""
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise RuntimeError("slices with steps are not supported by UntypedStorage")
            return UntypedStorage(self._bytes()[key], self.device)
        return int(self._bytes()[key])

    def _bytes(self):
        """The owner as a flat uint8 array (a view, no copy)."""
        flat = self._owner.reshape(-1)
        return flat if flat.dtype == np.uint8 else flat.view(np.uint8)

    def data_ptr(self) -> int:
        return 0 if type(self._owner) is MetaArray else _ptr(self._owner)

    def nbytes(self) -> int:
        return int(self._owner.nbytes) if type(self._owner) is not MetaArray else 0

    def size(self) -> int:
        return self.nbytes()

    def __len__(self) -> int:
        return self.nbytes()

    def element_size(self) -> int:
        return 1

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def __eq__(self, other) -> bool:
        return isinstance(other, UntypedStorage) and other._owner is self._owner

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"UntypedStorage(nbytes={self.nbytes()}, device={self.device})"


class TypedStorage:
    """A storage seen as elements of one dtype (PyTorch's deprecated `Tensor.storage()`)."""

    def __init__(self, untyped: UntypedStorage, dtype: D.dtype) -> None:
        self._untyped, self.dtype = untyped, dtype
        self.device = untyped.device

    def untyped(self) -> UntypedStorage:
        return self._untyped

    def data_ptr(self) -> int:
        return self._untyped.data_ptr()

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self._untyped.nbytes()

    def size(self) -> int:
        return self.nbytes() // self.element_size()

    def __len__(self) -> int:
        return self.size()

    def __repr__(self) -> str:
        return f"TypedStorage(size={self.size()}, dtype={self.dtype}, device={self.device})"


def _tensor_untyped_storage(self: Tensor) -> UntypedStorage:
    return UntypedStorage(storage_owner(self._data), self.device)


def _tensor_storage(self: Tensor) -> TypedStorage:
    return TypedStorage(_tensor_untyped_storage(self), self.dtype)


Tensor.untyped_storage = _tensor_untyped_storage
Tensor.storage = _tensor_storage
