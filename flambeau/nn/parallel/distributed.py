"""DistributedDataParallel: one model replica per process, gradients averaged by bucketed async all-reduce.

At construction the parameters are checked to agree across ranks and rank 0's parameters and buffers are
broadcast. Parameters (in reverse registration order, roughly the order backward produces their
gradients) are packed into buckets of `bucket_cap_mb` (the first bucket 1 MiB, as PyTorch's), each with a
flat gradient buffer made once. A hook after each gradient accumulation counts the parameter ready; a bucket
whose parameters are all ready has their gradients copied into its buffer (one batched copy: one
`triton_copy_many` launch on cuda, array copies on the host; nothing for gradients that already are its views)
and its all-reduce started asynchronously while backward goes on (buckets start in the same order on every
rank; on cuda NCCL runs on its own stream). Without a comm hook the all-reduce is issued on the group's engine
itself, as PyTorch's reducer calls its ProcessGroup: no collective argument checks, Work or Future per bucket.
When the last bucket has started, the reductions are waited for (on NCCL, whose one stream per device completes
them in order, two waits a step: the last-but-one bucket's, covering those before it, and the last's) and
the averaged gradients copied back (two batched copies a step: every bucket's but the last, issued before the
last reduction is waited for so that on cuda it overlaps that reduction, then the last's; with
`gradient_as_bucket_view=True` the parameters' `.grad` are views of the buckets: no copy back, and with
`zero_grad(set_to_none=False)` no copy in either). Per step the reducer runs no Python per parameter besides its
hook: the checks are maps over lists made with the buckets. `register_comm_hook` replaces the all-reduce (see
`flambeau.distributed.algorithms.ddp_comm_hooks.default_hooks` for fp16/bf16 compression).

As PyTorch's reducer: the order gradients arrive in during the first synced backward is recorded and, at the
next forward, the buckets are rebuilt once in that order (rank 0's order, broadcast), unless
`find_unused_parameters` without `static_graph`. With `static_graph=True` the first iteration finds the
unused parameters (graph walk, used map all-reduced) and later iterations reuse that answer: no graph walk,
no used-map all-reduce, the unused ones marked ready as backward starts.
"""
from __future__ import annotations

import contextlib
import itertools
import operator
import os
import threading

from ... import _backends, _dtype, _pending_grads, _state
from ..._backends import multi_tensor
from ..._ops import functions as torch       # the operator functions flambeau exports
from ..._device import device as Device
from ..._tensor import Tensor
from ...autograd import engine as _engine
from ...autograd.graph import reachable_leaves
from ... import distributed as dist
from ...distributed.distributed_c10d import _avg, _buf
from ..modules.module import Module

__all__ = ["DistributedDataParallel", "GradBucket"]

DEFAULT_BUCKET_CAP_MB = 25
FIRST_BUCKET_BYTES = 1024 * 1024
MB = 1024 * 1024
_ARRAY_NATIVE_KINDS = "biufc"     # NumPy dtype kinds whose copies CuPy and NumPy both run (not bfloat16's 'V')
CUDA_MEMCPY_DEVICE_TO_DEVICE = 3  # cudaMemcpyKind (driver_types.h)
_data_of, _grad_of, _version_of = (operator.attrgetter(a) for a in ("_data", "_grad", "_version"))
_layout_of = operator.attrgetter("__class__", "dtype", "shape", "strides")
_nbytes_of = operator.attrgetter("nbytes")


def _defer_from_env() -> bool:
    value = os.environ.get("FLAMBEAU_DDP_DEFER_WAIT", "1")
    if value not in ("0", "1"):
        raise ValueError(f"FLAMBEAU_DDP_DEFER_WAIT={value!r}: expected 1 (leave the reductions of the buckets that "
                         f"complete with backward's last gradients to be waited for when those gradients are "
                         f"used) or 0 (wait for every bucket when backward ends, as PyTorch's reducer)")
    return value == "1"


DEFER_LAST_WAIT = _defer_from_env()


class GradBucket:
    """What a comm hook receives: the flattened gradients of one bucket (PyTorch's GradBucket)."""

    def __init__(self, index: int, buffer, params: list, is_last: bool) -> None:
        self._index, self._buffer, self._params, self._is_last = index, buffer, params, is_last

    def index(self) -> int:
        return self._index

    def buffer(self):
        return self._buffer

    def is_last(self) -> bool:
        return self._is_last

    def parameters(self) -> list:
        return list(self._params)

    def gradients(self) -> list:
        out, start = [], 0
        for p in self._params:
            out.append(self._buffer[start:start + p.numel()].view(p.shape))
            start += p.numel()
        return out

    def set_buffer(self, buffer) -> None:
        self._buffer = buffer


class _HostCopier:
    """The host engine's `copy_many`: one array copy per pair (the cuda one is `triton_copy_many`)."""

    @staticmethod
    def copy_many(srcs: list, dsts: list) -> None:
        for s, d in zip(srcs, dsts):
            d[...] = s


def _copier_for(flat):
    """What copies a bucket's gradients in and out as one call: `triton_copy_many` on cuda (one launch),
    array copies on the host; None (a `copy_` per gradient) for host dtypes NumPy has no copy kernels for."""
    batched = multi_tensor.copy_many_for(flat._device)
    if batched is not None:
        return batched
    if flat._device.type == "cpu" and flat._data.dtype.kind in _ARRAY_NATIVE_KINDS:
        return _HostCopier
    return None


class _Bucket:
    """One bucket: its parameters, the flat buffer their gradients are reduced in (made once), views of
    that buffer in the parameters' shapes, and what the per-step copies compare against and use, worked
    out once: the views' arrays and their (array type, dtype, shape, strides). The views share the flat
    buffer's version counter (as PyTorch's views their base's)."""

    def __init__(self, index: int, params: list, indices: list) -> None:
        self.index, self.params, self.indices = index, params, indices
        self.numel = sum(p.numel() for p in params)
        self.pending = len(params)
        self.future = self.request = None    # the comm hook's Future, or the default all-reduce's engine request
        self.buf = None                      # flat's memory as the group's engine takes it (None: not directly)
        with _no_grad():
            self.flat = torch.zeros(self.numel, dtype=params[0].dtype, device=params[0].device)
            self.views, start = [], 0
            for p in params:
                self.views.append(self.flat[start:start + p.numel()].view(p.shape))
                start += p.numel()
        self.copier = _copier_for(self.flat)
        self.arrays = list(map(_data_of, self.views))
        self.layouts = list(map(_layout_of, self.arrays))
        self.engine = self.buf = None        # set by `_Reducer`: the default all-reduce's engine and buffer
        self.avg_n = 0
        self.in_place = False                # set by `_Reducer`: the default all-reduce may run on the gradients
        self.reducing = None                 # the gradients being reduced in their own memory this step
        self.burst = 0                       # backward's count of applied nodes when this bucket started
        self.staged = False                  # ... or through the views (copied in, to be copied back)
        self.address_of = operator.attrgetter("data.ptr" if hasattr(self.arrays[0].data, "ptr") else "ctypes.data")

    def batch(self, grads: list) -> list | None:
        """The arrays of `grads` (one per parameter) when one `copier.copy_many` moves all of them: every
        gradient present and laid out exactly as its view (checked by maps over the list: no Python per
        gradient; a gradient that is its view is copied onto itself, which changes nothing); else None."""
        if self.copier is None:
            return None
        try:
            arrays = list(map(_data_of, grads))
        except AttributeError:               # a parameter without a gradient (None has no _data)
            return None
        return arrays if list(map(_layout_of, arrays)) == self.layouts else None

    def in_place_buffers(self, grads: list) -> list:
        """What a grouped all-reduce of this bucket reduces in place, one array per parameter (the same
        operations on every rank): the gradients' own memory when every one is laid out as its view and no
        two share memory; else the views, every gradient copied in (`staged`: copied back once reduced).
        No Python per gradient: maps over the list, a sort of the address spans."""
        arrays = self.batch(grads)
        if arrays is not None:
            starts = list(map(self.address_of, arrays))
            spans = list(itertools.chain.from_iterable(sorted(zip(starts, map(operator.add, starts,
                                                                             map(_nbytes_of, arrays))))))
            if all(map(operator.le, spans[1:-1:2], spans[2::2])):     # each span ends before the next starts
                self.reducing, self.staged = grads, False
                return arrays
        for g, view in zip(grads, self.views):
            if g is not None and g is not view:
                _copy_into(view, g)
        self.reducing, self.staged = grads, True
        return self.arrays


def _assign_buckets(params: list, order: list, cap_bytes: int, first_bytes: int) -> list:
    """Parameters (indices into `params`), in the order given, into buckets of one dtype and device, closing
    each at its byte cap."""
    buckets, open_ = [], {}
    for i in order:
        p = params[i]
        key = (p.dtype, str(p.device))
        cur = open_.setdefault(key, [[], 0])
        cur[0].append(i)
        cur[1] += p.numel() * p.element_size()
        limit = first_bytes if not buckets else cap_bytes
        if cur[1] >= limit:
            buckets.append(cur[0])
            del open_[key]
    buckets.extend(c[0] for c in open_.values())
    return [_Bucket(b, [params[i] for i in idx], idx) for b, idx in enumerate(buckets)]


def _copy_into(dst, src) -> None:
    """dst[...] = src (same shape and dtype) on the arrays themselves, off the dispatcher: the reducer's copies
    that do not go through a bucket's batched copy (a gradient of another layout). Contiguous device arrays
    are one cudaMemcpyAsync on the current stream (any dtype, bfloat16 too); host arrays are a NumPy copy;
    what is left (strided device arrays of dtypes CuPy has no kernels for) goes through `copy_`."""
    d, s = dst._data, src._data
    if dst._device.type == "cuda" and d.flags.c_contiguous and s.flags.c_contiguous and d.dtype == s.dtype:
        cuda = _backends.get("cuda").xp.cuda
        cuda.runtime.memcpyAsync(d.data.ptr, s.data.ptr, d.nbytes, CUDA_MEMCPY_DEVICE_TO_DEVICE,
                                 cuda.get_current_stream().ptr)
        dst._version[0] += 1
    elif d.dtype.kind in _ARRAY_NATIVE_KINDS:
        d[...] = s
        dst._version[0] += 1
    else:
        with _no_grad():
            dst.copy_(src)


def _zero(t) -> None:
    with _no_grad():
        t.zero_()


def _default_allreduce(group, bucket: GradBucket):
    return dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()


def _bind_engine(bucket: _Bucket, group) -> None:
    """Prepare `bucket`'s default all-reduce to run straight on `group`'s engine for its device, as PyTorch's
    reducer calls its ProcessGroup rather than the Python collective (no argument checks, Work or Future per
    bucket and step): the engine, the flat buffer's memory as that engine takes it, and the group size to
    divide by after a SUM when the engine has no native average (0: it averages). Left unset where the engine
    would reduce a copy (cuda tensors on a host engine): that bucket goes through `dist.all_reduce`."""
    try:
        engine = group.engine_for(bucket.flat._device.type)
    except RuntimeError:
        return
    if getattr(engine, "device_type", "cpu") != bucket.flat._device.type:
        return
    buf = _buf(engine, bucket.flat)
    if buf is bucket.flat._data:
        bucket.engine, bucket.buf = engine, buf
        bucket.avg_n = 0 if getattr(engine, "native_avg", False) else group.size()


def _one_ordered_engine(buckets: list) -> bool:
    """Whether every bucket's default all-reduce runs on one engine that completes the operations on a device
    in the order they were issued (`in_order_per_device`: NCCL's one stream per device), on one device, averaged
    by the engine itself (no host division to wait for): then a wait for a later bucket covers the earlier."""
    engine = buckets[0].engine
    return len(buckets) > 2 and getattr(engine, "in_order_per_device", False) and all(
        b.engine is engine and b.buf is not None and not b.avg_n and b.flat._device == buckets[0].flat._device
        for b in buckets)


class _Reducer:
    """The per-iteration state: which parameters are ready, which buckets have started.

    Each parameter's hook (after its gradient is accumulated) only counts it ready in its bucket; a bucket
    whose gradients are all in has them copied into its flat buffer (one batched copy, none for gradients
    that already are its views) and its reduction started at once, asynchronously (on cuda the engine runs
    it on its NCCL stream, so it overlaps the rest of backward). When the last bucket has started the
    reductions are waited for (on cuda: the compute stream waits, the host goes on) and the averaged
    gradients copied back (one batched copy), or with `gradient_as_bucket_view` the parameters' `.grad`
    are the bucket views themselves. Nothing is done per parameter in Python on the usual path: the
    per-step work is a few maps over each bucket's lists."""

    def __init__(self, params: list, group, cap_bytes: int, first_bytes: int, find_unused: bool,
                 as_view: bool, static_graph: bool = False) -> None:
        self.params, self.group, self.find_unused, self.as_view = params, group, find_unused, as_view
        self.cap_bytes, self.first_bytes, self.static_graph = cap_bytes, first_bytes, static_graph
        self._set_buckets(_assign_buckets(params, list(reversed(range(len(params)))), cap_bytes, first_bytes))
        self.index_of = {id(p): i for i, p in enumerate(params)}
        self.arrival, self.has_rebuilt = [], False       # gradient arrival order (param indices), once
        self.recording = self.should_rebuild()           # whether hooks note the arrival order
        self.static_unused, self.static_used_map = None, None   # static_graph: the first iteration's answer
        self.hook_state, self.hook = group, _default_allreduce
        self.active, self.next_bucket, self.ready = False, 0, [False] * len(params)
        self.some_unused = False                          # parameters marked ready without a gradient
        self.pending = None                  # the last step's buckets whose waits were left to their use
        self.defer = DEFER_LAST_WAIT
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]

    def _set_buckets(self, buckets: list) -> None:
        self.buckets = buckets
        for b in buckets:
            _bind_engine(b, self.group)
            b.in_place = b.buf is not None and not b.avg_n and hasattr(b.engine, "all_reduce_many") and \
                not self.as_view and not self.find_unused
        self.ordered_waits = _one_ordered_engine(buckets)
        self.slot_of = {id(p): (b, v) for b in buckets for p, v in zip(b.params, b.views)}
        self.bucket_of = [None] * len(self.params)       # parameter index -> its bucket
        for b in buckets:
            for i in b.indices:
                self.bucket_of[i] = b

    def _hook(self, i: int):
        """Parameter i's post-accumulate-grad hook: it is ready; its bucket starts when it is complete."""
        def ddp_gradient_ready(param) -> None:
            if not self.active:
                return
            self.ready[i] = True
            if self.recording:
                self.arrival.append(i)
            bucket = self.bucket_of[i]
            bucket.pending -= 1
            if not bucket.pending:          # the bucket is complete: it and the ones after it may start
                self._launch_ready()
        return ddp_gradient_ready

    def should_rebuild(self) -> bool:
        """PyTorch's `should_rebuild_buckets`: once, unless unused parameters are searched every iteration."""
        return (self.static_graph or not self.find_unused) and not self.has_rebuilt

    def needs_graph_walk(self) -> bool:
        """Whether the next backward must find the unused parameters by walking the autograd graph."""
        return self.find_unused and not (self.static_graph and self.static_unused is not None) \
            or self.static_graph and self.static_unused is None

    def rebuild_buckets(self) -> bool:
        """PyTorch's `_rebuild_buckets`: after the first synced backward, buckets in gradient-arrival order
        (rank 0's, broadcast so every rank reduces the same buckets in the same order); True if rebuilt."""
        if not self.should_rebuild() or not self.arrival:
            return False
        seen = set(self.arrival)
        order = self.arrival + [i for i in range(len(self.params)) if i not in seen]   # never ready: last
        order_t = torch.tensor(order, dtype=_dtype.int64, device=self.params[0].device)
        dist.broadcast(order_t, src=dist.get_global_rank(self.group, 0), group=self.group)
        old = self.slot_of
        self._set_buckets(_assign_buckets(self.params, order_t.tolist(), self.cap_bytes, self.first_bytes))
        if self.as_view:                 # the .grad that were views of the old buckets move into the new ones
            for p in self.params:
                if p.grad is not None and p.grad is old[id(p)][1]:
                    view = self.slot_of[id(p)][1]
                    _copy_into(view, p.grad)
                    p.grad = view
        self.arrival, self.has_rebuilt = [], True
        self.recording = self.should_rebuild()
        return True

    def settle(self) -> None:
        """Wait for the reductions the last backward left pending (`_finalize`), if not waited for yet."""
        if self.pending is not None:
            self.pending.settle()
            self.pending = None

    def prepare_for_forward(self) -> None:
        if self.pending is not None:
            self.settle()
        if self.active:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. This error "
                "indicates that your module has parameters that were not used in producing loss. You can enable "
                "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
                "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
                "participate in calculating loss. Parameters that did not receive a gradient: "
                + ", ".join(str(i) for i, p in enumerate(self.params) if self.bucket_of[i].pending
                            and not self.ready[i]))

    def prepare_for_backward(self, outputs: list) -> None:
        if self.pending is not None:
            self.settle()
        for b in self.buckets:
            b.pending, b.future, b.request = len(b.params), None, None
        self.active, self.next_bucket, self.ready = True, 0, [False] * len(self.params)
        self.some_unused = False
        if self.needs_graph_walk():
            reached = _reachable_leaves(outputs)
            unused = [p for p in self.params if id(p) not in reached]
            if self.static_graph:
                self.static_unused = unused
        elif self.static_graph:
            unused = self.static_unused
        else:
            return
        self.some_unused = bool(unused)
        for p in unused:
            _zero(self.slot_of[id(p)][1])
            self._mark_ready(p)

    def _mark_ready(self, param) -> None:
        bucket = self.slot_of[id(param)][0]
        bucket.pending -= 1
        if not bucket.pending:
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Start the complete buckets from the next one on, in order; once all have started, finish."""
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self._launch(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets):
            self._finalize()

    def _launch(self, bucket: _Bucket) -> None:
        """Copy the bucket's gradients into its flat buffer and start its reduction: the default average on
        the engine itself (`_bind_engine`), else the comm hook (or `dist.all_reduce`) on a GradBucket. On an
        engine that reduces many arrays in one operation (NCCL's group: one kernel) the default average runs
        on the gradients themselves, no copy in or back (`_Bucket.in_place_buffers`); not with
        `find_unused_parameters` or a static graph, whose unused parameters reduce their views' zeros."""
        bucket.burst = _engine.nodes_applied[0]
        if bucket.in_place and self.hook is _default_allreduce and not self.static_graph:
            bucket.request = bucket.engine.all_reduce_many(bucket.in_place_buffers(list(map(_grad_of, bucket.params))),
                                                           "AVG")
            return
        self._copy_in(bucket)
        if bucket.buf is not None and self.hook is _default_allreduce:
            bucket.request = bucket.engine.all_reduce(bucket.buf, "SUM" if bucket.avg_n else "AVG")
            return
        grad_bucket = GradBucket(bucket.index, bucket.flat, bucket.params, bucket.index == len(self.buckets) - 1)
        bucket.future = self.hook(self.hook_state, grad_bucket)

    def _copy_in(self, bucket: _Bucket) -> None:
        """The bucket's gradients into its views: nothing for those that are the views, one batched copy
        when every one is laid out as its view, else a copy each (an unused parameter, with no gradient,
        has its view zeroed already). With `gradient_as_bucket_view` the views become the `.grad`."""
        grads = list(map(_grad_of, bucket.params))
        if self.some_unused:            # those marked ready without a gradient keep the `.grad` they have
            ready = self.ready
            grads = [g if ready[i] else None for g, i in zip(grads, bucket.indices)]
        elif all(map(operator.is_, grads, bucket.views)):
            return
        arrays = bucket.batch(grads)
        if arrays is not None:
            bucket.copier.copy_many(arrays, bucket.arrays)
            bucket.flat._version[0] += 1    # the views' counter
        else:
            for g, view in zip(grads, bucket.views):
                if g is not None and g is not view:
                    _copy_into(view, g)
        if self.as_view:
            for p, g, view in zip(bucket.params, grads, bucket.views):
                if g is not None:
                    p._grad = view          # the view has the parameter's dtype, shape and device

    def _finalize(self) -> None:
        self.active = False
        globally_used = self.static_used_map
        if self.find_unused and not self.static_graph or self.static_graph and globally_used is None:
            used = torch.tensor(self.ready, dtype=_dtype.int32, device=self.params[0].device)
            dist.all_reduce(used, group=self.group)
            globally_used = used.tolist()
            if self.static_graph:
                self.static_used_map = globally_used
        back: dict = {}                 # copier -> (sources, destinations, versions): one batched copy each
        deferred = self._deferrable(globally_used)
        waited = self.buckets[:len(self.buckets) - len(deferred)]
        if waited:
            *head, last = waited
            covered = self.ordered_waits and self.hook is _default_allreduce and bool(head)
            if covered:                 # the engine completes a device's operations in issue order: waiting for
                head[-1].request.wait()     # the last-but-one bucket's all-reduce covers the ones before it
            for b in head:
                self._reduced(b, not covered, globally_used, back)
            _copy_back(back)            # the copy back of these runs while the last reduction still does
            self._reduced(last, True, globally_used, back)
            _copy_back(back)
        if deferred:
            self._defer(deferred)

    def _deferrable(self, globally_used: list | None) -> list:
        """The buckets whose waits are left to the first use of their gradients (`_pending_grads`): those
        started after the last node backward applied (with its gradients: GPT-2's embedding and first layer)
        whose average ran on the gradients themselves. None with unused parameters searched, a comm hook,
        `FLAMBEAU_DDP_DEFER_WAIT=0`, or a hook of the user's on one of their parameters (it may have kept
        the gradient, which it would read unwaited)."""
        last = self.buckets[-1]
        if not self.defer or last.reducing is None or globally_used is not None or \
                self.hook is not _default_allreduce:
            return []
        tail = []
        for b in reversed(self.buckets):
            if b.burst != last.burst:
                break
            if b.request is None or b.avg_n or b.staged or b.reducing is None or not all(
                    not p._hooks and len(p.__dict__.get("_post_acc_hooks", ())) == 1 for p in b.params):
                return []
            tail.append(b)
        return tail[::-1]

    def _defer(self, buckets: list) -> None:
        """List `buckets`' parameters as pending (`_pending_grads`): the first use of one of their gradients
        waits for these reductions (one wait on an engine that completes them in order, else one each)."""
        kept = []
        for b in buckets:
            b.flat._version[0] += 1
            grads, b.reducing = b.reducing, None
            for version in map(_version_of, grads):
                version[0] += 1
            kept.append(grads)
        requests = [b.request for b in buckets]
        if self.ordered_waits:
            requests = requests[-1:]
        cuda = _backends.get("cuda").xp.cuda if any(getattr(r, "waits_on_device", False) for r in requests) else None
        backward_stream = cuda.get_current_stream() if cuda is not None else None

        def wait() -> None:
            """The stream current at the first use waits, and backward's stream too: as after PyTorch's
            backward, the gradients are final on the stream backward ran on, whichever stream used them first."""
            for r in requests:
                r.wait()
            if backward_stream is not None and cuda.get_current_stream().ptr != backward_stream.ptr:
                with backward_stream:
                    for r in requests:
                        r.wait()
            kept.clear()                # the gradients' memory is released on the streams that waited
        self.pending = _pending_grads.Pending([p for b in buckets for p in b.params], buckets[0].index, wait)
        _pending_grads.defer(self.pending)

    def _reduced(self, b: _Bucket, wait: bool, globally_used: list | None, back: dict) -> None:
        """Bucket `b`'s reduction has completed (after its wait when `wait`): its averaged gradients go back
        to the parameters (`_copy_out`, batched into `back`) or, with unused parameters searched, to those some
        rank used (`_copy_out_used`)."""
        request = b.request
        if request is not None:         # the default average on the engine (`_launch`)
            if wait:
                request.wait()
            if b.avg_n:
                _avg(b.buf, b.avg_n)
            b.flat._version[0] += 1
            grads, b.reducing = b.reducing, None
            if grads is not None and not b.staged:      # reduced in the gradients' own memory
                for version in map(_version_of, grads):
                    version[0] += 1
                return
        else:
            value = b.future.wait()
            flat = value[0] if isinstance(value, (list, tuple)) else value
            if flat is not b.flat:
                _copy_into(b.flat, flat)
        if globally_used is None:
            self._copy_out(b, back)
        else:
            self._copy_out_used(b, globally_used)

    def _copy_out(self, bucket: _Bucket, back: dict) -> None:
        """Every parameter of the bucket had its gradient reduced: the averaged views become the `.grad`
        (`gradient_as_bucket_view`), or are copied back into them (added to `back`, the step's one batched
        copy back, when every gradient is laid out as its view), or cloned for a parameter that has none."""
        params, views = bucket.params, bucket.views
        grads = list(map(_grad_of, params))
        if self.as_view:
            if not all(map(operator.is_, grads, views)):
                for p, view in zip(params, views):
                    p._grad = view
            return
        arrays = bucket.batch(grads)
        if arrays is not None:
            srcs, dsts, versions = back.setdefault(bucket.copier, ([], [], []))
            srcs.extend(bucket.arrays)
            dsts.extend(arrays)
            versions.extend(map(_version_of, grads))
            return
        for p, g, view in zip(params, grads, views):
            if g is None:
                with _no_grad():
                    p.grad = view.clone()
            elif g is not view:
                _copy_into(g, view)

    def _copy_out_used(self, bucket: _Bucket, globally_used: list) -> None:
        """`_copy_out` when unused parameters are searched: those no rank used keep the `.grad` they had."""
        for p, view in zip(bucket.params, bucket.views):
            if not globally_used[self.index_of[id(p)]]:
                continue
            grad = p.grad
            if grad is view:
                continue
            if self.as_view:
                p.grad = view
            elif grad is None:
                with _no_grad():
                    p.grad = view.clone()
            else:
                _copy_into(grad, view)


def _copy_back(back: dict) -> None:
    """Run and empty the batched copies `_copy_out` gathered (copier -> sources, destinations, versions)."""
    for copier, (srcs, dsts, versions) in back.items():
        copier.copy_many(srcs, dsts)
        for version in versions:
            version[0] += 1
    back.clear()


def _reachable_leaves(outputs: list) -> set:
    """ids of the leaf tensors the autograd graph of `outputs` reaches."""
    roots = [o.grad_fn for o in outputs if getattr(o, "grad_fn", None) is not None]
    return {id(node.variable) for node in reachable_leaves(roots)}


def _tensors_in(obj) -> list:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_in(v)]
    return []


def _to_device(obj, device):
    """Every tensor in `obj` (tuples, named tuples, lists, dicts, nested) on `device`; the rest as it is."""
    if isinstance(obj, Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=True)
    if isinstance(obj, tuple):
        moved = [_to_device(x, device) for x in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    if isinstance(obj, list):
        return [_to_device(x, device) for x in obj]
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


class DistributedDataParallel(Module):
    """Data parallelism over the processes of `process_group` (PyTorch's signature)."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None) -> None:
        super().__init__()
        if process_group is None and not dist.is_initialized():
            raise ValueError("Default process group has not been initialized, please make sure to call "
                             "init_process_group.")
        self.module = module
        self.process_group = process_group or dist.GroupMember.WORLD
        devices = {p.device for p in module.parameters()}
        if device_ids and (len(devices) != 1 or next(iter(devices)).type == "cpu"):
            raise ValueError("DistributedDataParallel device_ids and output_device arguments only work with "
                             "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                             f"{device_ids}, output_device {output_device}, and module parameters {devices}.")
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        first = device_ids[0] if device_ids else None
        self._input_device = None if first is None else Device("cuda", first) if isinstance(first, int) else \
            first if isinstance(first, Device) else Device(first)
        self.broadcast_buffers, self.find_unused_parameters = broadcast_buffers, find_unused_parameters
        self.static_graph, self.gradient_as_bucket_view = static_graph, gradient_as_bucket_view
        self.require_backward_grad_sync = True
        seen, params = set(), []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient.")
        self._verify_same_model(params)
        self.modules_buffers = list(module.buffers())     # PyTorch's: found once, synced each forward if any
        if init_sync:
            self._sync_module_states()
        cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MB)
        first = FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap       # PyTorch: a given cap applies to all
        self.bucket_bytes_cap, self.first_bucket_bytes_cap = cap, first    # read by the compiler's DDPOptimizer
        self.reducer = _Reducer(params, self.process_group, cap, first, find_unused_parameters,
                                gradient_as_bucket_view, static_graph)

    def _verify_same_model(self, params: list) -> None:
        mine = [(tuple(p.shape), str(p.dtype)) for p in params]
        everyone = [None] * dist.get_world_size(self.process_group)
        dist.all_gather_object(everyone, mine, group=self.process_group)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise RuntimeError(f"DDP expects same model across all ranks, but rank {r} has parameters "
                                   f"{theirs} while rank 0 has {everyone[0]}")

    def _sync_module_states(self) -> None:
        src = dist.get_global_rank(self.process_group, 0)
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            with _no_grad():
                dist.broadcast(t.detach() if t.requires_grad else t, src=src, group=self.process_group)

    def will_sync_module_buffers(self) -> bool:
        return self.broadcast_buffers and len(self.modules_buffers) > 0

    def _sync_buffers(self) -> None:
        """Rank 0's buffers to every rank: one broadcast per dtype and device (a group's buffers flattened into
        one tensor when there are several, as PyTorch's broadcast_coalesced)."""
        src = dist.get_global_rank(self.process_group, 0)
        groups: dict = {}
        for b in self.modules_buffers:
            groups.setdefault((b.dtype, str(b.device)), []).append(b)
        for bufs in groups.values():
            if len(bufs) == 1:
                dist.broadcast(bufs[0], src=src, group=self.process_group)
                continue
            with _no_grad():
                flat = torch.cat([b.reshape(-1) for b in bufs])
                dist.broadcast(flat, src=src, group=self.process_group)
                start = 0
                for b in bufs:
                    _copy_into(b, flat[start:start + b.numel()].view(b.shape))
                    start += b.numel()

    def _pre_forward(self, sync: bool) -> None:
        """PyTorch's `_pre_forward`: the reducer's one-time bucket rebuild and the buffer broadcast; from
        here to `_post_forward` this module is the thread's active DDP module (`_get_active_ddp_module`):
        a graph the compiler captures meanwhile (the wrapped module compiled, `DDP(compile(model))`) is
        split at this module's bucket boundaries, as PyTorch's dynamo does."""
        _ACTIVE.module = self
        if sync:
            self.reducer.prepare_for_forward()
            self.reducer.rebuild_buckets()
        if _state.tls.grad_enabled and self.will_sync_module_buffers():
            self._sync_buffers()

    def _post_forward(self, sync: bool, out) -> None:
        _ACTIVE.module = None
        if sync:
            self.reducer.prepare_for_backward(_tensors_in(out) if self.reducer.needs_graph_walk() else [])

    @staticmethod
    def _get_active_ddp_module():
        """The DDP module whose forward is running in this thread, or None (PyTorch's, read by the compiler)."""
        return getattr(_ACTIVE, "module", None)

    def forward(self, *inputs, **kwargs):
        sync = _state.tls.grad_enabled and self.require_backward_grad_sync
        if self._input_device is not None:      # PyTorch's: with device_ids, the inputs go to that device first
            inputs, kwargs = _to_device(inputs, self._input_device), _to_device(kwargs, self._input_device)
        self._pre_forward(sync)
        try:
            out = self.module(*inputs, **kwargs)
        except BaseException:
            _ACTIVE.module = None
            raise
        self._post_forward(sync, out)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first synced backward after reduces the total."""
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def register_comm_hook(self, state, hook) -> None:
        """`hook(state, bucket: GradBucket) -> Future` whose value is the bucket's reduced flat tensor."""
        if self.reducer.hook is not _default_allreduce:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self.reducer.hook_state, self.reducer.hook = state, hook

    def _set_static_graph(self) -> None:
        """PyTorch's: declare the graph static after construction (before the first iteration)."""
        self.static_graph = self.reducer.static_graph = True
        self.reducer.recording = self.reducer.should_rebuild()


# the rebuild (a one-time host decision with a broadcast) and the buffer broadcast run eagerly under flambeau.compile,
# as PyTorch's dynamo-disabled `_pre_forward`: the state they flip is not guarded on, and the frame resumed after
# the call guards on no value of it (it returns None), so the compiled forward is not recompiled
DistributedDataParallel._pre_forward._flambeau_dynamo_disable = True
DistributedDataParallel._post_forward._flambeau_dynamo_disable = True
_ACTIVE = threading.local()


@contextlib.contextmanager
def _no_grad():
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False
    try:
        yield
    finally:
        _state.tls.grad_enabled = prev
