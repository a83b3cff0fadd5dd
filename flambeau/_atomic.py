"""Atomic file replacement for checkpoints: write a temporary file beside the target, fsync it,
rename it over the target, fsync the folder.

The temporary file is named `.<target name>.flambeau-tmp-<pid>-<random hex>`. It is removed on
every exit this process can see: an exception (KeyboardInterrupt included) and SIGTERM/SIGHUP/SIGINT
while they have their default action (the handler removes the file, then the process dies of the
same signal as it would have). SIGKILL cannot be caught: the next save to the same target removes
temporaries whose process is gone (a pid that no longer exists, or a zombie). A temporary of a live
process, this one's other saves included, is never touched.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import threading
from typing import Iterator

_TMP_TAG = ".flambeau-tmp-"
_TMP_PID = re.compile(r"-(\d+)-[0-9a-f]+$")
_CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def temp_name(base: str) -> str:
    return f".{base}{_TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True                   # not a pid we wrote; leave the file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale(folder: str, base: str) -> None:
    """Remove temporaries of saves to `folder/base` whose writing process is gone."""
    prefix = f".{base}{_TMP_TAG}"
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = _TMP_PID.search(name) if name.startswith(prefix) else None
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


@contextlib.contextmanager
def _unlink_on_signals(tmp: str) -> Iterator[None]:
    """While the body runs, a terminating signal with the default action first removes `tmp`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def remove_then_die(signum, frame):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = {}
    for sig in _CAUGHT:
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, remove_then_die)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(f) -> Iterator[str]:
    """Yield a temporary path for the body to write; on success it replaces `f` durably."""
    path = os.path.abspath(os.fspath(f))
    folder, base = os.path.split(path)
    remove_stale(folder, base)
    tmp = os.path.join(folder, temp_name(base))
    with _unlink_on_signals(tmp):
        try:
            yield tmp
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _fsync_folder(folder)


def write_atomic(f, data: bytes) -> None:
    """Write `data` to a file object, or atomically to a path."""
    if hasattr(f, "write"):
        f.write(data)
        return
    with atomic_path(f) as tmp:
        with open(tmp, "xb") as fh:
            fh.write(data)
