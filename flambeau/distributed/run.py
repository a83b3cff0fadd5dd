"""`python -m flambeau.distributed.run --nproc-per-node N script.py args`: torchrun's launcher on MPI.

It starts N workers through mpiexec (MPICH's Hydra, from the `mpich` wheel), each running the script as
`python -m flambeau.run` would (so unmodified PyTorch scripts run on flambeau), with torchrun's
environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS. When a worker fails, the others are stopped (the
worker aborts the MPI job; the launcher also stops mpiexec as soon as a failure is recorded) and its
traceback is shown; with `--max-restarts K` the whole group is started again up to K times.
Only one node for now (`--nnodes 1`).

Stopping a group stops every process of it: mpiexec, Hydra's proxy and the workers each run in a session
of their own, so a signal to mpiexec's process group reaches none of the others, and a worker spinning in
a collective outlives a killed mpiexec. `kill_tree` finds them by parent links and by the launch id every
one of them carries in its environment (FLAMBEAU_LAUNCH_ID, found even after a process was reparented),
and the launcher runs it on failure, on exit and on SIGTERM/SIGINT/SIGHUP (what `timeout` and CI send).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid

from .._backends import cuda_device_count

MONITOR_INTERVAL_S = 0.1      # how often the launcher looks for a failed worker
FAILURE_GRACE_S = 2.0         # after a failure, how long the group has to stop by itself
STOP_GRACE_S = 5.0            # after SIGTERM, how long before SIGKILL
VERSION_TIMEOUT_S = 10.0      # how long `mpiexec --version` may take to say which MPI it is
LAUNCH_ID_VAR = "FLAMBEAU_LAUNCH_ID"   # set in every process of a launch (inherited if already set)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flambeau.distributed.run",
                                description="Start N workers of a training script (torchrun's interface).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", type=int, default=0)
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default="")
    p.add_argument("--rdzv-backend", "--rdzv_backend", default="static")
    p.add_argument("--rdzv-id", "--rdzv_id", default="")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
    p.add_argument("--monitor-interval", "--monitor_interval", type=float, default=MONITOR_INTERVAL_S)
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    p.add_argument("--no-python", "--no_python", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def mpiexec_path() -> str:
    """The mpiexec of the `mpich` wheel installed beside this Python, else the one on PATH."""
    beside = os.path.join(sysconfig.get_path("scripts"), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("flambeau.distributed.run needs mpiexec: pip install 'flambeau[distributed]' "
                           "(the mpich and mpi4py wheels)")
    return found


def mpiexec_command(nproc: int) -> list:
    """mpiexec's arguments to start `nproc` local workers, in the dialect of the MPI found (MPICH's Hydra,
    as the wheel ships, or a system Open MPI, whose mpiexec refuses Hydra's `-launcher` and root)."""
    path = mpiexec_path()
    if not _is_open_mpi(path):
        return [path, "-n", str(nproc), "-launcher", "fork"]
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [path, "-n", str(nproc), "--oversubscribe", "--bind-to", "none"] + root


@functools.lru_cache(maxsize=None)
def _is_open_mpi(path: str) -> bool:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def _nproc(value: str) -> int:
    if value in ("auto", "cpu"):
        return os.cpu_count() or 1
    if value == "gpu":
        return cuda_device_count()
    return int(value)


def _failures(folder: str) -> list:
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
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(MONITOR_INTERVAL_S)
    pids += [p for p in process_tree(pid, marker) if p != os.getpid() and p not in pids]
    _signal_all(pids, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(proc: subprocess.Popen, marker: str) -> None:
    """Stop the group; an mpiexec already reaped has no pid to follow (it may be reused), only the marker."""
    kill_tree(proc.pid if proc.poll() is None else None, marker)
    proc.wait()


class _Stopped(Exception):
    """The launcher got a stop signal; the group is stopped on the way out."""


def _raise_stopped(signum, frame):
    for sig in _STOP_SIGNALS:                   # a second signal must not interrupt the stopping
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signal.Signals(signum).name)


def _run_group(cmd: list, env: dict, folder: str, interval: float) -> int:
    """Run the workers until they all exit or one fails; returns mpiexec's exit code (or 1). However it
    ends (failure, exception, stop signal), no process of the group is left running."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    marker = env[LAUNCH_ID_VAR]
    failed_at = None
    try:
        while proc.poll() is None:
            time.sleep(interval)
            if failed_at is None and _failures(folder):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                _stop(proc, marker)
    finally:
        _stop(proc, marker)
    return proc.returncode if failed_at is None else (proc.returncode or 1)


def _summary(script: str, failures: list, rc: int, attempt: int) -> str:
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


def main(argv: list | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.nnodes not in ("1", "1:1"):
        raise SystemExit("flambeau.distributed.run: only --nnodes 1 is implemented so far (multi-node is "
                         "issue 17, item 7)")
    nproc = _nproc(args.nproc_per_node)
    host = args.master_addr
    port = args.master_port
    if args.rdzv_endpoint:
        host, _, p = args.rdzv_endpoint.rpartition(":")
        port = int(p) if p else port
    run_id = args.rdzv_id or uuid.uuid4().hex[:8]
    target = ([] if args.no_python else [sys.executable, "-m", "flambeau.distributed._worker"]) \
        + (["-m"] if args.module else []) + [args.training_script] + list(args.training_script_args)
    launch_id = os.environ.get(LAUNCH_ID_VAR) or uuid.uuid4().hex
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in _STOP_SIGNALS}
    try:
        _attempts(args, nproc, host, port, run_id, target, launch_id)
    except _Stopped as e:
        print(f"flambeau.distributed.run: stopped by {e}; the workers were stopped", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _attempts(args, nproc: int, host: str, port: int, run_id: str, target: list, launch_id: str) -> None:
    rc = 1
    for attempt in range(args.max_restarts + 1):
        folder = tempfile.mkdtemp(prefix="flambeau_run_")
        env = dict(os.environ, MASTER_ADDR=host, MASTER_PORT=str(port or _free_port(host)),
                   WORLD_SIZE=str(nproc), GROUP_RANK=str(args.node_rank), GROUP_WORLD_SIZE="1",
                   TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT=str(attempt),
                   TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), FLAMBEAU_ERROR_DIR=folder,
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{LAUNCH_ID_VAR: launch_id})
        cmd = mpiexec_command(nproc) + target
        try:
            rc = _run_group(cmd, env, folder, args.monitor_interval)
            if rc == 0:
                return
            print(_summary(args.training_script, _failures(folder), rc, attempt), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if attempt < args.max_restarts:
            print(f"flambeau.distributed.run: restarting the workers ({attempt + 1}/{args.max_restarts})",
                  file=sys.stderr, flush=True)
    raise SystemExit(rc if rc > 0 else 1)


if __name__ == "__main__":
    main()
