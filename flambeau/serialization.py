"""Checkpoints that are safe to load: `flambeau.save` / `flambeau.load`.

Default format (a zip archive, stored uncompressed):
  structure.json        the object's structure: dicts (ordered), lists, tuples, numbers, strings,
                        dtypes, devices, sizes, and references to tensors by name
  tensors.safetensors   every tensor's bytes, in the safetensors layout (8-byte header length,
                        JSON header of dtype/shape/offsets, raw little-endian data)
  objects.pkl           only with weights_only=False: pickled objects JSON can't express
Loading executes no code unless `weights_only=False` is passed. Writes go to a temporary file
that is fsynced and renamed over the target, so a crash mid-save leaves the old file intact.

PyTorch interop: `load` reads PyTorch's zip `.pt` files (tensors, state dicts, nested
containers) with a restricted unpickler that only rebuilds tensors and plain containers;
`save(obj, f, format="pt")` writes a file that `torch.load(weights_only=True)` accepts.
"""
from __future__ import annotations

import collections
import io
import json
import os
import pickle
import struct
import tempfile
import zipfile

import numpy as np

from . import _dtype as D
from ._tensor import Tensor, Size

MAGIC = "flambeau-checkpoint-v1"

_ST_NAMES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
             "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64", "complex64": "C64",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
             "complex128": "C128"}
_ST_FROM = {v: k for k, v in _ST_NAMES.items()}


class UnpicklingError(pickle.UnpicklingError):
    pass


# ---- safetensors -------------------------------------------------------------------------------
def _safetensors_bytes(tensors: dict) -> bytes:
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        arr = np.array(t.detach().cpu()._host(), order="C")
        b = arr.tobytes()
        header[name] = {"dtype": _ST_NAMES[t.dtype.name], "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _read_safetensors(buf: bytes) -> dict:
    if len(buf) < 8:
        raise RuntimeError("checkpoint is truncated: safetensors header missing")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise RuntimeError("checkpoint is truncated or corrupt: safetensors header length exceeds file size")
    header = json.loads(buf[8:8 + n])
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = D.BY_NAME[_ST_FROM[info["dtype"]]]
        b, e = info["data_offsets"]
        if e > len(data):
            raise RuntimeError(f"checkpoint is truncated or corrupt: tensor '{name}' lies past the end of the file")
        arr = np.frombuffer(data[b:e], dtype=dt.np).reshape(info["shape"]).copy()
        out[name] = Tensor._make(arr, _cpu(), dt)
    return out


def _cpu():
    from ._device import CPU
    return CPU


# ---- structure encoding ----------------------------------------------------------------------------
class _Encoder:
    def __init__(self, allow_pickle: bool):
        self.tensors: dict = {}
        self.ids: dict = {}
        self.objects: list = []
        self.allow_pickle = allow_pickle

    def enc(self, x):
        if x is None or isinstance(x, (bool, int, float, str)):
            if isinstance(x, float) and not np.isfinite(x):
                return {"__float__": repr(x)}
            return x
        if isinstance(x, Tensor):
            key = id(x)
            if key not in self.ids:
                name = str(len(self.tensors))
                self.ids[key] = name
                self.tensors[name] = x
            cls = type(x).__name__
            return {"__tensor__": self.ids[key], "requires_grad": x.requires_grad,
                    "device": str(x.device), "param": cls == "Parameter"}
        if isinstance(x, D.dtype):
            return {"__dtype__": x.name}
        if isinstance(x, Size):
            return {"__size__": list(x)}
        if isinstance(x, (dict, collections.OrderedDict)) and all(isinstance(k, (str, int)) for k in x):
            items = [[self.enc(k), self.enc(v)] for k, v in x.items()]
            out = {"__dict__": items, "ordered": isinstance(x, collections.OrderedDict)}
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out["_metadata"] = self.enc(meta)
            return out
        if type(x) is list:
            return [self.enc(v) for v in x]
        if type(x) is tuple:
            return {"__tuple__": [self.enc(v) for v in x]}
        if type(x).__name__ == "device" and type(x).__module__.startswith("flambeau"):
            return {"__device__": str(x)}
        if not self.allow_pickle:
            raise pickle.PicklingError(
                f"flambeau.save: cannot store an object of type {type(x).__module__}.{type(x).__name__} in a "
                "safe checkpoint; pass pickle_protocol/weights_only-compatible data (tensors, containers, "
                "numbers, strings) or save with format='pickle'.")
        self.objects.append(x)
        return {"__object__": len(self.objects) - 1}


def _decode(x, tensors, objects):
    if isinstance(x, list):
        return [_decode(v, tensors, objects) for v in x]
    if not isinstance(x, dict):
        return x
    if "__tensor__" in x:
        t = tensors[x["__tensor__"]]
        if x.get("param"):
            from .nn.parameter import Parameter
            t = Parameter(t, requires_grad=x.get("requires_grad", True))
        elif x.get("requires_grad"):
            t.requires_grad_(True)
        return t
    if "__dtype__" in x:
        return D.BY_NAME[x["__dtype__"]]
    if "__size__" in x:
        return Size(x["__size__"])
    if "__tuple__" in x:
        return tuple(_decode(v, tensors, objects) for v in x["__tuple__"])
    if "__float__" in x:
        return float(x["__float__"])
    if "__device__" in x:
        from ._device import device
        return device(x["__device__"])
    if "__dict__" in x:
        d = collections.OrderedDict() if x.get("ordered") else {}
        for k, v in x["__dict__"]:
            d[_decode(k, tensors, objects)] = _decode(v, tensors, objects)
        if "_metadata" in x:
            d._metadata = _decode(x["_metadata"], tensors, objects)
        return d
    if "__object__" in x:
        if objects is None:
            raise UnpicklingError(
                "Weights only load failed. This file contains arbitrary Python objects. Re-running "
                "`flambeau.load` with `weights_only` set to `False` will likely succeed, but it can result "
                "in arbitrary code execution. Do it only if you got the file from a trusted source.")
        return objects[x["__object__"]]
    raise RuntimeError(f"checkpoint structure is corrupt: unknown entry {list(x)[:3]}")


# ---- atomic file writing -------------------------------------------------------------------
def _atomic_write(f, data: bytes) -> None:
    if hasattr(f, "write"):
        f.write(data)
        return
    path = os.fspath(f)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".flambeau-save-", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        try:
            dfd = os.open(d, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)
        except OSError:
            pass
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True,
         *, format: str = "flambeau", weights_only: bool = True) -> None:
    """Save `obj` to a path or file object. format='pt' writes a PyTorch-loadable zip file."""
    if format == "pt":
        from ._pt_format import dumps_pt
        _atomic_write(f, dumps_pt(obj))
        return
    enc = _Encoder(allow_pickle=True)
    structure = enc.enc(obj)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("format", MAGIC)
        z.writestr("structure.json", json.dumps(structure))
        z.writestr("tensors.safetensors", _safetensors_bytes(enc.tensors))
        if enc.objects:
            z.writestr("objects.pkl", pickle.dumps(enc.objects, protocol=pickle_protocol))
    _atomic_write(f, buf.getvalue())


def load(f, map_location=None, pickle_module=None, *, weights_only: bool | None = None, mmap=None, **kw):
    """Load a checkpoint written by `save` or by PyTorch's `torch.save` (zip format)."""
    if weights_only is None:
        weights_only = True
    data = f.read() if hasattr(f, "read") else open(os.fspath(f), "rb").read()
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
        names = z.namelist()
    except zipfile.BadZipFile:
        if data[:2] == b"\x80\x02" or data[:1] == b"\x80":
            raise RuntimeError("flambeau.load: this is a legacy (non-zip) PyTorch file, which is not supported; "
                               "re-save it with a current torch.save") from None
        raise RuntimeError("flambeau.load: the file is not a checkpoint or is truncated/corrupt "
                           "(not a zip archive)") from None
    try:
        if "format" in names and z.read("format").decode() == MAGIC:
            tensors = _read_safetensors(z.read("tensors.safetensors"))
            objects = None
            if "objects.pkl" in names and not weights_only:
                objects = pickle.loads(z.read("objects.pkl"))
            out = _decode(json.loads(z.read("structure.json")), tensors, objects)
        else:
            from ._pt_format import loads_pt
            out = loads_pt(z, names, weights_only=weights_only)
    except (zipfile.BadZipFile, KeyError, struct.error, json.JSONDecodeError, EOFError) as e:
        raise RuntimeError(f"flambeau.load: the checkpoint is truncated or corrupt ({type(e).__name__}: {e})") from None
    if map_location is not None:
        out = _map(out, map_location)
    return out


def _map(x, loc):
    if isinstance(x, Tensor):
        dev = loc(x, str(x.device)) if callable(loc) else loc
        if isinstance(dev, dict):
            dev = dev.get(str(x.device), str(x.device))
        if isinstance(dev, Tensor):
            return dev
        moved = x.to(dev)
        if type(x) is not Tensor:
            moved = type(x)(moved, requires_grad=x.requires_grad)
        return moved
    if isinstance(x, collections.OrderedDict):
        d = collections.OrderedDict((k, _map(v, loc)) for k, v in x.items())
        if hasattr(x, "_metadata"):
            d._metadata = x._metadata
        return d
    if isinstance(x, dict):
        return {k: _map(v, loc) for k, v in x.items()}
    if isinstance(x, list):
        return [_map(v, loc) for v in x]
    if isinstance(x, tuple):
        return tuple(_map(v, loc) for v in x)
    return x


def _rebuild_tensor_from_numpy(arr, dtype_name, device, requires_grad):
    """Used by Tensor.__reduce_ex__ (copy.deepcopy, multiprocessing)."""
    from ._ops.creation import tensor
    t = tensor(arr, dtype=D.BY_NAME[dtype_name], device=device)
    return t.requires_grad_(requires_grad) if requires_grad else t
