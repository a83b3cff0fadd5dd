"""Rendezvous: from an `init_method` URL to a store, this process's rank and the world size.

`env://` reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; `tcp://host:port` and `file:///path` name the
store directly (rank and world_size as arguments or `?rank=&world_size=` in the URL). Rank 0 hosts the
TCPStore; the others connect to it (retrying until the timeout), as PyTorch's handlers do.
"""
from __future__ import annotations

import os
import urllib.parse

from .store import FileStore, Store, TCPStore

__all__ = ["rendezvous", "register_rendezvous_handler"]


def _env(name: str, given: int | str | None = None) -> str:
    if given is not None and given != -1:
        return str(given)
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: environment variable "
                         f"{name} expected, but not set")
    return value


def _query(url: urllib.parse.ParseResult, rank: int, world_size: int) -> tuple:
    q = dict(urllib.parse.parse_qsl(url.query))
    rank = int(q.get("rank", rank))
    world_size = int(q.get("world_size", world_size))
    if rank < 0 or world_size <= 0:
        raise ValueError(f"{url.scheme}:// rendezvous needs rank and world_size (got rank={rank}, "
                         f"world_size={world_size})")
    return rank, world_size


def _env_handler(url, rank: int, world_size: int, timeout) -> tuple:
    rank = int(_env("RANK", rank))
    world_size = int(_env("WORLD_SIZE", world_size))
    host, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    return TCPStore(host, port, world_size, rank == 0, timeout, wait_for_workers=False), rank, world_size


def _tcp_handler(url, rank: int, world_size: int, timeout) -> tuple:
    rank, world_size = _query(url, rank, world_size)
    if url.hostname is None or url.port is None:
        raise ValueError(f"tcp:// rendezvous needs host and port, got {url.geturl()!r}")
    return TCPStore(url.hostname, url.port, world_size, rank == 0, timeout, wait_for_workers=False), rank, world_size


def _file_handler(url, rank: int, world_size: int, timeout) -> tuple:
    rank, world_size = _query(url, rank, world_size)
    store = FileStore(url.path, world_size)
    store.set_timeout(timeout)
    return store, rank, world_size


_HANDLERS = {"env": _env_handler, "tcp": _tcp_handler, "file": _file_handler}


def register_rendezvous_handler(scheme: str, handler) -> None:
    """`handler(url, rank, world_size, timeout) -> (store, rank, world_size)` for `scheme://` URLs."""
    if scheme in _HANDLERS:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _HANDLERS[scheme] = handler


def rendezvous(init_method: str, rank: int = -1, world_size: int = -1, timeout=None) -> tuple[Store, int, int]:
    url = urllib.parse.urlparse(init_method)
    if url.scheme not in _HANDLERS:
        raise RuntimeError(f"No rendezvous handler for {url.scheme}://")
    return _HANDLERS[url.scheme](url, rank, world_size, timeout)
