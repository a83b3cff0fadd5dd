"""`python -m flambeau.distributed.run --nproc-per-node N script.py args`: torchrun's launcher on MPI.

It starts N workers through mpiexec (MPICH's Hydra, from the `mpich` wheel), each running the script as
`python -m flambeau.run` would (so unmodified PyTorch scripts run on flambeau), with torchrun's
environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS. When a worker fails, the others are stopped (the
worker aborts the MPI job; the launcher also stops mpiexec as soon as a failure is recorded) and its
traceback is shown; with `--max-restarts K` the whole group is started again up to K times.
Only one node for now (`--nnodes 1`).
"""
from __future__ import annotations

import argparse
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


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run_group(cmd: list, env: dict, folder: str, interval: float) -> int:
    """Run the workers until they all exit or one fails; returns mpiexec's exit code (or 1)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    failed_at = None
    try:
        while proc.poll() is None:
            time.sleep(interval)
            if failed_at is None and _failures(folder):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                _stop(proc)
    finally:
        _stop(proc)
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
    rc = 1
    for attempt in range(args.max_restarts + 1):
        folder = tempfile.mkdtemp(prefix="flambeau_run_")
        env = dict(os.environ, MASTER_ADDR=host, MASTER_PORT=str(port or _free_port(host)),
                   WORLD_SIZE=str(nproc), GROUP_RANK=str(args.node_rank), GROUP_WORLD_SIZE="1",
                   TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT=str(attempt),
                   TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), FLAMBEAU_ERROR_DIR=folder,
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        cmd = [mpiexec_path(), "-n", str(nproc), "-launcher", "fork"] + target
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
