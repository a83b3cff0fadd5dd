"""Load and launch the Triton kernels of a compiled graph (codegen_triton.py), on cuda or on the CPU.

The generated module is written to the on-disk cache (`<flambeau cache dir>/triton/`) under a key
hashing its source, the device (GPU compute capability, or "interpret") and the Triton version
(`GeneratedModule`), and imported from there (Triton's `@triton.jit` reads a function's source from its
file) only when one of its functions is needed as a `JITFunction`: to run in the interpreter, or to
compile a kernel whose cubin the disk cache lacks.

On cuda each kernel is built for the current device with `triton.compile` on first launch and launched through CuPy
on its current stream (`flambeau._backends.triton_launch`: no PyTorch, no Triton launcher). Its cubin and launch
metadata are cached on disk (`flambeau._backends.cubin_cache`), keyed by the kernel's own source text cut from the
module's (`KernelRef.key`: the function with its own, its parameters' and its locals' names replaced by positional
ones, `canonical_source`, and the module prelude it calls, not the whole module, so a graph that differs in one
kernel reuses the others' cubins, and identical kernels of a model's repeated layers share one), signature, block
sizes, pointer alignment, compute capability and Triton version, so a second process, or a second compile of the
same model, loads every cubin without importing the module: no `@triton.jit` decoration (~1 ms a kernel) and no
Python compile of its source (GPT-2's forward and backward: 322 kernels).

On cpu tensors the kernels run in Triton's interpreter, which `TRITON_INTERPRET=1` turns on (it
must be set before Triton is imported), and each NumPy array is passed wrapped in `HostArray`,
which offers what the interpreter reads of an argument (`data_ptr`, `dtype`, `untyped_storage()`,
`new_empty`/`set_`/`copy_`, which on memory already on the host alias rather than copy). The
interpreter has no libdevice, so the module's `libdevice` is `InterpreterLibdevice`: the same
functions on the interpreter's NumPy blocks.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import numpy as np
import triton
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

from .. import _backends, _cpp_builder, _logging
from .._backends import compile_worker, cubin_cache, triton_launch as TL
from . import autotune as autotune_mod, config
from .codegen_triton import HEADER, REDUCE_HELPERS, TL as TL_NAMES, TRITON_HELPERS

log = _logging.get_logger("flambeau._inductor")
ALIGN = 16                          # bytes: pointers promised aligned to Triton (vectorised access)
_modules: dict = {}
_lock = threading.Lock()
stats = {"launches": 0, "compiled": 0, "cubin_cache_hits": 0, "compiled_in_workers": 0, "modules_imported": 0}


def triton_version() -> str:
    return triton.__version__


def _cupy():
    return _backends.get("cuda").xp


def cache_dir() -> str:
    return os.path.join(_cpp_builder.cache_dir, "triton")


def device_key(device) -> str:
    """'interpret' for cpu tensors, else 'sm<capability>' of the current cuda device."""
    if device.type == "cpu":
        return "interpret"
    return f"sm{_cupy().cuda.Device().compute_capability}"


_PRELUDE = HEADER + TRITON_HELPERS + REDUCE_HELPERS    # what a generated kernel may call besides itself
_PRELUDE_HASH = hashlib.sha256(_PRELUDE.encode())
_JIT_DEF = "\n@triton.jit\ndef "               # how codegen_triton begins each function (`_function`)


_DEF_LINE = re.compile(r"def (\w+)\(([^)]*)\):")
_WORD = re.compile(r"[A-Za-z_]\w*")
_LOCAL = re.compile(r"^\s+([A-Za-z_]\w*)\s*=(?!=)|\bfor ([A-Za-z_]\w*) in\b", re.M)


def canonical_source(source: str) -> tuple:
    """(text, {parameter: positional name}) of one kernel's source (`kernel_sources`), for its cache key: its own
    name, its parameters (by position: `_fl_p0`, ...) and the locals it assigns (by first assignment: `_fl_v0`, ...)
    renamed, attributes (`x.to`) never: the same computation under other names (a GPT's identical layers read
    `arg5` and store `buf28_v` in one kernel, `arg17` and `buf55_v` in the next) is the same text. The binary does
    not depend on those names: a cubin's entry point is loaded by the name recorded with it."""
    m = _DEF_LINE.match(source)
    params = [p.split(":")[0].strip() for p in m.group(2).split(",") if p.strip()]
    names = {n: f"_fl_p{i}" for i, n in enumerate(params)}
    every = {m.group(1): "_fl_kernel", **names}
    for a, b in _LOCAL.findall(source):
        every.setdefault(a or b, f"_fl_v{len(every)}")
    between, words = _WORD.split(source), _WORD.findall(source)    # (one pass: ~0.2 ms a kernel)
    text = "".join(b + (w if b.endswith(".") else every.get(w, w)) for b, w in zip(between, words)) + between[-1]
    return text, names


def kernel_sources(module_source: str) -> dict:
    """{function name: its source text, from `def` to its last line} of a generated module's jit
    functions (the prelude's helpers too), cut from the text: each begins at `@triton.jit` at the start
    of a line and ends before the next (a function's own lines are indented)."""
    out = {}
    for piece in module_source.split(_JIT_DEF)[1:]:
        out[piece[:piece.index("(")]] = "def " + piece.rstrip()
    return out


def _write_atomic(path: str, data, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, mode) as f:
        f.write(data)
    os.replace(tmp, path)


class KernelRef:
    """One kernel of a `GeneratedModule`: its name, cache key (a hash of the module prelude and of its
    `canonical_source`) and its parameters' positional names, without its `JITFunction`, which `jit` makes
    (importing the module) only when asked."""
    __slots__ = ("module", "name", "key", "params")

    def __init__(self, module: "GeneratedModule", name: str, source: str):
        self.module, self.name = module, name
        text, self.params = canonical_source(source)
        h = _PRELUDE_HASH.copy()
        h.update(text.encode())
        self.key = h.hexdigest()

    @property
    def jit(self):
        """The kernel's `@triton.jit` function (the module imported at the first use)."""
        return getattr(self.module.load(), self.name)


class GeneratedModule:
    """A generated module of Triton kernels, written to disk (`__file__`) and imported at the first
    `load()` (every `@triton.jit` of it run then); `kernel(name)` needs only its text."""

    def __init__(self, source: str, path: str, name: str, interpret: bool):
        self.source, self.__file__, self.name, self.interpret = source, path, name, interpret
        self._module = None
        self._refs = None
        self._sources = None

    def kernel(self, name: str) -> KernelRef:
        refs = self._refs
        if refs is None:
            refs = self._refs = {}
            self._sources = kernel_sources(self.source)
        ref = refs.get(name)
        if ref is None:
            ref = refs[name] = KernelRef(self, name, self._sources[name])
        return ref

    def load(self):
        """The imported module (Python module object), imported once."""
        mod = self._module
        if mod is None:
            with _lock:
                mod = self._module
                if mod is None:
                    spec = importlib.util.spec_from_file_location(self.name, self.__file__)
                    mod = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(mod)
                    if self.interpret:
                        mod.libdevice = InterpreterLibdevice()
                    sys.modules[self.name] = mod
                    self._module = mod
                    stats["modules_imported"] += 1
        return mod


def load_module(source: str, device):
    """The generated module (`GeneratedModule`) of `source`, written to the on-disk cache on a miss, made
    once per process; imported at once only for the interpreter (cpu tensors)."""
    dkey = device_key(device)
    key = hashlib.sha256(f"{source}\n{dkey}\n{triton.__version__}".encode()).hexdigest()
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod, key
        path = os.path.join(cache_dir(), key[:2], f"k{key[:40]}.py")
        if not os.path.exists(path):
            _write_atomic(path, source)
        mod = _modules[key] = GeneratedModule(source, path, f"flambeau_triton_{key[:40]}_{dkey}", dkey == "interpret")
    if mod.interpret:
        mod.load()
    return mod, key


# ---- launching ------------------------------------------------------------------------------------
class HostArray:
    """A NumPy array as Triton's interpreter takes a tensor argument (see the module docstring)."""
    __slots__ = ("a", "dtype")

    def __init__(self, a: np.ndarray, tl_dtype):
        self.a = a
        self.dtype = tl_dtype

    def data_ptr(self) -> int:
        return self.a.__array_interface__["data"][0]

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args):
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self):
        return self.a.shape

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def copy_(self, other):
        return self


def _interpreter_int(v: int):
    """A size argument as the interpreter's 0-d int64 tensor (it makes a Python int a 1-element
    array, which `range()` in a kernel can't take)."""
    return tl.tensor(TensorHandle(np.array(v, np.int64), tl.int64), tl.int64)


def _tl_dtype(dt):
    return getattr(tl, TL_NAMES[dt].split(".")[1])


_SINGLE_LAUNCH = """
def make(one, general):
    def call({args}):
        {ptrs} = {reads}
        if ({ors}) % ALIGN or not one:
            return general({wrapped})
        single = one[0]
        if single is None:
            return chained(one[1], ({ptrs},))
        fptr, g0, g1, g2, threads, shared, blocks = single
        blk = blocks.get(get_ident())
        if blk is None:
            return general({wrapped})
        stats["launches"] += 1
        blk.values[:{n}] = {ptrs},
        run, stream = TL._driver or TL._driver_calls()
        run(fptr, g0, g1, g2, threads, 1, 1, shared, stream(), blk.address, 0)
    return call
"""


def _chained(chain: tuple, ptrs: tuple) -> None:
    """The launches of a prepared chain (`Launcher._prepare_direct`; `Launcher._one`'s second item) for aligned
    pointers `ptrs`: run by `_direct_call`, and straight from the generated entry (`_single_launch`)."""
    run, stream = TL._driver or TL._driver_calls()
    s, tid = stream(), threading.get_ident()
    stats["launches"] += len(chain)
    for fptr, g0, g1, g2, threads, shared, take, ws, n, blocks in chain:
        blk = blocks.get(tid)
        if blk is None:
            blk = blocks[tid] = TL.PointerBlock(n)
        blk.values[:n] = ptrs[:take] + ws if take is not None else ptrs
        run(fptr, g0, g1, g2, threads, 1, 1, shared, s, blk.address, 0)
_single_launch_makers: dict = {}       # (number of arguments, raw positions) -> `make` of _SINGLE_LAUNCH for them


class RawPointer:
    """A device address where a launch reads an array's `.data.ptr` (`_single_launch`'s raw arguments,
    handed to the general path)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    @property
    def data(self):
        return self


def _single_launch(n: int, one: list, general, raw: tuple = ()):
    """call(*n arguments): the Launcher call of a static graph's kernel on cuda, made for `n` arguments,
    those at positions `raw` device addresses (ints: the wrapper's arena temporaries) and the others
    arrays. Once `general` (`Launcher._direct_call`) has prepared the launches (`Launcher._one`), an
    aligned call reads the pointers into locals; a chain of one kernel taking just the call's pointers, on
    a thread that launched before, writes them into its `PointerBlock` and calls cuLaunchKernel (no
    argument tuple or list, no loop); a longer chain runs `_chained`; any other call is `general`'s (the
    raw addresses as `RawPointer`s)."""
    make = _single_launch_makers.get((n, raw))
    if make is None:
        names, ptrs = [f"a{i}" for i in range(n)], [f"p{i}" for i in range(n)]
        src = _SINGLE_LAUNCH.format(
            args=", ".join(names), ptrs=", ".join(ptrs), ors=" | ".join(ptrs), n=n,
            reads=", ".join(a if i in raw else f"{a}.data.ptr" for i, a in enumerate(names)),
            wrapped=", ".join(f"RawPointer({a})" if i in raw else a for i, a in enumerate(names)))
        ns = {"ALIGN": ALIGN, "get_ident": threading.get_ident, "stats": stats, "TL": TL, "RawPointer": RawPointer,
              "chained": _chained}
        exec(compile(src, f"<flambeau-launch-{n}>", "exec"), ns)
        make = _single_launch_makers[n, raw] = ns["make"]
    return make(one, general)


class Launcher:
    """Calls one scheduled kernel's generated function(s) (`Launch`, then `Launch.then`):
    `launcher(*arrays, *sizes[, err])`, the grid computed from the sizes."""

    def __init__(self, module, launch, device, autotune: bool = False):
        self.chain = []
        la = launch
        while la is not None:
            self.chain.append((la, module.kernel(la.name)))
            la = la.then
        self.launch = launch
        self.error_flag = any(la.error_flag for la, _ in self.chain)
        self.device = device
        self.kernel_key = self.chain[0][1].key        # what autotuning results are cached under
        self.interpret = device.type == "cpu"
        self.n_bufs = len(launch.buffers)
        self.size_names = launch.size_names
        self.tl_dtypes = [_tl_dtype(b.dtype) for b in launch.buffers]
        self._compiled: dict = {}
        self._workspace: dict = {}
        self.autotune = autotune and not self.interpret and autotune_mod.tunable(self.chain)
        self._tuned: dict = {}               # size values -> the Launch variant chosen (autotune.py)
        self._static = None                  # [(launch, fn, grid, scratch pointers, kernels)] (`_static_call`)
        self._direct = None                  # the aligned static launches (`_direct_call`); False: none
        # `_direct` as `_single_launch` reads it, once prepared: [the one launch (function, grid x/y/z, threads,
        # shared bytes, per-thread blocks) when the chain is a single kernel of just the call's pointers, else
        # None; else the launches, scratch pointers as tuples (`_chained`)]
        self._one: list = []

    def workspace(self, la) -> list:
        """The scratch arrays of a launch (a split reduction's partial results), by name, shared by
        the launches of the chain and made once per Launcher: launches on one stream run in order,
        so every call may reuse them."""
        out = []
        for name, dt, n in la.workspace:
            a = self._workspace.get(name)
            if a is None:
                a = self._workspace[name] = (np if self.interpret else _cupy()).empty(n, dt.np)
            out.append(a)
        return out

    def direct(self) -> bool:
        """Whether `entry` is a function of the call's pointers (a graph with static sizes on cuda, not
        autotuned): what may take raw addresses."""
        return not self.size_names and not self.interpret and not self.autotune

    def entry(self, raw: tuple = ()):
        """What a wrapper calls: for a graph with static sizes on cuda a function of the call's arrays made
        for their number (`_single_launch`; the arguments at positions `raw` device addresses), else the
        Launcher (`raw` must then be empty)."""
        if self.direct():
            return _single_launch(self.n_bufs + (1 if self.error_flag else 0), self._one, self._direct_call, raw)
        if raw:
            raise ValueError("Launcher.entry: raw addresses need a static launch on cuda (Launcher.direct())")
        return self

    def __call__(self, *args):
        nb, ns = self.n_bufs, len(self.size_names)
        if not ns and not self.interpret and not self.autotune:
            return self._direct_call(*args)
        bufs, sizes, err = args[:nb], args[nb:nb + ns], args[nb + ns:]
        env = dict(zip(self.size_names, sizes)) if sizes else {}
        for la, fn in self.chain:
            g = la.grid(env)
            if g[0] == 0:
                continue
            stats["launches"] += 1
            e = err if la.error_flag else ()
            ws = self.workspace(la) if la.workspace else ()
            if self.interpret:
                arrays = [HostArray(a, t) for a, t in zip(bufs, self.tl_dtypes)]
                extra = [HostArray(x, tl.int32) for x in e] + \
                    [HostArray(x, _tl_dtype(dt)) for x, (_, dt, _) in zip(ws, la.workspace)]
                fn.jit[g](*arrays, *map(_interpreter_int, sizes), *extra, **la.constexprs)
                continue
            ptrs = [a.data.ptr for a in bufs] + [x.data.ptr for x in tuple(e) + tuple(ws)]
            if self.autotune:
                la = self._tuned_launch(la, fn, ptrs, sizes, env)
                g = la.grid(env)
            self._launch(la, fn, g, ptrs, sizes)

    def _direct_call(self, *args):
        """A static call whose pointers (buffers, error flag) are all 16-byte aligned, as CuPy's
        allocations are: each launch's driver arguments worked out once (`_prepare_direct`), the
        pointers written into its `PointerBlock` by one slice assignment, the stream read once. A
        misaligned pointer, and a kernel with other parameters, take `_static_call`."""
        ptrs = [a.data.ptr for a in args]
        m = 0
        for p in ptrs:
            m |= p
        direct = self._direct
        if m % ALIGN or direct is False:
            return self._static_call(args)
        if direct is None:
            direct = self._direct = self._prepare_direct(len(ptrs))
            if direct is False:
                return self._static_call(args)
            if len(direct) == 1 and direct[0][6] is None:
                fptr, g0, g1, g2, threads, shared, _, _, _, blocks = direct[0]
                self._one[:] = [(fptr, g0, g1, g2, threads, shared, blocks), None]
            elif direct:
                self._one[:] = [None, direct]
        _chained(direct, tuple(ptrs))

    def _prepare_direct(self, n_args: int):
        """((function, grid x/y/z, threads, shared bytes, pointers taken of the call's (None: all),
        scratch pointers (a tuple), parameter count, per-thread blocks), ...) of the chain's non-empty launches for
        aligned pointers, or False when one needs `_static_call` (misaligned scratch, a parameter
        that is no pointer, global scratch)."""
        out = []
        for la, fn in self.chain:
            ws = tuple(a.data.ptr for a in self.workspace(la))
            take = n_args if la.error_flag else self.n_bufs
            n = take + len(ws)
            if any(p % ALIGN for p in ws):
                return False
            k, _ = self._entry(la, fn, tuple(range(n)))
            if not TL.pointers_only(k):
                return False
            g = tuple(int(x) for x in la.grid({})) + (1, 1)
            if g[0] and g[1] and g[2]:
                out.append((k.function.ptr, g[0], g[1], g[2], k.num_warps * TL._THREADS_PER_WARP, k.shared,
                            None if take == n_args and not ws else take, ws, n, {}))
        return tuple(out)

    def _static_call(self, args):
        """A call of a graph with static sizes on cuda: each launch's grid, scratch pointers and kernels
        (per pointer alignment) worked out once (`_static`), the buffers' pointers read once per call."""
        static = self._static
        if static is None:
            static = self._static = [(la, fn, la.grid({}), [a.data.ptr for a in self.workspace(la)], {})
                                     for la, fn in self.chain]
        nb = self.n_bufs
        bufs = [a.data.ptr for a in args[:nb]]
        err = [x.data.ptr for x in args[nb:]]
        for la, fn, g, ws, entries in static:
            if g[0] == 0:
                continue
            stats["launches"] += 1
            ptrs = bufs + err + ws if la.error_flag else bufs + ws
            aligned = tuple(i for i, p in enumerate(ptrs) if p % ALIGN == 0)
            entry = entries.get(aligned)
            if entry is None:
                entry = entries[aligned] = self._entry(la, fn, aligned)
            k, direct = entry
            if direct:
                TL.launch_values(k, g, ptrs)
            else:
                TL.launch(k, g, *[TL.Ptr(p) for p in ptrs])

    def _entry(self, la, fn, aligned) -> tuple:
        """(kernel, whether `TL.launch_values` takes its arguments) of `la` for these pointer alignments."""
        entry = self._compiled.get((la.name, la.xblock, la.num_warps, aligned))
        if entry is None:
            k = self._kernel(la, fn, aligned)
            entry = self._compiled[la.name, la.xblock, la.num_warps, aligned] = (k, TL.takes_values(k))
        return entry

    def _launch(self, la, fn, g, ptrs, sizes):
        aligned = tuple(i for i, p in enumerate(ptrs) if p % ALIGN == 0)
        k, direct = self._entry(la, fn, aligned)
        nb = self.n_bufs
        if direct:
            TL.launch_values(k, g, ptrs[:nb] + list(sizes) + ptrs[nb:])
        else:
            TL.launch(k, g, *[TL.Ptr(p) for p in ptrs[:nb]], *sizes, *[TL.Ptr(p) for p in ptrs[nb:]])

    def _tuned_launch(self, la, fn, ptrs, sizes, env):
        """The variant of `la` that autotuning chose for these sizes (see autotune.py)."""
        key = tuple(sizes)
        best = self._tuned.get(key)
        if best is None:
            def run(v):
                self._launch(v, fn, v.grid(env), ptrs, sizes)
            aligned = tuple(i for i, p in enumerate(ptrs) if p % ALIGN == 0)

            def build(v):
                await_jobs()
                self._entry(v, fn, aligned)
            best = autotune_mod.choose(self, la, env, run, _cupy(), cache_dir(), device_key(self.device),
                                       _write_atomic, build)
            if best is None:                 # capturing, nothing known: the generator's choice, not kept
                return la
            self._tuned[key] = best
            kept = {(v.xblock, v.num_warps) for v in self._tuned.values()}
            for k in [k for k in self._compiled if k[0] == la.name and k[1:3] not in kept]:
                del self._compiled[k]       # the losers' kernels (their CuPy modules unload when unreferenced)
        return best

    def build(self) -> None:
        """Every kernel of the chain loaded for 16-byte aligned pointers, as a first call will need it, once every
        queued compile job is done (`await_jobs`): what a template's choice does before timing (mm_template.select)."""
        await_jobs()
        for la, fn in self.chain:
            self._entry(la, fn, tuple(range(len(_arg_names(la)))))

    def _kernel(self, la, fn, aligned: tuple):
        """The cubin for these pointer alignments: from the disk cache, else compiled and cached."""
        names = _arg_names(la)
        return load_or_compile(fn, la.signature(), la.constexprs, la.num_warps, tuple(names[i] for i in aligned),
                               device_key(self.device), la.num_stages)


def _cubin_key(kernel: KernelRef, sig, constexprs, num_warps, aligned, dkey, num_stages: int = 1) -> str:
    """The cubin cache key of a kernel's build: its parameters named by position (`KernelRef.params`), so every
    kernel of the same canonical source (a GPT's layers) shares one cubin."""
    pos = kernel.params
    stages = [num_stages] if num_stages != 1 else []
    return cubin_cache.key("inductor", kernel.key, sorted((pos[n], t) for n, t in sig.items()),
                           sorted((pos[n], v) for n, v in constexprs.items()), num_warps, [pos[n] for n in aligned],
                           dkey, triton_version(), *stages)


def build_cubin(fn, sig: dict, constexprs: dict, num_warps: int, aligned: tuple, capability: int, num_stages: int = 1):
    """(cubin bytes, launch metadata) of jit function `fn` compiled by `triton.compile` for
    sm_<capability> (needs no GPU: tests compile generated kernels on the CPU machine too)."""
    return TL._triton_compile(fn, sig, constexprs, num_warps, num_stages, aligned, capability)


def load_or_compile(kernel: KernelRef, sig, constexprs, num_warps, aligned, dkey, num_stages: int = 1):
    """The loaded kernel of `kernel` for these launch facts: its cubin from the disk cache (a hit counts in
    `stats["cubin_cache_hits"]`; the module is not imported), else compiled (`stats["compiled"]`) and cached.
    (`num_stages` reaches `build_cubin` only when it is not 1: mm_template.py's products.)"""
    key = _cubin_key(kernel, sig, constexprs, num_warps, aligned, dkey, num_stages)
    pending = _pending.get(key)
    if pending is not None:                  # a worker is compiling it (`precompile`): wait for its job
        pending.result()
        _pending.pop(key, None)
    entry = cubin_cache.read(key)
    if entry is not None:
        stats["cubin_cache_hits"] += 1
    else:
        entry = build_cubin(kernel.jit, sig, constexprs, num_warps, aligned, int(dkey[2:]),
                            **({"num_stages": num_stages} if num_stages != 1 else {}))
        cubin_cache.write(key, *entry)
        stats["compiled"] += 1
    return TL.load_cubin(*entry, tuple(t for t in sig.values() if t != "constexpr"))


# ---- compiling in parallel -------------------------------------------------------------------------
_pending: dict = {}                 # cubin cache key -> Future of the worker job compiling it
_jobs: queue.SimpleQueue = queue.SimpleQueue()      # (job, cubin cache key, Future) for the worker threads
_workers: list = []                 # the worker threads started (`_start_workers`), each with its process
_busy = [0]                         # workers compiling a job now
broken = [None]                     # why compile workers are off in this process (one died unborn), or None
_workers_lock = threading.Lock()
compile_times: list = []            # (kernel, seconds its worker spent, worker thread, done at perf_counter)
MIN_PARALLEL_JOBS = 2               # kernels missing at least, for a process's first workers to start


def _arg_names(la) -> tuple:
    return tuple(b.name for b in la.buffers) + (("fl_err",) if la.error_flag else ()) + \
        tuple(w for w, _, _ in la.workspace)


def await_jobs() -> None:
    """Wait until every kernel queued for the compile workers is compiled. Autotuning calls it before it times
    anything: the first step launches every kernel of its module anyway, so the wait costs little, and the
    workers' compiles (all the host's cores) would otherwise slow the launches being timed."""
    for fut in list(_pending.values()):
        fut.result()


def precompile(module, launches, device) -> None:
    """Start compiling a cuda module's kernels in worker processes (`precompile_for`)."""
    if device.type == "cuda":
        precompile_for(module, launches, device_key(device))


def precompile_for(module, launches, dkey: str) -> list:
    """Queue each kernel of `launches` whose cubin the disk cache lacks as one job for the compile workers
    (`_worker_thread`), in launch order, with every pointer assumed 16-byte aligned (CuPy's allocations
    are), and start workers for them (up to `config.compile_threads`; none while nothing misses: a warm
    start runs none); returns the jobs' futures. A launch waits in `load_or_compile` for its kernel's job
    only. Nothing with the cubin cache off (`cubin_cache.enabled`: the workers' cubins go through it), and
    nothing for fewer than MIN_PARALLEL_JOBS missing kernels while no worker runs (one kernel compiles
    faster in this process than a worker starts)."""
    if config.compile_threads <= 1 or not cubin_cache.enabled or broken[0]:
        return []
    jobs, seen = [], set()
    for la in launches:
        while la is not None:
            names, sig = _arg_names(la), la.signature()
            key = _cubin_key(module.kernel(la.name), sig, la.constexprs, la.num_warps, names, dkey, la.num_stages)
            if key not in _pending and key not in seen and not cubin_cache.exists(key):
                seen.add(key)             # (identical kernels of one module: one job)
                jobs.append(({"path": module.__file__, "name": la.name, "sig": sig, "constexprs": la.constexprs,
                              "num_warps": la.num_warps, "num_stages": la.num_stages, "aligned": list(names),
                              "capability": int(dkey[2:])}, key))
            la = la.then
    if not jobs or (len(jobs) < MIN_PARALLEL_JOBS and not _workers):
        return []
    futures = []
    for job, key in jobs:
        fut = _pending[key] = Future()
        _jobs.put((job, key, fut))
        futures.append(fut)
    compile_worker.start_triton_key()
    _start_workers(int(dkey[2:]))
    return futures


PRESTART = 8                        # workers a cuda compile starts before lowering on an empty cubin cache


def begin_cuda_compile(device) -> None:
    """Before a cuda graph is lowered: Triton's cache key (`compile_worker.triton_key`: from the sizes and
    times of Triton's files) begins in the background, for the compile workers (sent to each before its first
    job) and for this process's own `triton.compile`; and where the cubin cache holds no
    entry at all (every kernel will miss), up to PRESTART workers start now, their start overlapping the
    lowering. With any entry there, workers wait for the first miss (`precompile_for`)."""
    compile_worker.start_triton_key()
    if config.compile_threads > 1 and cubin_cache.enabled and not broken[0] and not _workers and \
            _cubin_cache_empty():
        _start_workers(int(device_key(device)[2:]), at_least=min(PRESTART, config.compile_threads))


def cold_cache() -> bool:
    """Whether a cuda compile now starts from nothing: compile workers in use and the cubin cache empty (every
    kernel will be compiled)."""
    return config.compile_threads > 1 and cubin_cache.enabled and not broken[0] and _cubin_cache_empty()


def _cubin_cache_empty() -> bool:
    try:
        with os.scandir(cubin_cache.root()) as entries:
            return next(entries, None) is None
    except OSError:                 # no directory yet
        return True


def _start_workers(capability: int, at_least: int = 0) -> None:
    """Start worker threads (each starting its process) for the jobs queued and running (at least
    `at_least`), up to `config.compile_threads` in all."""
    with _workers_lock:
        want = min(config.compile_threads, max(at_least, _jobs.qsize() + _busy[0]))
        while len(_workers) < want:
            t = threading.Thread(target=_worker_thread, args=(capability, _jobs),
                                 name=f"flambeau-compile-{len(_workers)}", daemon=True)
            _workers.append(t)
            t.start()


def shutdown_workers() -> None:
    """End every compile worker (its thread and process) once the jobs queued before have been taken; a later
    miss starts new ones. (At exit nothing needs it: a worker ends when its stdin closes.)"""
    with _workers_lock:
        threads = list(_workers)
        _workers.clear()
        for _ in threads:
            _jobs.put(None)
    for t in threads:
        t.join()


class _Worker:
    """One compile worker process (`flambeau/_backends/compile_worker.py`, which imports Triton and nothing
    of flambeau): a job is one JSON line in, its cubin or error one JSON line out."""

    def __init__(self, capability: int):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.proc = subprocess.Popen([sys.executable, "-P", compile_worker.__file__, str(capability)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        self.has_key = False
        self.answered = 0

    def send_key(self) -> None:
        """Triton's cache key, once (`start_triton_key`), unless it could not be computed."""
        self.has_key = True
        try:
            key = compile_worker.start_triton_key().result()
        except Exception:           # the worker's Triton computes it itself
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.write(json.dumps({"triton_key": key}) + "\n")

    def close(self) -> None:
        """End the process: its stdin closed, it exits after the job in hand."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait()

    def run(self, job: dict) -> dict | None:
        """The worker's answer to `job`, or None when the process is gone."""
        try:
            if not self.has_key:
                self.send_key()
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            return None
        if not line.strip():
            return None
        self.answered += 1
        return json.loads(line)


def _forget_workers_after_fork() -> None:
    """In a forked child: the parent's worker threads do not exist there and its queued jobs are the parent's;
    the child starts its own workers at its first miss."""
    global _jobs, _workers_lock
    _jobs, _workers_lock = queue.SimpleQueue(), threading.Lock()
    _workers.clear()
    _pending.clear()
    _busy[0] = 0


os.register_at_fork(after_in_child=_forget_workers_after_fork)


def _release_queued(jobs: queue.SimpleQueue) -> None:
    """Complete the future of every job still queued (their launches compile the kernels themselves); the
    queued ends of threads (`shutdown_workers`) stay queued."""
    ends = 0
    while True:
        try:
            item = jobs.get_nowait()
        except queue.Empty:
            break
        if item is None:
            ends += 1
        else:
            item[2].set_result(None)
    for _ in range(ends):
        jobs.put(None)


def _worker_thread(capability: int, jobs: queue.SimpleQueue) -> None:
    """Take queued jobs one at a time, have this thread's worker process compile each, write the cubin into
    the disk cache and complete the job's future; a worker that dies is replaced (its job is left to the
    launching thread, which compiles what the cache lacks itself). None in the queue ends the thread and
    its process (`shutdown_workers`)."""
    worker = _Worker(capability)
    while True:
        item = jobs.get()
        if item is None:
            worker.close()
            return
        job, key, fut = item
        with _workers_lock:
            _busy[0] += 1
        try:
            answer = worker.run(job)
            if answer is None and not worker.answered:     # it could not even start: workers are off
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=10)
                broken[0] = f"a compile worker process exited before its first answer (code {worker.proc.poll()})"
                log.warning("flambeau inductor: %s; Triton kernels now compile in the launching process", broken[0])
                _release_queued(jobs)
                return
            if answer is None:
                worker = _Worker(capability)
            elif "cubin" in answer:
                cubin_cache.write(key, base64.b64decode(answer["cubin"]), answer["meta"])
                stats["compiled_in_workers"] += 1
                compile_times.append((job["name"], round(answer["seconds"], 4), threading.current_thread().name,
                                      round(time.perf_counter(), 4)))
        except Exception:           # never leave a launch waiting: it compiles the kernel itself
            pass
        finally:
            with _workers_lock:
                _busy[0] -= 1
            fut.set_result(None)


# ---- libdevice for the interpreter ---------------------------------------------------------------
def _elementwise(fn):
    """A math-module function over arrays (elementwise, in float64: the interpreter's blocks are small)."""
    vec = np.vectorize(fn, otypes=[np.float64])
    return lambda a: vec(np.asarray(a, np.float64))


# libdevice function -> NumPy function of the same semantics (float32/float64 operands)
def _lgamma(x: float) -> float:
    return math.lgamma(x) if math.isfinite(x) and not (x <= 0 and x == int(x)) else math.inf if x != -math.inf else \
        math.inf


_NUMPY_OF = {"sqrt": np.sqrt, "log1p": np.log1p, "expm1": np.expm1, "tan": np.tan, "asin": np.arcsin,
             "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
             "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erf": _elementwise(math.erf), "erfc": _elementwise(math.erfc),
             "lgamma": _elementwise(_lgamma), "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "nearbyint": np.rint,
             "atan2": np.arctan2, "hypot": np.hypot, "nextafter": np.nextafter, "pow": np.power, "fmod": np.fmod,
             "copysign": np.copysign, "rsqrt": lambda a: 1.0 / np.sqrt(a), "exp": np.exp, "log": np.log,
             "sin": np.sin, "cos": np.cos}
_INT_RESULT = {"signbit": np.signbit}


class InterpreterLibdevice:
    """`libdevice` inside interpreted kernels: each function computes on the blocks' NumPy data."""

    def __getattr__(self, name):
        fn = _NUMPY_OF.get(name)
        int_fn = _INT_RESULT.get(name)
        if fn is None and int_fn is None:
            raise AttributeError(f"libdevice.{name} has no interpreter version")

        def call(*xs):
            ts = [x for x in xs if isinstance(x, tl.tensor)]
            ty = ts[0].type
            data = [x.handle.data if isinstance(x, tl.tensor) else x for x in xs]
            shape = np.broadcast_shapes(*[np.shape(d) for d in data])
            with np.errstate(all="ignore"):
                if int_fn is not None:
                    r = np.broadcast_to(int_fn(*data).astype(np.int32), shape).copy()
                    out_ty = tl.block_type(tl.int32, list(shape)) if shape else tl.int32
                    return tl.tensor(TensorHandle(r, tl.int32), out_ty)
                dt = data[0].dtype if isinstance(data[0], np.ndarray) else np.float32
                r = np.broadcast_to(np.asarray(fn(*data)).astype(dt), shape).copy()
            out_ty = ty if not shape or ty.is_block() else tl.block_type(ty.scalar, list(shape))
            return tl.tensor(TensorHandle(r, ty.scalar), out_ty)
        call.__name__ = name
        return call

