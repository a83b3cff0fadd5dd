"""The processes of a launch: finding and stopping them, and what their failures left behind.

mpiexec, Hydra's proxy and the workers each run in a session of their own, so a signal to mpiexec's
process group reaches none of the others, and a worker spinning in a collective outlives a killed mpiexec.
`kill_tree` finds them by parent links and by the launch id every one of them carries in its environment
(FLAMBEAU_LAUNCH_ID, found even after a process was reparented). A failing worker leaves a record
(`rank_<N>.json`: message, traceback, time) in FLAMBEAU_ERROR_DIR; `read_failures` and `summary` turn the
records into the launcher's report. Used by `run.py` (one node) and `_multinode.py` (several).

MPICH unlinks its shared-memory segments (/dev/shm/mpich_shm_*, 2 MiB per rank) in MPI_Finalize, so a job
that ends otherwise (a rank's MPI_Abort, a killed rank) would leave them there for good: each worker
notes the segments it maps in FLAMBEAU_ERROR_DIR (`record_shared_memory`, called by the MPI engine once
MPI is up) and the launcher unlinks those still there when the job is over (`remove_shared_memory`).
"""
from __future__ import annotations

import json
import os
import signal
import time

MONITOR_INTERVAL_S = 0.1      # how often a launcher looks for a failed worker
STOP_GRACE_S = 5.0            # after SIGTERM, how long before SIGKILL
LAUNCH_ID_VAR = "FLAMBEAU_LAUNCH_ID"   # set in every process of a launch (inherited if already set)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SHM_DIR = "/dev/shm/"
MPI_SHM_PREFIXES = ("mpich_shm_",)     # the file names of MPICH's shared-memory segments
SHM_RECORD = "shm_{pid}.txt"          # a worker's note of its segments, in FLAMBEAU_ERROR_DIR
_RECORD_HEAD, _RECORD_TAIL = SHM_RECORD.split("{pid}")


def _is_mpi_segment(path: str) -> bool:
    return path.startswith(SHM_DIR) and path[len(SHM_DIR):].startswith(MPI_SHM_PREFIXES)


def record_shared_memory() -> None:
    """Note in FLAMBEAU_ERROR_DIR (if set) the MPI shared-memory files this process maps."""
    folder = os.environ.get("FLAMBEAU_ERROR_DIR")
    if not folder:
        return
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if SHM_DIR in line}
        mine = sorted(p for p in paths if _is_mpi_segment(p))
        with open(os.path.join(folder, SHM_RECORD.format(pid=os.getpid())), "w") as fh:
            fh.write("\n".join(mine))
    except (OSError, IndexError):      # no /proc (not Linux), or the folder is gone: nothing to note
        pass


def remove_shared_memory(folder: str) -> None:
    """Unlink the shared-memory files the workers of a finished job noted in `folder`, where still there."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(_RECORD_HEAD) and n.endswith(_RECORD_TAIL)]
    except OSError:
        return
    for name in names:
        with open(os.path.join(folder, name)) as fh:
            for path in fh.read().split():
                if _is_mpi_segment(path):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass


def read_failures(folder: str) -> list:
    """The failure records (`rank_<N>.json`, written by `_worker`) in `folder`, oldest first."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank_") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as fh:
                out.append(json.load(fh))
    return sorted(out, key=lambda r: r["timestamp"])


def _children_by_parent() -> dict:
    out: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def _carrying(marker: str) -> list:
    """Pids of this user's processes whose environment holds FLAMBEAU_LAUNCH_ID=marker."""
    needle = f"{LAUNCH_ID_VAR}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
    return found


def process_tree(pid: int | None, marker: str | None = None) -> list:
    """`pid` and all its descendants, plus every process carrying the launch id `marker`."""
    children = _children_by_parent()
    found, todo = [], [] if pid is None else [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.append(p)
            todo.extend(children.get(p, ()))
    if marker:
        found += [p for p in _carrying(marker) if p not in found]
    return found


def _signal_all(pids, sig) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid: int | None, marker: str | None = None, grace_s: float = STOP_GRACE_S) -> None:
    """Stop `pid` (a live child, or None), its descendants and the processes of launch `marker`: SIGTERM,
    then SIGKILL after `grace_s` for any still alive (found again, so processes started meanwhile go too)."""
    pids = [p for p in process_tree(pid, marker) if p != os.getpid()]
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(MONITOR_INTERVAL_S)
    pids += [p for p in process_tree(pid, marker) if p != os.getpid() and p not in pids]
    _signal_all(pids, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Stopped(Exception):
    """The launcher got a stop signal; the group is stopped on the way out."""


def raise_stopped(signum, frame) -> None:
    """Signal handler of a launcher: ignore further stop signals, unwind with `Stopped`."""
    for sig in STOP_SIGNALS:                   # a second signal must not interrupt the stopping
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signal.Signals(signum).name)


def summary(script: str, failures: list, rc: int, attempt: int) -> str:
    """The report a launcher prints when its group failed: the root cause first, with its traceback."""
    bar = "=" * 60
    lines = [bar, f"{script} FAILED (attempt {attempt}, exit code {rc})", "-" * 60]
    if not failures:
        lines.append("no worker recorded an error (a worker was killed by a signal or exited before reporting)")
    for i, f in enumerate(failures):
        lines.append(("Root Cause (first observed failure):" if i == 0 else "Other failure:")
                     + f"\n  rank: {f['rank']} (pid {f['pid']})\n  error: {f['message']}")
        if i == 0:
            lines.append("  traceback:\n" + "".join("    " + ln + "\n" for ln in f["traceback"].splitlines()))
    lines.append(bar)
    return "\n".join(lines)
