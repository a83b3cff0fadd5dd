"""Loading an AOTInductor package (aoti.py writes them): `aoti_load_package(path)` -> a callable.

The package is checked before anything of it runs: a zip whose entries are exactly the expected
names (no directories, no '..', no duplicates), `archive_format` and `version` this code reads, a
metadata.json of the expected fields, sizes within bounds (zip CRCs checked on read). It is then
extracted into a private temporary directory, model.so is loaded with ctypes and a runner created
through the C API (aoti_runtime.h: weights.bin read and checked against the library's size and
checksum), and the directory removed. Loading a package runs its library: load only packages you
trust, as with any shared library.

`AOTICompiledModel(*args, **kwargs)` takes the exported program's inputs (same pytree), runs the
package through `fl_aoti_run` (one C call; the C++ wrapper owns every intermediate buffer) and
returns the outputs in the program's output pytree. A shape the program does not take (a static
dim, a dynamic dim out of its Dim range) raises RuntimeError with the runtime's message.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

from .. import _cpp_builder
from .. import _dtype as D
from .._device import CPU
from .._strict_zip import read_strict_zip
from .._tensor import Tensor
from ..utils import _pytree as pytree
from .aoti import ABI_VERSION, ARCHIVE_FORMAT, PACKAGE_VERSION

ENTRIES = ("archive_format", "version", "metadata.json", "model.so", "model.cpp", "weights.bin", "aoti_runtime.h")
MAX_ENTRY_BYTES = 1 << 34
DTYPES = {0: D.float32, 1: D.float64, 2: D.int64, 3: D.int32, 4: D.int16, 5: D.int8, 6: D.uint8, 7: D.bool,
          8: D.bfloat16, 9: D.float16}
TREE_TYPES = (None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict",
              "collections.namedtuple", "collections.defaultdict")
ERR_SHAPE, ERR_KERNEL = 4, 5


class AOTIPackageError(RuntimeError):
    """A file that is not a package this version can load (the message says what is wrong)."""


def _check_tree(j) -> None:
    if not isinstance(j, dict) or j.get("type") not in TREE_TYPES:
        raise AOTIPackageError(f"aoti_load_package: bad pytree spec in metadata.json ({str(j)[:80]})")
    for c in j.get("children_spec", []):
        _check_tree(c)


def _spec(text):
    try:
        _, tree = json.loads(text)
    except (ValueError, TypeError) as e:
        raise AOTIPackageError(f"aoti_load_package: bad pytree spec in metadata.json ({e})") from None
    _check_tree(tree)
    return pytree.treespec_loads(text)


def read_package(path) -> dict:
    """{entry name: bytes} of a package, refusing anything else (see module docstring)."""
    out = read_strict_zip(path, ENTRIES, archive_format=ARCHIVE_FORMAT, max_entry_bytes=MAX_ENTRY_BYTES,
                          error=AOTIPackageError, caller="aoti_load_package", what="AOTInductor package")
    if out["version"] != str(PACKAGE_VERSION).encode():
        raise AOTIPackageError(f"aoti_load_package: package version {out['version'][:20]!r}; this flambeau reads "
                               f"version {PACKAGE_VERSION}")
    return out


def _metadata(data: bytes) -> dict:
    try:
        meta = json.loads(data)
    except ValueError as e:
        raise AOTIPackageError(f"aoti_load_package: metadata.json is not JSON ({e})") from None
    need = ("format", "version", "abi_version", "inputs", "outputs", "in_spec", "out_spec")
    if not isinstance(meta, dict) or any(k not in meta for k in need):
        raise AOTIPackageError(f"aoti_load_package: metadata.json lacks fields (needs {', '.join(need)})")
    if meta["version"] != PACKAGE_VERSION or meta["abi_version"] != ABI_VERSION:
        raise AOTIPackageError(f"aoti_load_package: metadata.json says version {meta['version']!r}, ABI "
                               f"{meta['abi_version']!r}; this flambeau reads {PACKAGE_VERSION}, {ABI_VERSION}")
    return meta


def extract_package(path, directory: str) -> dict:
    """Write a checked package's files into `directory` (for the C API: fl_aoti_create(directory));
    returns its metadata."""
    entries = read_package(path)
    meta = _metadata(entries["metadata.json"])
    os.makedirs(directory, exist_ok=True)
    for name, data in entries.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    return meta


def _bind(lib):
    p, i32, i64p = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)
    sigs = {"fl_aoti_create": ([ctypes.c_char_p, ctypes.POINTER(p)], i32), "fl_aoti_free": ([p], None),
            "fl_aoti_last_error": ([], ctypes.c_char_p), "fl_aoti_run": ([p, p, p], i32),
            "fl_aoti_num_outputs": ([p], i32), "fl_aoti_output_ndim": ([p, i32], i32),
            "fl_aoti_output_dtype": ([p, i32], i32), "fl_aoti_output_shape": ([p, i32], i64p),
            "fl_aoti_output_data": ([p, i32], p), "fl_aoti_num_constants": ([p], i32),
            "fl_aoti_constant_fqn": ([p, i32], ctypes.c_char_p), "fl_aoti_constant_data": ([p, i32], p),
            "fl_aoti_set_constant": ([p, i32, p, i32], i32)}
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


class AOTICompiledModel:
    """See module docstring."""

    def __init__(self, path):
        entries = read_package(path)
        self.metadata = _metadata(entries["metadata.json"])
        self.in_spec = _spec(self.metadata["in_spec"])
        self.out_spec = _spec(self.metadata["out_spec"])
        d = tempfile.mkdtemp(prefix="flambeau_aoti_")
        try:
            for name in ("model.so", "weights.bin"):
                with open(os.path.join(d, name), "wb") as f:
                    f.write(entries[name])
            self._lib = _bind(_cpp_builder._dlopen(os.path.join(d, "model.so"), openmp=True))
            runner = ctypes.c_void_p()
            if self._lib.fl_aoti_create(d.encode(), ctypes.byref(runner)) != 0:
                raise AOTIPackageError(f"aoti_load_package: {self._lib.fl_aoti_last_error().decode()}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self._runner = runner
        self._n_in = len(self.metadata["inputs"])
        if self._lib.fl_aoti_num_outputs(runner) != len(self.metadata["outputs"]):
            raise AOTIPackageError("aoti_load_package: metadata.json and model.so disagree on the outputs")
        by_name = {dt.name: dt for dt in DTYPES.values()}
        try:
            self._dtypes = [by_name[i["dtype"]] for i in self.metadata["inputs"]]
        except (KeyError, TypeError):
            raise AOTIPackageError("aoti_load_package: metadata.json names an unknown input dtype") from None
        # per output: its NumPy dtype (from the library) and its shape when static (else read per call)
        self._out_meta = [(np.dtype(DTYPES[self._lib.fl_aoti_output_dtype(runner, i)].np),
                           None if not all(isinstance(d, int) for d in o["shape"]) else tuple(o["shape"]))
                          for i, o in enumerate(self.metadata["outputs"])]
        self._ptrs = (ctypes.c_void_p * max(1, self._n_in))()
        self._shapes = (ctypes.c_void_p * max(1, self._n_in))()
        self._constants: dict = {}      # fqn -> the indices of the constants holding it
        for j in range(self._lib.fl_aoti_num_constants(runner)):
            fqn = self._lib.fl_aoti_constant_fqn(runner, j).decode()
            if fqn:
                self._constants.setdefault(fqn, []).append(j)
        self._user_managed = {}          # index -> the caller's tensor the runner reads (kept alive here)

    def __del__(self):
        lib, runner = getattr(self, "_lib", None), getattr(self, "_runner", None)
        if lib is not None and runner:
            lib.fl_aoti_free(runner)

    def _flat_inputs(self, args, kwargs) -> list:
        try:
            leaves = self.in_spec.flatten_up_to((args, kwargs))
        except ValueError as e:
            raise TypeError(f"The AOTInductor package was called with inputs of a different structure than it was "
                            f"exported with ({e})") from None
        flat = [leaf for sub in leaves for leaf in pytree.tree_leaves(sub)]
        return [x for x in flat if isinstance(x, Tensor)]

    def __call__(self, *args, **kwargs):
        tensors = self._flat_inputs(args, kwargs)
        if len(tensors) != self._n_in:
            raise TypeError(f"The AOTInductor package takes {self._n_in} tensors, got {len(tensors)}")
        arrays, shapes = [], []
        for i, (t, dt) in enumerate(zip(tensors, self._dtypes)):
            if t.dtype is not dt or t.device.type != "cpu":
                raise RuntimeError(f"AOTInductor package: input {self.metadata['inputs'][i]['name']} must be a cpu "
                                   f"{dt} tensor (got {t.dtype} on {t.device})")
            a = np.ascontiguousarray(t._data)
            s = np.array(a.shape if a.ndim else (0,), np.int64)
            arrays.append(a)
            shapes.append(s)
            self._ptrs[i] = a.ctypes.data
            self._shapes[i] = s.ctypes.data
        lib = self._lib
        code = lib.fl_aoti_run(self._runner, self._ptrs, self._shapes)
        if code:
            msg = lib.fl_aoti_last_error().decode()
            if code == ERR_KERNEL and "index out of range" in msg:
                raise IndexError(msg)
            raise RuntimeError(msg)
        outs = []
        for i, (npdt, static) in enumerate(self._out_meta):
            shape = static
            if shape is None:
                nd = lib.fl_aoti_output_ndim(self._runner, i)
                shape = tuple(lib.fl_aoti_output_shape(self._runner, i)[:nd])
            n = int(np.prod(shape, dtype=np.int64)) * npdt.itemsize
            ptr = lib.fl_aoti_output_data(self._runner, i)
            buf = (ctypes.c_char * n).from_address(ptr) if n else b""
            outs.append(Tensor._make(np.frombuffer(buf, npdt).reshape(shape).copy(), CPU))
        return pytree.tree_unflatten(outs, self.out_spec)


    def get_constant_fqns(self) -> list:
        """The FQNs of the parameters, buffers and constants the package holds (not those folded away
        at compile time), as PyTorch's AOTICompiledModel.get_constant_fqns."""
        return list(self._constants)

    def load_constants(self, constants_map: dict, *, check_full_update: bool, user_managed: bool = False) -> None:
        """Replace constants by FQN (PyTorch's): each tensor copied into the runner, or with
        `user_managed` read (and, for a buffer the program updates, written) in place by every later run;
        the caller keeps it alive. `check_full_update`: every constant must be given."""
        entries = {c["fqn"]: c for c in self.metadata.get("constants", []) if c.get("fqn")}
        unknown = [k for k in constants_map if k not in self._constants]
        if unknown:
            raise RuntimeError(f"Constant not found: {unknown[0]}")
        if check_full_update and set(constants_map) != set(self._constants):
            raise RuntimeError("load_constants: check_full_update, but these constants are not given: "
                               f"{sorted(set(self._constants) - set(constants_map))}")
        for fqn, t in constants_map.items():
            want = entries[fqn]
            if not isinstance(t, Tensor) or t.device.type != "cpu" or t.dtype.name != want["dtype"] or \
                    list(t.shape) != list(want["shape"]):
                raise RuntimeError(f"load_constants: constant {fqn} must be a cpu {want['dtype']} tensor of shape "
                                   f"{tuple(want['shape'])} (got {getattr(t, 'dtype', type(t).__name__)} "
                                   f"{tuple(getattr(t, 'shape', ()))})")
            if user_managed and not t.is_contiguous():
                raise RuntimeError(f"load_constants: user_managed constant {fqn} must be contiguous")
            a = t._data if user_managed else np.ascontiguousarray(t._data)
            for j in self._constants[fqn]:
                if self._lib.fl_aoti_set_constant(self._runner, j, a.ctypes.data, int(user_managed)):
                    raise RuntimeError(self._lib.fl_aoti_last_error().decode())
                if user_managed:
                    self._user_managed[j] = t
                else:
                    self._user_managed.pop(j, None)


def aoti_load_package(path) -> AOTICompiledModel:
    """The callable running the package at `path` (see module docstring)."""
    return AOTICompiledModel(path)


# ---- the example C++ program (aoti_example.cpp): its build and its tensor files ------------------------
EXAMPLE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aoti_example.cpp")
CODES = {dt: code for code, dt in DTYPES.items()}


def build_example_program(package_dir: str, exe: str) -> str:
    """Compile aoti_example.cpp against the extracted package in `package_dir` (linked with its
    model.so, found through an rpath); returns `exe`."""
    cmd = [_cpp_builder.cxx, "-O2", "-std=c++17", EXAMPLE_SRC, "-I", package_dir, os.path.join(package_dir, "model.so"),
           f"-Wl,-rpath,{os.path.abspath(package_dir)}", "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise _cpp_builder.CppCompileError(f"building {EXAMPLE_SRC} failed:\n{r.stderr[:4000]}")
    return exe


def write_tensor_file(path: str, t: Tensor) -> None:
    """A tensor in aoti_example.cpp's file format (dtype code, rank, sizes, C-contiguous data)."""
    a = np.ascontiguousarray(t._data)
    with open(path, "wb") as f:
        f.write(np.array([CODES[t.dtype], a.ndim, *a.shape], np.int64).tobytes())
        f.write(a.tobytes())


def read_tensor_file(path: str) -> Tensor:
    with open(path, "rb") as f:
        data = f.read()
    code, ndim = np.frombuffer(data[:16], np.int64)
    shape = tuple(int(s) for s in np.frombuffer(data[16:16 + 8 * ndim], np.int64))
    return Tensor._make(np.frombuffer(data[16 + 8 * ndim:], DTYPES[int(code)].np).reshape(shape).copy(), CPU)
