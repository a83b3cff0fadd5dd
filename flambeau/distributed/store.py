"""Key-value stores for rendezvous, as `torch.distributed`'s: HashStore, PrefixStore, FileStore, TCPStore.

Every store offers PyTorch's methods (set/get/add/append/check/wait/compare_set/delete_key/num_keys/
multi_get/multi_set, a `timeout`) over one small core each subclass supplies: `_apply(op, args)`, which
performs one operation atomically and answers `MISSING` when it needs a key that is absent; `get` and
`wait` block until the key exists or the timeout passes (then `DistStoreError`, as PyTorch's).
The TCPStore's server lives in `_tcp_server.py` (asyncio, on uvloop when installed).
"""
from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
import threading
import time

from ._store_ops import MISSING, StoreConnectionClosed, apply_op, decode_arg, encode_arg, frame, recv_frame
from ._tcp_server import StoreServer

__all__ = ["Store", "HashStore", "PrefixStore", "FileStore", "TCPStore", "DistError", "DistStoreError",
           "DistNetworkError", "DistBackendError", "default_pg_timeout"]

default_pg_timeout = datetime.timedelta(minutes=30)
FILE_POLL_S = 0.01            # FileStore re-reads its log this often while waiting for a key
CONNECT_RETRY_S = 0.05        # a TCPStore client retries a refused connection this often
SERVER_SLACK_S = 5.0          # a TCPStore request waits this long past its own timeout for the answer


class DistError(RuntimeError):
    """Base of the distributed errors (PyTorch's `torch.distributed.DistError`)."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""


class DistNetworkError(DistError):
    """A store could not reach its server."""


class DistBackendError(DistError):
    """A collective failed in the communication library."""


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


def _bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return bytes(value)
    raise TypeError(f"Store value must be str or bytes, got {type(value).__name__}")


class Store:
    """The interface; subclasses implement `_apply(op, args)` and `_wait_keys(keys, seconds)`."""

    def __init__(self, timeout=default_pg_timeout) -> None:
        self._timeout = datetime.timedelta(seconds=_seconds(timeout))

    @property
    def timeout(self) -> datetime.timedelta:
        return self._timeout

    def set_timeout(self, timeout) -> None:
        self._timeout = datetime.timedelta(seconds=_seconds(timeout))

    def set(self, key: str, value) -> None:
        self._apply("set", (key, _bytes(value)))

    def get(self, key: str) -> bytes:
        self.wait([key])
        value = self._apply("get", (key,))
        if value is MISSING:
            raise DistStoreError(f"key {key!r} was deleted while being read")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._apply("add", (key, int(amount)))

    def append(self, key: str, value) -> None:
        self._apply("append", (key, _bytes(value)))

    def check(self, keys: list) -> bool:
        return self._apply("check", tuple(keys))

    def wait(self, keys: list, timeout=None) -> None:
        seconds = _seconds(self._timeout if timeout is None else timeout)
        if not self._wait_keys(list(keys), seconds):
            raise DistStoreError(f"wait timeout after {int(seconds * 1000)}ms, keys: "
                                 + ", ".join("/" + k for k in keys))

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        return self._apply("compare_set", (key, _bytes(expected_value), _bytes(desired_value)))

    def delete_key(self, key: str) -> bool:
        return self._apply("delete_key", (key,))

    def num_keys(self) -> int:
        return self._apply("num_keys", ())

    def multi_get(self, keys: list) -> list:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list, values: list) -> None:
        for k, v in zip(keys, values):
            self.set(k, v)

    def _apply(self, op: str, args: tuple):
        raise NotImplementedError

    def _wait_keys(self, keys: list, seconds: float) -> bool:
        raise NotImplementedError


class HashStore(Store):
    """A dict in this process, for threads of one process (PyTorch's HashStore)."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict = {}
        self._cond = threading.Condition()

    def _apply(self, op, args):
        with self._cond:
            out = apply_op(self._data, op, args)
            self._cond.notify_all()
            return out

    def _wait_keys(self, keys, seconds):
        with self._cond:
            return self._cond.wait_for(lambda: all(k in self._data for k in keys), seconds)

    def wait(self, keys: list, timeout=None) -> None:
        seconds = _seconds(self._timeout if timeout is None else timeout)
        if not self._wait_keys(list(keys), seconds):
            raise DistStoreError("Wait timeout")


class PrefixStore(Store):
    """Every key of `store` seen through `prefix + "/"` (PyTorch's PrefixStore)."""

    def __init__(self, prefix: str, store: Store) -> None:
        super().__init__(store.timeout)
        self.prefix, self.underlying_store = prefix, store

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    @property
    def timeout(self) -> datetime.timedelta:
        return self.underlying_store.timeout

    def set_timeout(self, timeout) -> None:
        self.underlying_store.set_timeout(timeout)

    def _apply(self, op, args):
        if op == "num_keys":
            return self.underlying_store.num_keys()
        if op == "check":
            return self.underlying_store.check([self._key(k) for k in args])
        return self.underlying_store._apply(op, (self._key(args[0]),) + tuple(args[1:]))

    def wait(self, keys: list, timeout=None) -> None:
        self.underlying_store.wait([self._key(k) for k in keys], timeout)


class FileStore(Store):
    """A store in one file shared by processes of one machine (or a shared file system).

    The file is an append-only log of operations under `flock`; the state is the log replayed.
    With `num_workers` > 0 the last of that many stores to be closed deletes the file, as PyTorch's."""

    def __init__(self, file_name: str, num_workers: int = -1) -> None:
        super().__init__()
        self.path, self._num_workers, self._closed = file_name, num_workers, False
        open(file_name, "ab").close()
        self._apply("add", ("__store_workers", 1))

    def _replay(self, fh) -> dict:
        fh.seek(0)
        blob, data, pos = fh.read(), {}, 0
        while pos < len(blob):
            count, = struct.unpack_from("<I", blob, pos)
            pos += 4
            parts = []
            for _ in range(count):
                n, = struct.unpack_from("<Q", blob, pos)
                parts.append(blob[pos + 8:pos + 8 + n])
                pos += 8 + n
            apply_op(data, parts[0].decode(), tuple(decode_arg(p) for p in parts[1:]))
        return data

    def _apply(self, op, args):
        with open(self.path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                data = self._replay(fh)
                before = dict(data)
                out = apply_op(data, op, args)
                if data != before:
                    fh.seek(0, os.SEEK_END)
                    fh.write(frame([op.encode()] + [encode_arg(a) for a in args]))
                    fh.flush()
                return out
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _wait_keys(self, keys, seconds):
        deadline = time.monotonic() + seconds
        while not self._apply("check", tuple(keys)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(FILE_POLL_S)
        return True

    def delete_key(self, key: str) -> bool:
        """True, present or not (PyTorch's FileStore appends a deletion either way)."""
        self._apply("delete_key", (key,))
        return True

    def close(self) -> None:
        if self._closed or not os.path.exists(self.path):
            return
        self._closed = True
        left = self._num_workers - self._apply("add", ("__store_closed", 1))
        if self._num_workers > 0 and left <= 0:
            os.unlink(self.path)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class TCPStore(Store):
    """A store served over TCP by one process (`is_master=True`) to all others.

    `TCPStore(host_name, port, world_size=None, is_master=False, timeout=..., wait_for_workers=True)`;
    port 0 on the master picks a free port (read it back from `.port`). The server runs on asyncio in a
    daemon thread of the master, on uvloop (libuv) when it is installed (`.libuvBackend` says which)."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout=datetime.timedelta(seconds=300), wait_for_workers: bool = True,
                 multi_tenant: bool = False, master_listen_fd=None, use_libuv: bool = True) -> None:
        super().__init__(timeout)
        self.host, self._server = host_name, None
        self.libuvBackend = False
        if is_master:
            self._server = StoreServer(host_name, port, use_libuv)
            port, self.libuvBackend = self._server.port, self._server.uses_libuv
        self.port = port
        self._lock = threading.Lock()
        self._sock = self._connect(_seconds(timeout))
        self.add("__store_clients", 1)
        if is_master and wait_for_workers and world_size:
            self._wait_for_workers(world_size)

    def _connect(self, seconds: float) -> socket.socket:
        deadline = time.monotonic() + seconds
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(seconds, 0.001))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise DistNetworkError(f"The client socket has timed out after {int(seconds * 1000)}ms while "
                                           f"trying to connect to ({self.host}, {self.port}): {e}") from None
                time.sleep(CONNECT_RETRY_S)

    def _wait_for_workers(self, world_size: int) -> None:
        seconds = _seconds(self._timeout)
        deadline = time.monotonic() + seconds
        while int(self._request("get", "__store_clients", b"0")) < world_size:
            if time.monotonic() >= deadline:
                raise DistStoreError(f"Timed out after {int(seconds)} seconds waiting for clients. "
                                     f"{int(self._request('get', '__store_clients', b'0'))}/{world_size} "
                                     "clients joined.")
            time.sleep(CONNECT_RETRY_S)

    def _request(self, op: str, *args, wait_s: float = 0.0):
        limit = wait_s + _seconds(self._timeout) + SERVER_SLACK_S
        with self._lock:
            self._sock.settimeout(limit)
            try:
                self._sock.sendall(frame([op.encode()] + [encode_arg(a) for a in args]))
                status, *body = recv_frame(self._sock)
            except StoreConnectionClosed as e:
                raise DistNetworkError(f"{e} (during {op})") from None
            except socket.timeout:
                raise DistStoreError(f"TCPStore: no answer to {op} from {self.host}:{self.port} within "
                                     f"{limit:.1f} s") from None
        if status == b"missing":
            return MISSING
        if status == b"error":
            raise DistStoreError(body[0].decode())
        return decode_arg(body[0]) if body else None

    def _apply(self, op, args):
        out = self._request(op, *args)
        return bool(out) if op in ("check", "delete_key") else out

    def _wait_keys(self, keys, seconds):
        return bool(self._request("wait", int(seconds * 1000), *keys, wait_s=seconds))

    def __del__(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()
        if getattr(self, "_server", None) is not None:
            self._server.close()
