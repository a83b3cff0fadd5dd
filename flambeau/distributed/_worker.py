"""One worker of `flambeau.distributed.run`: started by mpiexec, it sets torchrun's environment and runs
the script the way `python -m flambeau.run` does (so `import torch` scripts run on flambeau).

Environment set from mpiexec's (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS): RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK. An uncaught exception writes `rank_<N>.json`
(message, traceback, time) into FLAMBEAU_ERROR_DIR for the launcher to report, prints the traceback,
and aborts the MPI job (if MPI was started) so no other rank waits forever in a collective.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

from ..run import main as run_script

WORKER_EXIT_FAILURE = 1


def _set_env() -> int:
    rank = os.environ.get("PMI_RANK", "0")
    local_world = os.environ.get("MPI_LOCALNRANKS", os.environ.get("PMI_SIZE", "1"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
    os.environ.update(RANK=rank, LOCAL_RANK=os.environ.get("MPI_LOCALRANKID", rank), LOCAL_WORLD_SIZE=local_world,
                      ROLE_RANK=rank, ROLE_WORLD_SIZE=os.environ["WORLD_SIZE"])
    return int(rank)


def _report(rank: int, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
    sys.stderr.flush()
    folder = os.environ.get("FLAMBEAU_ERROR_DIR")
    if folder:
        record = {"rank": rank, "message": f"{type(exc).__name__}: {exc}", "traceback": text,
                  "timestamp": time.time(), "pid": os.getpid()}
        tmp = os.path.join(folder, f".rank_{rank}.json")
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(folder, f"rank_{rank}.json"))


def _abort_mpi() -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(WORKER_EXIT_FAILURE)


def main(argv: list) -> None:
    rank = _set_env()
    try:
        run_script(argv)
    except SystemExit as e:
        if e.code not in (None, 0):
            _report(rank, e)
            _abort_mpi()
        raise
    except BaseException as e:  # noqa: BLE001  any failure of the user's script is reported, then fatal
        _report(rank, e)
        _abort_mpi()
        raise SystemExit(WORKER_EXIT_FAILURE) from None


if __name__ == "__main__":
    main(sys.argv[1:])
