"""Compile Triton kernels for a GPU target with `triton.compile`, in this process or in a worker process.

`triton_compile` is the one call of Triton's compiler (the hand-written kernels of `triton_launch` and the
generated ones of `flambeau._inductor.triton_runtime`). Before it compiles, `triton.compile` computes
its own cache key from `triton_key()`, a hash of the contents of Triton's compiler sources and of libtriton
(a ~400 MB shared library: 0.4 s a process on the H100 host, on the critical path of a cold first step).
flambeau hands it another key instead (`use_triton_key`, replacing `triton.runtime.cache.triton_key`, the
function Triton's cache lookup calls): `triton_key` here, a hash of Triton's version and of the paths, sizes
and modification times of those same files, read in milliseconds, which changes whenever one of them does (a
reinstall, an edit). It keys Triton's own cache (TRITON_CACHE_DIR) only: flambeau's cubins are kept under
flambeau's keys (`cubin_cache`). `start_triton_key` gets it once per process in a background thread.

Run as a script (`python -P compile_worker.py <capability>`), this file is a compile worker of
`triton_runtime`: it imports Triton and nothing of flambeau (the package's import is ~1 s of a worker's
start), makes Triton's cuda backend at once, then reads one JSON line at a time: {"triton_key": key}, the
launching process's key (sent before the first job), or a job {"path", "name", "sig", "constexprs",
"num_warps", "num_stages" (optional: 1), "aligned", "capability"}: the jit function `name` of the generated
module at `path` (imported once per worker) to compile, answered by one line, {"cubin": base64, "meta": launch
metadata, "seconds"} or {"error": message}. The launching process writes the cubin into its cache.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from concurrent.futures import Future

_THREADS_PER_WARP = 32
_primed: list = []                  # True once this process's Triton has its key (`prime_triton_key`)
_key: list = []                     # the Future of this process's `triton_key` (`start_triton_key`)
_key_lock = threading.Lock()


def _triton():
    """Triton (its compiler, backends and cache modules come with the package), imported at first use."""
    import triton  # deferred: optional dependency, present only where cuda is used; ~0.3 s to import
    return triton


def triton_compile(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int, aligned,
                   capability: int) -> tuple:
    """(cubin, launch metadata) of jit function `fn` from `triton.compile` for sm_<capability> (no GPU
    needed); the parameters named in `aligned` are promised 16-byte aligned (`tt.divisibility`)."""
    triton = _triton()
    names = list(fn.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = triton.compiler.ASTSource(fn, dict(signature), dict(constexprs), attrs)
    compiled = triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", capability, _THREADS_PER_WARP),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    md = compiled.metadata
    return compiled.asm["cubin"], {"name": md.name, "num_warps": md.num_warps, "shared": md.shared,
                                   "global_scratch": md.global_scratch_size}


def _key_inputs() -> list:
    """[relative path, size, mtime_ns] of every file `triton_key()` reads (Triton's runtime/cache.py, the
    compiler, backends and language packages, libtriton), and more: any change among them is seen."""
    triton = _triton()
    root = os.path.dirname(os.path.abspath(triton.__file__))
    out = []
    for top in ("compiler", "backends", "language"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    out.append(os.path.join(d, f))
    out.append(os.path.join(root, "runtime", "cache.py"))
    out += sorted(os.path.join(root, "_C", f) for f in os.listdir(os.path.join(root, "_C"))
                  if f.startswith("libtriton."))
    rows = []
    for p in out:
        st = os.stat(p)
        rows.append([os.path.relpath(p, root), st.st_size, st.st_mtime_ns])
    return [root, triton.__version__, rows]


def triton_key() -> str:
    """The key Triton's cache gets from this process: a sha256 of `_key_inputs()` (Triton's version, the paths,
    sizes and modification times of every file its own `triton_key()` hashes)."""
    return "flambeau-files-" + hashlib.sha256(json.dumps(_key_inputs()).encode()).hexdigest()


def start_triton_key() -> Future:
    """`triton_key()` computed once per process in a background thread (it walks Triton's package: a few ms),
    so that it overlaps what the process does next; the future of its value."""
    with _key_lock:
        if not _key:
            fut = Future()
            _key.append(fut)

            def compute():
                try:
                    fut.set_result(triton_key())
                except Exception as e:      # no key kept: each compile lets Triton hash for itself
                    fut.set_exception(e)
            threading.Thread(target=compute, name="flambeau-triton-key", daemon=True).start()
    return _key[0]


def _forget_key_after_fork() -> None:
    """In a forked child the thread computing the key (`start_triton_key`) does not exist: start afresh (a
    finished key is kept)."""
    global _key_lock
    _key_lock = threading.Lock()
    if _key and not _key[0].done():
        _key.clear()


os.register_at_fork(after_in_child=_forget_key_after_fork)


def use_triton_key(key: str) -> None:
    """Hand Triton its cache key computed elsewhere (`triton_key`): `triton.compile` then reads no file for it."""
    _triton().runtime.cache.triton_key = lambda: key


def prime_triton_key() -> None:
    """Before this process's first `triton.compile`: Triton's key from `start_triton_key`, once."""
    if _primed:
        return
    try:
        use_triton_key(start_triton_key().result())
    except Exception:               # Triton computes it as it would have
        pass
    _primed.append(True)


def _import(path: str, modules: dict):
    """The generated module at `path`, imported once."""
    mod = modules.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"flambeau_triton_worker_{len(modules)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        modules[path] = mod
    return mod


def _answer(job: dict, modules: dict) -> dict:
    t0 = time.perf_counter()
    try:
        fn = getattr(_import(job["path"], modules), job["name"])
        cubin, meta = triton_compile(fn, job["sig"], job["constexprs"], job["num_warps"], job.get("num_stages", 1),
                                     tuple(job["aligned"]), job["capability"])
    except Exception as e:          # the launching process compiles it itself and reports the error
        return {"error": f"{type(e).__name__}: {e}"}
    return {"cubin": base64.b64encode(cubin).decode("ascii"), "meta": meta, "seconds": time.perf_counter() - t0}


def _warm_up(capability: int) -> None:
    """What a process's first `triton.compile` does once, done before the first job: Triton's compiler
    imported, its cuda backend made and hashed (ptxas asked its version)."""
    try:
        triton = _triton()
        triton.compiler.compiler.make_backend(triton.backends.compiler.GPUTarget("cuda", capability,
                                                                                 _THREADS_PER_WARP)).hash()
    except Exception:               # only a head start: the first job does it otherwise
        pass


def serve(capability: int, stdin=sys.stdin, stdout=sys.stdout) -> None:
    """A worker's life: warm Triton up, then answer one line at a time until stdin closes: {"triton_key": key}
    (Triton's cache key, which the launching process computed: `use_triton_key`; no answer) or a job."""
    _warm_up(capability)
    modules: dict = {}
    for line in stdin:
        msg = json.loads(line)
        if "triton_key" in msg:
            use_triton_key(msg["triton_key"])
            continue
        stdout.write(json.dumps(_answer(msg, modules)) + "\n")
        stdout.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
