"""`flambeau.profiler`: PyTorch's `torch.profiler` for operator calls on the host.

While a `profile` records, a dispatch mode times every operator call (backward's too) and every
`record_function` range on the calling thread: one event each, with its name (`aten::mm`, or the label),
start, duration, nesting depth and, with `record_shapes`, the input shapes; `with_flops` adds the
multiply-adds of the matrix products. `key_averages()` groups the events by name (and input shapes) into
PyTorch's columns: calls, CPU total and self time (total less the events directly inside), averages;
`.table()` prints them; `export_chrome_trace` writes Chrome's trace format (atomically). A `schedule`
(PyTorch's wait / warmup / active cycles, `repeat`, `skip_first`) picks the recorded steps of
`profile.step()`, and `on_trace_ready` (for example `tensorboard_trace_handler(dir)`) runs at the end of
each active stretch.

Device activity: with `ProfilerActivity.CUDA` the events are the host side of each op (its launch); device
kernel times are not collected (there is no CUPTI here), which a warning says once. Memory profiling,
stacks and module hierarchies are not recorded: asking for them raises.
"""
from __future__ import annotations

import enum
import functools
import gzip
import json
import os
import socket
import threading
import time
import warnings

from .._atomic import write_atomic
from ..utils._python_dispatch import TorchDispatchMode

__all__ = ["ProfilerActivity", "ProfilerAction", "profile", "record_function", "schedule",
           "tensorboard_trace_handler", "supported_activities"]


class ProfilerActivity(enum.Enum):
    CPU = 0
    XPU = 1
    MTIA = 2
    CUDA = 3
    HPU = 4
    PrivateUse1 = 5


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def supported_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.CUDA}


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0):
    """step -> ProfilerAction: `skip_first` steps of nothing, then cycles of `wait` idle, `warmup` and
    `active` recorded steps (the cycle's last one saves), `repeat` cycles (0: forever); `skip_first_wait`
    leaves out the first cycle's wait."""
    if warmup < 0 or active <= 0 or wait < 0 or skip_first < 0 or repeat < 0:
        raise ValueError("Invalid profiler schedule arguments")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results")
    cycle = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"profiler schedule: step {step} < 0")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        at = step % cycle
        if at < wait:
            return ProfilerAction.NONE
        if at < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if at < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


def _default_schedule(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


class FunctionEvent:
    """One timed call: `name`, `start_us`, `duration_us`, `self_cpu_time_total` (less its direct children),
    `input_shapes`, `flops`, `thread`, `depth`."""

    def __init__(self, name: str, start_ns: int, depth: int, thread: int, input_shapes: list, flops: int):
        self.name, self.key, self.depth, self.thread = name, name, depth, thread
        self.start_ns, self.end_ns = start_ns, start_ns
        self.input_shapes, self.flops = input_shapes, flops
        self.children_ns = 0
        self.count = 1

    @property
    def cpu_time_total(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3

    @property
    def self_cpu_time_total(self) -> float:
        return (self.end_ns - self.start_ns - self.children_ns) / 1e3

    @property
    def device_time_total(self) -> float:
        return 0.0

    cuda_time_total = self_cuda_time_total = self_device_time_total = device_time_total

    def __repr__(self) -> str:
        return f"<FunctionEvent {self.name} cpu_time_total={self.cpu_time_total:.1f}us>"


class FunctionEventAvg:
    """The events of one key summed: `count`, `cpu_time_total`, `self_cpu_time_total`, `cpu_time` (average)."""

    def __init__(self, key: str, input_shapes) -> None:
        self.key, self.input_shapes = key, input_shapes
        self.count, self.cpu_time_total, self.self_cpu_time_total, self.flops = 0, 0.0, 0.0, 0
        self.device_time_total = self.self_device_time_total = 0.0
        self.cuda_time_total = self.self_cuda_time_total = 0.0

    def add(self, e: FunctionEvent) -> None:
        self.count += 1
        self.cpu_time_total += e.cpu_time_total
        self.self_cpu_time_total += e.self_cpu_time_total
        self.flops += e.flops

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return f"<FunctionEventAvg key={self.key} count={self.count} cpu_time_total={self.cpu_time_total:.1f}us>"


SORT_KEYS = {"cpu_time_total", "self_cpu_time_total", "cpu_time", "count", "flops", "device_time_total",
             "self_device_time_total", "cuda_time_total", "self_cuda_time_total"}


class EventList(list):
    """A list of events (or of averages: `key_averages()`), with PyTorch's `table` and `total_average`."""

    def key_averages(self, group_by_input_shape: bool = False) -> "EventList":
        groups: dict = {}
        for e in self:
            shapes = str(e.input_shapes) if group_by_input_shape else None
            avg = groups.get((e.key, shapes))
            if avg is None:
                avg = groups[(e.key, shapes)] = FunctionEventAvg(e.key, e.input_shapes if shapes else None)
            avg.add(e)
        return EventList(groups.values())

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg("Total", None)
        for e in self:
            total.count += e.count
            total.cpu_time_total += e.cpu_time_total
            total.self_cpu_time_total += e.self_cpu_time_total
        return total

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_name_column_width: int = 55,
              header: str | None = None, top_level_events_only: bool = False, **_ignored) -> str:
        rows = self if isinstance(next(iter(self), None), FunctionEventAvg) or not self else self.key_averages()
        if sort_by is not None:
            if sort_by not in SORT_KEYS:
                raise ValueError(f"table: sort_by must be one of {sorted(SORT_KEYS)}, got {sort_by!r}")
            rows = sorted(rows, key=lambda r: getattr(r, sort_by), reverse=True)
        rows = list(rows)[:row_limit] if row_limit is not None and row_limit >= 0 else list(rows)
        self_total = sum(r.self_cpu_time_total for r in self)     # (events or their averages: the same sum)
        width = min(max_name_column_width, max([len("Name")] + [len(r.key) for r in rows]))
        cols = ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"]
        with_shapes = any(r.input_shapes for r in rows)
        line = "-" * (width + 2 + 15 * len(cols) + (40 if with_shapes else 0))
        head = f"{'Name':<{width}}  " + "".join(f"{c:>15}" for c in cols) + ("  Input Shapes" if with_shapes else "")
        out = ([header] if header else []) + [line, head, line]
        pct = (lambda v: f"{100 * v / self_total:.2f}%") if self_total else (lambda v: "0.00%")
        for r in rows:
            name = r.key if len(r.key) <= width else r.key[:width - 3] + "..."
            cells = [pct(r.self_cpu_time_total), _us(r.self_cpu_time_total), pct(r.cpu_time_total),
                     _us(r.cpu_time_total), _us(r.cpu_time), str(r.count)]
            out.append(f"{name:<{width}}  " + "".join(f"{c:>15}" for c in cells) +
                       (f"  {r.input_shapes}" if with_shapes else ""))
        out += [line, f"Self CPU time total: {_us(self_total)}", ""]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def _us(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3f}s"
    if v >= 1e3:
        return f"{v / 1e3:.3f}ms"
    return f"{v:.3f}us"


MATMUL_FLOPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"}


def _flops(name: str, args) -> int:
    """2 * m * n * k of a matrix product (batched: times the batch), as PyTorch's flop counts; 0 otherwise."""
    if name not in MATMUL_FLOPS:
        return 0
    shapes = [tuple(a.shape) for a in args if hasattr(a, "shape")]
    if name in ("addmm", "baddbmm"):
        shapes = shapes[1:]
    if len(shapes) < 2 or len(shapes[0]) < 1 or len(shapes[1]) < 1:
        return 0
    a, b = shapes[0], shapes[1]
    k = a[-1]
    n = b[0] if name == "linear" else (b[-1] if len(b) > 1 else 1)
    rows = 1
    for d in a[:-1]:
        rows *= d
    return 2 * rows * k * n


class _Recorder:
    """The events of one recording: a stack per thread of the open ones."""

    def __init__(self, record_shapes: bool, with_flops: bool) -> None:
        self.events: list = []
        self.record_shapes, self.with_flops = record_shapes, with_flops
        self.stacks = threading.local()

    def open(self, name: str, args=()) -> FunctionEvent:
        stack = getattr(self.stacks, "open", None)
        if stack is None:
            stack = self.stacks.open = []
        shapes = [list(a.shape) if hasattr(a, "shape") else [] for a in args] if self.record_shapes else []
        e = FunctionEvent(name, time.perf_counter_ns(), len(stack), threading.get_ident(), shapes,
                          _flops(name.split("::")[-1], args) if self.with_flops else 0)
        stack.append(e)
        return e

    def close(self, e: FunctionEvent) -> None:
        e.end_ns = time.perf_counter_ns()
        stack = self.stacks.open
        stack.pop()
        if stack:
            stack[-1].children_ns += e.end_ns - e.start_ns
        self.events.append(e)


_active: list = []          # the recorders recording now (record_function adds its range to each)


class _OpTimer(TorchDispatchMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        e = self.recorder.open("aten::" + str(func.name).split(".")[0], args)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.recorder.close(e)


class record_function:
    """A labelled range in the profile (a context manager or a decorator); nothing when none records."""

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name, self.args = name, args
        self.events: list = []

    def __enter__(self):
        self.events = [(r, r.open(self.name)) for r in list(_active)]
        return self

    def __exit__(self, *exc) -> bool:
        for r, e in reversed(self.events):
            r.close(e)
        self.events = []
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)
        return wrapped


_UNSUPPORTED = ("profile_memory", "with_stack", "with_modules")


class profile:
    """PyTorch's `torch.profiler.profile` (see the module docstring)."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config=None, execution_trace_observer=None,
                 acc_events: bool = False, use_cuda: bool | None = None, custom_trace_id_callback=None):
        asked = {"profile_memory": profile_memory, "with_stack": with_stack, "with_modules": with_modules}
        for name in _UNSUPPORTED:
            if asked[name]:
                raise NotImplementedError(f"flambeau.profiler.profile: {name}=True is not supported (only operator "
                                          "and record_function times, input shapes and matrix-product flops)")
        acts = set(activities) if activities is not None else {ProfilerActivity.CPU} | (
            {ProfilerActivity.CUDA} if use_cuda else set())
        unknown = acts - supported_activities()
        if unknown:
            raise ValueError(f"flambeau.profiler.profile: unsupported activities {sorted(a.name for a in unknown)}")
        if ProfilerActivity.CUDA in acts:
            _warn_cuda_once()
        self.activities = acts
        self.schedule = schedule if schedule is not None else _default_schedule
        self.on_trace_ready = on_trace_ready
        self.record_shapes, self.with_flops = record_shapes, with_flops
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._recorder = None
        self._mode = None
        self._saved: list = []          # the events of the last finished recording

    # ---- recording ----------------------------------------------------------------------------
    def _start_recording(self) -> None:
        if self._recorder is not None:
            return
        self._recorder = _Recorder(self.record_shapes, self.with_flops)
        _active.append(self._recorder)
        self._mode = _OpTimer(self._recorder)
        self._mode.__enter__()

    def _stop_recording(self) -> None:
        if self._recorder is None:
            return
        self._mode.__exit__(None, None, None)
        _active.remove(self._recorder)
        self._saved = self._recorder.events
        self._recorder = self._mode = None

    def _enter_action(self, action: ProfilerAction) -> None:
        recording = action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if recording:
            if self.current_action not in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                self._start_recording()
        self.current_action = action

    def _leave_action(self) -> None:
        if self.current_action == ProfilerAction.RECORD_AND_SAVE:
            self._stop_recording()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

    def start(self) -> None:
        self._enter_action(self.schedule(self.step_num))

    def stop(self) -> None:
        if self.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._stop_recording()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
        self.current_action = ProfilerAction.NONE

    def step(self) -> None:
        """The end of one step: the schedule's next action starts (a finished active stretch is saved)."""
        self._leave_action()
        self.step_num += 1
        nxt = self.schedule(self.step_num)
        if nxt in (ProfilerAction.NONE, ProfilerAction.WARMUP) and self._recorder is not None:
            self._stop_recording()
        self._enter_action(nxt)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # ---- results ------------------------------------------------------------------------------
    def events(self) -> EventList:
        return EventList(sorted(self._saved, key=lambda e: e.start_ns))

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> EventList:
        return self.events().key_averages(group_by_input_shape)

    def export_chrome_trace(self, path: str) -> None:
        """Chrome's trace format ("X" events in microseconds), written atomically (gzipped for a `.gz` path)."""
        data = json.dumps(self._chrome_trace()).encode()
        if str(path).endswith(".gz"):
            data = gzip.compress(data)
        write_atomic(path, data)

    def _chrome_trace(self) -> dict:
        events = self.events()
        t0 = events[0].start_ns if events else 0
        pid = os.getpid()
        return {"traceEvents": [
            {"name": e.name, "ph": "X", "cat": "cpu_op" if e.name.startswith("aten::") else "user_annotation",
             "ts": (e.start_ns - t0) / 1e3, "dur": (e.end_ns - e.start_ns) / 1e3, "pid": pid, "tid": e.thread,
             "args": {"Input Dims": e.input_shapes} if e.input_shapes else {}} for e in events],
            "displayTimeUnit": "ms"}


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, use_gzip: bool = False):
    """on_trace_ready writing each saved stretch to `dir_name/<worker>.<ms>.pt.trace.json[.gz]`."""
    def handler(prof: profile) -> None:
        os.makedirs(dir_name, exist_ok=True)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        path = os.path.join(dir_name, f"{worker}.{time.time_ns() // 1_000_000}.pt.trace.json")
        prof.export_chrome_trace(path + ".gz" if use_gzip else path)
    return handler


_warned: list = []


def _warn_cuda_once() -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn("flambeau.profiler: ProfilerActivity.CUDA records the host side of each operator call; "
                      "device kernel times are not collected")
