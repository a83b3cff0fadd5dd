"""Running a tests/dist_workers script under `python -m flambeau.distributed.run`, bounded in time.

Each launch carries a fresh FLAMBEAU_LAUNCH_ID; on a timeout the launcher and every process of its group
(found by parent links and by that id, since mpiexec, Hydra's proxy and the workers each run in their own
session) are killed before subprocess.TimeoutExpired is raised, so a hung rank never outlives its test.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from flambeau.distributed.run import LAUNCH_ID_VAR, kill_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "dist_workers")
RUN_TIMEOUT_S = 240           # one launch of 2-4 workers; a hang fails the test instead of stalling CI
KILL_GRACE_S = 2.0            # after a timeout, SIGTERM to the group, then SIGKILL after this


def launch(script: str, nproc: int, *args: str, extra: tuple = (), timeout: float = RUN_TIMEOUT_S,
           launch_id: str | None = None):
    """(returncode, stdout, stderr) of the launcher running `script` with `nproc` workers."""
    pytest.importorskip("mpi4py")
    launch_id = launch_id or uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", **{LAUNCH_ID_VAR: launch_id})
    cmd = [sys.executable, "-m", "flambeau.distributed.run", "--nproc-per-node", str(nproc), *extra,
           os.path.join(WORKERS, script), *args]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          start_new_session=True) as p:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid, launch_id, KILL_GRACE_S)
            so, se = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, so, se) from None
    return p.returncode, so, se
