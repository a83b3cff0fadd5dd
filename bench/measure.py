"""What several benchmarks measure the same way: the operator calls that reach flambeau's backend during
one call of a function, a function's median device time between two CUDA events (CuPy's or PyTorch's),
several systems timed in interleaved rounds, the time Python's garbage collector ran inside a block and
what a full collection walks (`heap_report`), a
profiler's Chrome-trace events and the time a set of intervals covers, and which of some instruction-set extensions the CPU has (/proc/cpuinfo's flags). Imported as
`from bench import measure` (the repository root on sys.path)."""
from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time

CPUINFO = "/proc/cpuinfo"


def functional_calls(fn) -> int:
    """How many operator calls reach flambeau's backend (`_dispatch.call_functional`) during `fn()`."""
    from flambeau import _dispatch
    calls = [0]
    real = _dispatch.call_functional

    def counting(op, args, kwargs, record=True):
        calls[0] += 1
        return real(op, args, kwargs, record)
    _dispatch.call_functional = counting
    try:
        fn()
    finally:
        _dispatch.call_functional = real
    return calls[0]


def cupy_events() -> tuple:
    """(start, end, elapsed_ms) on CuPy's current stream."""
    import cupy
    return cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.get_elapsed_time


def torch_events() -> tuple:
    """(start, end, elapsed_ms) on PyTorch's current cuda stream."""
    import torch
    return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
            lambda start, end: start.elapsed_time(end))


def median_event_ms(fn, warmup: int, reps: int, events: tuple | None = None, sync=None) -> float:
    """fn's median time in ms over `reps` calls, each between the records of `events` = (start, end,
    elapsed_ms) (CuPy's when None), after `warmup` untimed calls and then `sync()` where given."""
    start, end, elapsed_ms = events if events is not None else cupy_events()
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(elapsed_ms(start, end))
    return statistics.median(times)


def _calibration_work(n: int) -> int:
    """A fixed pure-Python workload shaped like flambeau's host path: calls, attribute and dict lookups,
    small tuples and lists made and dropped."""
    class Node:
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            self.a, self.b = a, b
    table, acc = {}, 0
    for i in range(n):
        node = Node(i, (i, i + 1))
        table[i & 1023] = node
        got = table.get((i * 7) & 1023)
        if got is not None:
            acc += got.b[1] - got.a
        acc += len([node.a, node.b])
    return acc


def host_calibration_ms(n: int = 200_000, repeats: int = 5) -> float:
    """Milliseconds this process takes for `_calibration_work(n)`, the best of `repeats`: how fast this
    process's host runs Python. The GPU machine's host speed moves up to 2x between processes; a bench line
    carrying it shows whether two processes' step times are comparable."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _calibration_work(n)
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 2)


def host_us(fn, number: int, repeats: int, sync) -> float:
    """Host microseconds a call of `fn` (the device synchronised before and after each run of `number`
    calls, not inside it): the median over `repeats` runs."""
    runs = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e6)
        sync()
    return round(statistics.median(runs), 2)


def cpu_has(extensions: tuple, cpuinfo: str = CPUINFO) -> list:
    """Those of `extensions` (flag names such as "avx512_bf16") among the words of the first flags line of
    `cpuinfo` (whole words: "avx512f" is not found in "avx512fp16")."""
    flags: set = set()
    with open(cpuinfo) as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    return [e for e in extensions if e in flags]


def interleaved_rounds(systems: dict, rounds: int, time_one) -> tuple:
    """`time_one(system)` for every system of `systems` ({name: system}), `rounds` times over, interleaved
    (a round times each system once, so a change in the machine's load falls on all alike):
    ({name: [time per round]}, {name: median time})."""
    times: dict = {k: [] for k in systems}
    for _ in range(rounds):
        for k, system in systems.items():
            times[k].append(time_one(system))
    return times, {k: statistics.median(v) for k, v in times.items()}


class GcMeter:
    """Time Python's cyclic garbage collector ran inside the block, and its collections per generation
    (`collections[g]`, through gc.callbacks). A full (generation 2) collection walks every tracked object
    of the process, so a host-bound step that happens to hold one is slower by all of it."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0

    def _hook(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> "GcMeter":
        gc.callbacks.append(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._hook)


def heap_report(top: int) -> dict:
    """What a full collection walks: one timed `gc.collect()` (thread CPU time) and what it freed, the
    tracked objects and their references (what the collector visits per pass) by type, and the `top`
    containers with the most references (a list of 100k elements is walked element by element, ints or not)."""
    t0 = time.thread_time()
    freed = gc.collect()
    ms = (time.thread_time() - t0) * 1e3
    objs = gc.get_objects()
    by_type: dict = {}
    biggest = []
    for o in objs:
        t = f"{type(o).__module__}.{type(o).__qualname__}"
        r = len(gc.get_referents(o))
        n, e = by_type.get(t, (0, 0))
        by_type[t] = (n + 1, e + r)
        if r >= 256:
            head = list(o)[:3] if isinstance(o, (dict, set, frozenset)) else o[:3] if isinstance(o, (list, tuple)) else ""
            biggest.append((r, t, repr(head)[:160]))
    biggest.sort(key=lambda b: -b[0])
    types = sorted(by_type.items(), key=lambda kv: -kv[1][1])[:top]
    return {"full_collection_cpu_ms": round(ms, 2), "freed": freed, "tracked": len(objs),
            "references": sum(e for _, e in by_type.values()),
            "by_type": [[t, n, e] for t, (n, e) in types], "biggest": [list(b) for b in biggest[:top]]}


def trace_events(prof) -> list:
    """The Chrome-trace events ("traceEvents") of a finished PyTorch profiler `prof`."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


def union_us(intervals) -> float:
    """How long at least one of the (start, end) `intervals` covers (overlaps counted once)."""
    total, end = 0.0, None
    for s, f in sorted(intervals):
        if end is None or s > end:
            total += f - s
            end = f
        elif f > end:
            total += f - end
            end = f
    return total
