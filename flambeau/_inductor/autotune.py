"""Block-size autotuning of generated Triton kernels (`config.max_autotune`, mode="max-autotune").

A generated kernel takes its outer block (`XBLOCK`) as a constexpr and its grid from it, so the same
source runs with other blocks and warp counts. At a kernel's first launch on cuda with given sizes,
`choose` compiles a few configurations around the generator's own (half and twice the block, half
and twice the warps), times each over a few launches with CUDA events, and keeps the fastest. The
choice is cached on disk (next to the cubins, keyed by the module's key, the kernel and its sizes),
so a later process reads it without timing anything.

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

TIMED_LAUNCHES = 5            # launches timed per configuration (after one untimed)
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


def _path(cache_dir: str, kernel_key: str, name: str, env: dict, dkey: str) -> str:
    key = hashlib.sha256(json.dumps([kernel_key, name, sorted(env.items()), dkey]).encode()).hexdigest()
    return os.path.join(cache_dir, "autotune", key[:2], key + ".json")


def choose(launcher, la, env: dict, run, cupy, cache_dir: str, dkey: str, write):
    """The Launch variant to use for these sizes: from the disk cache, else timed with `run(variant)`
    (which launches it once) and cached. None while the stream is capturing and nothing is known."""
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
    timed = []
    for v in candidates(la, xnumel):
        run(v)                                   # compiles it, and warms it
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
