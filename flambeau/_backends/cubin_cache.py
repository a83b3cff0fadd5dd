"""The on-disk cache of compiled GPU kernels (cubins): a warm process loads a kernel's binary without Triton.

Both kinds of Triton kernels go through it: the hand-written ones (`triton_launch.compile_kernel`) and
those the inductor generates (`flambeau._inductor.triton_runtime`). Before this cache the hand-written
ones went to `triton.compile` on every start, which computes Triton's own cache key (a hash of Triton's
sources and libtriton, ~0.4 s on the H100 host) before finding its hit.

An entry is one file, `<FLAMBEAU_CACHE_DIR>/triton/cubin/<key[:2]>/<key>.bin`: a magic line, one JSON line
of what a launch needs (the kernel's name, warps, shared memory, global scratch bytes) with the cubin's
length and sha256, then the cubin. The caller's `key(...)` hashes everything the binary depends on (the
kernel's source and dependencies, signature, constexprs, pointer alignment, options, compute capability)
together with the Triton version and `VERSION` (bumped when an entry's format or meaning changes).
`read` checks an entry whole (magic, JSON, length, checksum): anything else, a truncated or corrupt file
or another format, is a miss (`stats["corrupt"]`) and the caller rebuilds and rewrites it. `write` goes
to a temporary file renamed over the entry, so concurrent writers of one key each leave a whole entry and
a reader never sees part of one. `FLAMBEAU_KERNEL_CACHE=0` (`enabled = False`) turns reading and
writing off (every kernel compiled by Triton).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading

from .. import _cpp_builder

VERSION = 1
MAGIC = b"flambeau-cubin 1\n"
enabled: bool = os.environ.get("FLAMBEAU_KERNEL_CACHE", "1") not in ("", "0")
stats = {"hits": 0, "misses": 0, "corrupt": 0, "writes": 0}
META_FIELDS = ("name", "num_warps", "shared", "global_scratch")   # what every entry's metadata holds


def root() -> str:
    """The cache's directory (under `_cpp_builder.cache_dir`, FLAMBEAU_CACHE_DIR, read at each call)."""
    return os.path.join(_cpp_builder.cache_dir, "triton", "cubin")


def key(*parts) -> str:
    """The entry key of a kernel binary described by `parts` (JSON-able: strings, numbers, lists, dicts
    with string keys), with this cache's VERSION."""
    return hashlib.sha256(json.dumps([VERSION, *parts], sort_keys=True).encode()).hexdigest()


def path(k: str) -> str:
    return os.path.join(root(), k[:2], k + ".bin")


def exists(k: str) -> bool:
    """Whether an entry file is there (not checked: `read` checks)."""
    return enabled and os.path.exists(path(k))


def read(k: str):
    """(cubin bytes, metadata dict) of entry `k`, or None: missing, disabled, or not a whole valid entry."""
    if not enabled:
        return None
    try:
        with open(path(k), "rb") as f:
            data = f.read()
    except OSError:
        stats["misses"] += 1
        return None
    entry = _parse(data)
    if entry is None:
        stats["corrupt"] += 1
        return None
    stats["hits"] += 1
    return entry


def _parse(data: bytes):
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return None
    try:
        meta = json.loads(data[len(MAGIC):end])
    except ValueError:
        return None
    cubin = data[end + 1:]
    if not isinstance(meta, dict) or any(f not in meta for f in META_FIELDS) or meta.get("size") != len(cubin) \
            or meta.get("sha256") != hashlib.sha256(cubin).hexdigest():
        return None
    return cubin, {f: meta[f] for f in META_FIELDS}


def write(k: str, cubin: bytes, meta: dict) -> None:
    """Store entry `k` (temporary file, then renamed over the entry: atomic for readers and other
    writers). Does nothing when the cache is off; a file-system error leaves the cache without it."""
    if not enabled:
        return
    head = {f: meta[f] for f in META_FIELDS}
    head.update(size=len(cubin), sha256=hashlib.sha256(cubin).hexdigest())
    p = path(k)
    tmp = f"{p}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + json.dumps(head).encode() + b"\n" + bytes(cubin))
        os.replace(tmp, p)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    stats["writes"] += 1
