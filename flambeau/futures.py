"""torch.futures: `Future` (then / wait / value / done / set_result), `collect_all`, `wait_all`.

A Future here may complete lazily: one made by a distributed `Work.get_future()` carries a waiter that
finishes the communication when someone waits on it (or on a Future chained from it with `then`).
"""
from __future__ import annotations

from typing import Callable

__all__ = ["Future", "collect_all", "wait_all"]


class Future:
    """A value that arrives later (PyTorch's `torch.futures.Future`)."""

    def __init__(self, *, devices=None, waiter: Callable[[], None] | None = None) -> None:
        self._done, self._value, self._exception = False, None, None
        self._callbacks: list = []
        self._waiter = waiter

    def done(self) -> bool:
        return self._done

    def wait(self):
        if not self._done and self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            waiter()
        if not self._done:
            raise RuntimeError("Future.wait: the future has no result and nothing will produce one")
        return self.value()

    def value(self):
        if self._exception is not None:
            raise self._exception
        return self._value

    def set_result(self, result) -> None:
        if self._done:
            raise RuntimeError("Future can only be marked completed once.")
        self._done, self._value = True, result
        self._run_callbacks()

    def set_exception(self, result: BaseException) -> None:
        if self._done:
            raise RuntimeError("Future can only be marked completed once.")
        self._done, self._exception = True, result
        self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, callback: Callable[["Future"], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def then(self, callback: Callable[["Future"], object]) -> "Future":
        """A Future holding `callback(self)` once this one completes."""
        chained = Future(waiter=self.wait)

        def run_then(parent: "Future") -> None:
            try:
                chained.set_result(callback(parent))
            except Exception as e:  # noqa: BLE001  carried to whoever waits on the chained future
                chained.set_exception(e)
        self.add_done_callback(run_then)
        return chained


def collect_all(futures: list) -> Future:
    """One Future completing with the list of `futures` once all of them complete."""
    def wait_each() -> None:
        for f in futures:
            f.wait()
        out.set_result(list(futures))
    out = Future(waiter=wait_each)
    return out


def wait_all(futures: list) -> list:
    return [f.wait() for f in futures]
