"""PyTorch's zip checkpoint format (`torch.save`), read and written without importing torch.

Reading uses an unpickler that resolves only an allow-list of globals (OrderedDict, the tensor and
parameter rebuild functions, storage type markers, dtypes, Size, device); anything else is
refused unless `weights_only=False`. Writing emits the same pickle opcodes PyTorch does, naming
`torch._utils._rebuild_tensor_v2` and `torch.<T>Storage` as plain GLOBAL references.
"""
from __future__ import annotations

import collections
import io
import pickle
import zipfile

import numpy as np

from . import _dtype as D
from ._tensor import Tensor, Size

_STORAGE = {"FloatStorage": D.float32, "DoubleStorage": D.float64, "HalfStorage": D.float16,
            "BFloat16Storage": D.bfloat16, "LongStorage": D.int64, "IntStorage": D.int32,
            "ShortStorage": D.int16, "CharStorage": D.int8, "ByteStorage": D.uint8, "BoolStorage": D.bool,
            "ComplexFloatStorage": D.complex64, "ComplexDoubleStorage": D.complex128}
_STORAGE_OF = {v.name: k for k, v in _STORAGE.items()}

_REFUSED = ("Weights only load failed. This file can still be loaded, to do so you have two options, do "
            "those steps only if you trust the source of the checkpoint. Re-running `flambeau.load` with "
            "`weights_only` set to `False` will likely succeed, but it can result in arbitrary code "
            "execution. Do it only if you got the file from a trusted source. Unsupported global: GLOBAL {}")


class _StorageType:
    def __init__(self, dtype):
        self.dtype = dtype


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    arr, dtype = storage
    it = arr.itemsize
    view = np.lib.stride_tricks.as_strided(arr[storage_offset:], tuple(size), tuple(s * it for s in stride))
    from ._device import CPU
    t = Tensor._make(view, CPU, dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_parameter(data, requires_grad, backward_hooks, *state):
    from .nn.parameter import Parameter
    return Parameter(data, requires_grad=requires_grad)


def _device(s, index=None):
    from ._device import device
    return device(s, index)


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): Size,
    ("torch", "device"): _device,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, z, prefix, weights_only):
        super().__init__(f)
        self.z = z
        self.prefix = prefix
        self.weights_only = weights_only
        self.storages = {}

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE:
            return _StorageType(_STORAGE[name])
        if module == "torch" and name in D.BY_NAME:
            return D.BY_NAME[name]
        if self.weights_only or module.split(".")[0] == "torch":
            raise pickle.UnpicklingError(_REFUSED.format(f"{module}.{name}"))
        return super().find_class(module, name)

    def persistent_load(self, pid):
        kind, stype, key, location, numel = pid
        if kind != "storage" or not isinstance(stype, _StorageType):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid[:2]!r}")
        if key not in self.storages:
            raw = self.z.read(f"{self.prefix}data/{key}")
            arr = np.frombuffer(raw, dtype=stype.dtype.np).copy()
            if arr.size < numel:
                raise RuntimeError(f"checkpoint storage {key} is truncated ({arr.size} < {numel} elements)")
            self.storages[key] = (arr, stype.dtype)
        return self.storages[key]


def loads_pt(z: zipfile.ZipFile, names, *, weights_only: bool):
    pkl = [n for n in names if n.endswith("data.pkl")]
    if not pkl:
        raise RuntimeError("flambeau.load: not a flambeau or PyTorch checkpoint (no data.pkl in the archive)")
    prefix = pkl[0][:-len("data.pkl")]
    return _Unpickler(io.BytesIO(z.read(pkl[0])), z, prefix, weights_only).load()


# ---- writing ---------------------------------------------------------------------------------
class _Global:
    _cache: dict = {}

    def __new__(cls, module, name):
        key = (module, name)
        if key not in cls._cache:
            g = object.__new__(cls)
            g.module, g.name = module, name
            cls._cache[key] = g
        return cls._cache[key]


    def __call__(self, *a):  # pickle requires reduce functions to be callable; never called here
        raise RuntimeError(f"{self.module}.{self.name} is a pickle reference, not a function")


class _StorageRef:
    def __init__(self, key, dtype, numel):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Pickler(pickle._Pickler):
    def __init__(self, f):
        super().__init__(f, protocol=2)
        self.blobs = {}

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, D.dtype):          # torch pickles a dtype as the bare global torch.<name>
            obj = _Global("torch", obj.name)
        if isinstance(obj, _Global):
            x = self.memo.get(id(obj))
            if x is not None:
                self.write(self.get(x[0]))
                return
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            self.memoize(obj)
            return
        super().save(obj, save_persistent_id)

    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", _Global("torch", _STORAGE_OF[obj.dtype.name]), obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            if type(obj) is not Tensor:
                inner = obj.detach()
                return (_Global("torch._utils", "_rebuild_parameter"),
                        (inner, obj.requires_grad, collections.OrderedDict()))
            arr = np.array(obj.detach().cpu()._host(), order="C")
            key = str(len(self.blobs))
            self.blobs[key] = arr.tobytes()
            st, acc = [], 1
            for s in reversed(arr.shape):
                st.append(acc)
                acc *= max(s, 1)
            return (_Global("torch._utils", "_rebuild_tensor_v2"),
                    (_StorageRef(key, obj.dtype, arr.size), 0, tuple(arr.shape), tuple(reversed(st)),
                     obj.requires_grad, collections.OrderedDict()))
        if isinstance(obj, Size):
            return _Global("torch", "Size"), (tuple(obj),)
        if type(obj).__name__ == "device" and type(obj).__module__.startswith("flambeau"):
            return _Global("torch", "device"), (str(obj),)
        return NotImplemented


def dumps_pt(obj) -> bytes:
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(obj)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/.format_version", "1")
        for key, b in p.blobs.items():
            z.writestr(f"archive/data/{key}", b)
        z.writestr("archive/version", "3\n")
    return out.getvalue()
