"""`torch.multiprocessing.spawn` / `start_processes`: run `fn(i, *args)` in `nprocs` new processes, PyTorch's
way. Each child reports an exception's traceback to the parent through its own queue and exits 1; `join`
waits for any child to end, and at the first failure stops the others (SIGTERM, then SIGKILL after a grace
period) and raises `ProcessRaisedException` (the child's traceback in the message) or
`ProcessExitedException` (an exit code or a signal without a Python error)."""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
import traceback
import warnings

__all__ = ["spawn", "start_processes", "ProcessContext", "SpawnContext", "ProcessException",
           "ProcessRaisedException", "ProcessExitedException"]

TERMINATE_GRACE_S = 30.0         # PyTorch's: how long a SIGTERM'd child gets before SIGKILL


class ProcessException(Exception):
    __slots__ = ["error_index", "pid"]

    def __init__(self, msg: str, error_index: int, pid: int):
        super().__init__(msg)
        self.msg, self.error_index, self.pid = msg, error_index, pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A child raised: its traceback is in the message."""


class ProcessExitedException(ProcessException):
    """A child ended with a non-zero exit code or by a signal, without a Python exception to report."""
    __slots__ = ["exit_code", "signal_name"]

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name: str | None = None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code, self.signal_name = exit_code, signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


def _wrap(fn, i: int, args: tuple, error_queue) -> None:
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass                                    # the parent stopped us
    except Exception:                           # noqa: BLE001 -- reported to the parent, which raises it
        error_queue.put(traceback.format_exc())
        sys.exit(1)


class ProcessContext:
    def __init__(self, processes: list, error_queues: list):
        self.processes, self.error_queues = processes, error_queues
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self) -> list:
        return [int(p.pid) for p in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """True once every process ended well; False while some still run (after `timeout`); raises at the
        first one that failed, after stopping the others."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(self.sentinels.keys(), timeout=timeout)
        failed = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            p = self.processes[index]
            p.join()
            if p.exitcode != 0 and failed is None:
                failed = index
        if failed is None:
            return not self.sentinels
        self._stop_others(TERMINATE_GRACE_S if grace_period is None else grace_period)
        p, queue = self.processes[failed], self.error_queues[failed]
        if queue.empty():
            code = p.exitcode
            if code < 0:
                name = signal.Signals(-code).name
                raise ProcessExitedException(f"process {failed} terminated with signal {name}", failed, p.pid,
                                             code, name)
            raise ProcessExitedException(f"process {failed} terminated with exit code {code}", failed, p.pid, code)
        trace = queue.get()
        raise ProcessRaisedException(f"\n\n-- Process {failed} terminated with the following error:\n{trace}",
                                     failed, p.pid)

    def _stop_others(self, grace: float) -> None:
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + grace
        for p in self.processes:
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        self.sentinels.clear()


SpawnContext = ProcessContext


def start_processes(fn, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                    start_method: str = "spawn"):
    ctx = multiprocessing.get_context(start_method)
    processes, queues = [], []
    for i in range(nprocs):
        q = ctx.SimpleQueue()
        p = ctx.Process(target=_wrap, args=(fn, i, args, q), daemon=daemon)
        p.start()
        processes.append(p)
        queues.append(q)
    context = ProcessContext(processes, queues)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(fn, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn"):
    """`fn(i, *args)` for i in range(nprocs), each in a new process started by `start_method`."""
    if start_method != "spawn":
        warnings.warn(f"This method only supports start_method=spawn (got: {start_method}).\nTo use a different "
                      "start_method use:\n\t\t torch.multiprocessing.start_processes(...)", FutureWarning,
                      stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, start_method)
