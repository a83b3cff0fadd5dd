"""The cuda collective engine: NCCL through CuPy's bindings (`cupy.cuda.nccl`, libnccl from the
`nvidia-nccl-cu13` wheel), behind backend "nccl" (and the cuda half of "cpu:gloo,cuda:nccl").

One `NCCLBackend` is one process group's engine; its NCCL communicator is made on first use, on the device
of the first cuda tensor it sees (one device per process, as PyTorch's). The NCCL unique id travels
through the process group's store: the group's rank 0 asks NCCL for one and sets it under a key every
rank derives the same way (the group's key and how many communicators this engine made), the others
read it (blocking, bounded by the store's timeout). So any init_method that gives a store works.

Every operation runs on the engine's own NCCL stream of the tensor's device (as PyTorch's ProcessGroupNCCL),
after the caller's current stream has reached it (an event recorded there, waited for by the NCCL stream;
no host synchronisation; one such event per device and thread, recorded again for each operation: a stream wait holds
the record it was given), so communication overlaps the computation the caller queues next. A CUDA event
recorded after it is the `DeviceRequest`: `wait()` makes the then-current stream wait on the event, `test()`
asks whether it has happened. The buffers of a request stay referenced until its event has happened (also
when the caller drops the request unwaited), so the memory pool cannot hand them to other work too early. Collectives NCCL lacks are NCCL group calls: uneven
all_gather as one broadcast per rank, uneven reduce_scatter as one reduce per rank, all_to_all, gather and
scatter as sends and receives. Reductions: SUM/AVG/PRODUCT/MIN/MAX natively (AVG is ncclAvg; integers
divide truncating); bool reduces as uint8 (SUM is MAX, PRODUCT is MIN, as PyTorch's); complex reduces
as its real pairs (SUM and AVG only). Object collectives (`all_gather_object`, ...) go through the store.

Keep NVLink multicast off where the machine says so (NCCL_NVLS_ENABLE=0): nothing here asks for it.
"""
from __future__ import annotations

import pickle
from threading import get_ident

from .. import _backends
from .store import DistBackendError

# ncclDataType_t and ncclRedOp_t (nccl.h); passed to CuPy as plain integers
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_UNIQUE_ID_BYTES = 128

_DTYPES = {"int8": NCCL_INT8, "uint8": NCCL_UINT8, "int32": NCCL_INT32, "uint32": NCCL_UINT32,
           "int64": NCCL_INT64, "uint64": NCCL_UINT64, "float16": NCCL_FLOAT16, "float32": NCCL_FLOAT32,
           "float64": NCCL_FLOAT64, "bfloat16": NCCL_BFLOAT16, "bool": NCCL_UINT8}
_COMPLEX_PARTS = {"complex64": "float32", "complex128": "float64"}
_OPS = {"SUM": NCCL_SUM, "AVG": NCCL_AVG, "PRODUCT": NCCL_PROD, "MIN": NCCL_MIN, "MAX": NCCL_MAX}
_BOOL_OPS = {"SUM": NCCL_MAX, "MAX": NCCL_MAX, "PRODUCT": NCCL_MIN, "MIN": NCCL_MIN}


def _cupy():
    """CuPy, the cuda backend's namespace (the one seam to it: tests without a GPU replace this function)."""
    return _backends.get("cuda").xp


def nccl_library():
    """CuPy's NCCL module, or a RuntimeError saying what is missing."""
    try:
        from cupy.cuda import nccl  # deferred: optional dependency, present only where cuda is used
    except ImportError as e:
        raise RuntimeError("backend 'nccl' needs CuPy with NCCL (pip install cupy-cuda13x nvidia-nccl-cu13)") from e
    if not getattr(nccl, "available", False):
        raise RuntimeError("backend 'nccl': CuPy was built without NCCL or libnccl was not found "
                           "(pip install nvidia-nccl-cu13)")
    return nccl


def is_available() -> bool:
    try:
        nccl_library()
    except RuntimeError:
        return False
    return True


def encode_unique_id(uid) -> bytes:
    """CuPy's unique id (bytes, or 128 signed chars as ints before CuPy 14) as bytes for the store."""
    if len(uid) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    return bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(b & 0xFF for b in uid)


def decode_unique_id(data: bytes) -> tuple:
    return tuple(b - 256 if b > 127 else b for b in data)


def _dtype_name(arr) -> str:
    name = str(arr.dtype)
    if name not in _DTYPES and name not in _COMPLEX_PARTS:
        raise RuntimeError(f"NCCL backend: unsupported dtype {name}")
    return name


def nccl_op(op_name: str, dtype_name: str) -> int:
    """The ncclRedOp_t reducing `dtype_name` arrays as PyTorch's ReduceOp `op_name` does on NCCL."""
    if op_name in ("BAND", "BOR", "BXOR", "PREMUL_SUM"):
        raise ValueError(f"Cannot use ReduceOp.{op_name} with NCCL")
    if dtype_name == "bool":
        if op_name not in _BOOL_OPS:
            raise ValueError(f"Cannot use ReduceOp.{op_name} with boolean inputs")
        return _BOOL_OPS[op_name]
    if dtype_name in _COMPLEX_PARTS and op_name not in ("SUM", "AVG"):
        raise ValueError(f"all_reduce does not support {op_name} on complex tensors")
    return _OPS[op_name]


class _Source:
    """What `Work.source_rank()` reads of a receive: its (known) peer."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def Get_source(self) -> int:  # noqa: N802  mpi4py's Status spelling, which Work reads
        return self.rank


class DeviceRequest:
    """Operations enqueued on a stream, completed by a CUDA event recorded after them.

    `wait()` makes the current stream wait on the event (the host goes on); `host_wait` requests
    (barrier) block the host instead. `keep` holds the buffers until the request is dropped."""
    waits_on_device = True

    def __init__(self, keep: tuple = (), source: int | None = None, host_wait: bool = False) -> None:
        self.event, self.keep, self.host_wait = None, keep, host_wait
        self.stream = None
        self.status = None if source is None else _Source(source)

    def record(self, cupy, stream) -> None:
        self.event = cupy.cuda.Event(disable_timing=True)
        self.event.record(stream)
        self.stream = stream

    def wait(self) -> None:
        if self.host_wait:
            self.event.synchronize()
        else:
            cupy = _cupy()
            cupy.cuda.get_current_stream().wait_event(self.event)

    def test(self) -> bool:
        return self.event.done


HIGHEST_STREAM_PRIORITY = -(1 << 20)     # below every device's priority range (H100's is 0 to -5)


class NCCLBackend:
    """One process group on NCCL: collectives over contiguous CuPy arrays, each returning a `DeviceRequest`."""
    device_type = "cuda"
    native_avg = True
    in_order_per_device = True     # one NCCL stream per device: its operations complete in the order issued

    def __init__(self, store, rank: int, world_size: int, timeout=None, key: str = "0", library=None) -> None:
        if store is None:
            raise RuntimeError("backend 'nccl' exchanges its unique id through the process group's store; "
                               "init_process_group with init_method (env://, tcp://, file://) or store=")
        self.store, self._rank, self._size, self.timeout, self.key = store, rank, world_size, timeout, key
        self._library, self.comm, self.device, self.made, self.splits, self.object_rounds = library, None, None, 0, 0, 0
        self._grouped: list | None = None
        self._streams: dict = {}          # device -> the NCCL stream of this engine
        self.high_priority = False        # ProcessGroupNCCL.Options.is_high_priority_stream (set before first use)
        self._ready: dict = {}            # (device, thread) -> the event each operation's stream wait is on
        self._inflight: list = []         # requests whose event has not happened yet (their buffers kept)

    # ---- the communicator -----------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    @property
    def nccl(self):
        if self._library is None:
            self._library = nccl_library()
        return self._library

    def _unique_id(self):
        key = f"nccl_unique_id/{self.key}/{self.made}"
        if self._rank == 0:
            uid = self.nccl.get_unique_id()
            self.store.set(key, encode_unique_id(uid))
            return uid
        return self.store.get(key)

    def communicator(self, device: int):
        """The NCCL communicator of this group on cuda device `device` (made on first use)."""
        if self.comm is None:
            cupy = _cupy()
            uid = self._unique_id()
            self.made += 1
            with cupy.cuda.Device(device):
                try:                     # CuPy >= 14 takes the id as bytes, older CuPy as a tuple of ints
                    self.comm = self.nccl.NcclCommunicator(self._size, encode_unique_id(uid), self._rank)
                except TypeError:
                    self.comm = self.nccl.NcclCommunicator(self._size, decode_unique_id(encode_unique_id(uid)),
                                                           self._rank)
            self.device = device
        elif device != self.device:
            raise ValueError(f"NCCL backend: tensor on cuda:{device}, but this process group's communicator is on "
                             f"cuda:{self.device} (one device per process; call flambeau.cuda.set_device(LOCAL_RANK) "
                             "before the first collective)")
        return self.comm

    def buffer(self, t):
        """`t`'s data as a contiguous CuPy array (its own memory when contiguous)."""
        if t._device.type != "cuda":
            raise ValueError(f"NCCL backend: tensors must be on cuda, got a {t._device.type} tensor")
        a = t._data
        if a.flags.c_contiguous:
            return a
        cupy = _cupy()
        with cupy.cuda.Device(a.device.id):
            return cupy.ascontiguousarray(a)

    def nccl_stream(self, device: int):
        """The stream this engine's operations on cuda device `device` run on (made on first use)."""
        stream = self._streams.get(device)
        if stream is None:
            cupy = _cupy()
            with cupy.cuda.Device(device):
                if self.high_priority:      # CUDA clamps a number below the device's range to its greatest
                    stream = cupy.cuda.Stream(non_blocking=True, priority=HIGHEST_STREAM_PRIORITY)
                else:
                    stream = cupy.cuda.Stream(non_blocking=True)
                self._streams[device] = stream
        return stream

    def _start(self, *arrays, source: int | None = None, host_wait: bool = False):
        """(communicator, NCCL stream, request) for an operation on `arrays` (the first on the device): the
        NCCL stream is made to wait for what the caller's current stream has queued so far."""
        cupy = _cupy()
        device = arrays[0].device.id
        comm = self.communicator(device)
        stream = self.nccl_stream(device)
        with cupy.cuda.Device(device):
            key = (device, get_ident())   # per thread: another's record cannot come between this one and the wait
            ready = self._ready.get(key)
            if ready is None:
                ready = self._ready[key] = cupy.cuda.Event(disable_timing=True)
            ready.record(cupy.cuda.get_current_stream())
        stream.wait_event(ready)        # waits for this record: the event may be recorded again at once
        while self._inflight and self._inflight[0].test():
            self._inflight.pop(0)
        req = DeviceRequest(arrays, source, host_wait)
        return comm, stream, req

    def _finish(self, req: DeviceRequest, stream) -> DeviceRequest:
        if self._grouped is not None:
            self._grouped.append((req, stream))
        else:
            cupy = _cupy()
            req.record(cupy, stream)
            self._inflight.append(req)
        return req

    def group_start(self) -> None:
        """Start an NCCL group: operations until `group_end` are launched together (no ordering deadlock)."""
        self.nccl.groupStart()
        self._grouped = [] if self._grouped is None else self._grouped

    def group_end(self) -> None:
        try:
            self.nccl.groupEnd()
        finally:
            pending, self._grouped = self._grouped or [], None
        cupy = _cupy()
        for req, stream in pending:
            req.record(cupy, stream)
            self._inflight.append(req)

    def _grouped_calls(self, calls, *arrays):
        """Run `calls(comm, stream_ptr)` inside one NCCL group; one request for all of it."""
        comm, stream, req = self._start(*arrays)
        outer = self._grouped is not None
        if not outer:
            self.nccl.groupStart()
        try:
            calls(comm, stream.ptr)
        finally:
            if not outer:
                self.nccl.groupEnd()
        return self._finish(req, stream)

    # ---- collectives ----------------------------------------------------------------------------
    def all_reduce(self, buf, op_name: str) -> DeviceRequest:
        count, dtype, op = _reduction(buf, op_name)
        comm, stream, req = self._start(buf)
        comm.allReduce(buf.data.ptr, buf.data.ptr, count, dtype, op, stream.ptr)
        return self._finish(req, stream)

    def all_reduce_many(self, bufs: list, op_name: str) -> DeviceRequest:
        """Each array of `bufs` (contiguous, one device) all-reduced in place, in one NCCL group: NCCL runs
        the group's operations as one kernel launch. DDP's reducer reduces a bucket's gradients so, in
        their own memory, where PyTorch's copies them into a flat buffer and back. One request for all."""
        ops = [(b.data.ptr, *_reduction(b, op_name)) for b in bufs]

        def reduce_each(comm, stream):
            for ptr, count, dtype, op in ops:
                comm.allReduce(ptr, ptr, count, dtype, op, stream)
        return self._grouped_calls(reduce_each, *bufs)

    def broadcast(self, buf, root: int) -> DeviceRequest:
        count, dtype = _count_type(buf)
        comm, stream, req = self._start(buf)
        comm.broadcast(buf.data.ptr, buf.data.ptr, count, dtype, root, stream.ptr)
        return self._finish(req, stream)

    def reduce(self, buf, op_name: str, root: int) -> DeviceRequest:
        name = _dtype_name(buf)
        op = nccl_op(op_name, name)
        count, dtype = _count_type(buf)
        comm, stream, req = self._start(buf)
        comm.reduce(buf.data.ptr, buf.data.ptr, count, dtype, op, root, stream.ptr)
        return self._finish(req, stream)

    def all_gather(self, send, recv, counts: list) -> DeviceRequest:
        _, dtype = _count_type(send)
        unit = _units(send)
        if len(set(counts)) == 1:
            comm, stream, req = self._start(send, recv)
            comm.allGather(send.data.ptr, recv.data.ptr, counts[0] * unit, dtype, stream.ptr)
            return self._finish(req, stream)
        offsets = _offsets(counts, recv.itemsize)

        def broadcast_each(comm, stream):
            for r, n in enumerate(counts):
                dst = recv.data.ptr + offsets[r]
                comm.broadcast(send.data.ptr if r == self._rank else dst, dst, n * unit, dtype, r, stream)
        return self._grouped_calls(broadcast_each, send, recv)

    def reduce_scatter(self, send, recv, counts: list, op_name: str) -> DeviceRequest:
        name = _dtype_name(send)
        op = nccl_op(op_name, name)
        _, dtype = _count_type(send)
        unit = _units(send)
        if len(set(counts)) == 1:
            comm, stream, req = self._start(send, recv)
            comm.reduceScatter(send.data.ptr, recv.data.ptr, counts[0] * unit, dtype, op, stream.ptr)
            return self._finish(req, stream)
        offsets = _offsets(counts, send.itemsize)

        def reduce_each(comm, stream):
            for r, n in enumerate(counts):
                src = send.data.ptr + offsets[r]
                comm.reduce(src, recv.data.ptr if r == self._rank else src, n * unit, dtype, op, r, stream)
        return self._grouped_calls(reduce_each, send, recv)

    def all_to_all(self, send, send_counts: list, recv, recv_counts: list) -> DeviceRequest:
        _, dtype = _count_type(send)
        unit = _units(send)
        s_off, r_off = _offsets(send_counts, send.itemsize), _offsets(recv_counts, recv.itemsize)

        def exchange(comm, stream):
            for r in range(self._size):
                comm.send(send.data.ptr + s_off[r], send_counts[r] * unit, dtype, r, stream)
                comm.recv(recv.data.ptr + r_off[r], recv_counts[r] * unit, dtype, r, stream)
        return self._grouped_calls(exchange, send, recv)

    def gather(self, send, recv, counts: list, root: int) -> DeviceRequest:
        return self._rooted_exchange(send, recv, counts, root, to_root=True)

    def scatter(self, send, counts: list, recv, root: int) -> DeviceRequest:
        return self._rooted_exchange(recv, send, counts, root, to_root=False)

    def _rooted_exchange(self, own, parts, counts: list, root: int, to_root: bool) -> DeviceRequest:
        """gather (`to_root`: every rank sends `own` to the root, which receives rank r's into `parts` at
        r's offset) or scatter (the root sends each rank its piece of `parts`, every rank receives into
        `own`), as sends and receives in one NCCL group; `parts` is None off the root."""
        _, dtype = _count_type(own)
        unit = _units(own)

        def exchange(comm, stream):
            root_side, own_side = (comm.recv, comm.send) if to_root else (comm.send, comm.recv)
            if self._rank == root:
                offsets = _offsets(counts, parts.itemsize)
                for r, n in enumerate(counts):
                    root_side(parts.data.ptr + offsets[r], n * unit, dtype, r, stream)
            own_side(own.data.ptr, own.size * unit, dtype, root, stream)
        return self._grouped_calls(exchange, *([own] if parts is None else [own, parts]))

    def send(self, buf, dst: int, tag: int) -> DeviceRequest:
        count, dtype = _count_type(buf)
        comm, stream, req = self._start(buf)
        comm.send(buf.data.ptr, count, dtype, dst, stream.ptr)
        return self._finish(req, stream)

    def recv(self, buf, src: int | None, tag: int) -> DeviceRequest:
        if src is None:
            raise RuntimeError("NCCL backend: recv from any source is not supported; give src")
        count, dtype = _count_type(buf)
        comm, stream, req = self._start(buf, source=src)
        comm.recv(buf.data.ptr, count, dtype, src, stream.ptr)
        return self._finish(req, stream)

    def barrier(self) -> DeviceRequest:
        """An all_reduce of one int32 on this group's device, waited for by the host."""
        cupy = _cupy()
        device = self.device if self.device is not None else cupy.cuda.Device().id
        with cupy.cuda.Device(device):
            one = cupy.ones(1, dtype=cupy.int32)
        comm, stream, req = self._start(one, host_wait=True)
        comm.allReduce(one.data.ptr, one.data.ptr, 1, NCCL_INT32, NCCL_SUM, stream.ptr)
        return self._finish(req, stream)

    # ---- objects, through the store -------------------------------------------------------------
    def _object_key(self, what: str) -> str:
        self.object_rounds += 1
        return f"nccl_objects/{self.key}/{what}/{self.object_rounds}"

    def all_gather_object(self, obj) -> list:
        key = self._object_key("all_gather")
        self.store.set(f"{key}/{self._rank}", pickle.dumps(obj))
        return [pickle.loads(self.store.get(f"{key}/{r}")) for r in range(self._size)]

    def broadcast_object(self, obj, root: int):
        key = self._object_key("broadcast")
        if self._rank == root:
            self.store.set(key, pickle.dumps(obj))
            return obj
        return pickle.loads(self.store.get(key))

    def gather_object(self, obj, root: int) -> list | None:
        key = self._object_key("gather")
        self.store.set(f"{key}/{self._rank}", pickle.dumps(obj))
        if self._rank != root:
            return None
        return [pickle.loads(self.store.get(f"{key}/{r}")) for r in range(self._size)]

    def scatter_object(self, objs: list | None, root: int):
        key = self._object_key("scatter")
        if self._rank == root:
            for r, o in enumerate(objs):
                self.store.set(f"{key}/{r}", pickle.dumps(o))
        return pickle.loads(self.store.get(f"{key}/{self._rank}"))

    # ---- groups ---------------------------------------------------------------------------------
    def split(self, ranks: list) -> "NCCLBackend | None":
        """The engine of a group of `ranks` (this group's ranks); every rank calls it, in the same order."""
        self.splits += 1
        if self._rank not in ranks:
            return None
        return NCCLBackend(self.store, ranks.index(self._rank), len(ranks), self.timeout,
                           f"{self.key}.{self.splits}", self._library)

    def free(self) -> None:
        if self.comm is not None:
            try:
                self.comm.destroy()
            except Exception as e:  # noqa: BLE001  NCCL's error type is CuPy's; report it as PyTorch's
                raise DistBackendError(f"NCCL: destroying the communicator failed: {e}") from None
            self.comm = None
        self._inflight = []


def _reduction(buf, op_name: str) -> tuple:
    """(element count, NCCL dtype, NCCL op) of an all-reduce of `buf` (a complex array as its float pairs)."""
    key = (buf.dtype, op_name)
    kind = _reductions.get(key)
    if kind is None:                # a dtype's name is slow to make (NumPy builds it): once per dtype and op
        name = _dtype_name(buf)
        op = nccl_op(op_name, name)
        kind = _reductions[key] = (2, _DTYPES[_COMPLEX_PARTS[name]], op) if name in _COMPLEX_PARTS else \
            (1, _DTYPES.get(name), op)
    units, dtype, op = kind
    return units * buf.size, dtype, op


_reductions: dict = {}              # (array dtype, op name) -> (NCCL elements per element, NCCL dtype, NCCL op)


def _units(arr) -> int:
    """NCCL elements per array element (2 for complex: its real pairs)."""
    return 2 if _dtype_name(arr) in _COMPLEX_PARTS else 1


def _count_type(arr) -> tuple:
    """(NCCL element count, ncclDataType_t) of a whole array."""
    name = _dtype_name(arr)
    if name in _COMPLEX_PARTS:
        return 2 * arr.size, _DTYPES[_COMPLEX_PARTS[name]]
    return arr.size, _DTYPES[name]


def _offsets(counts: list, itemsize: int) -> list:
    out, at = [], 0
    for n in counts:
        out.append(at)
        at += n * itemsize
    return out


def make_nccl_backend(store, rank: int, world_size: int, timeout) -> NCCLBackend:
    """The factory `Backend.register_backend("nccl", ...)` holds."""
    return NCCLBackend(store, rank, world_size, timeout)
