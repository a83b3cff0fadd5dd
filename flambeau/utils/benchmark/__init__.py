"""`flambeau.utils.benchmark`: `Timer` and `Measurement`, the part of `torch.utils.benchmark` that
scripts use to time a statement (`Timer(stmt, setup, globals).blocked_autorange().median`,
`timeit(number)`). Where a GPU is present the clock synchronizes cuda before each reading, so a timed
block ends only when its device work has, as PyTorch's timer does."""
from __future__ import annotations

import statistics
import timeit as _timeit

from ... import cuda

_MIN_BLOCK_S = 0.01        # blocked_autorange sizes its blocks to take at least this long


class Measurement:
    """The times of one statement: per-run seconds `times`, `median`, `mean`, `iqr`."""

    def __init__(self, number_per_run: int, raw_times: list, stmt: str = "", label: str | None = None) -> None:
        self.number_per_run, self.raw_times, self.stmt, self.label = number_per_run, list(raw_times), stmt, label

    @property
    def times(self) -> list:
        return [t / self.number_per_run for t in self.raw_times]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.mean(self.times)

    @property
    def iqr(self) -> float:
        ts = sorted(self.times)
        if len(ts) < 2:
            return 0.0
        q = statistics.quantiles(ts, n=4)
        return q[2] - q[0]

    def __repr__(self) -> str:
        head = f"{self.label}\n" if self.label else ""
        return (f"<flambeau.utils.benchmark.Measurement object>\n{head}{self.stmt}\n  Median: {self.median * 1e6:.2f} us\n"
                f"  {len(self.raw_times)} measurements, {self.number_per_run} runs per measurement")


def _synchronize() -> None:
    if cuda.is_available():
        cuda.synchronize()


def _synchronized_clock() -> float:
    """The default clock, read after the device's queued work has finished."""
    cuda.synchronize()
    return _timeit.default_timer()


class Timer:
    """`torch.utils.benchmark.Timer`: time `stmt` (a string run with `globals`, after `setup`)."""

    def __init__(self, stmt: str = "pass", setup: str = "pass", global_setup: str = "", timer=None,
                 globals: dict | None = None, label: str | None = None, sub_label: str | None = None,
                 description: str | None = None, env: str | None = None, num_threads: int = 1,
                 language: str = "python") -> None:
        self.stmt, self.label = stmt, label
        clock = timer or (_synchronized_clock if cuda.is_available() else _timeit.default_timer)
        self._timer = _timeit.Timer(stmt=stmt, setup=setup, timer=clock, globals=dict(globals or {}))

    def _block(self, number: int) -> float:
        _synchronize()
        return self._timer.timeit(number)

    def timeit(self, number: int = 1000000) -> Measurement:
        self._block(1)                                         # warm-up
        return Measurement(number, [self._block(number)], self.stmt, self.label)

    def blocked_autorange(self, callback=None, min_run_time: float = 0.2) -> Measurement:
        number = 1
        while True:                                            # a block long enough to time
            t = self._block(number)
            if t >= _MIN_BLOCK_S or number >= 1 << 20:
                break
            number *= 10
        times, total = [], 0.0
        while total < min_run_time or len(times) < 2:
            t = self._block(number)
            if callback is not None:
                callback(number, t)
            times.append(t)
            total += t
        return Measurement(number, times, self.stmt, self.label)

    def adaptive_autorange(self, threshold: float = 0.1, *, min_run_time: float = 0.01, max_run_time: float = 10.0,
                           callback=None) -> Measurement:
        return self.blocked_autorange(callback, min_run_time=max(min_run_time, 0.2))
