"""One worker of `flambeau.distributed.run`: started by mpiexec, it sets torchrun's environment and runs
the script the way `python -m flambeau.run` does (so `import torch` scripts run on flambeau).

Environment set from mpiexec's (Hydra's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS, or Open MPI's
OMPI_COMM_WORLD_*): RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK. An uncaught exception writes `rank_<N>.json`
(message, traceback, time) into FLAMBEAU_ERROR_DIR for the launcher to report, prints the traceback,
and aborts the MPI job (if MPI was started) so no other rank waits forever in a collective.

Before the script runs, the objects alive in the worker (flambeau's import: its operator registry,
decompositions and modules, about 57k objects) are moved out of the cyclic garbage collector's reach
(`gc.freeze()`): they live as long as the process, and a full collection scanning them takes ~30-40 ms,
which in data-parallel training stalls every rank (the others wait for this one in the next collective).
The script's own objects are collected as usual.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

from ..run import main as run_script
from ._parent_death import die_with_parent

WORKER_EXIT_FAILURE = 1


def _mpi_env(hydra: str, open_mpi: str, default: str) -> str:
    """A value of mpiexec's environment under MPICH's Hydra name, else Open MPI's, else `default`."""
    return os.environ.get(hydra, os.environ.get(open_mpi, default))


def _set_env() -> int:
    rank = _mpi_env("PMI_RANK", "OMPI_COMM_WORLD_RANK", "0")
    size = _mpi_env("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "1")
    local_world = _mpi_env("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", size)
    os.environ.setdefault("WORLD_SIZE", size)
    os.environ.update(RANK=rank, LOCAL_RANK=_mpi_env("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", rank),
                      LOCAL_WORLD_SIZE=local_world, ROLE_RANK=rank, ROLE_WORLD_SIZE=os.environ["WORLD_SIZE"])
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
    die_with_parent()                  # Hydra's proxy gone (its launcher killed): this worker goes too
    rank = _set_env()
    gc.freeze()                        # flambeau's import-time objects: never garbage, costly to scan
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
