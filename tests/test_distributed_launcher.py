"""`python -m flambeau.distributed.run` (torchrun's interface on mpiexec): environment, failures, restarts.

Each launch is bounded (tests/dist_helpers.RUN_TIMEOUT_S); a failing worker must stop the group well
within it, so a hang fails the test instead of stalling CI.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from flambeau.distributed.run import LAUNCH_ID_VAR, process_tree
from tests.dist_helpers import ROOT, WORKERS, launch

STOPPED_WITHIN_S = 90          # a failed group must be stopped long before the launch timeout
HANG_TIMEOUT_S = 40            # the launch timeout of the hung group (long enough for 2 workers to start)
FROZEN_AT_LEAST = 10000       # objects of flambeau's import the worker freezes before the script (~57k)
GONE_WITHIN_S = 15             # after the kill, how long the group's processes may take to disappear


def test_environment_traceback_and_restart(tmp_path):
    rc, so, se = launch("launcher.py", 3, "env", str(tmp_path), "extra", extra=("--max-restarts", "1"))
    assert rc == 0, se
    assert "Root Cause (first observed failure)" in se and "rank: 1" in se
    assert "ValueError: rank 1 fails on attempt 0" in se and "restarting the workers (1/1)" in se
    records = [json.load(open(tmp_path / f"env{r}.json")) for r in range(3)]
    ports = {rec["MASTER_PORT"] for rec in records}
    run_ids = {rec["TORCHELASTIC_RUN_ID"] for rec in records}
    assert len(ports) == 1 and len(run_ids) == 1
    for r, rec in enumerate(records):
        assert rec["RANK"] == rec["LOCAL_RANK"] == str(r) and rec["rank"] == r
        assert rec["WORLD_SIZE"] == rec["LOCAL_WORLD_SIZE"] == "3" and rec["world"] == 3
        assert rec["MASTER_ADDR"] == "127.0.0.1" and rec["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert rec["TORCHELASTIC_MAX_RESTARTS"] == "1" and rec["launched"] is True
        assert rec["torch"] == "flambeau" and rec["args"] == ["extra"]
        assert rec["frozen"] > FROZEN_AT_LEAST and rec["collected"] >= 1   # flambeau's import frozen, not the script's


@pytest.mark.parametrize("mode,message", [("kill", "killed by a signal"),
                                          ("raise", "KeyError: 'rank 0 raised on purpose'"),
                                          ("monitored", "Ranks 1 failed to pass monitoredBarrier")])
def test_a_failing_worker_stops_the_group(tmp_path, mode, message):
    start = time.monotonic()
    rc, so, se = launch("launcher.py", 2, mode, str(tmp_path))
    assert rc != 0
    assert time.monotonic() - start < STOPPED_WITHIN_S
    assert "FAILED" in se and message in se, se
    if mode == "raise":
        assert "[rank0]: Traceback" in se and "rank: 0" in se
    mapped = [path for r in range(2) for path in (tmp_path / f"shm{r}.txt").read_text().split()]
    assert mapped, "the workers mapped no shared memory (MPICH's intranode transport uses it)"
    assert [path for path in mapped if os.path.exists(path)] == [], "a failed job left MPI's shared memory behind"


def test_launcher_help_and_bad_arguments():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "flambeau.distributed.run", "--help"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0 and "--nproc-per-node" in p.stdout and "--max-restarts" in p.stdout


def _survivors(launch_id: str) -> list:
    """Live (not zombie) processes carrying the launch id, after up to GONE_WITHIN_S for them to go."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        alive = []
        for pid in process_tree(None, launch_id):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def test_a_hung_rank_is_killed_with_its_whole_group_on_timeout(tmp_path):
    pytest.importorskip("mpi4py")
    launch_id = uuid.uuid4().hex
    with pytest.raises(subprocess.TimeoutExpired):
        launch("launcher.py", 2, "hang", str(tmp_path), timeout=HANG_TIMEOUT_S, launch_id=launch_id)
    assert (tmp_path / "started0").exists() and (tmp_path / "started1").exists(), "the workers never started"
    assert _survivors(launch_id) == []


def test_the_launcher_stops_its_group_when_terminated(tmp_path):
    pytest.importorskip("mpi4py")
    launch_id = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **{LAUNCH_ID_VAR: launch_id})
    cmd = [sys.executable, "-m", "flambeau.distributed.run", "--nproc-per-node", "2",
           os.path.join(WORKERS, "launcher.py"), "hang", str(tmp_path)]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as p:
        try:
            deadline = time.monotonic() + HANG_TIMEOUT_S
            while not ((tmp_path / "started0").exists() and (tmp_path / "started1").exists()):
                assert time.monotonic() < deadline and p.poll() is None, "the workers never started"
                time.sleep(0.2)
            p.send_signal(signal.SIGTERM)                       # what `timeout` or a CI runner sends
            _, se = p.communicate(timeout=GONE_WITHIN_S + 10)
            assert p.returncode != 0 and "stopped by SIGTERM" in se, se
            assert _survivors(launch_id) == []
        finally:
            from flambeau.distributed.run import kill_tree
            kill_tree(p.pid if p.poll() is None else None, launch_id, 1.0)


@pytest.mark.parametrize("version, dialect", [
    ("HYDRA build details:\n    Version:                                 4.3.0", ["-launcher", "fork"]),
    ("mpiexec (Open MPI) 4.1.5\n\nReport bugs to https://www.open-mpi.org/community/help/",
     ["--oversubscribe", "--bind-to", "none"]),
])
def test_mpiexec_command_speaks_the_dialect_of_the_mpi_found(tmp_path, monkeypatch, version, dialect):
    # A system Open MPI's mpiexec refuses Hydra's -launcher (the GPU machine's /usr/bin/mpiexec did).
    from flambeau.distributed import run
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\ncat <<'END'\n" + version + "\nEND\n")
    fake.chmod(0o755)
    monkeypatch.setattr(run, "mpiexec_path", lambda: str(fake))
    cmd = run.mpiexec_command(3)
    assert cmd[:3] == [str(fake), "-n", "3"] and cmd[3:3 + len(dialect)] == dialect
    other = ["--oversubscribe"] if dialect[0] == "-launcher" else ["-launcher"]
    assert not set(other) & set(cmd)


def test_worker_reads_open_mpi_ranks(monkeypatch):
    from flambeau.distributed import _worker
    for name in ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_worker.os, "environ", dict(_worker.os.environ, OMPI_COMM_WORLD_RANK="2",
                                                    OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="0",
                                                    OMPI_COMM_WORLD_LOCAL_SIZE="2"))
    assert _worker._set_env() == 2
    env = _worker.os.environ
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "4", "0", "2")


def test_store_port_is_drawn_below_the_ephemeral_range_and_bindable():
    """The launcher's store port is a bindable one below the kernel's ephemeral range (a port there can be
    handed to a connecting socket between the pick and the store's bind: "Address already in use" under
    many concurrent launches)."""
    import socket

    from flambeau.distributed._multinode import _ephemeral_low, free_port
    ports = {free_port("localhost") for _ in range(20)}
    assert all(1024 <= p < _ephemeral_low() for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
