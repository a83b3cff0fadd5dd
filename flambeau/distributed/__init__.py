"""torch.distributed: importable, and honest that it cannot run yet.

Collectives and process groups arrive with the distributed issue. Until then `is_available()`
answers False, `is_initialized()` False, and every call that needs the default process group
(`get_rank`, `get_world_size`, `barrier`, `all_reduce`, ...) raises the ValueError PyTorch raises
before `init_process_group`; `init_process_group` itself raises a RuntimeError that says so.
Single-process scripts that guard their DDP setup (`if ddp: init_process_group(...)`, nanoGPT's
pattern) import and run unchanged. The enums (`ReduceOp`, `Backend`) are plain constants.
"""
from __future__ import annotations

import enum
import os

NO_GROUP = ("Default process group has not been initialized, please make sure to call init_process_group.")
NOT_BUILT = ("{}: flambeau.distributed has no process groups yet (flambeau.distributed.is_available() is "
             "False): multi-process training is not implemented. Run the script as a single process "
             "(without torchrun / without setting RANK and WORLD_SIZE).")

__all__ = ["is_available", "is_initialized", "is_nccl_available", "is_gloo_available", "is_mpi_available",
           "is_torchelastic_launched", "init_process_group", "destroy_process_group", "get_rank",
           "get_world_size", "get_backend", "get_default_backend_for_device", "barrier", "all_reduce",
           "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
           "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "send", "recv", "new_group",
           "get_process_group_ranks", "monitored_barrier", "ReduceOp", "Backend"]


class ReduceOp(enum.Enum):
    """The reductions a collective applies (names as PyTorch's `ReduceOp`)."""
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8


class Backend(str):
    """Backend names as PyTorch spells them (`Backend("GLOO") == "gloo"`)."""
    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    UCC = "ucc"
    XCCL = "xccl"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, but got: {type(name)}")
        return super().__new__(cls, name.lower())


_DEFAULT_BACKEND = {"cpu": Backend.GLOO, "cuda": Backend.NCCL}


def is_available() -> bool:
    """False: this build of flambeau has no distributed package yet."""
    return False


def is_initialized() -> bool:
    """Whether the default process group exists (never, until init_process_group works)."""
    return False


def is_nccl_available() -> bool:
    return False


def is_gloo_available() -> bool:
    return False


def is_mpi_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    """Whether this process was started by torchrun (it sets TORCHELASTIC_RUN_ID), as PyTorch checks."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_default_backend_for_device(device) -> str:
    """The backend PyTorch pairs with a device type: "gloo" for cpu, "nccl" for cuda."""
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    kind = str(kind).split(":")[0]
    if kind not in _DEFAULT_BACKEND:
        raise ValueError(f"Default backend not registered for device : {kind}")
    return _DEFAULT_BACKEND[kind]


def init_process_group(backend=None, init_method=None, timeout=None, world_size: int = -1, rank: int = -1,
                       store=None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """Raises RuntimeError: there are no process groups to create yet."""
    raise RuntimeError(NOT_BUILT.format("init_process_group"))


def destroy_process_group(group=None) -> None:
    """As PyTorch with no process group: AssertionError."""
    raise AssertionError("Process group cannot be None")


def _needs_group(name: str):
    """A collective that needs the default process group: raises PyTorch's ValueError."""
    def collective(*args, **kwargs):
        raise ValueError(NO_GROUP)
    collective.__name__ = collective.__qualname__ = name
    return collective


def get_rank(group=None) -> int:
    """Raises ValueError, as PyTorch's does before init_process_group."""
    raise ValueError(NO_GROUP)


def get_world_size(group=None) -> int:
    """Raises ValueError, as PyTorch's does before init_process_group."""
    raise ValueError(NO_GROUP)


get_backend = _needs_group("get_backend")
barrier = _needs_group("barrier")
monitored_barrier = _needs_group("monitored_barrier")
all_reduce = _needs_group("all_reduce")
all_gather = _needs_group("all_gather")
all_gather_into_tensor = _needs_group("all_gather_into_tensor")
broadcast = _needs_group("broadcast")
reduce = _needs_group("reduce")
gather = _needs_group("gather")
scatter = _needs_group("scatter")
reduce_scatter = _needs_group("reduce_scatter")
reduce_scatter_tensor = _needs_group("reduce_scatter_tensor")
all_to_all = _needs_group("all_to_all")
send = _needs_group("send")
recv = _needs_group("recv")
new_group = _needs_group("new_group")
get_process_group_ranks = _needs_group("get_process_group_ranks")
