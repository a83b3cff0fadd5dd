"""Running a tests/dist_workers script under `python -m flambeau.distributed.run`, bounded in time."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "dist_workers")
RUN_TIMEOUT_S = 240           # one launch of 2-4 workers; a hang fails the test instead of stalling CI


def launch(script: str, nproc: int, *args: str, extra: tuple = (), timeout: float = RUN_TIMEOUT_S):
    """(returncode, stdout, stderr) of the launcher running `script` with `nproc` workers."""
    pytest.importorskip("mpi4py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "flambeau.distributed.run", "--nproc-per-node", str(nproc), *extra,
           os.path.join(WORKERS, script), *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr
