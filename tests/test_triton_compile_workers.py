"""The compile workers of a cuda graph's Triton kernels (issue 13's cold first step), on the CPU machine:
Triton compiles for sm_90 without a GPU, CuPy's module loading is a recorder.

- a worker is `flambeau/_backends/compile_worker.py`, which imports Triton and nothing of flambeau, and
  compiles with the Triton cache key the launching process sends it (no hashing of libtriton of its own);
- each kernel missing from the cubin cache is one job, queued in launch order; workers start only for
  missing kernels (a warm start starts none), and a launch waits for its own kernel's job;
- Triton's key is kept on disk and read back while Triton's files are unchanged, equal to Triton's own.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import queue
import subprocess
import sys

import pytest

import flambeau as fl
from bench.fake_cuda_loader import loader_cupy
from flambeau import _cpp_builder, _inductor
from flambeau._inductor import codegen_triton, triton_schedule
from flambeau._inductor.compile_fx import _size_names
from flambeau._inductor.graph import GraphLowering
from flambeau._inductor.scheduler import Kernel, schedule

triton_runtime = pytest.importorskip("flambeau._inductor.triton_runtime")
from flambeau._backends import compile_worker, cubin_cache  # noqa: E402

WORKER = compile_worker.__file__


class Cuda:
    type = "cuda"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cubin cache, worker pool and job queue; the device is 'sm90', CuPy's loader a recorder."""
    Cupy = loader_cupy()
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path))
    monkeypatch.setattr(triton_runtime.TL, "_cupy", lambda: Cupy)
    monkeypatch.setattr(triton_runtime, "device_key", lambda d: "interpret" if d.type == "cpu" else "sm90")
    monkeypatch.setattr(triton_runtime, "_jobs", queue.SimpleQueue())
    monkeypatch.setattr(triton_runtime, "_pending", {})
    monkeypatch.setattr(triton_runtime, "_workers", [])
    monkeypatch.setattr(triton_runtime, "_modules", {})
    monkeypatch.setattr(triton_runtime, "broken", [None])
    monkeypatch.setattr(_inductor.config, "compile_threads", 2)
    yield tmp_path
    triton_runtime.shutdown_workers()


def _generated(monkeypatch, fn, *args):
    """(module, launches in order) of the Triton code generated for cuda from `fn`'s graph."""
    out = []

    def capture(gm, example_inputs, **kwargs):
        graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
        kernels = [k for k in triton_schedule.split_for_grid(schedule(graph), graph) if isinstance(k, Kernel)]
        source, launches = codegen_triton.generate(kernels, _size_names(graph))
        out.append((source, [launches[k.name] for k in kernels]))
        return gm
    monkeypatch.setattr(_inductor, "compile_fx", capture)
    fl._dynamo.reset()
    fl.compile(fn)(*args)
    fl._dynamo.reset()
    source, launches = out[0]
    mod, _ = triton_runtime.load_module(source, Cuda())
    return mod, launches


def _functions(launches) -> list:
    out = []
    for la in launches:
        while la is not None:
            out.append(la)
            la = la.then
    return out


def _two_kernels(a, b):
    return (a / a.sum(1, keepdim=True)).sum(0) + b.sum(0), (b * 2).sum()


def _args():
    return fl.randn(8, 32), fl.randn(8, 32)


def test_one_job_per_missing_kernel_in_launch_order_and_no_worker_on_a_warm_start(monkeypatch, cache):
    started = []
    monkeypatch.setattr(triton_runtime, "_start_workers", lambda capability: started.append(capability))
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    functions = _functions(launches)
    assert len(functions) >= 2
    futures = triton_runtime.precompile_for(mod, launches, "sm90")
    jobs = [triton_runtime._jobs.get_nowait() for _ in futures]
    assert triton_runtime._jobs.empty() and started == [90]
    assert [j["name"] for j, _, _ in jobs] == [la.name for la in functions]
    assert all(j["path"] == mod.__file__ and j["capability"] == 90 for j, _, _ in jobs)
    assert [triton_runtime._pending[k] for _, k, _ in jobs] == futures
    for job, key, fut in jobs:                    # as a worker would: each cubin into the cache
        cubin_cache.write(key, b"cubin", {"name": job["name"], "num_warps": job["num_warps"], "shared": 0,
                                          "global_scratch": 0})
        fut.set_result(None)
    for la in functions:                           # the launches wait for their jobs, then hit the cache
        triton_runtime.load_or_compile(mod.kernel(la.name), la.signature(), la.constexprs, la.num_warps,
                                       triton_runtime._arg_names(la), "sm90")
    assert not triton_runtime._pending
    monkeypatch.setattr(triton_runtime, "_modules", {})     # a warm start: every cubin cached
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    assert triton_runtime.precompile_for(mod, launches, "sm90") == [] and started == [90]
    assert triton_runtime._jobs.empty()


def test_no_compile_workers_with_the_cubin_cache_off(monkeypatch, cache):
    """Workers hand their cubins over through the disk cache: with it off (FLAMBEAU_KERNEL_CACHE=0) their
    work would be lost and every kernel compiled twice, so `precompile_for` queues nothing."""
    started = []
    monkeypatch.setattr(triton_runtime, "_start_workers", lambda capability: started.append(capability))
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    monkeypatch.setattr(cubin_cache, "enabled", False)
    assert triton_runtime.precompile_for(mod, launches, "sm90") == [] and not started
    assert triton_runtime._jobs.empty()


def test_workers_start_for_the_jobs_queued_up_to_compile_threads(monkeypatch, cache):
    made = []

    class FakeWorker:
        def __init__(self, capability):
            made.append(capability)

        def run(self, job):
            return {"error": "not compiled here"}

        def close(self):
            closed.append(True)
    closed = []
    monkeypatch.setattr(triton_runtime, "_Worker", FakeWorker)
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    futures = triton_runtime.precompile_for(mod, launches, "sm90")
    for f in futures:
        f.result(timeout=60)
    assert len(triton_runtime._workers) == min(2, len(futures)) and made == [90] * len(triton_runtime._workers)
    for la in _functions(launches):                 # the failed jobs: no cubin, no waiting left
        assert not cubin_cache.exists(triton_runtime._cubin_key(mod.kernel(la.name), la.signature(), la.constexprs,
                                                                la.num_warps, triton_runtime._arg_names(la), "sm90"))
    threads = list(triton_runtime._workers)
    triton_runtime.shutdown_workers()
    assert not triton_runtime._workers and not any(t.is_alive() for t in threads) and len(closed) == len(threads)


def test_workers_start_before_lowering_only_on_an_empty_cubin_cache(monkeypatch, cache):
    """`begin_cuda_compile` (compile_fx calls it before lowering a cuda graph) starts workers at once where the
    cubin cache holds nothing (every kernel will miss), and none where it holds an entry (a warm start)."""
    made = []

    class FakeWorker:
        answered = 0

        def __init__(self, capability):
            made.append(capability)

        def close(self):
            pass
    monkeypatch.setattr(triton_runtime, "_Worker", FakeWorker)
    monkeypatch.setattr(triton_runtime, "PRESTART", 8)
    triton_runtime.begin_cuda_compile(Cuda())                    # empty cache: min(PRESTART, compile_threads)
    assert len(triton_runtime._workers) == 2
    triton_runtime.begin_cuda_compile(Cuda())                    # once
    assert len(triton_runtime._workers) == 2
    triton_runtime.shutdown_workers()
    assert made == [90, 90]
    cubin_cache.write(cubin_cache.key("any"), b"cubin", {"name": "k", "num_warps": 4, "shared": 0,
                                                         "global_scratch": 0})
    triton_runtime.begin_cuda_compile(Cuda())                    # an entry there: no worker before a miss
    assert not triton_runtime._workers and made == [90, 90]


def test_workers_that_cannot_start_turn_workers_off_and_release_every_launch(monkeypatch, cache):
    """A worker process that exits before its first answer (a Python that can't run it): no launch is left
    waiting for a job, and later graphs queue none (their kernels compile in the launching process)."""
    class Unborn:
        answered = 0

        def __init__(self, capability):
            self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)

        def run(self, job):
            self.proc.wait()
            return None

        def close(self):
            pass
    monkeypatch.setattr(triton_runtime, "_Worker", Unborn)
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    monkeypatch.setattr(_inductor.config, "compile_threads", 2)
    futures = triton_runtime.precompile_for(mod, launches, "sm90")
    assert len(futures) > 2                     # more jobs than workers: some are still queued when they die
    for f in futures:
        f.result(timeout=30)
    assert "code 3" in triton_runtime.broken[0]
    monkeypatch.setattr(triton_runtime, "_modules", {})
    monkeypatch.setattr(triton_runtime, "_pending", {})
    mod, launches = _generated(monkeypatch, lambda a: (a * 3).sum(0) + a.sum(1).sum(), fl.randn(8, 32))
    assert triton_runtime.precompile_for(mod, launches, "sm90") == []


def test_a_forked_child_starts_its_own_workers(monkeypatch, cache):
    """The parent's worker threads don't exist in a forked child: it forgets them (and the parent's queue and
    jobs, and a Triton key still being computed by a parent thread) and starts its own at its first miss, whose
    jobs then complete."""
    made = []

    class FakeWorker:
        answered = 0

        def __init__(self, capability):
            made.append(os.getpid())

        def run(self, job):
            self.answered += 1
            return {"error": "not compiled here"}

        def close(self):
            pass
    monkeypatch.setattr(triton_runtime, "_Worker", FakeWorker)
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    for f in triton_runtime.precompile_for(mod, launches, "sm90"):
        f.result(timeout=60)
    assert triton_runtime._workers
    mod2, launches2 = _generated(monkeypatch, lambda a: (a * 3).sum(0) + a.sum(1).sum(), fl.randn(8, 32))
    from concurrent.futures import Future
    monkeypatch.setattr(compile_worker, "_key", [Future()])      # Triton's key still being computed
    pid = os.fork()
    if pid == 0:                                      # the child: its own workers, its jobs done
        ok = False
        try:
            ok = not triton_runtime._workers and not triton_runtime._pending and compile_worker._key == []
            futures = triton_runtime.precompile_for(mod2, launches2, "sm90")
            for f in futures:
                f.result(timeout=60)
            ok = ok and bool(futures) and os.getpid() in made and len(triton_runtime._workers) >= 1
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _job(mod, la) -> dict:
    return {"path": mod.__file__, "name": la.name, "sig": la.signature(), "constexprs": la.constexprs,
            "num_warps": la.num_warps, "aligned": list(triton_runtime._arg_names(la)), "capability": 90}


_CACHE_DIR_NAMES = """
import hashlib, importlib.util, json, sys
import triton
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import get_cache_key, make_backend
from triton.runtime import cache as triton_cache
job, keys = json.loads(sys.argv[1]), sys.argv[2:]
spec = importlib.util.spec_from_file_location("generated", job["path"])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn = getattr(mod, job["name"])
names = list(fn.arg_names)
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in job["aligned"]}
src = triton.compiler.ASTSource(fn, dict(job["sig"]), dict(job["constexprs"]), attrs)
backend = make_backend(GPUTarget("cuda", 90, 32))
options = backend.parse_options({"num_warps": job["num_warps"], "num_stages": 1})
for key in keys:
    triton_cache.triton_key = lambda: key
    text = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    print(triton_cache._base32(hashlib.sha256(text.encode("utf-8")).hexdigest()))
"""


def _triton_cache_dir_names(job, keys, env) -> list:
    """The directory Triton's own cache gives the compile of `job` when its `triton_key()` is each of `keys`
    (computed by Triton's functions in a process without the interpreter)."""
    r = subprocess.run([sys.executable, "-c", _CACHE_DIR_NAMES, json.dumps(job), *keys], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_a_worker_imports_no_flambeau_and_compiles_with_the_key_it_is_sent(monkeypatch, cache, tmp_path_factory):
    """The worker process run as the runtime runs it, with a made-up Triton key sent first: the cubin it
    answers is a real sm_90 binary, Triton's cache entry of the compile lies where that key puts it, and no
    flambeau module was imported (PYTHONPROFILEIMPORTTIME lists every import on stderr)."""
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    la = launches[0]
    job = _job(mod, la)
    triton_dir = tmp_path_factory.mktemp("triton-cache")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPROFILEIMPORTTIME="1", TRITON_CACHE_DIR=str(triton_dir))
    proc = subprocess.run([sys.executable, "-P", WORKER, "90"], input=json.dumps({"triton_key": "made-up-key"}) +
                          "\n" + json.dumps(job) + "\n", capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.splitlines()[0])
    assert "error" not in answer, answer
    cubin = base64.b64decode(answer["cubin"])
    assert cubin[:4] == b"\x7fELF" and answer["meta"]["name"] == la.name
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "triton" in imported and not [m for m in imported if m.split(".")[0] == "flambeau"]
    env.pop("PYTHONPROFILEIMPORTTIME")
    made_up, other = _triton_cache_dir_names(job, ["made-up-key", "another-key"], env)
    assert os.listdir(triton_dir) == [made_up] and made_up != other


def test_a_real_worker_fills_the_cache_and_the_launches_compile_nothing(monkeypatch, cache):
    """`precompile_for` with real worker processes: every kernel's cubin is in the cache when its job is done,
    and loading the kernels in launch order compiles none in this process."""
    mod, launches = _generated(monkeypatch, _two_kernels, *_args())
    futures = triton_runtime.precompile_for(mod, launches, "sm90")
    assert len(futures) == len(_functions(launches))
    for f in futures:
        f.result(timeout=300)

    def refuse(*args, **kwargs):
        raise AssertionError("compiled in the launching process although a worker compiled it")
    monkeypatch.setattr(triton_runtime, "build_cubin", refuse)
    for la in _functions(launches):
        triton_runtime.load_or_compile(mod.kernel(la.name), la.signature(), la.constexprs, la.num_warps,
                                       triton_runtime._arg_names(la), "sm90")


def test_triton_key_is_read_from_file_stats_without_hashing_triton_and_moves_with_them(monkeypatch):
    """The key handed to Triton's cache comes from the paths, sizes and modification times of the files Triton's
    own `triton_key()` hashes (libtriton among them: 0.4 s of hashing on the H100 host, on a cold first step's
    critical path), never from Triton's hash; the same in another process, and another when a file's size or
    time changes."""
    from triton.runtime import cache as triton_cache

    def hashing(*args):
        raise AssertionError("Triton's files hashed")
    monkeypatch.setattr(triton_cache, "triton_key", hashing)
    key = compile_worker.triton_key()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(compile_worker.__file__).parent)] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    other = subprocess.run([sys.executable, "-P", "-c", "import compile_worker; print(compile_worker.triton_key())"],
                           capture_output=True, text=True, env=env, timeout=300).stdout.strip()
    assert key.startswith("flambeau-files-") and other == key
    inputs = compile_worker._key_inputs()
    assert any(row[0].startswith("_C") and "libtriton" in row[0] for row in inputs[2])
    for where in (1, 2):                            # libtriton's size, then its modification time, moved
        moved = json.loads(json.dumps(inputs))
        lib = next(row for row in moved[2] if "libtriton" in row[0])
        lib[where] += 1
        monkeypatch.setattr(compile_worker, "_key_inputs", lambda m=moved: m)
        assert compile_worker.triton_key() != key

