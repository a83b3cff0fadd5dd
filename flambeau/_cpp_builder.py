"""Compile C++ source into a shared library, with an on-disk cache, and load it with ctypes.

A foundation module (it imports nothing of flambeau): both the eager CPU kernels
(`flambeau._backends.cpu_kernels`) and the code generator (`flambeau._inductor`) build through it.

Flags are detected once per compiler and machine (and remembered on disk): we try
`-O3 -march=native -mprefer-vector-width=512 -fopenmp` plus libmvec's vector math, and drop what the compiler rejects
(no OpenMP, no -march) rather than failing. A library is cached under
`cache_dir/<key>.so` with key = hash(source, flags, compiler version, machine), so a
warm start loads it without running the compiler. Compile errors raise `CppCompileError` naming
the kernel source file and quoting the compiler's message.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading

# Knobs (module attributes; tests and users may set them). Environment variables read at import:
#   FLAMBEAU_CACHE_DIR=path   the on-disk library cache (default ~/.cache/flambeau/inductor)
#   FLAMBEAU_CXX=g++          the C++ compiler (else $CXX, else g++)
cache_dir: str = os.environ.get("FLAMBEAU_CACHE_DIR",
                                os.path.join(os.path.expanduser("~"), ".cache", "flambeau", "inductor"))
cxx: str = os.environ.get("FLAMBEAU_CXX", os.environ.get("CXX", "g++"))

# The single-argument float functions of glibc's libmvec (`_ZGVeN16v_expf`, ...) that the flag
# probe links with `simd` declarations: `simd_math` is True only when all of them (and powf, atan2f)
# do. Generated kernels declare only these as `simd` (tests/test_inductor.py checks that every
# op's libmvec spelling is listed here).
PROBED_SIMD1 = ("exp", "log", "log1p", "expm1", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
         "tanh", "asinh", "acosh", "atanh", "erf", "erfc")

counters = {"compiles": 0, "disk_hits": 0, "memory_hits": 0}
_lock = threading.Lock()
_loaded: dict = {}          # key -> CDLL
_flags_cache: dict = {}


class CppCompileError(RuntimeError):
    pass


class NoCompilerError(RuntimeError):
    pass


def _machine_id() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    model += line
                    if line.startswith("flags"):
                        break
    except OSError:
        pass
    return platform.machine() + hashlib.sha256(model.encode()).hexdigest()[:16]


def compiler_version(cxx: str) -> str:
    path = shutil.which(cxx)
    if path is None:
        raise NoCompilerError(f"C++ compiler {cxx!r} not found")
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise NoCompilerError(f"C++ compiler {cxx!r} does not run: {e}") from e
    if r.returncode != 0:
        raise NoCompilerError(f"C++ compiler {cxx!r} does not run: {r.stderr.strip()}")
    return r.stdout.splitlines()[0] if r.stdout else path


_PROBE = r"""
#include <cmath>
#include <cstdint>
%s
extern "C" void probe(const float* a, float* b, int64_t n) {
  #pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) b[i] = %s;
}
"""


def _try_build(cxx, flags, libs, src, workdir) -> bool:
    cpp = os.path.join(workdir, "probe.cpp")
    so = os.path.join(workdir, f"probe{abs(hash((tuple(flags), tuple(libs), src)))}.so")
    with open(cpp, "w") as f:
        f.write(src)
    r = subprocess.run([cxx, *flags, cpp, "-o", so, *libs], capture_output=True, text=True)
    if r.returncode != 0:
        return False
    try:
        _dlopen(so, "-fopenmp" in flags)
    except OSError:
        return False
    return True


# OpenMP worker threads that spin long (libgomp's default, ~300k iterations) after a kernel steal the
# cores that NumPy's BLAS and eager ops need in between; threads that go to sleep at once make every
# parallel region (and every barrier) pay a futex wake-up of tens of us, which doubles the time of a
# 64x256x256 product. 10000 iterations (a few us) serves both, unless the user chose a policy.
_GOMP_SPINCOUNT = "10000"
_LIBGOMP = "libgomp.so.1"


def _libgomp_loaded() -> bool:
    """Whether this process has libgomp already (dlopen with RTLD_NOLOAD loads nothing)."""
    try:
        ctypes.CDLL(_LIBGOMP, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return True
    except (OSError, AttributeError):     # not loaded; or no RTLD_NOLOAD (not glibc): assume not
        return False


def _dlopen(so: str, openmp: bool) -> ctypes.CDLL:
    """ctypes.CDLL(so). The first library that uses OpenMP loads libgomp, which reads GOMP_SPINCOUNT
    once, in its constructor: the variable is set for that load only and the environment restored
    after, so the user's process (and its subprocesses) never see it."""
    if not openmp or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ or _libgomp_loaded():
        return ctypes.CDLL(so)
    os.environ["GOMP_SPINCOUNT"] = _GOMP_SPINCOUNT
    try:
        return ctypes.CDLL(so)
    finally:
        del os.environ["GOMP_SPINCOUNT"]


def detect_flags(compiler: str | None = None) -> dict:
    """{'cxx', 'version', 'flags', 'libs', 'simd_math'} for this compiler and machine."""
    compiler = compiler or cxx
    if compiler in _flags_cache:
        return _flags_cache[compiler]
    version = compiler_version(compiler)
    key = hashlib.sha256(f"{compiler}|{version}|{_machine_id()}|v2".encode()).hexdigest()[:24]
    path = os.path.join(cache_dir, f"flags-{key}.json")
    try:
        with open(path) as f:
            info = json.load(f)
        _flags_cache[compiler] = info
        return info
    except (OSError, ValueError):
        pass
    base = ["-O3", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fwrapv", "-w"]
    decls = "\n".join(f'extern "C" float {f}f(float) noexcept __attribute__((simd("notinbranch")));'
                      for f in PROBED_SIMD1) + \
        '\nextern "C" float powf(float, float) noexcept __attribute__((simd("notinbranch")));' \
        '\nextern "C" float atan2f(float, float) noexcept __attribute__((simd("notinbranch")));'
    body = " + ".join(f"{f}f(a[i])" for f in PROBED_SIMD1) + " + powf(a[i], a[i]) + atan2f(a[i], a[i])"
    plain = _PROBE % ("", "std::exp(a[i])")
    vec = _PROBE % (decls, body)
    info = None
    with tempfile.TemporaryDirectory() as d:
        for extra in (["-march=native", "-mprefer-vector-width=512", "-fopenmp"], ["-march=native", "-fopenmp"],
                      ["-fopenmp"], ["-march=native"], []):
            flags = base + extra
            if _try_build(compiler, flags, [], plain, d):
                simd = "-fopenmp" in extra and _try_build(compiler, flags, ["-lmvec"], vec, d)
                info = {"cxx": compiler, "version": version, "flags": flags, "libs": ["-lmvec"] if simd else [],
                        "simd_math": simd}
                break
    if info is None:
        raise NoCompilerError(f"C++ compiler {compiler!r} cannot build a shared library on this machine")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
    _flags_cache[compiler] = info
    return info


def cache_key(source: str, info: dict) -> str:
    h = hashlib.sha256()
    for part in (source, " ".join(info["flags"] + info["libs"]), info["version"], _machine_id()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def build(source: str, info: dict) -> tuple:
    """(library path, source path, whether the compiler ran) for `source`, compiling on a miss."""
    key = cache_key(source, info)
    d = os.path.join(cache_dir, key[:2])
    so = os.path.join(d, f"{key}.so")
    cpp = os.path.join(d, f"{key}.cpp")
    if os.path.exists(so):
        counters["disk_hits"] += 1
        return so, cpp, False
    os.makedirs(d, exist_ok=True)
    tag = f"{os.getpid()}.{threading.get_ident()}"
    with open(f"{cpp}.{tag}.tmp", "w") as f:      # atomic: another process may be compiling this file
        f.write(source)
    os.replace(f"{cpp}.{tag}.tmp", cpp)
    tmp = f"{so}.{tag}.tmp"
    cmd = [info["cxx"], *info["flags"], cpp, "-o", tmp, *info["libs"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    counters["compiles"] += 1
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip()
        if len(msg) > 4000:
            msg = msg[:4000] + "\n..."
        raise CppCompileError(f"C++ compilation of generated kernels failed.\n  source: {cpp}\n"
                              f"  command: {' '.join(cmd)}\n{msg}")
    os.replace(tmp, so)
    return so, cpp, True


def load(source: str, info: dict | None = None):
    """Build (or find in the cache) and dlopen the library for `source`: (CDLL, source path)."""
    info = info or detect_flags()
    key = cache_key(source, info)
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            counters["memory_hits"] += 1
            return lib[0], lib[1]
        so, cpp, _ = build(source, info)
        handle = _dlopen(so, "-fopenmp" in info["flags"])
        _loaded[key] = (handle, cpp)
        return handle, cpp
