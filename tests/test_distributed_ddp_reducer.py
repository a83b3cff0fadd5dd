"""What DDP's reducer does per training step, counted in one process (world size 1 on the CPU engine).

On a GPU each gradient copy is a kernel and each allocation a trip to the memory pool, so the step's device
time depends on these counts: one copy into the bucket per gradient that is not already its bucket view,
one copy back per gradient outside view mode, one all-reduce per bucket on the bucket's own flat buffer
(made once: the same memory every step), and no operator calls of the reducer's own (the step issues
the same operators as the model trained without DDP).
"""
from __future__ import annotations

import importlib.util
import types

import numpy as np
import pytest

import flambeau
from tests.conftest import python_calls, run_interpreted_script
import flambeau.distributed as dist
from flambeau.nn.parallel import distributed as ddp_module
from flambeau.utils._python_dispatch import TorchDispatchMode

STEPS = 4
BUCKET_CAP_MB = 0.002           # several buckets for the small model below


@pytest.fixture
def world1():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _model():
    flambeau.manual_seed(0)
    return flambeau.nn.Sequential(flambeau.nn.Linear(8, 32), flambeau.nn.Tanh(), flambeau.nn.Linear(32, 32),
                                  flambeau.nn.Tanh(), flambeau.nn.Linear(32, 4))


def _step(model, opt, set_to_none: bool, step: int):
    g = np.random.default_rng(step)
    x = flambeau.tensor(g.standard_normal((6, 8)).astype(np.float32))
    opt.zero_grad(set_to_none=set_to_none)
    (model(x) ** 2).mean().backward()
    opt.step()


def _counted(monkeypatch):
    """Wrap the reducer's copies (one by one, and the batched ones pair by pair, by array) and the
    all-reduces (the group engine's, which the reducer calls directly, by array): the log of what each
    step did."""
    log = {"copy": [], "all_reduce": [], "batches": []}
    engine = dist.GroupMember.WORLD.engine_for("cpu")
    copy, copy_many, all_reduce = ddp_module._copy_into, ddp_module._HostCopier.copy_many, engine.all_reduce

    def counting_copy(dst, src):
        log["copy"].append((dst._data, src._data))
        copy(dst, src)

    def counting_copy_many(srcs, dsts):
        log["copy"].extend(zip(dsts, srcs))
        log["batches"].append(len(srcs))
        copy_many(srcs, dsts)
    monkeypatch.setattr(ddp_module._HostCopier, "copy_many", staticmethod(counting_copy_many))

    def counting_all_reduce(buf, op_name):
        log["all_reduce"].append(buf)
        return all_reduce(buf, op_name)
    monkeypatch.setattr(ddp_module, "_copy_into", counting_copy)
    monkeypatch.setattr(engine, "all_reduce", counting_all_reduce)
    return log


@pytest.mark.parametrize("as_view,set_to_none,copies_in,copies_back", [
    (False, True, 1, 1), (False, False, 1, 1),
    (True, True, 1, 0),          # fresh gradients each step: copied in once, then the views are the .grad
    (True, False, 0, 0)])        # zeroed in place: backward accumulates straight into the bucket views
def test_reducer_work_per_step(world1, monkeypatch, as_view, set_to_none, copies_in, copies_back):
    model = ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_CAP_MB,
                                               gradient_as_bucket_view=as_view)
    opt = flambeau.optim.SGD(model.parameters(), lr=0.1)
    for s in range(2):                               # the first iteration and the bucket rebuild
        _step(model, opt, set_to_none, s)
    reducer = model.reducer
    params = reducer.params
    views = {id(v) for b in reducer.buckets for v in b.views}
    view_arrays = {id(v._data) for b in reducer.buckets for v in b.views}
    flats = [(b.flat, b.flat._data) for b in reducer.buckets]
    assert len(flats) > 1
    log = _counted(monkeypatch)
    for s in range(2, 2 + STEPS):
        _step(model, opt, set_to_none, s)
        if as_view:
            assert all(id(p.grad) in views for p in params)
        else:
            assert not any(id(p.grad) in views for p in params)
    ins = [c for c in log["copy"] if id(c[0]) in view_arrays]
    backs = [c for c in log["copy"] if id(c[1]) in view_arrays]
    assert len(ins) == copies_in * len(params) * STEPS
    assert len(backs) == copies_back * len(params) * STEPS
    assert len(log["copy"]) == len(ins) + len(backs)
    assert len(log["all_reduce"]) == len(reducer.buckets) * STEPS
    assert [id(a) for a in log["all_reduce"]] == [id(b.flat._data) for b in reducer.buckets] * STEPS
    assert [(b.flat, b.flat._data) for b in reducer.buckets] == flats        # no bucket made again
    for b in reducer.buckets:
        for v in b.views:
            assert np.shares_memory(v._data, b.flat._data)


@pytest.mark.parametrize("as_view", [False, True])
def test_batched_copies_one_call_per_bucket_in_and_one_back(world1, monkeypatch, as_view):
    """A bucket's gradients are copied in by one `copier.copy_many` call when the bucket starts (on cuda one
    `triton_copy_many` launch; on the host the array copies) and copied back by two calls a step; here
    the copier records each batch and runs it pair by pair: the trained weights equal those of the run
    with no copier (a copy per gradient) bit for bit."""
    weights = []
    for batched in (False, True):
        log = []
        if batched:
            def recording_copy_many(srcs, dsts):
                log.append([(id(d), id(s)) for s, d in zip(srcs, dsts)])
                for s, d in zip(srcs, dsts):
                    d[...] = s
            monkeypatch.setattr(ddp_module._HostCopier, "copy_many", staticmethod(recording_copy_many))
        else:
            monkeypatch.setattr(ddp_module, "_copier_for", lambda flat: None)
        model = ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_CAP_MB,
                                                   gradient_as_bucket_view=as_view)
        opt = flambeau.optim.SGD(model.parameters(), lr=0.1)
        for s in range(2):
            _step(model, opt, True, s)
        del log[:]
        copies, copy_into = [], ddp_module._copy_into
        monkeypatch.setattr(ddp_module, "_copy_into", lambda d, s: copies.append(d) or copy_into(d, s))
        for s in range(2, 2 + STEPS):
            _step(model, opt, True, s)
        weights.append([p.detach().numpy().copy() for p in model.parameters()])
        monkeypatch.undo()
        if not batched:
            continue
        reducer = model.reducer
        views = {id(v._data) for b in reducer.buckets for v in b.views}
        ins = [batch for batch in log if batch and batch[0][0] in views]
        backs = [batch for batch in log if batch and batch[0][0] not in views]
        assert len(ins) == len(reducer.buckets) * STEPS           # one batch per bucket and step
        assert sorted(len(b) for b in ins[:len(reducer.buckets)]) == sorted(len(b.params) for b in reducer.buckets)
        assert all(d in views and s not in views for batch in ins for d, s in batch)
        # outside view mode two a step: every bucket but the last (issued before the last reduction is waited
        # for: on cuda it overlaps that reduction), then the last
        last = len(reducer.buckets[-1].params)
        assert [len(b) for b in backs] == ([] if as_view else [len(reducer.params) - last, last] * STEPS)
        assert all(s in views and d not in views for batch in backs for d, s in batch)
        assert copies == []                                       # no copy left to `_copy_into`
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_copy_many_kernel_under_the_interpreter():
    """The batched copy kernel (`_backends/triton_copy_many.py`) under Triton's interpreter: float32,
    bfloat16, int64 and uint8 tensors over several chunks, each copied exactly and nothing around it written."""
    run_interpreted_script("triton_copy_many_interp.py")


def test_reducer_issues_no_operators_of_its_own(world1):
    """A DDP step at world size 1 dispatches exactly the operators of the same step without DDP: the
    reducer's copies and all-reduces run on the arrays, off the dispatcher (each operator call would
    add host time per parameter per step)."""
    counts = []
    for wrap in (False, True):
        model = _model()
        if wrap:
            model = ddp_module.DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
        opt = flambeau.optim.SGD(model.parameters(), lr=0.1)
        for s in range(2):
            _step(model, opt, True, s)
        with _OpCount() as c:
            _step(model, opt, True, 2)
        counts.append(c.n)
    assert counts[0] > 10 and counts[1] == counts[0]


class _FakeDeviceArray:
    """What `_copy_into` reads of a CuPy array: layout, dtype, size and device pointer."""

    def __init__(self, ptr: int, nbytes: int, dtype, contiguous: bool = True) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)
        self.nbytes, self.dtype = nbytes, np.dtype(dtype)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.assigned = None

    def __setitem__(self, key, value) -> None:
        self.assigned = value


def _fake_cuda_tensor(array):
    return types.SimpleNamespace(_data=array, _device=types.SimpleNamespace(type="cuda"), _version=[0])


@pytest.mark.parametrize("dtype", ["float32", "V2"])        # "V2": how NumPy sees bfloat16 (no CuPy kernels)
def test_device_copies_are_one_memcpy_on_the_current_stream(monkeypatch, dtype):
    calls = []
    runtime = types.SimpleNamespace(memcpyAsync=lambda *args: calls.append(args))
    cuda = types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: types.SimpleNamespace(ptr=77))
    monkeypatch.setattr(ddp_module._backends, "get", lambda device: types.SimpleNamespace(xp=types.SimpleNamespace(
        cuda=cuda)))
    dst = _fake_cuda_tensor(_FakeDeviceArray(1000, 4096, dtype))
    src = _fake_cuda_tensor(_FakeDeviceArray(9000, 4096, dtype))
    ddp_module._copy_into(dst, src)
    assert calls == [(1000, 9000, 4096, ddp_module.CUDA_MEMCPY_DEVICE_TO_DEVICE, 77)]
    assert dst._version == [1]
    strided = _fake_cuda_tensor(_FakeDeviceArray(9000, 4096, "float32", contiguous=False))
    dst = _fake_cuda_tensor(_FakeDeviceArray(1000, 4096, "float32"))
    ddp_module._copy_into(dst, strided)                     # a strided source: an array copy, not a memcpy
    assert len(calls) == 1 and dst._data.assigned is strided._data


def test_forward_does_not_walk_the_module_for_buffers(world1, monkeypatch):
    """The buffers are found once, at construction (PyTorch's `modules_buffers`); a model without any syncs
    none and walks nothing per forward (GPT-2's module tree is ~100 modules)."""
    model = ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_CAP_MB)
    walks = []
    monkeypatch.setattr(type(model.module), "buffers", lambda self, recurse=True: walks.append(1) or iter(()))
    opt = flambeau.optim.SGD(model.parameters(), lr=0.1)
    for s in range(3):
        _step(model, opt, True, s)
    assert walks == [] and model.modules_buffers == [] and not model.will_sync_module_buffers()


def test_multi_tensor_tables_upload_without_a_stream_synchronisation():
    """A multi-tensor table (fused AdamW, DDP's batched copies) missing from the cache is staged in pinned
    host memory and copied by cudaMemcpyAsync on the current stream (an upload from pageable memory,
    `cupy.asarray`, waits for the stream; a compiled DDP backward missed several times a step); a hit makes
    no copy; the staged bytes are the table (`multi_tensor.table`)."""
    from flambeau._backends import multi_tensor

    class Pinned(bytearray):
        ptr = 0x7000

    copies = []

    class Dev:
        def __init__(self, n):
            self.size, self.data = n, types.SimpleNamespace(ptr=0x9000)

    staged = []

    def alloc_pinned(n):
        staged.append(Pinned(n))
        return staged[-1]
    fake = types.SimpleNamespace(
        empty=lambda n, dtype: Dev(n),
        asarray=lambda *a, **k: pytest.fail("a pageable upload synchronises the stream"),
        cuda=types.SimpleNamespace(alloc_pinned_memory=alloc_pinned,
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=55),
                                   runtime=types.SimpleNamespace(memcpyAsync=lambda *a: copies.append(a))))
    cache = {}
    addresses, numels = ((0x100, 0x200), (0x300, 0x400)), (5, 70)
    dev, n = multi_tensor.device_table(fake, cache, ("k",), addresses, numels, 64, 2)
    want = multi_tensor.table(addresses, numels, 64)
    assert n == multi_tensor.chunk_count(want, 2, 2) == 3
    assert copies == [(0x9000, 0x7000, want.nbytes, multi_tensor.CUDA_MEMCPY_HOST_TO_DEVICE, 55)]
    np.testing.assert_array_equal(np.frombuffer(staged[0], dtype=np.int64), want)
    again, _ = multi_tensor.device_table(fake, cache, ("k",), addresses, numels, 64, 2)
    assert again is dev and len(copies) == 1


class _TwoBranches(flambeau.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = flambeau.nn.Linear(4, 3), flambeau.nn.Linear(4, 3)

    def forward(self, x, use_b: bool):
        return self.a(x) + self.b(x) if use_b else self.a(x)


def test_unused_parameter_reduces_zeros_not_its_stale_gradient(world1):
    """find_unused_parameters: a parameter this rank did not use contributes zeros to its bucket's
    reduction even when its `.grad` still holds an earlier step's gradient (accumulating, no zero_grad),
    and keeps that `.grad`; the used ones' gradients equal PyTorch's (one process: the average is the
    local gradient)."""
    import torch
    flambeau.manual_seed(0)
    fl_model = _TwoBranches()
    ref = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 3), "b": torch.nn.Linear(4, 3)})
    with torch.no_grad():
        for p, q in zip(fl_model.parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy()))
    model = ddp_module.DistributedDataParallel(fl_model, find_unused_parameters=True, bucket_cap_mb=1)
    seen = []

    def recording_hook(state, bucket):
        seen.append({id(p): g.detach().numpy().copy() for p, g in zip(bucket.parameters(), bucket.gradients())})
        return ddp_module._default_allreduce(state, bucket)
    model.register_comm_hook(flambeau.distributed.GroupMember.WORLD, recording_hook)
    g = np.random.default_rng(0)
    for step, use_b in enumerate([True, False, False]):
        x = g.standard_normal((5, 4)).astype(np.float32)
        (model(flambeau.tensor(x), use_b) ** 2).sum().backward()
        xt = torch.from_numpy(x)
        ((ref["a"](xt) + ref["b"](xt) if use_b else ref["a"](xt)) ** 2).sum().backward()
        for p, q in zip(fl_model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-6, atol=1e-6)
        if not use_b:
            for p in fl_model.b.parameters():
                assert np.abs(p.grad.numpy()).max() > 0                 # a stale gradient it keeps
                assert not np.any(seen[-1][id(p)])                       # reduced as zeros


@pytest.mark.parametrize("as_view", [False, True])
def test_reducer_runs_no_python_per_parameter_but_its_hook(world1, as_view):
    """What DDP adds to a training step in Python calls: each parameter's hook, and per bucket a bounded
    number (copy in, all-reduce, wait, copy back: maps over the bucket's lists), not a call per parameter
    (GPT-2 has ~150 parameters; each call is host time a GPU step waits for). Counted against the same step
    without DDP, at world size 1, on a model of many small parameters in a few buckets."""
    def mlp():
        flambeau.manual_seed(0)
        return flambeau.nn.Sequential(*[flambeau.nn.Linear(2, 2) for _ in range(60)])
    counts = []
    for wrap in (False, True):
        model = mlp()
        if wrap:
            model = ddp_module.DistributedDataParallel(model, bucket_cap_mb=0.001, gradient_as_bucket_view=as_view)
        opt = flambeau.optim.SGD(model.parameters(), lr=0.1)
        for s in range(3):
            _step2(model, opt, s)
        counts.append(python_calls(lambda: _step2(model, opt, 3)))
    n_params, n_buckets = len(model.reducer.params), len(model.reducer.buckets)
    assert n_params == 120 and 2 <= n_buckets <= 4
    added = counts[1] - counts[0]
    assert n_params <= added <= n_params + PYTHON_CALLS_PER_BUCKET * n_buckets + PYTHON_CALLS_PER_STEP, \
        (added, n_params, n_buckets)


PYTHON_CALLS_PER_BUCKET = 12    # launch, copy in, the engine's all-reduce and its request's wait, copy back
PYTHON_CALLS_PER_STEP = 24      # prepare_for_backward, the forward's wrapper, the batched copy back


def _step2(model, opt, step: int):
    x = flambeau.tensor(np.random.default_rng(step).standard_normal((3, 2)).astype(np.float32))
    opt.zero_grad(set_to_none=True)
    (model(x) ** 2).mean().backward()
    opt.step()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_copy_many_tables_each_pairs_addresses_and_sizes(monkeypatch):
    """`triton_copy_many.copy_many`'s host side on fake device arrays: one table and launch per element size,
    holding the sources' then the destinations' addresses and the element counts, in the given order."""
    from flambeau._backends import triton_copy_many as C

    class Arr:
        def __init__(self, ptr, size, itemsize):
            self.data, self.size, self.itemsize = types.SimpleNamespace(ptr=ptr), size, itemsize
            self.device = types.SimpleNamespace(id=0)
    tables, launches = [], []

    def device_table(cupy, cache, key, addresses, numels, chunk, rows, limit):
        tables.append((addresses, numels))
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x1000)), 1
    monkeypatch.setattr(C.multi_tensor, "device_table", device_table)
    monkeypatch.setattr(C, "_cupy", lambda a: None)
    monkeypatch.setattr(C.TL, "compile_kernel", lambda *a, **k: "kernel")
    monkeypatch.setattr(C.TL, "launch", lambda kern, grid, *args: launches.append((kern, grid, args[-1])))
    monkeypatch.setattr(C, "_kernels", {})
    srcs = [Arr(100, 5, 4), Arr(200, 7, 2), Arr(300, 9, 4)]
    dsts = [Arr(1100, 5, 4), Arr(1200, 7, 2), Arr(1300, 9, 4)]
    C.copy_many(srcs, dsts)
    assert sorted(tables) == sorted([(((100, 300), (1100, 1300)), (5, 9)), (((200,), (1200,)), (7,))])
    assert sorted(n for _, _, n in launches) == [1, 2]
    tables.clear()
    C.copy_many(srcs[::2], dsts[::2])
    assert tables == [(((100, 300), (1100, 1300)), (5, 9))]


@pytest.mark.parametrize("as_view", [False, True])
@pytest.mark.parametrize("zero", ["none", "zeros", "accumulate"])
def test_gradients_each_step_equal_pytorchs(world1, as_view, zero):
    """Every step's `.grad` (world size 1: the average is the local gradient) equal PyTorch's for the same
    weights and data, with gradient_as_bucket_view or not, zero_grad(set_to_none=True / False) or no
    zero_grad at all (gradients accumulate: in view mode straight into the buckets), across the bucket
    rebuild; with gradient_as_bucket_view the `.grad` are the bucket views after every step."""
    import torch
    fl_model = _model()
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p, q in zip(fl_model.parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy()))
    model = ddp_module.DistributedDataParallel(fl_model, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=as_view)
    opt, ref_opt = flambeau.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        x = np.random.default_rng(step).standard_normal((6, 8)).astype(np.float32)
        if zero != "accumulate":
            opt.zero_grad(set_to_none=zero == "none")
            ref_opt.zero_grad(set_to_none=zero == "none")
        (model(flambeau.tensor(x)) ** 2).mean().backward()
        (ref(torch.from_numpy(x)) ** 2).mean().backward()
        for p, q in zip(fl_model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        views = {id(v) for b in model.reducer.buckets for v in b.views}
        assert all((id(p.grad) in views) == as_view for p in fl_model.parameters())
        opt.step()
        ref_opt.step()


class _AveragingEngine:
    """The group's host engine with a native average (as NCCL's ncclAvg): records each all-reduce's buffer
    and op and runs it as the host engine's SUM (world size 1: the sum is the average); the rest delegates."""
    native_avg = True

    def __init__(self, engine, in_order: bool, log: list) -> None:
        self.engine, self.calls, self.waited, self.in_order_per_device, self.log = engine, [], [], in_order, log

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def all_reduce(self, buf, op_name: str):
        self.calls.append((buf, op_name))
        self.log.append(("reduce", id(buf)))
        request, outer = self.engine.all_reduce(buf, "SUM"), self

        class Waited:
            def wait(self) -> None:
                outer.waited.append(buf)
                outer.log.append(("wait", id(buf)))
                request.wait()
        return Waited()


@pytest.mark.parametrize("in_order", [False, True])
def test_default_all_reduce_runs_on_the_engine_with_its_native_average(world1, monkeypatch, in_order):
    """Without a comm hook each bucket's all-reduce is issued on the group's engine itself (PyTorch's reducer
    calls its ProcessGroup), on the bucket's flat memory in place: with an engine that averages natively (NCCL)
    the op is AVG and no host division follows; each request is waited for once per step, or, on an engine
    whose operations complete in issue order (NCCL's one stream), only the last-but-one (covering those before
    it) and the last; the copy back of every bucket but the last is issued after the waits covering them and
    before the last's wait; gradients equal the unwrapped model's (world size 1). A comm hook still receives
    GradBuckets."""
    group = dist.GroupMember.WORLD
    log = []
    fake = _AveragingEngine(group.engine_for("cpu"), in_order, log)
    copy_many = ddp_module._HostCopier.copy_many

    def logged_copy_many(srcs, dsts):
        log.append(("copy", len(srcs)))
        copy_many(srcs, dsts)
    monkeypatch.setattr(ddp_module._HostCopier, "copy_many", staticmethod(logged_copy_many))
    monkeypatch.setattr(group, "engine_for", lambda device_type: fake)
    divisions = []
    monkeypatch.setattr(ddp_module, "_avg", lambda arr, n: divisions.append(n))
    plain = _model()
    model = ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    opts = [flambeau.optim.SGD(m.parameters(), lr=0.1) for m in (plain, model)]
    for s in range(3):
        for m, opt in zip((plain, model), opts):
            _step(m, opt, True, s)
        for p, q in zip(plain.parameters(), model.module.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    buckets = model.reducer.buckets
    assert len(buckets) > 2
    flats = [id(b.flat._data) for b in buckets]
    assert [(id(buf), op) for buf, op in fake.calls[-len(buckets):]] == [(f, "AVG") for f in flats]
    assert len(fake.calls) == 3 * len(buckets) and divisions == []
    waited = flats[-2:] if in_order else flats
    assert [id(buf) for buf in fake.waited[-len(waited):]] == waited and len(fake.waited) == 3 * len(waited)
    finish = log[max(i for i, e in enumerate(log) if e[0] == "reduce") + 1:]     # the last step's, after backward
    n_last = len(buckets[-1].params)
    assert finish == [("wait", f) for f in waited[:-1]] + [("copy", len(model.reducer.params) - n_last),
                                                          ("wait", flats[-1]), ("copy", n_last)]
    seen = []
    model.register_comm_hook(None, lambda state, bucket: seen.append(bucket.index()) or
                             ddp_module._default_allreduce(group, bucket))
    _step(model, opts[1], True, 3)
    assert sorted(seen) == list(range(len(buckets)))


def test_cuda_buckets_on_a_host_engine_go_through_the_collective():
    """A cuda bucket in a group whose engine for cuda is a host engine (plain "gloo") is not bound: that engine
    reduces a host copy, which `dist.all_reduce` writes back; an engine of the bucket's device is bound."""
    flat = types.SimpleNamespace(_data=object(), _device=types.SimpleNamespace(type="cuda"))
    for engine, bound in ((types.SimpleNamespace(device_type="cpu"), False),
                          (types.SimpleNamespace(device_type="cuda", native_avg=True, buffer=lambda t: t._data), True)):
        bucket = types.SimpleNamespace(flat=flat, engine=None, buf=None, avg_n=0)
        ddp_module._bind_engine(bucket, types.SimpleNamespace(engine_for=lambda device_type: engine, size=lambda: 2))
        assert (bucket.buf is flat._data and bucket.engine is engine) == bound and bucket.avg_n == 0


def test_in_place_buffers_are_the_gradients_unless_they_share_memory_or_differ_in_layout(world1):
    """A bucket reduced in place (NCCL's grouped all-reduce) reduces the `.grad` arrays themselves when each is
    laid out as its view and no two overlap; otherwise every gradient goes through its view (copied in now,
    copied back once reduced): the same operations, on the same sizes, on every rank either way."""
    model = ddp_module.DistributedDataParallel(flambeau.nn.Linear(4, 3))
    (bucket,) = model.reducer.buckets

    def in_bucket_order(weight_grad, bias_grad):
        return [weight_grad if p.dim() == 2 else bias_grad for p in bucket.params]
    grads = in_bucket_order(flambeau.arange(12.0).view(3, 4), flambeau.arange(3.0) + 20)
    arrays = bucket.in_place_buffers(grads)
    assert [a is g._data for a, g in zip(arrays, grads)] == [True, True] and not bucket.staged
    base = flambeau.arange(12.0)
    for grads in (in_bucket_order(base.view(3, 4), base[:3]),                       # the bias's inside the weight's
                  in_bucket_order(flambeau.arange(12.0).view(4, 3).t(), flambeau.ones(3))):   # a transposed one
        arrays = bucket.in_place_buffers(grads)
        assert arrays is bucket.arrays and bucket.staged and bucket.reducing is grads
        for view, g in zip(bucket.views, grads):
            np.testing.assert_array_equal(view.numpy(), g.numpy())


class _InFlightEngine(_AveragingEngine):
    """`_AveragingEngine` with NCCL's grouped in-place all-reduce, whose results land only when waited for:
    until then the reduced arrays hold NaN (a read of an unwaited gradient sees them, and so does an optimizer
    stepping on one). Requests complete in issue order, as on NCCL's one stream: a wait completes every
    request issued before it too."""

    def __init__(self, engine, log: list) -> None:
        super().__init__(engine, True, log)
        self.in_flight = []                  # [(arrays, their results)] in issue order

    def all_reduce_many(self, bufs: list, op_name: str):
        assert op_name == "AVG"
        self.log.append(("reduce", len(self.in_flight)))
        self.in_flight.append((bufs, [b.copy() for b in bufs]))    # world size 1: the average is the array
        for b in bufs:
            b[...] = np.nan
        request, outer = len(self.in_flight) - 1, self

        class InFlight:
            def wait(self) -> None:
                outer.log.append(("wait", request))
                for bufs, results in outer.in_flight[:request + 1]:
                    for b, r in zip(bufs, results):
                        b[...] = r
                    results.clear()
        return InFlight()


def _finite(t) -> bool:
    return bool(np.isfinite(t._data).all())


@pytest.mark.parametrize("user_hook", [False, True])
def test_last_buckets_are_waited_for_when_their_gradients_are_used(world1, monkeypatch, user_hook):
    """The buckets that complete with the last gradients backward computes (here the first layer's, in a
    bucket or two of their own) are not waited for when backward returns: their parameters are pending
    (`flambeau._pending_grads`) and the first read of one of their `.grad` waits (one wait: the engine
    completes in order); every other bucket was waited for at the end of backward. A second backward adds
    into the pending gradients only after their wait, the optimizer steps on them only after it, and both
    give the unwrapped model's values. With a hook of the user's on one of those parameters, or
    FLAMBEAU_DDP_DEFER_WAIT=0, every bucket is waited for at the end of backward."""
    from flambeau import _pending_grads
    group = dist.GroupMember.WORLD
    log = []
    fake = _InFlightEngine(group.engine_for("cpu"), log)
    monkeypatch.setattr(group, "engine_for", lambda device_type: fake)
    plain, model = _model(), ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    first = list(model.module[0].parameters())
    if user_hook:
        first[1].register_hook(lambda g: None)
    opts = [flambeau.optim.SGD(m.parameters(), lr=0.1) for m in (plain, model)]
    x = flambeau.tensor(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    for s in range(3):              # (the buckets are rebuilt in arrival order after the first step)
        for m, opt in zip((plain, model), opts):
            opt.zero_grad()
            (m(x) ** 2).mean().backward()
        buckets = model.reducer.buckets
        final = [b for b in buckets if {id(p) for p in first} & {id(p) for p in b.params}]
        assert len(buckets) > 2 and final == buckets[-len(final):]
        pending = set(_pending_grads.waits)
        if user_hook:
            assert not pending and all(_finite(p._grad) for p in model.parameters())
        else:
            assert pending == {id(p) for b in final for p in b.params}
            assert all(_finite(p._grad) == (id(p) not in pending) for p in model.parameters())
            assert log[-1] == ("wait", len(fake.in_flight) - len(final) - 1)    # the last of the others
        if s == 1:                  # a second backward adds into them: after their wait
            for m in (plain, model.module):
                (m(x) ** 2).mean().backward()
            assert not _pending_grads.waits
        for p, q in zip(plain.parameters(), model.module.parameters()):
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-6)   # `.grad` waits
        assert not _pending_grads.waits and log[-1][0] == "wait"
        for opt in opts:
            opt.step()
        for p, q in zip(plain.parameters(), model.module.parameters()):
            np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-6)
    opts[1].zero_grad()
    (model(x) ** 2).mean().backward()
    assert bool(_pending_grads.waits) != user_hook
    opts[1].step()                  # the optimizer waits too
    assert not _pending_grads.waits and all(_finite(p) for p in model.parameters())
    model.reducer.defer = False
    opts[1].zero_grad()
    (model(x) ** 2).mean().backward()
    assert not _pending_grads.waits and all(_finite(p._grad) for p in model.parameters())


def test_defer_wait_setting_is_checked(monkeypatch):
    monkeypatch.setenv("FLAMBEAU_DDP_DEFER_WAIT", "yes")
    with pytest.raises(ValueError, match="FLAMBEAU_DDP_DEFER_WAIT='yes'"):
        ddp_module._defer_from_env()
    monkeypatch.setenv("FLAMBEAU_DDP_DEFER_WAIT", "0")
    assert ddp_module._defer_from_env() is False


def test_pending_groups_partition_in_their_order_and_settle_once():
    from flambeau import _pending_grads
    a, b, c, d = (flambeau.zeros(1) for _ in range(4))
    waited = []
    late, early = (_pending_grads.Pending(ps, order, lambda n=name: waited.append(n))
                   for ps, order, name in (([a, c], 5, "late"), ([d], 1, "early")))
    try:
        for g in (late, early):
            _pending_grads.defer(g)
        assert _pending_grads.partition([a, b, c, d]) == [(None, [b]), (early, [d]), (late, [a, c])]
        _pending_grads.settle(c)
        _pending_grads.settle(a)
        assert waited == ["late"] and set(_pending_grads.waits) == {id(d)}
        d.grad = None                   # replacing a pending gradient waits first
        assert waited == ["late", "early"] and not _pending_grads.waits
    finally:
        _pending_grads.waits.clear()


def test_a_first_use_on_another_stream_makes_backwards_stream_wait_too(world1, monkeypatch):
    """A pending gradient first read under another stream: that stream waits for the reduction, and so does
    the stream backward ran on (where the optimizer will read it, as after PyTorch's backward); read under
    backward's stream, one wait. (Fake cuda streams: the engine's requests wait on the current one.)"""
    from flambeau import _pending_grads

    class Stream:
        current = None

        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

        def __enter__(self):
            self.before, Stream.current = Stream.current, self
            return self

        def __exit__(self, *exc) -> None:
            Stream.current = self.before
    backward, side = Stream(1), Stream(2)
    Stream.current = backward
    cuda = types.SimpleNamespace(get_current_stream=lambda: Stream.current)
    monkeypatch.setattr(ddp_module, "_backends", types.SimpleNamespace(get=lambda name: types.SimpleNamespace(
        xp=types.SimpleNamespace(cuda=cuda))))
    group = dist.GroupMember.WORLD
    fake = _InFlightEngine(group.engine_for("cpu"), [])
    monkeypatch.setattr(group, "engine_for", lambda device_type: fake)
    many, waited = fake.all_reduce_many, []

    def on_device(bufs, op_name):
        request = many(bufs, op_name)
        wait = request.wait
        request.waits_on_device = True
        request.wait = lambda: (waited.append(Stream.current.ptr), wait())
        return request
    monkeypatch.setattr(fake, "all_reduce_many", on_device)
    model = ddp_module.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    x = flambeau.tensor(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    for first_use in (side, backward, side):
        model.zero_grad()
        (model(x) ** 2).mean().backward()
        assert _pending_grads.waits
        del waited[:]
        with first_use:
            [p.grad for p in model.parameters()]
        assert waited == ([2, 1] if first_use is side else [1]) and not _pending_grads.waits
