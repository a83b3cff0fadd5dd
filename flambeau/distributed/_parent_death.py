"""Die with the parent: a process of a launch must not outlive the process that started it.

A launcher killed by SIGKILL runs no cleanup, and mpiexec, Hydra's proxies and the workers each run in a
session of their own, so nothing else would stop them. Linux's `prctl(PR_SET_PDEATHSIG, SIGKILL)` has the
kernel kill a process when its parent dies: the launcher starts mpiexec and Hydra's proxy through this
module (`python -m flambeau.distributed._parent_death CMD...` sets it, then execs CMD, keeping it across
exec), and every worker sets it on itself (`die_with_parent()`), so launcher -> mpiexec/proxy -> workers
go down together. Elsewhere than Linux it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1           # <linux/prctl.h>


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux); exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:          # the parent died before the request was in place
        os._exit(1)


def command(cmd: list) -> list:
    """`cmd` started so that it dies with the process that starts it."""
    return [sys.executable, "-m", "flambeau.distributed._parent_death"] + list(cmd)


if __name__ == "__main__":
    die_with_parent()
    os.execvp(sys.argv[1], sys.argv[1:])
