"""The on-disk cubin cache of hand-written Triton kernels (`flambeau._backends.cubin_cache`, used by
`triton_launch.compile_kernel`; issue 13's warm first step):

- a second process loads the cubin of flambeau's fused AdamW kernel compiled for sm_90 by the first
  (real `triton.compile`, no GPU: CuPy replaced by a recorder) without calling Triton's compiler or its
  cache key, and loads the same bytes with the same launch metadata;
- the key changes with the kernel's source, a constexpr, the compute capability and the Triton version
  (`triton.compile` replaced by a counting fake here);
- a truncated, corrupt or foreign entry is a miss and is rebuilt; concurrent writer processes of one
  key never leave a partial entry for a reader; FLAMBEAU_KERNEL_CACHE=0 turns the cache off.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
from triton.runtime.jit import JITFunction  # noqa: E402

from flambeau import _cpp_builder  # noqa: E402
from flambeau._backends import cubin_cache, triton_launch as TL  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "cubin_cache_process.py")


def _process(mode: str, cache: str, capability: str = "90") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), FLAMBEAU_CACHE_DIR=cache,
               TRITON_CACHE_DIR=os.path.join(cache, "triton-own"))
    r = subprocess.run([sys.executable, SCRIPT, mode, capability], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_warm_process_loads_the_cubin_without_triton(tmp_path):
    cold = _process("cold", str(tmp_path))
    assert cold["stats"] == {"compiled": 1, "cache_hits": 0}
    assert cold["num_warps"] == 8 and cold["arg_types"][0] == "*i64"
    warm = _process("warm", str(tmp_path))         # Triton's compiler and triton_key raise if called
    assert warm["stats"] == {"compiled": 0, "cache_hits": 1}
    assert {k: v for k, v in warm.items() if k != "stats"} == {k: v for k, v in cold.items() if k != "stats"}


# ---- the key, corrupt entries, concurrency: triton.compile replaced by a counting fake ------------
KERNEL = """
import triton
import triton.language as tl


def {name}(X, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(X + i, tl.load(X + i, mask=i < N) {op} 1, mask=i < N)
"""


def _jit(tmp_path, op: str = "+", name: str = "bump"):
    """A JITFunction (made directly: TRITON_INTERPRET=1 makes `triton.jit` give interpreted functions) from
    its own file, always as module `fl_cubin_test_kernels`."""
    path = tmp_path / f"kernels_{name}_{'plus' if op == '+' else 'times'}.py"
    path.write_text(textwrap.dedent(KERNEL.format(name=name, op=op)))
    spec = importlib.util.spec_from_file_location("fl_cubin_test_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return JITFunction(getattr(mod, name))


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A cuda device whose capability the test sets (`gpu.capability`), CuPy's module loading recorded,
    `triton.compile` a fake counting its calls, a fresh cache directory and in-process kernel cache."""
    class State:
        capability = "90"
        compiled: list = []
        loaded: list = []

    class Function:
        ptr = 1

    class Module:
        def load(self, cubin):
            State.loaded.append(bytes(cubin))

        def get_function(self, name):
            return Function()

    class Cupy:
        class cuda:
            class Device:
                def __init__(self, dev):
                    self.compute_capability = State.capability
    Cupy.cuda.Module = Module

    def fake_compile(fn, signature, constexprs, num_warps, num_stages, aligned, capability):
        State.compiled.append((fn.__name__, capability))
        cubin = f"cubin {len(State.compiled)} of {fn.__name__} for sm_{capability}".encode()
        return cubin, {"name": fn.__name__, "num_warps": num_warps, "shared": 128, "global_scratch": 0}
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path / "cache"))
    monkeypatch.setattr(TL, "_cupy", lambda: Cupy)
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    monkeypatch.setattr(TL, "_triton_compile", fake_compile)
    monkeypatch.setattr(cubin_cache, "enabled", True)
    State.new_process = lambda: (monkeypatch.setattr(TL, "_cache", {}), monkeypatch.setattr(TL, "_capabilities", {}))
    State.new_process()
    return State


SIG = {"X": "*fp32", "N": "i32", "BLOCK": "constexpr"}


def _compile(fn, block=64):
    return TL.compile_kernel(fn, SIG, {"BLOCK": block}, num_warps=4, num_stages=1)


def test_second_process_hits_and_loads_the_stored_bytes(gpu, tmp_path):
    fn = _jit(tmp_path)
    k = _compile(fn)
    gpu.new_process()
    k2 = _compile(fn)
    assert len(gpu.compiled) == 1 and gpu.loaded == [b"cubin 1 of bump for sm_90"] * 2
    assert (k2.num_warps, k2.shared, k2.arg_types) == (k.num_warps, k.shared, k.arg_types) == (4, 128, ("*fp32", "i32"))


def test_the_key_follows_source_constexprs_capability_and_triton_version(gpu, tmp_path, monkeypatch):
    import triton
    fn = _jit(tmp_path)
    _compile(fn)
    gpu.new_process()
    _compile(_jit(tmp_path))                  # the same source again, another object: a hit
    assert len(gpu.compiled) == 1
    gpu.new_process()
    _compile(_jit(tmp_path, op="*"))          # same module and name, another body
    assert len(gpu.compiled) == 2
    gpu.new_process()
    _compile(fn, block=128)
    assert len(gpu.compiled) == 3
    gpu.new_process()
    gpu.capability = "80"
    _compile(fn)
    assert gpu.compiled[-1] == ("bump", 80) and len(gpu.compiled) == 4
    gpu.new_process()
    gpu.capability = "90"
    monkeypatch.setattr(triton, "__version__", triton.__version__ + ".other")
    _compile(fn)
    assert len(gpu.compiled) == 5
    gpu.new_process()
    _compile(fn)                              # every variant above is now stored
    assert len(gpu.compiled) == 5


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty"])
def test_a_damaged_entry_is_rebuilt(gpu, tmp_path, damage):
    fn = _jit(tmp_path)
    _compile(fn)
    path, = [os.path.join(d, f) for d, _, fs in os.walk(cubin_cache.root()) for f in fs]
    data = open(path, "rb").read()
    bad = {"truncated": data[:-5], "flipped": data[:-1] + bytes([data[-1] ^ 1]), "foreign": b"\x7fELF" + data[4:],
           "empty": b""}[damage]
    with open(path, "wb") as f:
        f.write(bad)
    corrupt = cubin_cache.stats["corrupt"]
    gpu.new_process()
    _compile(fn)
    assert len(gpu.compiled) == 2 and cubin_cache.stats["corrupt"] == corrupt + 1
    assert gpu.loaded[-1] == b"cubin 2 of bump for sm_90"          # the rebuilt binary, not the damaged one
    assert cubin_cache._parse(open(path, "rb").read())[0] == b"cubin 2 of bump for sm_90"
    gpu.new_process()
    _compile(fn)
    assert len(gpu.compiled) == 2


def test_the_switch_turns_the_cache_off(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(cubin_cache, "enabled", False)
    fn = _jit(tmp_path)
    _compile(fn)
    gpu.new_process()
    _compile(fn)
    assert len(gpu.compiled) == 2 and not os.path.exists(cubin_cache.root())
    env = {k: v for k, v in os.environ.items()}
    env.update(FLAMBEAU_KERNEL_CACHE="0", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", "from flambeau._backends import cubin_cache; print(cubin_cache.enabled)"],
                         env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "False"


WRITER = """
import sys
from flambeau import _cpp_builder
from flambeau._backends import cubin_cache
_cpp_builder.cache_dir = sys.argv[1]
w = int(sys.argv[2])
for i in range(int(sys.argv[3])):
    cubin = bytes([w * 16 + i % 16]) * (2 << 20)
    cubin_cache.write("ab" + "0" * 62, cubin, {"name": f"w{w}", "num_warps": 4, "shared": 0, "global_scratch": 0})
"""


def test_concurrent_writers_never_leave_a_partial_entry(tmp_path, monkeypatch):
    """Three processes rewrite one entry (2 MiB) 15 times each while this one reads it: every read is a
    whole entry of one writer (a write in place would be read half-written)."""
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path))
    monkeypatch.setattr(cubin_cache, "enabled", True)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(w), "15"], env=env) for w in range(3)]
    corrupt, whole = cubin_cache.stats["corrupt"], 0
    while any(p.poll() is None for p in procs):
        entry = cubin_cache.read("ab" + "0" * 62)
        if entry is not None:
            cubin, meta = entry
            w = int(meta["name"][1:])
            assert len(cubin) == 2 << 20 and cubin[0] // 16 == w and cubin == bytes([cubin[0]]) * len(cubin)
            whole += 1
    assert all(p.wait() == 0 for p in procs)
    assert cubin_cache.stats["corrupt"] == corrupt and whole > 0
    assert not [f for f in os.listdir(os.path.join(tmp_path, "triton", "cubin", "ab")) if f.endswith(".tmp")]
    assert hashlib.sha256(cubin_cache.read("ab" + "0" * 62)[0]).hexdigest()
