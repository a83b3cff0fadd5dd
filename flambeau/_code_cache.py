"""Python code objects of generated source, kept on disk: a warm process skips the Python compile.

A foundation module (it imports nothing of flambeau but `_cpp_builder`, for the cache directory). A compiled
graph's Python is generated text compiled by `compile()` in each process: the FX GraphModules' `forward`
(dynamo's graph, AOT autograd's joint, forward and backward), the inductor's wrapper, dynamo's guards. For
GPT-2 that is ~0.3-0.5 s of a warm first step. `compile_source(source, filename)` keeps the code object of
`source` in `<FLAMBEAU_CACHE_DIR>/pycode/<key[:2]>/<key>.bin`, keyed by a hash of the source, the compile mode
and this Python's bytecode magic number (marshal's format follows it), and loads it from there with
`marshal` on the next call; the file name is not in the key: a hit gets it set on the code object and the
code objects nested in it (`co_filename` is the only field it decides). An entry is a magic line, the
payload's sha256, the marshalled code; written to a temporary file and renamed; anything else (truncated,
damaged, another format) is a miss, compiled and written again. Sources under `MIN_CHARS` are compiled as
they come (their compile is faster than a file read). `FLAMBEAU_CODE_CACHE=0` (`enabled = False`) turns it off.
Every caller's module, like this one, compiles under `from __future__ import annotations` (which `compile`
inherits from the module calling it), so a cached code object is the one the caller's own `compile` made.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import threading
import types

from . import _cpp_builder

enabled: bool = os.environ.get("FLAMBEAU_CODE_CACHE", "1") not in ("", "0")
MIN_CHARS = 4096                    # shorter sources compile in less time than a cache file takes to read
MAGIC = b"flambeau-pycode 1\n"
stats = {"hits": 0, "misses": 0, "corrupt": 0}


def key(source: str, mode: str = "exec") -> str:
    """The cache key of `source` compiled in `mode` by this Python."""
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    h.update(mode.encode())
    h.update(b"\0")
    h.update(source.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def path(k: str) -> str:
    return os.path.join(_cpp_builder.cache_dir, "pycode", k[:2], f"{k}.bin")


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _read(p: str):
    """The code object of entry `p`, or None (absent, or not a whole entry)."""
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(MAGIC) + 32
    if data[:len(MAGIC)] != MAGIC or hashlib.sha256(data[head:]).digest() != data[len(MAGIC):head]:
        stats["corrupt"] += 1
        return None
    try:
        code = marshal.loads(data[head:])
    except (EOFError, ValueError, TypeError):
        stats["corrupt"] += 1
        return None
    return code if isinstance(code, types.CodeType) else None


def _write(p: str, code: types.CodeType) -> None:
    payload = marshal.dumps(code)
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = f"{p}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, p)
    except OSError:                 # a read-only or full cache directory: the code still runs
        pass


def compile_source(source: str, filename: str, mode: str = "exec") -> types.CodeType:
    """`compile(source, filename, mode)`, from the on-disk cache when this source was compiled before."""
    if not enabled or len(source) < MIN_CHARS:
        return compile(source, filename, mode)
    p = path(key(source, mode))
    code = _read(p)
    if code is not None:
        stats["hits"] += 1
        return _with_filename(code, filename) if code.co_filename != filename else code
    stats["misses"] += 1
    code = compile(source, filename, mode)
    _write(p, code)
    return code
