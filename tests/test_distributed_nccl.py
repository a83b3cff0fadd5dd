"""The NCCL backend's parts that need no GPU: the unique id's trip through the store (a fake NCCL library
and a fake CuPy stand in for the real ones), routing of tensors by device under "nccl" and
"cpu:gloo,cuda:nccl", and PyTorch's rules for which reductions NCCL takes. The collectives themselves
run on GPUs in tests/test_distributed_collectives.py (configurations nccl-world1, nccl-world2; marked cuda).
"""
from __future__ import annotations

import contextlib
import threading
import types

import numpy as np
import pytest

import flambeau
import flambeau.distributed as dist
from flambeau.distributed import _nccl_backend as nb
from flambeau.distributed.distributed_c10d import _device_backends

THREAD_TIMEOUT_S = 30


class FakeNccl:
    """CuPy's nccl module as far as communicator creation goes: records who asked for ids and comms."""
    available = True

    def __init__(self) -> None:
        self.ids_made, self.comms, self.lock = [], [], threading.Lock()

    def get_unique_id(self):
        rng = np.random.default_rng(len(self.ids_made))
        uid = tuple(int(v) for v in rng.integers(-128, 128, size=nb.NCCL_UNIQUE_ID_BYTES))
        with self.lock:
            self.ids_made.append(uid)
        return uid

    def NcclCommunicator(self, size, uid, rank):  # noqa: N802  CuPy's spelling
        if not isinstance(uid, bytes):
            raise TypeError("Argument 'commId' has incorrect type (expected bytes, got tuple)")     # CuPy 14
        with self.lock:
            self.comms.append((size, nb.decode_unique_id(uid), rank))
        return types.SimpleNamespace(size=size, uid=uid, rank=rank, destroy=lambda: None)


@pytest.fixture
def fake_cupy(monkeypatch):
    cuda = types.SimpleNamespace(Device=lambda device=None: contextlib.nullcontext())
    monkeypatch.setattr(nb, "_cupy", lambda: types.SimpleNamespace(cuda=cuda))


def _on_ranks(world: int, body) -> list:
    """body(rank) in `world` threads; their results (a failure in any thread fails the test)."""
    results, errors = [None] * world, []

    def run(r):
        try:
            results[r] = body(r)
        except BaseException as e:  # noqa: BLE001  re-raised in the test's thread below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(THREAD_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting for the unique id"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("store_kind", ["hash", "file", "tcp"])
def test_unique_id_travels_through_the_store(fake_cupy, tmp_path, store_kind):
    world = 3
    if store_kind == "hash":
        stores = [dist.HashStore()] * world
    elif store_kind == "file":
        stores = [dist.FileStore(str(tmp_path / "store"), world) for _ in range(world)]
    else:
        master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
        stores = [master] + [dist.TCPStore("127.0.0.1", master.port, world, is_master=False)
                             for _ in range(world - 1)]
    lib = FakeNccl()

    def make(r):
        engine = nb.NCCLBackend(dist.PrefixStore("default_pg", stores[r]), r, world, library=lib)
        engine.communicator(0)
        sub = engine.split([0, 2])
        if sub is not None:
            sub.communicator(0)
        return engine
    _on_ranks(world, make)
    assert len(lib.ids_made) == 2                       # rank 0 of the world, rank 0 of the group {0, 2}
    world_comms = [c for c in lib.comms if c[1] == lib.ids_made[0]]
    group_comms = [c for c in lib.comms if c[1] == lib.ids_made[1]]
    assert sorted(c[2] for c in world_comms) == [0, 1, 2] and {c[0] for c in world_comms} == {3}
    assert sorted(c[2] for c in group_comms) == [0, 1] and {c[0] for c in group_comms} == {2}


def test_unique_id_bytes_round_trip():
    uid = tuple(range(-64, 64))
    data = nb.encode_unique_id(uid)
    assert isinstance(data, bytes) and len(data) == nb.NCCL_UNIQUE_ID_BYTES
    assert nb.decode_unique_id(data) == uid
    with pytest.raises(ValueError, match="128"):
        nb.encode_unique_id(uid[:5])


def test_communicator_stays_on_its_device(fake_cupy):
    engine = nb.NCCLBackend(dist.HashStore(), 0, 1, library=FakeNccl())
    engine.communicator(0)
    with pytest.raises(ValueError, match="cuda:1.*cuda:0"):
        engine.communicator(1)


class _StreamLog:
    """A fake CuPy `cuda` namespace that logs event records, stream waits and the NCCL calls' streams."""

    def __init__(self) -> None:
        self.log, self.current, self.events = [], types.SimpleNamespace(ptr=0, name="compute"), []
        log = self.log

        class Stream:
            def __init__(self, non_blocking=False):
                self.ptr, self.name, self.non_blocking = 100 + len(log), "nccl", non_blocking

            def wait_event(self, event):
                log.append(("wait", self.name, event.n))

        class Event:
            def __init__(inner, disable_timing=False):
                inner.n, inner.done = len(self.events), False
                self.events.append(inner)

            def record(inner, stream):
                log.append(("record", inner.n, stream.name))

        self.current.wait_event = lambda event: log.append(("wait", "compute", event.n))
        self.cuda = types.SimpleNamespace(Device=lambda device=None: contextlib.nullcontext(), Stream=Stream,
                                          Event=Event, get_current_stream=lambda: self.current)

    def comm(self, size, uid, rank):
        return types.SimpleNamespace(
            allReduce=lambda send, recv, count, dtype, op, stream: self.log.append(("allReduce", stream)),
            destroy=lambda: None)


def test_collectives_run_on_the_nccl_stream_after_the_callers_stream(monkeypatch):
    """Overlap: the all_reduce is queued on the engine's own stream (which first waits for what the caller's
    stream has queued), the caller's stream waits only when the request is waited for, and an unwaited
    request keeps its buffer until its event has happened."""
    fake = _StreamLog()
    monkeypatch.setattr(nb, "_cupy", lambda: fake)
    lib = FakeNccl()
    lib.NcclCommunicator = fake.comm
    engine = nb.NCCLBackend(dist.HashStore(), 0, 1, library=lib)
    buf = types.SimpleNamespace(device=types.SimpleNamespace(id=0), data=types.SimpleNamespace(ptr=1 << 20),
                                size=8, dtype=np.dtype("float32"))
    req = engine.all_reduce(buf, "SUM")
    nccl_ptr = engine.nccl_stream(0).ptr
    assert nccl_ptr != fake.current.ptr
    assert fake.log == [("record", 0, "compute"), ("wait", "nccl", 0), ("allReduce", nccl_ptr),
                        ("record", 1, "nccl")]
    fake.log.clear()
    req.wait()
    assert fake.log == [("wait", "compute", 1)]
    del req
    assert engine._inflight[0].keep == (buf,)           # dropped unwaited, its buffer is still held
    fake.events[1].done = True
    fake.log.clear()
    engine.all_reduce(buf, "SUM")
    assert len(engine._inflight) == 1 and engine._inflight[0].event is fake.events[-1]
    # the caller's-stream event is made once and recorded again (a stream wait keeps the record it was
    # given); each operation's completion event is its own
    assert len(fake.events) == 3 and fake.log == [("record", 0, "compute"), ("wait", "nccl", 0),
                                                  ("allReduce", nccl_ptr), ("record", 2, "nccl")]


def _logging_engine(monkeypatch, rank: int, size: int):
    """An engine of rank `rank` in a world of `size` whose communicator logs its sends and receives as
    (call, address, NCCL count, NCCL dtype, peer); the log of NCCL group starts/ends beside it."""
    fake = _StreamLog()
    monkeypatch.setattr(nb, "_cupy", lambda: fake)
    lib = FakeNccl()
    lib.groupStart, lib.groupEnd = (lambda: fake.log.append("groupStart")), (lambda: fake.log.append("groupEnd"))
    engine = nb.NCCLBackend(dist.HashStore(), rank, size, library=lib)
    calls = []
    engine.comm, engine.device = types.SimpleNamespace(
        send=lambda ptr, n, dtype, peer, stream: calls.append(("send", ptr, n, dtype, peer)),
        recv=lambda ptr, n, dtype, peer, stream: calls.append(("recv", ptr, n, dtype, peer)),
        destroy=lambda: None), 0
    return engine, calls, fake.log


def _device_array(ptr: int, size: int, dtype: str):
    return types.SimpleNamespace(device=types.SimpleNamespace(id=0), data=types.SimpleNamespace(ptr=ptr), size=size,
                                 dtype=np.dtype(dtype), itemsize=np.dtype(dtype).itemsize)


@pytest.mark.parametrize("dtype,unit,nccl_dtype", [("float32", 1, nb.NCCL_FLOAT32), ("complex64", 2, nb.NCCL_FLOAT32)])
def test_gather_and_scatter_are_sends_and_receives_at_each_ranks_offset(monkeypatch, dtype, unit, nccl_dtype):
    """Uneven gather/scatter over 3 ranks (counts 2, 3, 1; root 1) as the NCCL calls of one group: the root
    moves rank r's piece at r's byte offset into/out of the whole buffer, every rank sends/receives its own
    (complex as its real pairs); off the root only the one call."""
    counts, root, item = [2, 3, 1], 1, np.dtype(dtype).itemsize
    whole, own = 1 << 20, 1 << 24
    at = {0: whole, 1: whole + 2 * item, 2: whole + 5 * item}
    engine, calls, log = _logging_engine(monkeypatch, root, 3)
    engine.gather(_device_array(own, 3, dtype), _device_array(whole, 6, dtype), counts, root)
    assert calls == [("recv", at[r], n * unit, nccl_dtype, r) for r, n in enumerate(counts)] + \
        [("send", own, 3 * unit, nccl_dtype, root)]
    assert [e for e in log if isinstance(e, str)] == ["groupStart", "groupEnd"]
    calls.clear()
    engine.scatter(_device_array(whole, 6, dtype), counts, _device_array(own, 3, dtype), root)
    assert calls == [("send", at[r], n * unit, nccl_dtype, r) for r, n in enumerate(counts)] + \
        [("recv", own, 3 * unit, nccl_dtype, root)]
    engine, calls, _ = _logging_engine(monkeypatch, 2, 3)
    engine.gather(_device_array(own, 1, dtype), None, counts, root)
    engine.scatter(None, counts, _device_array(own, 1, dtype), root)
    assert calls == [("send", own, unit, nccl_dtype, root), ("recv", own, unit, nccl_dtype, root)]


def test_backend_strings_name_an_engine_per_device():
    assert _device_backends("nccl") == {"cuda": "nccl"}
    assert _device_backends("gloo") == {"default": "gloo"}
    assert _device_backends("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    assert _device_backends("CPU:GLOO,CUDA:NCCL") == {"cpu": "gloo", "cuda": "nccl"}


def test_nccl_group_refuses_cpu_tensors_as_pytorch():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "nccl"
        assert isinstance(dist.group.WORLD.engine_for("cuda"), nb.NCCLBackend)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(flambeau.ones(3))
        sub = dist.new_group([0])
        assert isinstance(sub.engine_for("cuda"), nb.NCCLBackend) and sub.engine_for("cuda").key == "0.1"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("op,dtype,want", [("SUM", "float32", nb.NCCL_SUM), ("AVG", "bfloat16", nb.NCCL_AVG),
                                           ("PRODUCT", "int64", nb.NCCL_PROD), ("MIN", "float16", nb.NCCL_MIN),
                                           ("SUM", "bool", nb.NCCL_MAX), ("PRODUCT", "bool", nb.NCCL_MIN),
                                           ("AVG", "complex64", nb.NCCL_AVG)])
def test_reductions_map_to_nccl_ops_as_pytorch(op, dtype, want):
    assert nb.nccl_op(op, dtype) == want


@pytest.mark.parametrize("op,dtype,message", [("BAND", "int32", "Cannot use ReduceOp.BAND with NCCL"),
                                              ("BXOR", "bool", "Cannot use ReduceOp.BXOR with NCCL"),
                                              ("AVG", "bool", "Cannot use ReduceOp.AVG with boolean inputs"),
                                              ("MAX", "complex64", "MAX on complex")])
def test_reductions_nccl_lacks_raise_as_pytorch(op, dtype, message):
    with pytest.raises(ValueError, match=message):
        nb.nccl_op(op, dtype)


# ---- on the GPU (world size 1 in this process; world size 2 through the launcher in test_distributed_collectives)
@pytest.fixture
def nccl_world1():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.cuda
def test_cupy_has_nccl():
    assert nb.is_available() and dist.is_nccl_available()


@pytest.mark.cuda
def test_async_work_waits_on_the_stream_of_the_caller(nccl_world1):
    x = flambeau.arange(1 << 20, dtype=flambeau.float32, device="cuda")
    side = flambeau.cuda.Stream()
    with flambeau.cuda.stream(side):
        y = x * 2
        work = dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()                            # the current (default) stream now waits for the side stream's event
    z = y + 1
    np.testing.assert_array_equal(z.cpu().numpy(), np.arange(1 << 20, dtype=np.float32) * 2 + 1)
    flambeau.cuda.synchronize()
    assert work.is_completed()


@pytest.mark.cuda
def test_ddp_step_on_nccl_makes_no_host_syncs(nccl_world1):
    pytest.importorskip("torch")
    from bench import gpu_models
    from bench.gpu_profile import counts
    flambeau.manual_seed(0)
    model = gpu_models.gpt(flambeau, vocab=96, block=64, d=64, layers=2, heads=4).to("cuda")
    ddp = flambeau.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    assert len(ddp.reducer.buckets) > 1
    opt = flambeau.optim.AdamW(ddp.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = flambeau.tensor(rng.integers(0, 96, (4, 64)), device="cuda")
    y = flambeau.tensor(rng.integers(0, 96, (4, 64)), device="cuda")

    def step():
        return gpu_models.train_step(flambeau, ddp, opt, x, y, flambeau.bfloat16)
    step()
    step()
    c = counts(step, steps=2, stacks=True)
    assert c["kernels"] > 100
    assert c["d2h"] == 0, c["d2h_sites"]


@pytest.mark.cuda
def test_ddp_adamw_updates_the_reduced_buckets_before_waiting_for_the_last(nccl_world1, monkeypatch):
    """The buckets completed by backward's last gradients (the embedding's and the first layer's) are left
    pending when backward returns; the fused AdamW step updates every other parameter in one launch first,
    then waits for those reductions and updates them in a second launch: both launches together update
    every parameter once, as the unwrapped model's AdamW does (world size 1: the same values, up to the
    embedding backward's atomic additions, whose order varies from run to run)."""
    pytest.importorskip("torch")
    from bench import gpu_models
    from flambeau import _pending_grads
    from flambeau._backends import triton_adam
    log = []
    launch, settle = triton_adam.launch, _pending_grads.Pending.settle
    monkeypatch.setattr(triton_adam, "launch", lambda arrays, ptrs, **kw: (
        log.append(("launch", len(arrays.numels), len(_pending_grads.waits))), launch(arrays, ptrs, **kw))[1])
    monkeypatch.setattr(_pending_grads.Pending, "settle", lambda self: (
        log.append(("settle", len(self.params))) if not self.done else None, settle(self))[1])

    def model():
        flambeau.manual_seed(0)
        return gpu_models.gpt(flambeau, vocab=96, block=64, d=64, layers=2, heads=4).to("cuda")
    plain, ddp = model(), flambeau.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.05)
    opts = [flambeau.optim.AdamW(m.parameters(), lr=1e-3) for m in (plain, ddp)]
    rng = np.random.default_rng(0)
    n = len(list(plain.parameters()))
    for step in range(3):
        x, y = (flambeau.tensor(rng.integers(0, 96, (4, 64)), device="cuda") for _ in range(2))
        for m, opt in zip((plain, ddp), opts):
            del log[:]
            gpu_models.train_step(flambeau, m, opt, x, y, flambeau.bfloat16)
        for p, q in zip(plain.parameters(), ddp.module.parameters()):
            np.testing.assert_allclose(q.detach().cpu().numpy(), p.detach().cpu().numpy(), rtol=1e-5, atol=1e-7)
    (_, first, waiting), (_, deferred), (_, second, _) = log
    assert log[0][0] == "launch" and log[1][0] == "settle" and log[2][0] == "launch"
    assert first + second == n and second == deferred == waiting > 0 and not _pending_grads.waits


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,as_view", [("float32", False), ("bfloat16", False), ("float32", True)])
def test_ddp_gradients_equal_the_unwrapped_model_on_nccl(nccl_world1, dtype, as_view):
    """At world size 1 the average is the gradient itself: DDP's bucket copies (cudaMemcpyAsync, bf16 too)
    must hand back every gradient bit for bit, before and after the bucket rebuild."""
    dt = getattr(flambeau, dtype)

    def model():
        flambeau.manual_seed(0)
        return flambeau.nn.Sequential(flambeau.nn.Linear(16, 64), flambeau.nn.Tanh(), flambeau.nn.Linear(64, 8)
                                      ).to(device="cuda", dtype=dt)
    plain = model()
    ddp = flambeau.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.001, gradient_as_bucket_view=as_view)
    assert len(ddp.reducer.buckets) > 1
    rng = np.random.default_rng(0)
    for step in range(3):
        x = flambeau.tensor(rng.standard_normal((4, 16)), device="cuda", dtype=dt)
        for m in (plain, ddp):
            m.zero_grad(set_to_none=step != 1)
            (m(x).float() ** 2).sum().backward()
        for p, q in zip(plain.parameters(), ddp.module.parameters()):
            np.testing.assert_array_equal(q.grad.float().cpu().numpy(), p.grad.float().cpu().numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("mixed", [False, True])
def test_fsdp_gradients_equal_the_unwrapped_model_on_nccl(nccl_world1, mixed):
    """FSDP2 on cuda at world size 1 (the average is the gradient itself): the gathered parameters, copied out
    by address (`triton_copy_many.copy_addresses`) into one buffer per group, and the sharded gradients give
    the unwrapped model's gradients, for two steps; with MixedPrecisionPolicy(param_dtype=bfloat16,
    reduce_dtype=float32) the bf16 copies go the same way and equal the model run in bfloat16."""
    from flambeau.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def model(dtype=flambeau.float32):
        flambeau.manual_seed(0)
        return flambeau.nn.Sequential(flambeau.nn.Linear(16, 64), flambeau.nn.Tanh(), flambeau.nn.Linear(64, 8)
                                      ).to(device="cuda", dtype=dtype)
    plain = model(flambeau.bfloat16 if mixed else flambeau.float32)
    sharded = model()
    mp = MixedPrecisionPolicy(param_dtype=flambeau.bfloat16, reduce_dtype=flambeau.float32) if mixed \
        else MixedPrecisionPolicy()
    fully_shard(sharded[0], mp_policy=mp)
    fully_shard(sharded, mp_policy=mp)
    rng = np.random.default_rng(0)
    for step in range(2):
        x = flambeau.tensor(rng.standard_normal((4, 16)), device="cuda", dtype=flambeau.float32)
        for m, inp in ((plain, x.to(plain[0].weight.dtype)), (sharded, x)):
            m.zero_grad(set_to_none=True)
            (m(inp).float() ** 2).sum().backward()
        for p, q in zip(plain.parameters(), sharded.parameters()):
            got, want = q.grad.full_tensor().float().cpu().numpy(), p.grad.float().cpu().numpy()
            if mixed:
                np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
            else:
                np.testing.assert_array_equal(got, want)


def _priority_cupy(log: list):
    """A fake CuPy whose streams note their priority, clamped as CUDA does to a device range of 0 (least) to
    -5 (greatest)."""
    class Stream:
        def __init__(self, non_blocking=False, priority=None):
            self.priority = None if priority is None else min(0, max(-5, priority))
            self.ptr = 100 + len(log)
            log.append(self.priority)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda device=None: contextlib.nullcontext(),
                                                            Stream=Stream))


@pytest.mark.parametrize("high", [True, False])
def test_nccl_options_high_priority_stream_acts(monkeypatch, high):
    """init_process_group(pg_options=ProcessGroupNCCL.Options(is_high_priority_stream=...)): the group's NCCL
    stream is made at the device's greatest priority, or the default one."""
    log = []
    monkeypatch.setattr(nb, "_cupy", lambda: _priority_cupy(log))
    dist.init_process_group("nccl", store=dist.HashStore(), world_size=1, rank=0,
                            pg_options=dist.ProcessGroupNCCL.Options(is_high_priority_stream=high))
    try:
        engine = dist.group.WORLD.engines["default"] if "default" in dist.group.WORLD.engines else \
            dist.group.WORLD.engine
        engine.nccl_stream(0)
        assert log == ([-5] if high else [None])
        sub = dist.new_group([0])                         # no options: a default stream, as PyTorch's
        sub.engine.nccl_stream(0)
        assert log[-1] is None
    finally:
        dist.destroy_process_group()


def test_nccl_options_that_cannot_act_raise(monkeypatch):
    monkeypatch.setattr(nb, "_cupy", lambda: _priority_cupy([]))
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.max_ctas = 8
    with pytest.raises(NotImplementedError, match=r"max_ctas.*NCCL_MAX_CTAS"):
        dist.init_process_group("nccl", store=dist.HashStore(), world_size=1, rank=0, pg_options=opts)
    with pytest.raises(TypeError, match="pg_options of type object"):
        dist.init_process_group("nccl", store=dist.HashStore(), world_size=1, rank=0, pg_options=object())
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.ProcessGroupNCCL(dist.HashStore(), 0, 1)
