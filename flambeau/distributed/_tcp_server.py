"""The TCPStore server: one asyncio event loop in a daemon thread, on uvloop (libuv) when installed.

Every live server is stopped, its thread joined, by an `atexit` handler: Python finalizes the interpreter
after its atexit handlers while daemon threads still run, and a server thread woken then (a peer closing its
connection as the job ends) enters the finalized interpreter from libuv's read callback and crashes the
process with SIGSEGV, after faulthandler is gone (a rank of the CI's 2-process runs died so, now and then).

Requests are frames of byte strings (see `store._frame`): an operation name and its arguments. Each
operation runs atomically on the loop's dict (`store.apply_op`); `wait` parks the connection until its
keys exist or its deadline passes, without blocking other clients (PyTorch's TCPStore on libuv, 2.4).
"""
from __future__ import annotations

import asyncio
import atexit
import socket
import struct
import sys
import threading
import weakref

from ._store_ops import MISSING, apply_op, decode_arg, encode_arg, frame

SERVER_START_S = 30.0       # how long the master waits for its server thread to listen
SERVER_STOP_S = 2.0         # how long closing waits for the server thread to let go of the port


try:
    import uvloop
except ImportError:                  # optional (the `distributed` extra): plain asyncio then
    uvloop = None


def _new_loop() -> tuple:
    if uvloop is None:
        return asyncio.new_event_loop(), False
    return uvloop.new_event_loop(), True


class StoreServer:
    """Listens on (host, port); `port` 0 picks a free one. `close()` stops the loop."""

    def __init__(self, host: str, port: int, use_libuv: bool = True) -> None:
        self.data: dict = {}
        self.loop, self.uses_libuv = _new_loop() if use_libuv else (asyncio.new_event_loop(), False)
        self._changed: asyncio.Condition | None = None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("" if host in ("localhost", "127.0.0.1", "0.0.0.0") else host, port))
        sock.listen(256)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(sock, ready), daemon=True,
                                        name=f"flambeau-tcpstore-{self.port}")
        self._thread.start()
        if not ready.wait(SERVER_START_S):
            raise RuntimeError(f"TCPStore: the server on port {self.port} did not start")
        _live.add(self)

    def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start():
            self._changed = asyncio.Condition()
            self._server = await asyncio.start_server(self._client, sock=sock)
            ready.set()
        self.loop.run_until_complete(start())
        try:
            self.loop.run_forever()
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        """Cancel the clients' tasks and close the stopped loop: a loop left open keeps its handles in
        reference cycles that uvloop's objects do not let the collector free (one leaked loop per server)."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                count, = struct.unpack("<I", await reader.readexactly(4))
                parts = []
                for _ in range(count):
                    n, = struct.unpack("<Q", await reader.readexactly(8))
                    parts.append(await reader.readexactly(n))
                writer.write(await self._answer(parts[0].decode(), [decode_arg(p) for p in parts[1:]]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
        except asyncio.CancelledError:      # the server closing (`_close_loop`): end as a finished task, since
            writer.close()                  # Python 3.11's stream callback calls `task.exception()`, which raises
                                            # for a cancelled task and printed "Exception in callback" at exit

    async def _answer(self, op: str, args: list) -> bytes:
        if op == "wait":
            timeout_ms, keys = args[0], args[1:]
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: all(k in self.data for k in keys)),
                                           timeout_ms / 1000)
                    return frame([b"ok", encode_arg(1)])
                except asyncio.TimeoutError:
                    return frame([b"ok", encode_arg(0)])
        try:
            out = apply_op(self.data, op, tuple(args))
        except ValueError as e:
            return frame([b"error", str(e).encode()])
        async with self._changed:
            self._changed.notify_all()
        if out is MISSING:
            return frame([b"missing"])
        return frame([b"ok"] if out is None else [b"ok", encode_arg(out)])

    def _shutdown(self) -> None:
        self._server.close()                 # the listening socket: the port is free again
        self.loop.stop()

    def close(self) -> None:
        """Stop listening and stop the loop (the master's TCPStore calls this when it goes away)."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._shutdown)
            if not sys.is_finalizing():
                self._thread.join(SERVER_STOP_S)


_live: weakref.WeakSet = weakref.WeakSet()       # servers whose loop may still run


def _close_live_servers() -> None:
    """Stop every live server and join its thread before the interpreter is finalized (module docstring)."""
    for server in list(_live):
        server.close()


atexit.register(_close_live_servers)
