"""PyTorch's zip checkpoint format (`torch.save`), read and written without importing torch.

Reading uses a pure-Python unpickler (its memo is a dict, so a crafted memo index cannot make it
allocate) that resolves only an allow-list of globals (OrderedDict, the tensor and parameter
rebuild functions, storage type markers, dtypes, Size, device) and builds only OrderedDicts;
anything else is refused unless `weights_only=False`. Every tensor is checked against its storage
(offset, sizes, strides, overflow: PyTorch's `setStrided` rules and messages) before a view is made,
and every storage record must declare exactly the bytes its pickle claims before any is read;
the pickle itself is streamed from the archive (serialization._ZipRecords checks declared sizes).
Writing emits the same pickle opcodes PyTorch does, naming `torch._utils._rebuild_tensor_v2` and
`torch.<T>Storage` as plain GLOBAL references.
"""
from __future__ import annotations

import _compat_pickle
import collections
import io
import pickle
import zipfile

import numpy as np

from . import _dtype as D
from . import _weights_only
from ._tensor import Tensor, Size
from ._device import CPU, device
from .nn.parameter import Parameter

_STORAGE = {"FloatStorage": D.float32, "DoubleStorage": D.float64, "HalfStorage": D.float16,
            "BFloat16Storage": D.bfloat16, "LongStorage": D.int64, "IntStorage": D.int32,
            "ShortStorage": D.int16, "CharStorage": D.int8, "ByteStorage": D.uint8, "BoolStorage": D.bool,
            "ComplexFloatStorage": D.complex64, "ComplexDoubleStorage": D.complex128}
_STORAGE_OF = {v.name: k for k, v in _STORAGE.items()}
_UINT64_LIMIT = 2 ** 64          # PyTorch computes storage sizes in uint64 and fails on overflow
_INT64_MAX = 2 ** 63 - 1
_DRAIN_CHUNK = 1 << 20           # the pickle member's bytes after STOP are read (CRC-checked) this many at a time

_REFUSED = ("Weights only load failed. This file can still be loaded, to do so you have two options, do "
            "those steps only if you trust the source of the checkpoint. Re-running `flambeau.load` with "
            "`weights_only` set to `False` will likely succeed, but it can result in arbitrary code "
            "execution. Do it only if you got the file from a trusted source. {}")
_CORRUPT = "the pickle data is corrupt ({}: {})"


class _StorageType:
    def __init__(self, dtype):
        self.dtype = dtype


class _Storage:
    """A storage record's elements (a fresh buffer, or a view of a private file mapping)."""

    def __init__(self, raw: np.ndarray, dtype):
        if raw.ctypes.data % dtype.itemsize:          # a mapped record need not be aligned (torch's are)
            raw = raw.copy()
        self.array = raw.view(dtype.np)
        self.dtype = dtype
        self.nbytes = raw.nbytes


class RebuildArgumentError(TypeError):
    """A tensor's offset/size/stride in the pickle is not an int64 (PyTorch raises TypeError too)."""


def _int64(name: str, x) -> int:
    if type(x) is not int:
        raise RebuildArgumentError(f"_rebuild_tensor_v2(): {name} must be an int, not {type(x).__name__}")
    if not -_INT64_MAX - 1 <= x <= _INT64_MAX:
        raise RebuildArgumentError(f"_rebuild_tensor_v2(): {name} {x}: Overflow when unpacking long long")
    return x


def _ints(name: str, v) -> tuple:
    if not isinstance(v, (tuple, list)):
        raise RebuildArgumentError(f"_rebuild_tensor_v2(): argument '{name}' must be a tuple of ints, not {type(v).__name__}")
    return tuple(_int64(name, x) for x in v)


def _byte_strides(size: tuple, stride: tuple, itemsize: int) -> tuple:
    """NumPy's byte strides; a stride that never moves (size <= 1) and would overflow int64 becomes 0."""
    out = []
    for s, st in zip(size, stride):
        b = st * itemsize
        out.append(b if s > 1 or -_INT64_MAX <= b <= _INT64_MAX else 0)
    return tuple(out)


def check_view(nbytes: int, itemsize: int, offset: int, size: tuple, stride: tuple) -> None:
    """Raise PyTorch's RuntimeError unless elements `offset + sum(i_k * stride_k)` for every index
    i < size lie inside a storage of `nbytes` bytes (at::native::setStrided's checks, same order)."""
    if offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {offset}")
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape ({len(stride)} vs {len(size)})")
    numel = 1
    for s in size:
        numel *= s % _UINT64_LIMIT
        if s < 0 or numel > _INT64_MAX:
            raise RuntimeError("numel: integer multiplication overflow")
    if numel == 0:                 # an empty tensor needs no storage, whatever its offset
        span = itemsize
        for s in size:
            span *= max(s, 1)
        if span > _INT64_MAX:
            raise RuntimeError(f"an empty tensor of sizes={list(size)} is too large for a NumPy array")
        return
    last = 0
    for s, st in zip(size, stride):
        last += (st % _UINT64_LIMIT) * (s - 1)      # a negative stride wraps, as in PyTorch's uint64 math
    needed = (last + 1 + offset) * itemsize
    if needed >= _UINT64_LIMIT:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}")
    if needed > nbytes:
        raise RuntimeError("Trying to resize storage that is not resizable")


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError(f"_rebuild_tensor_v2 expects a storage, got {type(storage).__name__}")
    storage_offset = _int64("storage_offset", storage_offset)
    size, stride = _ints("size", size), _ints("stride", stride)
    dt = storage.dtype
    check_view(storage.nbytes, dt.itemsize, storage_offset, size, stride)
    base = storage.array
    if all(s > 0 for s in size):
        base = base[storage_offset:]
    view = np.lib.stride_tricks.as_strided(base, size, _byte_strides(size, stride, dt.itemsize))
    t = Tensor._make(view, CPU, dt)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_parameter(data, requires_grad, backward_hooks, *state):
    if not isinstance(data, Tensor):
        raise pickle.UnpicklingError(f"_rebuild_parameter expects a tensor, got {type(data).__name__}")
    return Parameter(data, requires_grad=bool(requires_grad))


def _device(s, index=None):
    return device(s, index)


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): Size,
    ("torch", "device"): _device,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}
_NEWOBJ_ALLOWED = (collections.OrderedDict, set, frozenset, Size)


def _load_build(self):
    """BUILD under weights_only: only an OrderedDict's attributes (a state_dict's `_metadata`)."""
    state = self.stack.pop()
    inst = self.stack[-1]
    if _weights_only.buildable(inst):
        setstate = getattr(inst, "__setstate__", None)
        if setstate is not None:
            setstate(state)
        else:
            inst.__dict__.update(state)
        return
    if type(inst) is not collections.OrderedDict or not isinstance(state, dict):
        raise pickle.UnpicklingError(_REFUSED.format(
            f"Can only build OrderedDict with a dict state, but got {type(inst).__name__}"))
    inst.__dict__.update(state)


def _load_newobj(self, *, ex=False):
    kwargs = self.stack.pop() if ex else {}
    args = self.stack.pop()
    cls = self.stack.pop()
    if cls not in _NEWOBJ_ALLOWED and not _weights_only.is_safe_object(cls):
        raise pickle.UnpicklingError(_REFUSED.format(f"NEWOBJ of unsupported type {cls!r}"))
    self.append(cls.__new__(cls, *args, **kwargs))


def _load_newobj_ex(self):
    _load_newobj(self, ex=True)


class _Unpickler(pickle._Unpickler):
    _SAFE_DISPATCH = dict(pickle._Unpickler.dispatch)
    _SAFE_DISPATCH[pickle.BUILD[0]] = _load_build
    _SAFE_DISPATCH[pickle.NEWOBJ[0]] = _load_newobj
    _SAFE_DISPATCH[pickle.NEWOBJ_EX[0]] = _load_newobj_ex

    def __init__(self, f, records, prefix: str, weights_only, place):
        super().__init__(f)
        self.records, self.prefix = records, prefix
        self.weights_only = weights_only
        self.place = place
        self.storages = {}
        if weights_only:
            self.dispatch = self._SAFE_DISPATCH

    def rebuild_tensor_placed(self, *args):
        """_rebuild_tensor_v2, then map_location's move (PyTorch applies it per storage)."""
        return self.place(_rebuild_tensor_v2(*args))

    def find_class(self, module, name):
        # Python 2 names (torch.save pickles with protocol 2, whose pickler writes `__builtin__.set`)
        # read as their Python 3 ones before any allowlist is consulted, as PyTorch's unpickler does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild_tensor_placed
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE:
            return _StorageType(_STORAGE[name])
        if module == "torch" and name in D.BY_NAME:
            return D.BY_NAME[name]
        safe = _weights_only.allowed(module, name)
        if safe is not None:
            return safe
        if self.weights_only:
            raise _weights_only.refused(module, name)
        if module.split(".")[0] == "torch":
            raise pickle.UnpicklingError(_REFUSED.format(f"Unsupported global: GLOBAL {module}.{name}"))
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and type(pid[4]) is int):
            raise pickle.UnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
        _, stype, key, _, numel = pid
        dt = stype.dtype
        if (key, dt) not in self.storages:
            try:
                self.storages[(key, dt)] = _Storage(self.read_record(self.prefix + key, numel, dt), dt)
            except (KeyError, EOFError, OSError, zipfile.BadZipFile) as e:
                raise RuntimeError(f"failed reading record {self.prefix + key} of the archive ({type(e).__name__}: "
                                   f"{e}); the checkpoint is truncated or corrupt") from None
        return self.storages[(key, dt)]

    def read_record(self, path: str, numel: int, dt) -> np.ndarray:
        """The record's bytes, once its declared size is the storage's: nothing is decompressed before."""
        expected = numel * dt.itemsize
        declared = self.records.size(path)
        if numel < 0 or declared != expected:
            raise RuntimeError(f"record size ({declared} bytes) does not match expected size ({expected} bytes "
                               f"= {numel} elements * {dt.itemsize} bytes/element) for dtype {dt.name}")
        return self.records.array(path)

    def load(self):
        try:
            out = super().load()
        except (RuntimeError, pickle.UnpicklingError, RebuildArgumentError):
            raise
        except Exception as e:       # malformed opcodes: Key/Index/Type/Value/EOF/struct errors
            raise pickle.UnpicklingError(_CORRUPT.format(type(e).__name__, e)) from None
        return out


def loads_pt(names, records, *, weights_only: bool, place):
    """Unpickle `data.pkl` of an opened zip archive. `records` (serialization._ZipRecords) gives a
    member's declared `size(path)`, its bytes as an `array(path)`, and a stream `open(path)`: the
    pickle is streamed, so bytes after its STOP are checked (CRC) in chunks, never held."""
    pkl = [n for n in names if n.endswith("data.pkl")]
    if not pkl:
        raise RuntimeError("flambeau.load: not a flambeau or PyTorch checkpoint (no data.pkl in the archive)")
    with records.open(pkl[0]) as stream:
        out = _Unpickler(stream, records, pkl[0][:-len("data.pkl")] + "data/", weights_only, place).load()
        while stream.read(_DRAIN_CHUNK):
            pass
    return out


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
