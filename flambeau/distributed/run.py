"""`python -m flambeau.distributed.run --nproc-per-node N script.py args`: torchrun's launcher on MPI.

It starts N workers through mpiexec (MPICH's Hydra, from the `mpich` wheel), each running the script as
`python -m flambeau.run` would (so unmodified PyTorch scripts run on flambeau), with torchrun's
environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS. When a worker fails, the others are stopped (the
worker aborts the MPI job; the launcher also stops mpiexec as soon as a failure is recorded) and its
traceback is shown; with `--max-restarts K` the whole group is started again up to K times.
Several nodes (`--nnodes M --node-rank R --rdzv-endpoint host:port`, one launcher per node): `_multinode.py`;
an elastic number of them (`--nnodes MIN:MAX --rdzv-backend c10d`, nodes joining and leaving): `_elastic.py`.

Stopping a group stops every process of it (`_processes.kill_tree`: mpiexec, Hydra's proxy and the workers
each run in a session of their own), on failure, on exit and on SIGTERM/SIGINT/SIGHUP (what `timeout` and
CI send).
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid

from .._backends import cuda_device_count
from . import _parent_death as parent_death
from ._elastic import LAST_CALL_TIMEOUT_S, run_elastic
from ._multinode import DEFAULT_JOIN_TIMEOUT_S, ROLE_NAME, MpiLauncher, free_port, run_nodes
from ._processes import (LAUNCH_ID_VAR, MONITOR_INTERVAL_S, STOP_SIGNALS, Stopped, kill_tree,  # noqa: F401
                         process_tree, raise_stopped, read_failures, remove_shared_memory, summary)

FAILURE_GRACE_S = 2.0         # after a failure, how long the group has to stop by itself
VERSION_TIMEOUT_S = 10.0      # how long `mpiexec --version` may take to say which MPI it is
RDZV_BACKENDS = ("static", "c10d")   # both mean: node 0's launcher serves the store at the endpoint


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
    p.add_argument("--rdzv-conf", "--rdzv_conf", default="", help="key=value,... (join_timeout: seconds)")
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


def _nproc(value: str) -> int:
    if value in ("auto", "cpu"):
        return os.cpu_count() or 1
    if value == "gpu":
        return cuda_device_count()
    return int(value)


def _stop(proc: subprocess.Popen, marker: str) -> None:
    """Stop the group; an mpiexec already reaped has no pid to follow (it may be reused), only the marker."""
    kill_tree(proc.pid if proc.poll() is None else None, marker)
    proc.wait()


def _run_group(cmd: list, env: dict, folder: str, interval: float) -> int:
    """Run the workers until they all exit or one fails; returns mpiexec's exit code (or 1). However it
    ends (failure, exception, stop signal), no process of the group is left running."""
    proc = subprocess.Popen(parent_death.command(cmd), env=env, start_new_session=True)
    marker = env[LAUNCH_ID_VAR]
    failed_at = None
    try:
        while proc.poll() is None:
            time.sleep(interval)
            if failed_at is None and read_failures(folder):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                _stop(proc, marker)
    finally:
        _stop(proc, marker)
    return proc.returncode if failed_at is None else (proc.returncode or 1)


def _nnodes(value: str) -> tuple:
    """(MIN, MAX) of `--nnodes N` or `--nnodes MIN:MAX`."""
    low, _, high = value.partition(":")
    low, high = int(low), int(high or low)
    if not 1 <= low <= high:
        raise SystemExit(f"flambeau.distributed.run: --nnodes {value}: need 1 <= MIN <= MAX")
    return low, high


def _rdzv_conf(conf: str) -> tuple:
    """(join_timeout, last_call_timeout) in seconds from --rdzv-conf key=value,..."""
    pairs = dict(item.split("=", 1) for item in conf.split(",") if "=" in item)
    return (float(pairs.get("join_timeout", DEFAULT_JOIN_TIMEOUT_S)),
            float(pairs.get("last_call_timeout", LAST_CALL_TIMEOUT_S)))


def _rendezvous(args, nnodes: int) -> tuple:
    """(host, port) of the rendezvous: --rdzv-endpoint, else --master-addr/--master-port."""
    if args.rdzv_backend not in RDZV_BACKENDS:
        raise SystemExit(f"flambeau.distributed.run: --rdzv-backend {args.rdzv_backend} is not supported; "
                         f"use one of {', '.join(RDZV_BACKENDS)}")
    host, port = args.master_addr, args.master_port
    if args.rdzv_endpoint:
        h, _, p = args.rdzv_endpoint.rpartition(":")
        host, port = (h, int(p)) if h else (p, port)
    if nnodes > 1 and not port:
        raise SystemExit("flambeau.distributed.run: --nnodes > 1 needs --rdzv-endpoint host:port (or "
                         "--master-addr and --master-port) that every node can reach")
    return host, port


def main(argv: list | None = None) -> None:
    args = _parser().parse_args(argv)
    min_nodes, nnodes = _nnodes(args.nnodes)
    if min_nodes < nnodes and args.rdzv_backend != "c10d":
        raise SystemExit(f"flambeau.distributed.run: --nnodes {args.nnodes} (elastic) needs --rdzv-backend c10d; "
                         f"the {args.rdzv_backend} rendezvous has a fixed number of nodes")
    nproc = _nproc(args.nproc_per_node)
    host, port = _rendezvous(args, nnodes)
    join_timeout, last_call = _rdzv_conf(args.rdzv_conf)
    target = ([] if args.no_python else [sys.executable, "-m", "flambeau.distributed._worker"]) \
        + (["-m"] if args.module else []) + [args.training_script] + list(args.training_script_args)
    launch_id = os.environ.get(LAUNCH_ID_VAR) or uuid.uuid4().hex
    previous = {sig: signal.signal(sig, raise_stopped) for sig in STOP_SIGNALS}
    try:
        if nnodes > 1:
            path = mpiexec_path()
            mpi = MpiLauncher(path, _is_open_mpi(path))
            if min_nodes < nnodes:
                run_elastic(args, nproc, min_nodes, nnodes, host, port, args.rdzv_id or "none", mpi, target,
                            launch_id, join_timeout, last_call)
            else:
                run_nodes(args, nproc, nnodes, host, port, args.rdzv_id or "none", mpi, target, launch_id,
                          join_timeout)
        else:
            _attempts(args, nproc, host, port, args.rdzv_id or uuid.uuid4().hex[:8], target, launch_id)
    except Stopped as e:
        print(f"flambeau.distributed.run: stopped by {e}; the workers were stopped", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _attempts(args, nproc: int, host: str, port: int, run_id: str, target: list, launch_id: str) -> None:
    rc = 1
    for attempt in range(args.max_restarts + 1):
        folder = tempfile.mkdtemp(prefix="flambeau_run_")
        env = dict(os.environ, MASTER_ADDR=host, MASTER_PORT=str(port or free_port(host)),
                   WORLD_SIZE=str(nproc), GROUP_RANK=str(args.node_rank), GROUP_WORLD_SIZE="1",
                   TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT=str(attempt), ROLE_NAME=ROLE_NAME,
                   TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), FLAMBEAU_ERROR_DIR=folder,
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{LAUNCH_ID_VAR: launch_id})
        cmd = mpiexec_command(nproc) + target
        try:
            rc = _run_group(cmd, env, folder, args.monitor_interval)
            if rc == 0:
                return
            print(summary(args.training_script, read_failures(folder), rc, attempt), file=sys.stderr, flush=True)
        finally:
            remove_shared_memory(folder)
            shutil.rmtree(folder, ignore_errors=True)
        if attempt < args.max_restarts:
            print(f"flambeau.distributed.run: restarting the workers ({attempt + 1}/{args.max_restarts})",
                  file=sys.stderr, flush=True)
    raise SystemExit(rc if rc > 0 else 1)


if __name__ == "__main__":
    main()
