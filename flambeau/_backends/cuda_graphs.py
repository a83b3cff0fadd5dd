"""CUDA graph capture over CuPy: a private memory pool and a capture stream per use, shared by the
compiler's CUDA graphs (`flambeau._inductor.cudagraphs`) and the user API (`flambeau.cuda.CUDAGraph`).

    g = CupyGraphs(device)                 # a private cupy.cuda.MemoryPool and a non-blocking stream
    graph, out = g.capture(fn, allocs)     # fn() under stream capture, ordered after the current
                                           # stream's queued work; its allocations come from the
                                           # private pool, each (start, end) appended to allocs
    g.launch(graph)                        # replay on the current stream

Capture runs in CuPy's relaxed mode (its default: the pool may grow with cudaMalloc meanwhile). Memory
of the private pool is never handed to code outside captures, so what a graph wrote stays where the
graph will write it again; its size is added to the device's allocated bytes (`extra_bytes`), so
`flambeau.cuda.memory_allocated` and the peak count it as PyTorch counts its graph pools. CuPy
refuses host synchronisations and host-to-device copies on a capturing stream; such an error, or
any other inside the capture, ends the capture and raises `CaptureFailed`.
"""
from __future__ import annotations

import contextlib

from . import extra_bytes, get


class CaptureFailed(RuntimeError):
    """The work could not be captured (the reason is the message)."""


class CupyGraphs:
    """A private CuPy memory pool and a capture stream on one cuda device."""

    def __init__(self, device):
        self.cupy = cupy = get("cuda").xp
        self.index = device.index or 0
        with cupy.cuda.Device(self.index):
            self.pool = cupy.cuda.MemoryPool()
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._open = None
        self._counted = 0                # bytes of the pool added to extra_bytes

    @contextlib.contextmanager
    def allocating(self, allocs: list):
        """Allocations inside come from the private pool; each (start, end) is appended to `allocs`."""
        pool = self.pool

        def malloc(n):
            m = pool.malloc(n)
            allocs.append((m.ptr, m.ptr + max(n, 1)))
            return m
        try:
            with self.cupy.cuda.using_allocator(malloc):
                yield
        finally:
            total = pool.total_bytes()
            extra_bytes[self.index] = extra_bytes.get(self.index, 0) - self._counted + total
            self._counted = total

    def begin(self, allocs: list) -> None:
        """Start capturing on the capture stream, made current (`end` stops)."""
        s = self.stream
        s.wait_event(self.cupy.cuda.get_current_stream().record())
        stack = contextlib.ExitStack()
        stack.enter_context(self.allocating(allocs))
        stack.enter_context(s)
        try:
            s.begin_capture()
        except Exception as e:
            stack.close()
            raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        self._open = stack

    def end(self, failed: bool = False):
        """The captured graph (None after `failed`: the capture is ended and dropped)."""
        stack, self._open = self._open, None
        try:
            graph = self.stream.end_capture()
        except Exception as e:
            if failed:
                return None
            raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        finally:
            stack.close()
        return None if failed else graph

    def capture(self, fn, allocs: list):
        """(graph, fn's result): see the module docstring."""
        self.begin(allocs)
        try:
            out = fn()
        except Exception as e:
            self.end(failed=True)
            raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        return self.end(), out

    def launch(self, graph) -> None:
        graph.launch()

    def copy(self, dst, src) -> None:
        self.cupy.copyto(dst, src)

    def empty_like(self, a):
        return self.cupy.empty(a.shape, a.dtype)

    @staticmethod
    def ptr(a) -> int:
        return a.data.ptr

    @staticmethod
    def span(a) -> tuple:
        """(first byte, one past the last byte) of an array's memory."""
        lo = a.data.ptr
        return lo, lo + (sum((s - 1) * st for s, st in zip(a.shape, a.strides)) + a.itemsize if a.size else 1)
