"""Process groups and collectives on tensors (PyTorch's `torch.distributed.distributed_c10d`).

`init_process_group` meets the other processes through a store (env://, tcp://, file:// or a given
store), then asks the registered backend factory for the collective engine of each device type
(`Backend.register_backend`; "gloo" and "mpi" give `_mpi_backend.MPIBackend`, "nccl" gives
`_nccl_backend.NCCLBackend`; "cpu:gloo,cuda:nccl" gives both, chosen per tensor by its device).
Collectives here turn tensors into contiguous buffers of their engine (host arrays for MPI, the tensor's
own memory when it is a contiguous CPU tensor; CuPy arrays on the tensor's device for NCCL), start the
engine's nonblocking operation and return a `Work` (`async_op=True`) or wait for it (on NCCL the wait
is the current stream's, not the host's). Ranks given to
collectives (src, dst, peer) are global ranks, as in PyTorch; `group_src`/`group_dst` are group ranks.
"""
from __future__ import annotations

import datetime
import enum
import os
import time

import numpy as np

from .. import _backends, _pending_grads, _state, cuda
from .._device import device as Device
from .._ops.creation import from_numpy
from .._tensor import Tensor
from ..futures import Future
from ._nccl_backend import make_nccl_backend
from .rendezvous import rendezvous
from .store import DistBackendError, PrefixStore, Store, default_pg_timeout

SPIN_TESTS = 200               # a waiting collective first polls this many times without sleeping,
MAX_POLL_SLEEP_S = 1e-3        # then sleeps between polls, doubling up to this
MIN_POLL_SLEEP_S = 1e-5

__all__ = ["ReduceOp", "Backend", "ProcessGroup", "ProcessGroupNCCL", "GroupMember", "Work", "init_process_group",
           "destroy_process_group", "new_group", "is_initialized", "get_rank", "get_world_size", "get_backend",
           "get_process_group_ranks", "get_global_rank", "get_group_rank"]


class RedOpType(enum.Enum):
    """The reduction kinds (PyTorch's `ReduceOp.RedOpType`)."""
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8


class ReduceOp:
    """The reductions a collective applies: `ReduceOp.SUM`, ... as PyTorch's."""
    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM


REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


def _mpi():
    """The MPI engine module. Importing it initializes MPI (mpi4py does at import), which waits for every
    rank while holding the GIL: it must happen before this process hosts the TCPStore that other ranks are
    still connecting to, and never at `import flambeau`."""
    from . import _mpi_backend  # deferred: optional dependency (mpi4py) that initializes MPI on import
    return _mpi_backend


def _mpi_factory(name):
    def make_mpi_backend(store, rank: int, world_size: int, timeout):
        return _mpi().world_backend(name, rank, world_size)
    make_mpi_backend.__name__ = f"make_{name}_backend"
    return make_mpi_backend


class Backend(str):
    """Backend names as PyTorch spells them (`Backend("GLOO") == "gloo"`), and their registry."""
    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    UCC = "ucc"
    XCCL = "xccl"
    _factories: dict = {"gloo": _mpi_factory("gloo"), "mpi": _mpi_factory("mpi"), "nccl": make_nccl_backend}

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, but got: {type(name)}")
        return super().__new__(cls, name.lower())

    @classmethod
    def register_backend(cls, name: str, func, extended_api: bool = False, devices=None) -> None:
        """`func(store, rank, world_size, timeout)` returns the engine for backend `name`."""
        cls._factories[name.lower()] = func
        setattr(cls, name.upper(), name.lower())


_DEFAULT_BACKEND = {"cpu": Backend.GLOO, "cuda": Backend.NCCL}


def _device_backends(backend: str) -> dict:
    """PyTorch's backend string as {device type: backend name}: "nccl" -> {"cuda": "nccl"},
    "cpu:gloo,cuda:nccl" -> both, "gloo"/"mpi" -> {"default": ...} (every device, staged through host)."""
    out = {}
    for part in Backend(backend).split(","):
        device, sep, name = part.strip().rpartition(":")
        if not sep:
            return {"cuda" if name == Backend.NCCL else "default": name}
        out[device] = name
    return out


class _NCCLConfig:
    """PyTorch's `ProcessGroupNCCL.NCCLConfig`: settings of the NCCL communicator, each NCCL's "undefined"
    until set. flambeau's communicator is CuPy's, made without a config: a group given one with a setting
    changed raises (NCCL's environment variables, NCCL_MAX_CTAS and the like, still act)."""
    UNDEFINED = -2 ** 31                # NCCL_CONFIG_UNDEF_INT
    FIELDS = ("blocking", "cga_cluster_size", "max_ctas", "min_ctas", "split_share")

    def __init__(self):
        for name in self.FIELDS:
            setattr(self, name, self.UNDEFINED)
        self.net_name = None

    def changed(self) -> list:
        return [n for n in self.FIELDS if getattr(self, n) != self.UNDEFINED] + \
            (["net_name"] if self.net_name is not None else [])


class _NCCLOptions:
    """PyTorch's `ProcessGroupNCCL.Options`, passed as `pg_options` to `init_process_group` / `new_group`:
    `is_high_priority_stream` puts the group's collectives on a stream of the device's greatest priority."""

    def __init__(self, is_high_priority_stream: bool = False):
        self.is_high_priority_stream = is_high_priority_stream
        self.config = _NCCLConfig()
        self.split_from = None
        self.split_color = 0
        self.global_ranks_in_group: list = []
        self.group_name = ""
        self._timeout = None            # init_process_group's timeout wins, as PyTorch's


class ProcessGroupNCCL:
    """The NCCL process group's options (`ProcessGroupNCCL.Options`, `.NCCLConfig`); groups themselves are
    made by `init_process_group(backend="nccl")` and `new_group`."""
    Options = _NCCLOptions
    NCCLConfig = _NCCLConfig

    def __init__(self, *args, **kwargs):
        raise RuntimeError("flambeau: make an NCCL process group with init_process_group(backend='nccl') or "
                           "new_group(...); ProcessGroupNCCL(store, rank, size, options) is not supported")


def _apply_pg_options(caller: str, pg_options, engines: dict) -> None:
    """`pg_options` acting on the engines it is for (`engines`: backend name -> engine, None where this
    process is not in the group): NCCL options set the stream priority; what cannot act raises."""
    if pg_options is None:
        return
    if not isinstance(pg_options, _NCCLOptions):
        raise TypeError(f"{caller}: pg_options of type {type(pg_options).__name__} is not supported; flambeau "
                        "takes ProcessGroupNCCL.Options for the 'nccl' backend")
    if "nccl" not in engines:
        raise ValueError(f"{caller}: pg_options is ProcessGroupNCCL.Options but the group's backends are "
                         f"{sorted(engines)}")
    changed = pg_options.config.changed()
    if changed:
        raise NotImplementedError(f"{caller}: ProcessGroupNCCL.Options.config sets {changed}: flambeau's NCCL "
                                  "communicator (CuPy's) is made without a config; use NCCL's environment "
                                  "variables (NCCL_MAX_CTAS, NCCL_MIN_CTAS, NCCL_CGA_CLUSTER_SIZE, ...) instead")
    if pg_options.split_from is not None:
        raise NotImplementedError(f"{caller}: ProcessGroupNCCL.Options.split_from is not supported by flambeau")
    if engines["nccl"] is not None:
        engines["nccl"].high_priority = bool(pg_options.is_high_priority_stream)


class ProcessGroup:
    """A set of ranks and the engines joining them; `rank()`/`size()` are this process's place in it.

    `engine` is the group's main engine (object collectives, barrier, `new_group`); `engines` maps a
    device type ("cpu", "cuda", or "default" for any) to the engine its tensors use. Compiled code treats a
    group as a constant of the trace (its name, ranks and this process's rank never change)."""
    _dynamo_trace_constant = True

    def __init__(self, engine, ranks: list, backend: str, store: Store | None, name: str, timeout,
                 engines: dict | None = None) -> None:
        self.engine, self.ranks, self.backend, self.store = engine, list(ranks), backend, store
        self.group_name, self.timeout = name, timeout
        self.engines = engines if engines is not None else {"default": engine}

    def engine_for(self, device_type: str):
        """The engine collectives on `device_type` tensors run on (PyTorch's error when there is none)."""
        engine = self.engines.get(device_type, self.engines.get("default"))
        if engine is None:
            raise RuntimeError(f"No backend type associated with device type {device_type}")
        return engine

    def rank(self) -> int:
        return self.engine.rank()

    def size(self) -> int:
        return self.engine.size()

    def name(self) -> str:
        return self.backend

    def _get_backend_name(self) -> str:
        return self.backend

    def __repr__(self) -> str:
        return f"ProcessGroup(name={self.group_name!r}, backend={self.backend!r}, ranks={self.ranks})"


class GroupMember:
    """`GroupMember.WORLD` (the default group once initialized) and `NON_GROUP_MEMBER`."""
    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = object()


group = GroupMember


class _World:
    """This process's groups: the default one and those `new_group` made."""
    default: ProcessGroup | None = None
    groups: list = []
    count = 0


def is_initialized() -> bool:
    return _World.default is not None


def _default() -> ProcessGroup:
    if _World.default is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return _World.default


def _group(group) -> ProcessGroup:
    return _default() if group is None else group


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


def _bind_device(device_id):
    """`init_process_group(device_id=...)` checked as PyTorch checks it (an int is a cuda index; an accelerator
    device needs an index in range). flambeau also makes a cuda `device_id` the current device: its eager ops run
    on the current device, and the process's collectives and model are meant to live on `device_id`
    (pytorch/examples' FSDP2 example binds its ranks this way and never calls set_device)."""
    if device_id is None:
        return None
    if isinstance(device_id, int):
        if not cuda.is_available():
            raise ValueError("device_id is an int, but no accelerator support is found from the current "
                             "compilation. Please use a different compiled version that supports your accelerator.")
        device_id = Device("cuda", device_id)
    device_id = device_id if isinstance(device_id, Device) else Device(device_id)
    if device_id.type == "cpu":
        return device_id
    if device_id.type != "cuda" or not cuda.is_available():
        raise ValueError(f"device_id {device_id} does not match the current compilation's accelerator support: "
                         f"{'cuda' if cuda.is_available() else None}. Please use the correct accelerator type.")
    if device_id.index is None:
        raise ValueError("Please use a device_id with index.")
    if device_id.index >= cuda.device_count():
        raise ValueError(f"device_id {device_id} is out of range. Please use a device index less than "
                         f"{cuda.device_count()}.")
    cuda.set_device(device_id.index)
    return device_id


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store: Store | None = None, group_name: str = "",
                       pg_options=None, device_id=None) -> None:
    """Join this process to the default group (PyTorch's signature and rendezvous rules)."""
    if _World.default is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    if store is not None and (world_size <= 0 or rank < 0):
        raise ValueError("world_size and rank must be given with store")
    device_id = _bind_device(device_id)
    if backend is None and device_id is not None:          # PyTorch: the backend of device_id's type
        backend = _DEFAULT_BACKEND.get(device_id.type)
    by_device = _device_backends(backend or Backend.GLOO)
    by_device = {d: ("gloo" if n.startswith("cpu") else n) for d, n in by_device.items()}
    missing = sorted(set(by_device.values()) - set(Backend._factories))
    if missing:
        raise RuntimeError(f"init_process_group: backend {missing[0]!r} is not available in flambeau (registered: "
                           f"{sorted(Backend._factories)})")
    names = list(dict.fromkeys(by_device.values()))
    timeout = default_pg_timeout if timeout is None else timeout
    if Backend.GLOO in names or Backend.MPI in names:
        _mpi()
    if store is None and names == [Backend.MPI] and init_method is None and "MASTER_ADDR" not in os.environ:
        world = _mpi().MPI.COMM_WORLD
        rank = world.Get_rank() if rank < 0 else rank
        world_size = world.Get_size() if world_size < 0 else world_size
    elif store is None:
        store, rank, world_size = rendezvous(init_method or "env://", rank, world_size, timeout)
    if store is not None:
        store.set_timeout(timeout)
        store = PrefixStore("default_pg", store)
    made = {n: Backend._factories[n](store, rank, world_size, timeout) for n in names}
    _apply_pg_options("init_process_group", pg_options, made)
    engines = {d: made[n] for d, n in by_device.items()}
    engine = engines.get("cpu", engines.get("default", made[names[0]]))
    label = names[0] if len(names) == 1 else Backend(backend)
    _World.default = GroupMember.WORLD = ProcessGroup(engine, list(range(world_size)), label, store,
                                                      group_name or "0", timeout, engines)
    _World.groups = [_World.default]


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Forget `group` (or every group, with the default); the processes may init again. Gradients DDP left
    pending (`flambeau._pending_grads`) are waited for first: their reductions run on these engines."""
    if _pending_grads.waits:
        _pending_grads.settle_all()
    if group is None or group is _World.default:
        if _World.default is None:
            raise AssertionError("Process group cannot be None")
        for g in _World.groups:
            _free_engines(g)
        _World.default = GroupMember.WORLD = None
        _World.groups = []
        return
    if group is not GroupMember.NON_GROUP_MEMBER:
        _free_engines(group)
        _World.groups.remove(group)


def _free_engines(g: ProcessGroup) -> None:
    for engine in {id(e): e for e in g.engines.values()}.values():
        engine.free()


def new_group(ranks: list | None = None, timeout=None, backend: str | None = None, pg_options=None,
              use_local_synchronization: bool = False, group_desc: str | None = None, device_id=None):
    """A group of `ranks` (global ranks); every process of the default group must call it."""
    world = _default()
    ranks = sorted(range(world.size()) if ranks is None else ranks)
    bad = [r for r in ranks if not 0 <= r < world.size()]
    if bad or len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group: ranks {ranks} must be distinct ranks of the world of size {world.size()}")
    split = {id(e): e.split(ranks) for e in world.engines.values()}
    _apply_pg_options("new_group", pg_options, {_engine_name(e): split[id(e)] for e in world.engines.values()})
    _World.count += 1
    engine = split[id(world.engine)]
    if engine is None:
        return GroupMember.NON_GROUP_MEMBER
    pg = ProcessGroup(engine, ranks, world.backend, world.store, str(_World.count),
                      world.timeout if timeout is None else timeout,
                      {d: split[id(e)] for d, e in world.engines.items()})
    _World.groups.append(pg)
    return pg


def _engine_name(engine) -> str:
    return "nccl" if getattr(engine, "device_type", None) == "cuda" else type(engine).__name__


def _member(group) -> bool:
    return group is not GroupMember.NON_GROUP_MEMBER


def get_rank(group=None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).rank()


def get_world_size(group=None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).size()


def get_backend(group=None) -> str:
    return _group(group).backend


def get_process_group_ranks(group) -> list:
    return list(_group(group).ranks)


def get_global_rank(group, group_rank: int) -> int:
    return _group(group).ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    g = _group(group)
    if global_rank not in g.ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {g}")
    return g.ranks.index(global_rank)


def _peer(g: ProcessGroup, global_rank, group_rank, what: str) -> int:
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError(f"{what}: pass either the global rank or the group rank, not both")
        return group_rank
    if global_rank is None:
        raise ValueError(f"{what}: a rank is required")
    return get_group_rank(g, global_rank)


# ---- tensors <-> host buffers ---------------------------------------------------------------------
def _check_tensor(t, what: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")


def _host(t) -> np.ndarray:
    """`t`'s data as a contiguous host array: its own memory for a contiguous CPU tensor, else a copy."""
    a = t._host()
    if t._device.type == "cpu" and a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.array(a, order="C", copy=True)


def _engine(g: ProcessGroup, t):
    return g.engine_for(t._device.type)


def _buf(engine, t):
    """`t`'s data as a contiguous buffer of `engine`: a host array (MPI) or an array on `t`'s device (NCCL)."""
    if getattr(engine, "device_type", "cpu") == "cpu":
        return _host(t)
    return engine.buffer(t)


def _xp(arr):
    """The array namespace of `arr` (NumPy, or CuPy for an NCCL buffer)."""
    return np if isinstance(arr, np.ndarray) else _backends.get("cuda").xp


def _write_back(t, arr) -> None:
    """Make `arr` the contents of `t` (nothing to copy when `arr` is `t`'s memory): a version bump."""
    if arr is t._data:
        t._version[0] += 1
        return
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False
    try:
        if isinstance(arr, np.ndarray):
            t.copy_(from_numpy(arr.reshape(tuple(t.shape))))
        else:
            t.copy_(Tensor._make(arr.reshape(tuple(t.shape)), t._device, t._dtype))
    finally:
        _state.tls.grad_enabled = prev


def _same_dtype(tensors: list, what: str) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"{what}: Invalid usage of tensors with different dtypes Found "
                         + " and ".join(sorted(str(d) for d in dtypes)))


def _op_name(op) -> str:
    name = getattr(op, "name", None) or str(op)
    name = name.split(".")[-1]
    if name not in REDUCE_OPS or name == "PREMUL_SUM":
        raise ValueError(f"unsupported ReduceOp {op!r}")
    return name


def _avg(arr: np.ndarray, n: int) -> None:
    """AVG = SUM / n in place; integers divide truncating toward zero (NCCL's integer average)."""
    if arr.dtype.kind in "iub":
        q = np.abs(arr) // n
        arr[...] = np.where(arr < 0, -q, q) if arr.dtype.kind == "i" else q
    else:
        arr /= np.asarray(n, dtype=arr.dtype)


class Work:
    """A started collective: `wait()`, `is_completed()`, `get_future()` (PyTorch's Work)."""

    def __init__(self, request, finish=None, result: list | None = None, timeout=None) -> None:
        self._request, self._finish, self._result = request, finish, result or []
        self._timeout, self._finished = timeout, False

    def _complete(self) -> None:
        if not self._finished:
            self._finished = True
            if self._finish is not None:
                self._finish()

    def wait(self, timeout=None) -> bool:
        limit = self._timeout if timeout is None else timeout
        if limit is None or getattr(self._request, "waits_on_device", False):
            self._request.wait()
        else:
            self._poll(_seconds(limit))
        self._complete()
        return True

    def _poll(self, limit: float) -> None:
        """Test the request until it completes, raising after `limit` seconds: SPIN_TESTS tests, then sleeps
        between tests growing to MAX_POLL_SLEEP_S. The engine's `idle_sleep_s` (> 0 when this host runs more
        ranks than it has cores) makes every failed test sleep that long at once, so the ranks with work get
        the cores (`_mpi_backend`'s docstring has the figures)."""
        idle = getattr(self._request, "idle_sleep_s", 0.0)
        deadline, sleep, spins = time.monotonic() + limit, 0.0, 0
        while not self._request.test():
            if time.monotonic() > deadline:
                raise DistBackendError(f"Work.wait: the collective did not complete within {limit} "
                                       "seconds (a peer may have died or issued collectives in another order)")
            spins += 1
            if idle:
                time.sleep(idle)
            elif spins > SPIN_TESTS:
                sleep = min(MAX_POLL_SLEEP_S, max(sleep * 2, MIN_POLL_SLEEP_S))
                time.sleep(sleep)

    def is_completed(self) -> bool:
        if self._request.test():
            self._complete()
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self):
        return None

    def result(self) -> list:
        return self._result

    def source_rank(self) -> int:
        status = self._request.status
        if status is None:
            raise RuntimeError("source_rank() is only available for a recv from any source")
        return status.Get_source()

    def get_future(self) -> Future:
        fut = Future()

        def wait_and_set() -> None:
            self.wait()
            fut.set_result(self._result)
        fut._waiter = wait_and_set
        return fut


def _run(g: ProcessGroup, request, finish, result: list, async_op: bool):
    work = Work(request, finish, result, None if async_op else g.timeout)
    if async_op:
        return work
    work.wait()
    return None
