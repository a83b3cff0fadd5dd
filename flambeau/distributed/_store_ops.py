"""The operations every store performs and the bytes a TCPStore sends: shared by the stores and the server.

`apply_op(data, op, args)` performs one operation atomically on a dict of bytes; `MISSING` is what a read
of an absent key answers. A message is a frame: a count, then each part as a length and its bytes;
arguments carry a one-letter kind (b: bytes, i: int, s: str).
"""
from __future__ import annotations

import socket
import struct

MISSING = object()
INTERNAL = "__store_"        # keys the stores keep for themselves (worker counts); num_keys skips them


class StoreConnectionClosed(ConnectionError):
    """The other end of a store connection went away."""


def apply_op(data: dict, op: str, args: tuple):
    """One store operation on a dict of bytes (shared by HashStore, FileStore and the TCP server)."""
    if op == "set":
        data[args[0]] = args[1]
        return None
    if op == "get":
        return data.get(args[0], MISSING)
    if op == "add":
        value = int(data.get(args[0], b"0")) + int(args[1])
        data[args[0]] = str(value).encode()
        return value
    if op == "append":
        data[args[0]] = data.get(args[0], b"") + args[1]
        return None
    if op == "check":
        return all(k in data for k in args)
    if op == "compare_set":
        key, expected, desired = args
        if key not in data:
            if expected == b"":
                data[key] = desired
                return desired
            return expected
        if data[key] == expected:
            data[key] = desired
        return data[key]
    if op == "delete_key":
        return data.pop(args[0], MISSING) is not MISSING
    if op == "num_keys":
        return sum(not k.startswith(INTERNAL) for k in data)
    raise ValueError(f"unknown store operation {op!r}")


def encode_arg(a) -> bytes:
    if isinstance(a, bytes):
        return b"b" + a
    if isinstance(a, int):
        return b"i" + str(int(a)).encode()
    return b"s" + a.encode()


def decode_arg(p: bytes):
    kind, body = p[:1], p[1:]
    return body if kind == b"b" else int(body) if kind == b"i" else body.decode()


def frame(parts: list) -> bytes:
    out = [struct.pack("<I", len(parts))]
    for p in parts:
        out.append(struct.pack("<Q", len(p)))
        out.append(p)
    return b"".join(out)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise StoreConnectionClosed("TCPStore: the server closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> list:
    count, = struct.unpack("<I", _recv_exact(sock, 4))
    parts = []
    for _ in range(count):
        n, = struct.unpack("<Q", _recv_exact(sock, 8))
        parts.append(_recv_exact(sock, n))
    return parts
