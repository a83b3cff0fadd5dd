"""`python -m flambeau.distributed.run` (torchrun's interface on mpiexec): environment, failures, restarts.

Each launch is bounded (tests/dist_helpers.RUN_TIMEOUT_S); a failing worker must stop the group well
within it, so a hang fails the test instead of stalling CI.
"""
from __future__ import annotations

import json
import os
import time

import pytest

from tests.dist_helpers import launch

STOPPED_WITHIN_S = 90          # a failed group must be stopped long before the launch timeout


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


def test_launcher_help_and_bad_arguments():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "flambeau.distributed.run", "--help"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0 and "--nproc-per-node" in p.stdout and "--max-restarts" in p.stdout
