"""The CPU collective engine: MPI (MPICH from PyPI's `mpich` wheel) through mpi4py.

Why MPI: it is the established CPU collective library that installs from the package registry as a wheel
(`pip install mpi4py mpich`, no compiler, no system package), with nonblocking versions of every
collective PyTorch names (so `async_op=True` returns a real request), tuned algorithms per message size,
and a launcher (`mpiexec`, Hydra) that starts the processes and kills the job when one dies. Gloo
itself has no maintained Python wheel outside PyTorch. MPICH's processes must be started together by
`mpiexec` (its singleton connect/accept is broken in MPICH 5.0.x, pmodels/mpich#7805), so
`flambeau.distributed.run` launches workers through `mpiexec`.

This module knows host NumPy arrays and MPI, nothing of tensors: `MPIBackend` is one communicator
and its collectives; every call starts the nonblocking MPI operation and returns a `Request`.
Reductions run in the array's own dtype: MPICH reduces float16 natively; bfloat16 (no MPI type)
is reduced by user-defined MPI operations on ml_dtypes arrays; bool reduces as uint8 (SUM is OR,
PRODUCT is AND, as PyTorch's).

Waiting: MPI makes progress only inside its calls, and MPICH waits by busy polling. When this host runs more
ranks of the job than it has cores (4 ranks on 2 cores), a polling rank holds a core that a rank with work
needs until the scheduler preempts it, and each collective round costs a time slice (8 ms per 4 KiB
all_reduce measured at 4 ranks on 2 cores, 1.3 ms with sleeping waits). So, as Open MPI yields when idle
once it finds itself oversubscribed, a waiting rank of an oversubscribed host sleeps `OVERSUBSCRIBED_POLL_S`
between tests (`Request.idle_sleep_s`); otherwise it polls.
"""
from __future__ import annotations

import os
import time

import numpy as np

from mpi4py import MPI

import ml_dtypes

from ._processes import record_shared_memory
from .store import DistBackendError

_BOOL_OPS = {"SUM": "MAX", "MAX": "MAX", "BOR": "MAX", "PRODUCT": "MIN", "MIN": "MIN", "BAND": "MIN",
             "BXOR": "BXOR"}
_MPI_OPS = {"SUM": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN, "MAX": MPI.MAX, "BAND": MPI.BAND,
            "BOR": MPI.BOR, "BXOR": MPI.BXOR}
_NATIVE = {np.dtype(np.int8): MPI.INT8_T, np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.int16): MPI.INT16_T,
           np.dtype(np.uint16): MPI.UINT16_T, np.dtype(np.int32): MPI.INT32_T, np.dtype(np.uint32): MPI.UINT32_T,
           np.dtype(np.int64): MPI.INT64_T, np.dtype(np.uint64): MPI.UINT64_T, np.dtype(np.float16): MPI.FLOAT16_T,
           np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
           np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX, np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
           np.dtype(np.bool_): MPI.UINT8_T}
_BF16 = np.dtype(ml_dtypes.bfloat16)
_NUMPY_REDUCE = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}
OVERSUBSCRIBED_POLL_S = 2e-5      # a waiting rank's sleep between tests while the host is oversubscribed
_opaque_types: dict = {}
_idle_sleep = [0.0]               # OVERSUBSCRIBED_POLL_S once world_backend found more ranks here than cores
_bf16_ops: dict = {}


def _opaque(itemsize: int):
    """A committed MPI type of `itemsize` bytes, for dtypes MPI has no name for (bfloat16, float8)."""
    if itemsize not in _opaque_types:
        _opaque_types[itemsize] = MPI.BYTE.Create_contiguous(itemsize).Commit()
    return _opaque_types[itemsize]


def _mpi_type(dtype: np.dtype):
    return _NATIVE.get(dtype) or _opaque(dtype.itemsize)


def _bf16_op(name: str):
    """A user-defined MPI reduction over bfloat16 arrays (computed by NumPy with ml_dtypes)."""
    if name not in _bf16_ops:
        combine = _NUMPY_REDUCE[name]

        def bfloat16_reduction(inbuf, outbuf, datatype):
            a = np.frombuffer(inbuf, dtype=_BF16)
            b = np.frombuffer(outbuf, dtype=_BF16)
            b[...] = combine(a, b)
        bfloat16_reduction.__name__ = f"bfloat16_{name.lower()}"
        _bf16_ops[name] = MPI.Op.Create(bfloat16_reduction, commute=True)
    return _bf16_ops[name]


def mpi_op(op_name: str, dtype: np.dtype):
    """The MPI operation reducing `dtype` arrays as PyTorch's ReduceOp `op_name` does."""
    if dtype == np.bool_:
        return _MPI_OPS[_BOOL_OPS[op_name]]
    if dtype == _BF16:
        if op_name not in _NUMPY_REDUCE:
            raise RuntimeError(f"ReduceOp.{op_name} is not defined for bfloat16 tensors")
        return _bf16_op(op_name)
    if dtype not in _NATIVE:
        raise RuntimeError(f"reductions are not supported for dtype {dtype} by the MPI backend")
    if dtype.kind == "c" and op_name in ("MIN", "MAX"):
        raise RuntimeError(f"ReduceOp.{op_name} is not supported for complex tensors")
    if dtype.kind == "f" and op_name in ("BAND", "BOR", "BXOR"):
        raise RuntimeError(f"ReduceOp.{op_name} is not supported for floating point tensors")
    return _MPI_OPS[op_name]


def _buf(arr: np.ndarray, count: int | None = None):
    """mpi4py's [buffer, count, type] for a contiguous array (as bytes, so any dtype passes)."""
    n = arr.size if count is None else count
    return [arr.reshape(-1).view(np.uint8), n, _mpi_type(arr.dtype)]


def _vbuf(arr: np.ndarray, counts: list):
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    return [arr.reshape(-1).view(np.uint8), (list(counts), displs), _mpi_type(arr.dtype)]


class Request:
    """Started MPI requests; `wait()` completes them, `test()` asks without blocking. `idle_sleep_s` > 0:
    the host is oversubscribed and a waiter should sleep that long between tests (`wait` does)."""

    def __init__(self, requests: list, status: MPI.Status | None = None) -> None:
        self.requests, self.status, self.done = requests, status, not requests
        self.idle_sleep_s = _idle_sleep[0]

    def wait(self) -> None:
        if not self.done:
            try:
                if self.idle_sleep_s:
                    while not self.test():
                        time.sleep(self.idle_sleep_s)
                elif self.status is not None:
                    self.requests[0].Wait(self.status)
                else:
                    MPI.Request.Waitall(self.requests)
            except MPI.Exception as e:
                raise DistBackendError(f"MPI: {e}") from None
            self.done = True

    def test(self) -> bool:
        if not self.done:
            if self.status is not None:
                self.done = self.requests[0].Test(self.status)
            else:
                self.done = MPI.Request.Testall(self.requests)
        return self.done


class MPIBackend:
    """One MPI communicator: collectives over contiguous host arrays, each returning a `Request`."""

    def __init__(self, comm: MPI.Comm, name: str = "gloo") -> None:
        self.comm, self.name = comm, name

    def rank(self) -> int:
        return self.comm.Get_rank()

    def size(self) -> int:
        return self.comm.Get_size()

    def split(self, ranks: list) -> "MPIBackend | None":
        """A communicator of `ranks` (this communicator's ranks, in that order); every rank calls it."""
        me = self.rank()
        color = 0 if me in ranks else MPI.UNDEFINED
        comm = self.comm.Split(color, ranks.index(me) if me in ranks else 0)
        return None if comm == MPI.COMM_NULL else MPIBackend(comm, self.name)

    def all_reduce(self, buf: np.ndarray, op_name: str) -> Request:
        return Request([self.comm.Iallreduce(MPI.IN_PLACE, _buf(buf), mpi_op(op_name, buf.dtype))])

    def broadcast(self, buf: np.ndarray, root: int) -> Request:
        return Request([self.comm.Ibcast(_buf(buf), root)])

    def reduce(self, buf: np.ndarray, op_name: str, root: int) -> Request:
        op = mpi_op(op_name, buf.dtype)
        if self.rank() == root:
            return Request([self.comm.Ireduce(MPI.IN_PLACE, _buf(buf), op, root)])
        return Request([self.comm.Ireduce(_buf(buf), None, op, root)])

    def all_gather(self, send: np.ndarray, recv: np.ndarray, counts: list) -> Request:
        return Request([self.comm.Iallgatherv(_buf(send), _vbuf(recv, counts))])

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list, op_name: str) -> Request:
        return Request([self.comm.Ireduce_scatter(_buf(send), _buf(recv), list(counts),
                                                  mpi_op(op_name, send.dtype))])

    def all_to_all(self, send: np.ndarray, send_counts: list, recv: np.ndarray, recv_counts: list) -> Request:
        return Request([self.comm.Ialltoallv(_vbuf(send, send_counts), _vbuf(recv, recv_counts))])

    def gather(self, send: np.ndarray, recv: np.ndarray | None, counts: list, root: int) -> Request:
        return Request([self.comm.Igatherv(_buf(send), _vbuf(recv, counts) if recv is not None else None, root)])

    def scatter(self, send: np.ndarray | None, counts: list, recv: np.ndarray, root: int) -> Request:
        return Request([self.comm.Iscatterv(_vbuf(send, counts) if send is not None else None, _buf(recv), root)])

    def send(self, buf: np.ndarray, dst: int, tag: int) -> Request:
        return Request([self.comm.Isend(_buf(buf), dst, tag)])

    def recv(self, buf: np.ndarray, src: int | None, tag: int) -> Request:
        source = MPI.ANY_SOURCE if src is None else src
        return Request([self.comm.Irecv(_buf(buf), source, tag)], status=MPI.Status())

    def barrier(self) -> Request:
        return Request([self.comm.Ibarrier()])

    def all_gather_object(self, obj) -> list:
        return self.comm.allgather(obj)

    def broadcast_object(self, obj, root: int):
        return self.comm.bcast(obj, root)

    def gather_object(self, obj, root: int) -> list | None:
        return self.comm.gather(obj, root)

    def scatter_object(self, objs: list | None, root: int):
        return self.comm.scatter(objs, root)

    def free(self) -> None:
        if self.comm not in (MPI.COMM_WORLD, MPI.COMM_SELF):
            self.comm.Free()


def _host_ranks(world: MPI.Comm) -> int:
    """How many ranks of `world` run on this host (a collective call): the ranks with this host's name.
    (Not MPI's shared-memory split: under Open MPI it waits for ever when two of its "nodes" are one host,
    as a multi-node launch tested on one machine has them.)"""
    name = MPI.Get_processor_name()
    return world.allgather(name).count(name)


def world_backend(name: str, rank: int, world_size: int) -> MPIBackend:
    """The communicator of this job, its ranks numbered as the rendezvous numbered them."""
    record_shared_memory()         # MPI is up: its segments exist (the launcher removes them after the job)
    world = MPI.COMM_WORLD
    if world_size == 1:
        return MPIBackend(MPI.COMM_SELF.Dup(), name)
    if world.Get_size() != world_size:
        raise RuntimeError(
            f"init_process_group(backend={name!r}): world_size={world_size} but MPI started "
            f"{world.Get_size()} process(es). flambeau's CPU backend runs on MPI (MPICH), whose processes are "
            "started together by mpiexec: launch with `python -m flambeau.distributed.run --nproc-per-node "
            f"{world_size} script.py` (it runs mpiexec underneath) or `mpiexec -n {world_size} python script.py`.")
    comm = world.Split(0, rank)
    _idle_sleep[0] = OVERSUBSCRIBED_POLL_S if _host_ranks(world) > len(os.sched_getaffinity(0)) else 0.0
    ranks = comm.allgather(rank)
    if ranks != list(range(world_size)):
        comm.Free()
        raise ValueError(f"init_process_group: the ranks given to the {world_size} processes are {ranks}; each "
                         f"process needs a distinct rank in [0, {world_size})")
    return MPIBackend(comm, name)
