"""bench/measure.py, the helpers several benchmarks share, against known answers: the operator calls a
function sends to flambeau's backend (counted by hand), the median of event intervals (fake events with
set intervals), interleaved rounds (a set clock), the garbage collector's collections in a block (explicit
collections, the automatic ones off), the union of intervals, a profiler's exported trace
(a fake profiler) and the CPU flags found in a cpuinfo text (whole words only)."""
from __future__ import annotations

import gc
import json

import numpy as np

import flambeau
from bench import measure
from flambeau import _dispatch


def test_functional_calls_counts_each_backend_call_and_restores_the_dispatcher():
    a, b = flambeau.tensor(np.ones(3, np.float32)), flambeau.tensor(np.ones(3, np.float32))
    real = _dispatch.call_functional
    assert measure.functional_calls(lambda: None) == 0
    assert measure.functional_calls(lambda: (a + b).relu()) == 2
    assert measure.functional_calls(lambda: [a * b for _ in range(5)]) == 5
    assert _dispatch.call_functional is real


class _Events:
    """(start, end, elapsed_ms) whose intervals are `intervals_ms` in turn; logs records, syncs, calls."""

    def __init__(self, intervals_ms: list) -> None:
        self.log, self.intervals = [], list(intervals_ms)
        log = self.log

        class Event:
            def __init__(self, name):
                self.name = name

            def record(self):
                log.append(f"record {self.name}")

            def synchronize(self):
                log.append(f"sync {self.name}")
        self.start, self.end = Event("start"), Event("end")

    def events(self) -> tuple:
        return self.start, self.end, lambda start, end: self.intervals.pop(0)


def test_median_event_ms_times_each_call_between_the_events_after_warmup():
    fake = _Events([5.0, 1.0, 9.0, 3.0, 4.0])
    ms = measure.median_event_ms(lambda: fake.log.append("call"), 2, 5, fake.events(),
                                 sync=lambda: fake.log.append("sync device"))
    assert ms == 4.0
    assert fake.log == ["call", "call", "sync device"] + ["record start", "call", "record end", "sync end"] * 5


def test_cpu_has_reads_whole_words_of_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512fp16 avx512_bf16 amx_int8\n"
                    "processor\t: 1\nflags\t\t: fpu avx512f\n")
    assert measure.cpu_has(("avx512f", "avx512_bf16", "amx_int8", "f16c"), str(info)) == ["avx512_bf16", "amx_int8"]
    (tmp_path / "bare").write_text("processor\t: 0\n")
    assert measure.cpu_has(("avx512f",), str(tmp_path / "bare")) == []


def test_interleaved_rounds_times_every_system_once_a_round():
    order, clock = [], iter([3.0, 10.0, 1.0, 30.0, 2.0, 20.0])

    def time_one(system):
        order.append(system)
        return next(clock)
    times, med = measure.interleaved_rounds({"a": "A", "b": "B"}, 3, time_one)
    assert order == ["A", "B"] * 3
    assert times == {"a": [3.0, 1.0, 2.0], "b": [10.0, 30.0, 20.0]}
    assert med == {"a": 2.0, "b": 20.0}


def test_union_us_counts_overlaps_once():
    assert measure.union_us([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 4.0
    assert measure.union_us([]) == 0.0


def test_trace_events_reads_the_exported_trace():
    class Prof:
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": [{"name": "k", "ts": 1, "dur": 2}]}, f)
    assert measure.trace_events(Prof()) == [{"name": "k", "ts": 1, "dur": 2}]


def test_gc_meter_counts_the_collections_of_its_block_per_generation():
    """Explicit collections inside the block (automatic ones off) are counted by generation and timed;
    those after it are not, and the callback is gone."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with measure.GcMeter() as meter:
            gc.collect(0)
            gc.collect(2)
            gc.collect(2)
        gc.collect(1)
    finally:
        if enabled:
            gc.enable()
    assert meter.collections == [1, 0, 2]
    assert meter.seconds > 0
    assert meter._hook not in gc.callbacks


def test_host_calibration_runs_its_fixed_workload():
    """`measure.host_calibration_ms` times `_calibration_work(n)`, a fixed Python workload (its result checked
    against the same count done directly: each lookup that finds a node adds b[1] - a = 1, each step adds 2)
    and gives milliseconds (no assertion on how many)."""
    from bench import measure
    n = 3000
    stored, hits = set(), 0
    for i in range(n):
        stored.add(i & 1023)
        hits += ((i * 7) & 1023) in stored
    assert measure._calibration_work(n) == hits + 2 * n
    ms = measure.host_calibration_ms(n=1000, repeats=2)
    assert isinstance(ms, float) and ms > 0
