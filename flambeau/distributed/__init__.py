"""torch.distributed: stores, process groups, collectives, and the launcher (`python -m flambeau.distributed.run`).

Layout: `store.py` (HashStore, FileStore, PrefixStore, TCPStore; its asyncio/uvloop server in
`_tcp_server.py`), `rendezvous.py` (env:// tcp:// file://), `distributed_c10d.py` (process groups, Work,
the backend registry), `collectives.py` (collectives on tensors), `_mpi_backend.py` (the CPU engine: MPI
through mpi4py, behind backend="gloo" and "mpi"), `_nccl_backend.py` (the cuda engine: NCCL through CuPy,
backend="nccl"), `run.py` (the launcher, mpiexec underneath).
The CPU engine needs the `distributed` extra (`pip install flambeau[distributed]`: mpi4py, mpich, uvloop).
"""
from __future__ import annotations

import importlib.util
import os

from ._nccl_backend import is_available as _nccl_is_available
from .collectives import *  # noqa: F401,F403
from .collectives import __all__ as _collectives_all
from .distributed_c10d import *  # noqa: F401,F403
from .distributed_c10d import __all__ as _c10d_all
from .distributed_c10d import _DEFAULT_BACKEND, group  # noqa: F401
from .rendezvous import register_rendezvous_handler, rendezvous  # noqa: F401
from .store import (DistBackendError, DistError, DistNetworkError, DistStoreError, FileStore,  # noqa: F401
                    HashStore, PrefixStore, Store, TCPStore, default_pg_timeout)

__all__ = sorted(set(_collectives_all) | set(_c10d_all) | {
    "is_available", "is_nccl_available", "is_gloo_available", "is_mpi_available", "is_torchelastic_launched",
    "get_default_backend_for_device", "Store", "HashStore", "FileStore", "PrefixStore", "TCPStore", "DistError",
    "DistStoreError", "DistNetworkError", "DistBackendError", "default_pg_timeout", "rendezvous", "group"})


def is_available() -> bool:
    """True: the whole package exists (stores, process groups, collectives, functional collectives, DDP,
    DeviceMesh/DTensor, FSDP2, tensor parallel, pipelining, checkpoint, the launcher).

    Libraries read True as the promise of the whole package and import its submodules at import time
    (transformers: `distributed._functional_collectives`, `distributed.tensor`, `checkpoint`, `fsdp`)."""
    return True


def is_gloo_available() -> bool:
    """Whether backend "gloo" can run here: it runs on MPI, so whether mpi4py is installed."""
    return importlib.util.find_spec("mpi4py") is not None


def is_mpi_available() -> bool:
    return is_gloo_available()


def is_nccl_available() -> bool:
    """Whether backend "nccl" can run here: CuPy with its NCCL bindings and libnccl."""
    return _nccl_is_available()


def is_torchelastic_launched() -> bool:
    """Whether this process was started by a launcher that sets TORCHELASTIC_RUN_ID (torchrun, ours)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_default_backend_for_device(device) -> str:
    """The backend PyTorch pairs with a device type: "gloo" for cpu, "nccl" for cuda."""
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    kind = str(kind).split(":")[0]
    if kind not in _DEFAULT_BACKEND:
        raise ValueError(f"Default backend not registered for device : {kind}")
    return _DEFAULT_BACKEND[kind]
