"""Block-size autotuning of generated Triton kernels (`config.max_autotune`, mode="max-autotune").

A generated kernel takes its outer block (`XBLOCK`) as a constexpr and its grid from it, so the same source runs
with other blocks and warp counts. Its configurations are the generator's own and a few around it (half and twice
the block, half and twice the warps: `candidates`). When a cuda graph is compiled, every configuration of every
tuned kernel goes to the compile workers with the module's other kernels (`precompile_variants`, through
`mm_template.all_launches` and `triton_runtime.precompile`). At the kernel's first launch with given sizes,
`choose` first has every candidate built (after every queued worker job is done, `triton_runtime.await_jobs`:
nothing is timed while the host compiles), then times each over a few launches with CUDA events and keeps the
fastest; the Launcher then drops the losers' loaded kernels. The choice is cached on disk (next to the cubins,
keyed by the module's key, the kernel and its sizes), so a later process reads it without timing or building
anything.

Timing: one untimed launch (caches, clocks), then TIMED_LAUNCHES back to back between two events. A
generated pointwise or reduction kernel of a training step runs for microseconds to a millisecond, so
five launches give a total well above the events' resolution (~0.5 us) while the whole choice of a kernel
(5 candidates x 6 launches + one synchronisation each) stays in the milliseconds; a GPT-2 step's ~200
tuned kernels add about a second of timing to the first step, next to tens of seconds of compiling.

Only kernels whose repeated launches are harmless are tuned: one launch (no chain of a split
reduction or a scatter's copy), a real grid (not a single serial program), no workspace. A launch
while the stream is being captured into a CUDA graph is never tuned (timing synchronises); it takes
the generator's configuration unless a choice is already known. (Matrix-product templates choose between
their block configurations and the cuBLASLt extern in mm_template.py, cached under this module's `_path`.)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from . import codegen_triton

TIMED_LAUNCHES = 5            # launches timed per configuration (after one untimed; see the docstring)
stats = {"tuned": 0, "from_disk": 0}


def tunable(chain: list) -> bool:
    """Whether a Launcher's chain [(Launch, fn)] is one launch that can be repeated harmlessly."""
    if len(chain) != 1:
        return False
    la = chain[0][0]
    return not la.single_program and la.splits == 1 and not la.workspace and "XBLOCK" in la.constexprs


def candidates(la, xnumel: int) -> list:
    """Launch variants to time: the generator's, then half/twice the block, half/twice the warps."""
    out = [la]
    cap = codegen_triton.next_pow2(max(xnumel, 1))
    for xb in (la.xblock // 2, la.xblock * 2):
        if 1 <= xb <= cap:
            out.append(dataclasses.replace(la, xblock=xb, constexprs={**la.constexprs, "XBLOCK": xb}))
    for w in (la.num_warps // 2, la.num_warps * 2):
        if 1 <= w <= 16:
            out.append(dataclasses.replace(la, num_warps=w))
    return out


def precompile_variants(la) -> list:
    """The Launch variants of a tuned kernel other than the generator's own, to compile ahead with it
    (`mm_template.all_launches`); [] for a kernel that is not tuned. With a symbolic outer size the block
    cap is unknown: every variant is built (one too many costs a worker job, not a launch)."""
    if la.then is not None or not tunable([(la, None)]):
        return []
    return candidates(la, la.xnumel if isinstance(la.xnumel, int) else 1 << 62)[1:]


def _path(cache_dir: str, kernel_key: str, name: str, env: dict, dkey: str) -> str:
    key = hashlib.sha256(json.dumps([kernel_key, name, sorted(env.items()), dkey]).encode()).hexdigest()
    return os.path.join(cache_dir, "autotune", key[:2], key + ".json")


def choose(launcher, la, env: dict, run, cupy, cache_dir: str, dkey: str, write, build=None):
    """The Launch variant to use for these sizes: from the disk cache, else timed with `run(variant)`
    (which launches it once) and cached; `build(variant)` (optional) makes each variant's kernel ready
    before any is timed. None while the stream is capturing and nothing is known."""
    path = _path(cache_dir, launcher.kernel_key, la.name, env, dkey)
    if os.path.exists(path):
        with open(path) as f:
            best = json.load(f)
        stats["from_disk"] += 1
        return dataclasses.replace(la, xblock=best["xblock"], num_warps=best["num_warps"],
                                   constexprs={**la.constexprs, "XBLOCK": best["xblock"]})
    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing():
        return None
    xnumel = la.xnumel if isinstance(la.xnumel, int) else la.xnumel.evaluate(env)
    variants = candidates(la, xnumel)
    if build is not None:
        for v in variants:                       # every candidate compiled (by the workers) before timing
            build(v)
    timed = []
    for v in variants:
        run(v)                                   # warms it (compiles it when not built above)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(TIMED_LAUNCHES):
            run(v)
        end.record(stream)
        end.synchronize()
        timed.append((cupy.cuda.get_elapsed_time(start, end), len(timed), v))
    best = min(timed)[2]
    write(path, json.dumps({"xblock": best.xblock, "num_warps": best.num_warps}))
    stats["tuned"] += 1
    return best
