"""Checkpoints that are safe to load: `flambeau.save` / `flambeau.load`.

Native format (v2): a safetensors file, written and validated by the `safetensors` package. Its
header's `__metadata__` holds {"format": "flambeau-checkpoint-v2", "structure": JSON}, the object's
structure (dicts in order, lists, tuples, numbers, strings, dtypes, devices, sizes, references to
tensors by name); with `weights_only=False` objects JSON can't express are pickled into the uint8
tensor `__flambeau_objects__`. Any safetensors reader sees the tensors; `load(mmap=True)` maps them.
Version 1 files (a zip of structure.json + tensors.safetensors) are still read.

Plain `.safetensors` files: `load` returns their tensors as a dict; `save(state_dict, "x.safetensors")`
(or `format="safetensors"`) writes one that `safetensors.torch.load_file` reads.

PyTorch interop: `load` reads PyTorch's zip `.pt` files through `_pt_format`'s restricted unpickler;
`save(obj, f, format="pt")` writes a file that `torch.load(weights_only=True)` accepts.

Loading executes no code unless `weights_only=False`: under weights_only the pickled objects are
rebuilt only from containers, tensors and the user's allowlist (`safe_globals`, `add_safe_globals`,
as in PyTorch; see `_weights_only`); every tensor is checked against the bytes the
file holds for it. Errors follow torch.load: EOFError for an empty file, RuntimeError for a corrupt
archive or tensor, UnpicklingError for bytes that are no checkpoint. Saving to a path goes through a
temporary file in the same folder (`_atomic`), so a crash leaves the previous file intact.
"""
from __future__ import annotations

import collections
import io
import json
import mmap as _mmap
import os
import pickle
import struct
import warnings
import zipfile

import numpy as np
import safetensors

from . import _dtype as D
from ._atomic import write_atomic
from ._pt_format import dumps_pt, loads_pt
from ._weights_only import (add_safe_globals, clear_safe_globals, get_safe_globals,  # noqa: F401
                            safe_globals, unpickle_objects)
from ._tensor import Tensor, Size, sparse_bsc, sparse_bsr, sparse_csc, sparse_csr, strided
from ._device import CPU, device, privateuse1_name
from ._ops.creation import tensor
from .nn.parameter import Parameter
from .sparse import sparse_compressed_tensor, sparse_coo_tensor

COMPRESSED_LAYOUTS = {lay.name: lay for lay in (sparse_csr, sparse_csc, sparse_bsr, sparse_bsc)}

MAGIC_V1 = "flambeau-checkpoint-v1"
FORMAT_V2 = "flambeau-checkpoint-v2"
_OBJECTS = "__flambeau_objects__"      # the pickled objects of a weights_only=False save
_MAX_DEPTH = 200                       # structure nesting; json and the decoder recurse per level
_ZIP_MAGIC = b"PK\x03\x04"
_ST_LEN = struct.Struct("<Q")          # a safetensors file starts with its header's length
_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")     # signature ... name length, extra length
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)     # what PyTorch's zip reader (miniz) reads
_DEFLATE_MAX_RATIO = 1032              # deflate cannot expand its input more (zlib's technical notes)
_READ_CHUNK = 1 << 20
_PARSE_IN_MEMORY = 16 << 20            # a pickle member up to this size is read whole, larger ones streamed
_LEGACY_PT_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # torch.save(..., zip=False)

_ST_NAMES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
             "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64", "complex64": "C64",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_ST_FROM = {v: k for k, v in _ST_NAMES.items()}


class UnpicklingError(pickle.UnpicklingError):
    pass


_WEIGHTS_ONLY = ("Weights only load failed. This file contains arbitrary Python objects. Re-running "
                 "`flambeau.load` with `weights_only` set to `False` will likely succeed, but it can result "
                 "in arbitrary code execution. Do it only if you got the file from a trusted source.")


# ---- reading a file: bytes, a path read per tensor, or a private memory map -----------------------
class _Source:
    """The file being loaded. `array(offset, nbytes)` gives a writable uint8 array of those bytes:
    a view of a copy-on-write mapping (mmap=True), or a fresh buffer read for it."""

    def __init__(self, f, use_mmap: bool):
        self.path = None
        self.map = None
        if hasattr(f, "read"):
            if use_mmap:
                raise ValueError("f must be a file path in order to use the mmap argument")
            self.data = f.read()
            self.size = len(self.data)
            self.file = io.BytesIO(self.data)
            return
        self.path = os.fspath(f)
        self.data = None
        self.file = open(self.path, "rb")
        self.size = os.fstat(self.file.fileno()).st_size
        if use_mmap and self.size:
            self.map = _mmap.mmap(self.file.fileno(), 0, access=_mmap.ACCESS_COPY)

    def head(self, n: int) -> bytes:
        self.file.seek(0)
        return self.file.read(n)

    def array(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise RuntimeError(f"flambeau.load: bytes {offset}..{offset + nbytes} lie outside the file "
                               f"({self.size} bytes); it is truncated or corrupt")
        if self.map is not None:
            return np.frombuffer(self.map, np.uint8, nbytes, offset)
        out = np.empty(nbytes, np.uint8)
        self.file.seek(offset)
        if self.file.readinto(out) != nbytes:
            raise RuntimeError("flambeau.load: the file changed size while it was read")
        return out

    def close(self):
        self.file.close()


def _typed(raw: np.ndarray, dt) -> np.ndarray:
    """View bytes as dtype `dt`; copied when a mapped view is misaligned for it."""
    if raw.ctypes.data % dt.itemsize:
        raw = raw.copy()
    return raw.view(dt.np)


# ---- safetensors ---------------------------------------------------------------------------------
def _st_error(e: Exception) -> RuntimeError:
    return RuntimeError(f"flambeau.load: invalid safetensors data ({e}); the file is truncated or corrupt")


def _read_safetensors(src: _Source) -> tuple:
    """(tensors by name in file order, metadata) of a safetensors file, after `safetensors` has
    validated its header (dtypes, shapes against byte ranges, ranges contiguous and inside the file)."""
    copies = {}
    try:
        if src.path is not None:
            with safetensors.safe_open(src.path, framework="np"):
                pass
        else:                                     # bytes in memory: use the validated copies it makes
            copies = {name: info["data"] for name, info in safetensors.deserialize(src.data)}
    except safetensors.SafetensorError as e:
        raise _st_error(e) from None
    (n,) = _ST_LEN.unpack(src.head(_ST_LEN.size))
    header = json.loads(src.array(_ST_LEN.size, n).tobytes())
    meta = header.pop("__metadata__", None) or {}
    data_start = _ST_LEN.size + n
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] not in _ST_FROM:
            raise RuntimeError(f"flambeau.load: tensor '{name}' has dtype {info['dtype']}, which flambeau "
                               "does not support")
        dt = D.BY_NAME[_ST_FROM[info["dtype"]]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if int(np.prod(shape, dtype=object)) * dt.itemsize != end - begin:
            raise RuntimeError(f"flambeau.load: tensor '{name}' of shape {list(shape)} does not match its "
                               f"{end - begin} bytes")
        raw = np.frombuffer(copies[name], np.uint8) if name in copies else src.array(data_start + begin, end - begin)
        out[name] = Tensor._make(_typed(raw, dt).reshape(shape), _cpu(), dt)
    return out, meta


def _contiguous(t: Tensor) -> np.ndarray:
    return np.asarray(t.detach().cpu()._host(), order="C")    # (ascontiguousarray makes 0-d 1-d)


def _safetensors_write(tensors: dict, metadata: dict | None, f) -> None:
    """Write `tensors` (name -> NumPy array) as safetensors to a path (atomically) or a file object."""
    specs = {}
    for name, arr in tensors.items():
        dt = D.FROM_NP[arr.dtype].name
        if dt not in _ST_NAMES:
            raise RuntimeError(f"flambeau.save: safetensors has no {dt} dtype (tensor '{name}')")
        specs[name] = safetensors.TensorSpec(dtype=dt, shape=list(arr.shape), data_ptr=arr.ctypes.data,
                                             data_len=arr.nbytes)
    # serialize, not serialize_file: the latter writes through a temporary file of its own
    # (.tmpXXXXXX) that a killed save would leave behind, unrecognisable as ours
    write_atomic(f, safetensors.serialize(specs, metadata=metadata))


def _cpu():
    return CPU


# ---- structure encoding ----------------------------------------------------------------------------
class _Encoder:
    def __init__(self, allow_pickle: bool):
        self.arrays: dict = {}
        self.ids: dict = {}
        self.keep: list = []           # the saved tensors, so id() keys stay unique while encoding
        self.objects: list = []
        self.allow_pickle = allow_pickle

    def tensor(self, x: Tensor) -> dict:
        key = id(x)
        if key not in self.ids:
            self.ids[key] = name = str(len(self.ids))
            self.keep.append(x)
            arr = _contiguous(x)
            if x.dtype is D.complex128:          # safetensors has no C128: stored as float64 pairs
                arr = arr.view(np.float64).reshape(arr.shape + (2,))
            self.arrays[name] = arr
        return {"__tensor__": self.ids[key], "requires_grad": x.requires_grad, "device": str(x.device),
                "param": type(x).__name__ == "Parameter", "complex128": x.dtype is D.complex128}

    def sparse(self, x: Tensor, depth: int) -> dict:
        """A COO/CSR/CSC/BSR/BSC tensor as its index and value tensors (rebuilt, and checked, by the
        constructors); "crow" holds a compressed layout's compressed indices, "indices" its plain ones."""
        requires_grad, x = x.requires_grad, x.detach()
        if x.layout.name == "sparse_coo":
            parts = {"indices": x._indices(), "values": x._values()}
        elif x.layout.name in ("sparse_csr", "sparse_bsr"):
            parts = {"crow": x.crow_indices(), "indices": x.col_indices(), "values": x.values()}
        elif x.layout.name in ("sparse_csc", "sparse_bsc"):
            parts = {"crow": x.ccol_indices(), "indices": x.row_indices(), "values": x.values()}
        else:
            raise pickle.PicklingError(f"flambeau.save: cannot store a {type(x).__name__} ({x.layout}); save its "
                                       "to_dense()")
        out = {k: self.enc(v, depth) for k, v in parts.items()}
        out.update({"__sparse__": x.layout.name, "size": list(x.shape), "requires_grad": requires_grad})
        return out

    def enc(self, x, depth=0):
        if depth > _MAX_DEPTH:
            raise RuntimeError(f"flambeau.save: the object nests deeper than {_MAX_DEPTH} levels")
        if x is None or isinstance(x, (bool, int, float, str)):
            if isinstance(x, float) and not np.isfinite(x):
                return {"__float__": repr(x)}
            return x
        if isinstance(x, Tensor):
            return self.tensor(x) if x.layout is strided else self.sparse(x, depth + 1)
        if isinstance(x, D.dtype):
            return {"__dtype__": x.name}
        if isinstance(x, Size):
            return {"__size__": list(x)}
        d = depth + 1
        if isinstance(x, (dict, collections.OrderedDict)) and all(isinstance(k, (str, int)) for k in x):
            items = [[self.enc(k, d), self.enc(v, d)] for k, v in x.items()]
            out = {"__dict__": items, "ordered": isinstance(x, collections.OrderedDict)}
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out["_metadata"] = self.enc(meta, d)
            return out
        if type(x) is list:
            return [self.enc(v, d) for v in x]
        if type(x) is tuple:
            return {"__tuple__": [self.enc(v, d) for v in x]}
        if type(x).__name__ == "device" and type(x).__module__.startswith("flambeau"):
            return {"__device__": str(x)}
        if not self.allow_pickle:
            raise pickle.PicklingError(
                f"flambeau.save: cannot store an object of type {type(x).__module__}.{type(x).__name__} in a "
                "safe checkpoint; pass pickle_protocol/weights_only-compatible data (tensors, containers, "
                "numbers, strings) or save with format='pickle'.")
        self.objects.append(x)
        return {"__object__": len(self.objects) - 1}


class _Decoder:
    """Rebuilds the structure JSON; every malformed entry raises RuntimeError."""

    def __init__(self, tensors: dict, objects, restore_device: bool):
        self.tensors, self.objects = tensors, objects
        self.restore_device = restore_device    # no map_location: a third-party device's tensors go back to it

    def dec(self, x, depth=0):
        if depth > _MAX_DEPTH:
            raise RuntimeError(f"checkpoint structure is corrupt: it nests deeper than {_MAX_DEPTH} levels")
        d = depth + 1
        if isinstance(x, list):
            return [self.dec(v, d) for v in x]
        if not isinstance(x, dict):
            return x
        if "__tensor__" in x:
            return self.tensor(x)
        if "__sparse__" in x:
            return self.sparse(x, d)
        if "__dtype__" in x:
            return D.BY_NAME[x["__dtype__"]]
        if "__size__" in x:
            return Size([int(v) for v in x["__size__"]])
        if "__tuple__" in x:
            return tuple(self.dec(v, d) for v in x["__tuple__"])
        if "__float__" in x:
            return float(x["__float__"])
        if "__device__" in x:
            return device(x["__device__"])
        if "__dict__" in x:
            out = collections.OrderedDict() if x.get("ordered") else {}
            for k, v in x["__dict__"]:
                out[self.dec(k, d)] = self.dec(v, d)
            if "_metadata" in x:
                out._metadata = self.dec(x["_metadata"], d)
            return out
        if "__object__" in x:
            if self.objects is None:
                raise UnpicklingError(_WEIGHTS_ONLY)
            return self.objects[x["__object__"]]
        raise RuntimeError(f"checkpoint structure is corrupt: unknown entry {list(x)[:3]}")

    def sparse(self, x: dict, depth: int) -> Tensor:
        size = [int(v) for v in x["size"]]
        values, indices = self.dec(x["values"], depth), self.dec(x["indices"], depth)
        if x["__sparse__"] == "sparse_coo":
            t = sparse_coo_tensor(indices, values, size)
        elif x["__sparse__"] in COMPRESSED_LAYOUTS:
            t = sparse_compressed_tensor(self.dec(x["crow"], depth), indices, values, size,
                                         layout=COMPRESSED_LAYOUTS[x["__sparse__"]])
        else:
            raise RuntimeError(f"checkpoint structure is corrupt: unknown sparse layout {x['__sparse__']!r}")
        return t.requires_grad_(True) if x.get("requires_grad") else t

    def tensor(self, x: dict) -> Tensor:
        t = self.tensors[x["__tensor__"]]
        saved = str(x.get("device", "cpu"))
        if self.restore_device and saved.partition(":")[0] == privateuse1_name() != "privateuseone" \
                and t.device.type == "cpu":
            t = t.to(saved)
        if x.get("complex128"):
            if t.dtype is not D.float64 or t.dim() == 0 or t.shape[-1] != 2:
                raise RuntimeError("checkpoint structure is corrupt: a complex128 tensor is not stored as pairs")
            t = Tensor._make(np.asarray(t._host(), order="C").view(np.complex128)[..., 0], t.device, D.complex128)
        if x.get("param"):
            return Parameter(t, requires_grad=bool(x.get("requires_grad", True)))
        if x.get("requires_grad"):
            t.requires_grad_(True)
        return t


def _decode(structure, tensors: dict, objects, restore_device: bool = False):
    try:
        return _Decoder(tensors, objects, restore_device).dec(structure)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise RuntimeError(f"checkpoint structure is corrupt ({type(e).__name__}: {e})") from None


def _load_structure(text) -> object:
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise RuntimeError(f"checkpoint structure is corrupt ({type(e).__name__})") from None


# ---- save ---------------------------------------------------------------------------------------
def save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True,
         *, format: str | None = None, weights_only: bool = True) -> None:
    """Save `obj` to a path or file object. format='pt' writes a PyTorch-loadable zip file;
    format='safetensors' (the default for a path ending in .safetensors) a plain safetensors file of
    a dict of tensors; otherwise flambeau's native format."""
    if format is None:
        plain = not hasattr(f, "write") and os.fspath(f).endswith(".safetensors")
        format = "safetensors" if plain else "flambeau"
    if format == "pt":
        write_atomic(f, dumps_pt(obj))
    elif format == "safetensors":
        if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
            raise TypeError("flambeau.save: a .safetensors file holds a dict of str -> Tensor; "
                            f"got {type(obj).__name__} (save other objects in flambeau's format)")
        _safetensors_write({k: _contiguous(v) for k, v in obj.items()}, None, f)
    elif format == "flambeau":
        enc = _Encoder(allow_pickle=True)
        meta = {"format": FORMAT_V2, "structure": json.dumps(enc.enc(obj))}
        arrays = enc.arrays
        if enc.objects:
            blob = pickle.dumps(enc.objects, protocol=pickle_protocol)
            arrays = dict(arrays, **{_OBJECTS: np.frombuffer(blob, np.uint8)})
        _safetensors_write(arrays, meta, f)
    else:
        raise ValueError(f"flambeau.save: unknown format {format!r} (expected 'flambeau', 'pt' or 'safetensors')")


# ---- load ---------------------------------------------------------------------------------------
def _keep_place(t: Tensor) -> Tensor:
    return t


_KEEP_PLACE = _keep_place


def _placer(map_location):
    """tensor -> tensor as map_location asks (a device, a string, a dict of devices, a callable)."""
    if map_location is None:
        return _KEEP_PLACE

    def place(t: Tensor) -> Tensor:
        dev = map_location(t, str(t.device)) if callable(map_location) else map_location
        if isinstance(dev, dict):
            dev = dev.get(str(t.device), str(t.device))
        if isinstance(dev, Tensor):
            return dev
        return t.to(dev)
    return place


def _load_v2(src: _Source, weights_only: bool, place) -> object:
    tensors, meta = _read_safetensors(src)
    if meta.get("format") != FORMAT_V2:           # a plain safetensors file
        return {k: place(v) for k, v in tensors.items()}
    blob = tensors.pop(_OBJECTS, None)
    objects = None if blob is None else _objects(blob._host().tobytes(), weights_only)
    tensors = {k: place(v) for k, v in tensors.items()}
    return _decode(_load_structure(meta.get("structure")), tensors, objects, place is _KEEP_PLACE)


def _objects(blob: bytes, weights_only: bool) -> list:
    """A checkpoint's pickled Python objects: under weights_only only what `_weights_only` allows
    (containers, tensors, and the classes/functions of `safe_globals` / `add_safe_globals`)."""
    return unpickle_objects(blob) if weights_only else pickle.loads(blob)


def _v1_complex_as_pairs(buf: bytes) -> tuple:
    """v1 files wrote complex128 as dtype C128, which safetensors lacks: relabel those tensors
    float64 with a trailing 2 (same bytes) so the package validates them; return the names."""
    if len(buf) < _ST_LEN.size or b'"C128"' not in buf[:_ST_LEN.size + _ST_LEN.unpack(buf[:_ST_LEN.size])[0]]:
        return buf, set()
    n = _ST_LEN.unpack(buf[:_ST_LEN.size])[0]
    header = _load_structure(buf[_ST_LEN.size:_ST_LEN.size + n])
    if not isinstance(header, dict):
        raise RuntimeError("flambeau.load: the v1 checkpoint's safetensors header is corrupt")
    names = {k for k, v in header.items() if isinstance(v, dict) and v.get("dtype") == "C128"}
    for k in names:
        header[k] = dict(header[k], dtype="F64", shape=list(header[k].get("shape", [])) + [2])
    h = json.dumps(header).encode()
    return _ST_LEN.pack(len(h)) + h + buf[_ST_LEN.size + n:], names


def _load_v1(z: _ZipRecords, names, src: _Source, weights_only: bool, place) -> object:
    if src.map is not None:
        raise RuntimeError("flambeau.load: mmap=True needs the v2 format; this file was written by an older "
                           "flambeau (v1 zip). Load it with mmap=False and save it again to convert it.")
    buf, complex_names = _v1_complex_as_pairs(z.read("tensors.safetensors"))
    try:
        flat = safetensors.deserialize(buf)
    except safetensors.SafetensorError as e:
        raise _st_error(e) from None
    tensors = {}
    for name, info in flat:
        if info["dtype"] not in _ST_FROM:
            raise RuntimeError(f"flambeau.load: tensor '{name}' has unsupported dtype {info['dtype']}")
        dt = D.BY_NAME[_ST_FROM[info["dtype"]]]
        arr = np.frombuffer(info["data"], dt.np).reshape(info["shape"])
        if name in complex_names:
            arr, dt = arr.view(np.complex128)[..., 0], D.complex128
        tensors[name] = place(Tensor._make(arr, _cpu(), dt))
    objects = _objects(z.read("objects.pkl"), weights_only) if "objects.pkl" in names else None
    return _decode(_load_structure(z.read("structure.json")), tensors, objects)


class _ZipRecords:
    """The members of a zip archive, read without trusting the sizes it declares.

    Only stored and deflated members are read (what PyTorch's reader accepts). A member's declared
    compressed bytes must lie inside the file, and its declared size must be one its compressed
    bytes can produce (equal for stored, at most `_DEFLATE_MAX_RATIO` times for deflate), so
    nothing expands beyond `_DEFLATE_MAX_RATIO` times the file; callers that know how many bytes
    they need (a storage's numel * itemsize) check `size()` before any byte is decompressed.
    Reads go in `_READ_CHUNK` pieces into the caller's buffer; a stored member is a view of the
    mapping when the file is mapped."""

    def __init__(self, z: zipfile.ZipFile, src: _Source):
        self.z, self.src = z, src

    def info(self, name: str) -> zipfile.ZipInfo:
        info = self.z.getinfo(name)
        if info.compress_type not in _ZIP_METHODS:
            raise RuntimeError(f"flambeau.load: zip entry {name} uses compression method {info.compress_type}, "
                               "which PyTorch checkpoints never use (only stored or deflated entries are read); "
                               "the checkpoint is corrupt")
        if info.header_offset + info.compress_size > self.src.size:
            raise RuntimeError(f"flambeau.load: zip entry {name} claims {info.compress_size} compressed bytes, "
                               f"more than the file holds ({self.src.size} bytes); it is truncated or corrupt")
        limit = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
            _DEFLATE_MAX_RATIO * max(info.compress_size, 1)
        if info.file_size > limit:
            raise RuntimeError(f"flambeau.load: zip entry {name} claims {info.file_size} bytes from "
                               f"{info.compress_size} compressed bytes, more than its compression can produce; "
                               "the checkpoint is corrupt")
        return info

    def size(self, name: str) -> int:
        return self.info(name).file_size

    def array(self, name: str) -> np.ndarray:
        info = self.info(name)
        if self.src.map is not None and info.compress_type == zipfile.ZIP_STORED:
            head = self.src.array(info.header_offset, _ZIP_LOCAL_HEADER.size).tobytes()
            sig, name_len, extra_len = _ZIP_LOCAL_HEADER.unpack(head)
            if sig != _ZIP_MAGIC:
                raise RuntimeError(f"flambeau.load: zip entry {name} has a corrupt local header")
            return self.src.array(info.header_offset + _ZIP_LOCAL_HEADER.size + name_len + extra_len, info.file_size)
        out = np.empty(info.file_size, np.uint8)
        view = memoryview(out)
        with self.z.open(info) as fh:
            done = 0
            while done < info.file_size:
                got = fh.readinto(view[done:done + _READ_CHUNK])
                if not got:
                    raise RuntimeError(f"flambeau.load: zip entry {name} is truncated")
                done += got
        return out

    def read(self, name: str) -> bytes:
        return self.array(name).tobytes()

    def open(self, name: str) -> "io.BytesIO | _MemberStream":
        """The member as a file for a parser: in memory up to `_PARSE_IN_MEMORY` bytes (fastest for
        the pure-Python unpickler), else a stream that decompresses only what the parser consumes."""
        info = self.info(name)
        if info.file_size <= _PARSE_IN_MEMORY:
            return io.BytesIO(self.read(name))
        return _MemberStream(io.BufferedReader(self.z.open(info), _READ_CHUNK), info.file_size)


class _MemberStream:
    """A zip member's bytes for a parser (`read`, `readline`), never asking the decompressor for
    more than the member has left: a length prefix in the data (a pickle's BINBYTES8 of 2**60)
    must not become one allocation of that size (BufferedReader.read(n) allocates n first)."""

    def __init__(self, raw: io.BufferedReader, size: int):
        self.raw, self.left = raw, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.raw.read(n)
        self.left -= len(data)
        return data

    def readline(self, limit: int = -1) -> bytes:
        limit = self.left if limit is None or limit < 0 else min(limit, self.left)
        data = self.raw.readline(limit)
        self.left -= len(data)
        return data

    def __enter__(self) -> "_MemberStream":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


def _load_zip(src: _Source, weights_only: bool, place) -> object:
    try:
        z = zipfile.ZipFile(src.file)
        names = z.namelist()
        records = _ZipRecords(z, src)
        if "format" in names and records.read("format").decode(errors="replace") == MAGIC_V1:
            return _load_v1(records, names, src, weights_only, place)
        return loads_pt(names, records, weights_only=weights_only, place=place)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, OSError, ValueError, OverflowError,
            NotImplementedError, struct.error) as e:
        raise RuntimeError(f"flambeau.load: failed reading zip archive ({type(e).__name__}: {e}); the checkpoint "
                           "is truncated or corrupt") from None


_TRUE_VALUES = ("1", "y", "yes", "true")


def _resolve_weights_only(weights_only: bool | None, pickle_module) -> bool:
    """`load`'s weights_only as PyTorch settles it: unset means True unless a pickle_module is given;
    TORCH_FORCE_WEIGHTS_ONLY_LOAD forces True, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD makes an unset one False."""
    not_set = weights_only is None
    if not_set:
        weights_only = pickle_module is None
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_VALUES
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_VALUES
    if force and force_no:
        raise RuntimeError("flambeau.load: only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or "
                           "`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` should be set, but both were set; unset one")
    if force:
        weights_only = True
    elif force_no and not_set:
        warnings.warn("Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the `weights_only` "
                      "argument was not explicitly passed to `flambeau.load`, forcing weights_only=False.",
                      UserWarning, stacklevel=3)
        weights_only = False
    if weights_only and pickle_module is not None:
        raise RuntimeError("flambeau.load: can not safely load weights when explicit pickle_module is specified; "
                           "pass weights_only=False (only for a trusted file) or leave pickle_module out")
    return bool(weights_only)


def load(f, map_location=None, pickle_module=None, *, weights_only: bool | None = None, mmap: bool | None = None,
         **kw):
    """Load a checkpoint written by `save`, by PyTorch's `torch.save` (zip format), or a safetensors file.
    mmap=True maps the file's tensor bytes copy-on-write instead of reading them."""
    weights_only = _resolve_weights_only(weights_only, pickle_module)
    src = _Source(f, bool(mmap))
    try:
        if src.size == 0:
            raise EOFError("Ran out of input: the checkpoint file is empty")
        head = src.head(9)
        place = _placer(map_location)
        if head[:4] == _ZIP_MAGIC:
            return _load_zip(src, weights_only, place)
        if len(head) == 9 and head[8:9] == b"{":
            return _load_v2(src, weights_only, place)
        if src.head(len(_LEGACY_PT_MAGIC)) == _LEGACY_PT_MAGIC:
            raise RuntimeError("flambeau.load: this is a legacy (non-zip) PyTorch file, which is not supported; "
                               "re-save it with a current torch.save")
        raise UnpicklingError("flambeau.load: the file is not a checkpoint (neither a zip archive nor safetensors) "
                              "or its first bytes are corrupt")
    finally:
        src.close()


def _rebuild_tensor_from_numpy(arr, dtype_name, device, requires_grad):
    """Used by Tensor.__reduce_ex__ (copy.deepcopy, multiprocessing)."""
    t = tensor(arr, dtype=D.BY_NAME[dtype_name], device=device)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _tensor_reduce_ex(self, proto):
    """Tensor.__reduce_ex__ (installed below): rebuilt from a NumPy copy by `_rebuild_tensor_from_numpy`."""
    return (_rebuild_tensor_from_numpy,
            (np.array(self.detach()._host()), self._dtype.name, str(self._device), self._requires_grad))


Tensor.__reduce_ex__ = _tensor_reduce_ex
