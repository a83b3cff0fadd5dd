"""The collectives on tensors: each checks its arguments as PyTorch does, gives the engine of the tensors'
device (`ProcessGroup.engine_for`) contiguous buffers (host arrays for MPI, device arrays for NCCL), and
writes results back into the output tensors when the operation completes.

`async_op=True` returns a `Work`; otherwise the call waits (bounded by the group's timeout). A process
outside `group` (`GroupMember.NON_GROUP_MEMBER`) returns None at once, as in PyTorch.
"""
from __future__ import annotations

import numpy as np

from .distributed_c10d import (ReduceOp, Work, _avg, _buf, _check_tensor, _engine, _group, _member, _op_name,
                               _peer, _run, _same_dtype, _seconds, _write_back, _xp)
from .store import DistStoreError

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
           "isend", "irecv", "P2POp", "batch_isend_irecv", "barrier", "monitored_barrier",
           "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"]


def _finisher(*steps):
    def finish_collective() -> None:
        for step in steps:
            step()
    return finish_collective


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    _check_tensor(tensor, "all_reduce")
    if not _member(group):
        return None
    g, name = _group(group), _op_name(op)
    engine = _engine(g, tensor)
    buf = _buf(engine, tensor)
    post_avg = name == "AVG" and not getattr(engine, "native_avg", False)
    req = engine.all_reduce(buf, "SUM" if post_avg else name)

    def finish_all_reduce() -> None:
        if post_avg:
            _avg(buf, g.size())
        _write_back(tensor, buf)
    return _run(g, req, finish_all_reduce, [tensor], async_op)


def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False, group_src: int | None = None):
    _check_tensor(tensor, "broadcast")
    if not _member(group):
        return None
    g = _group(group)
    root = _peer(g, src, group_src, "broadcast")
    engine = _engine(g, tensor)
    buf = _buf(engine, tensor)
    return _run(g, engine.broadcast(buf, root), lambda: _write_back(tensor, buf), [tensor], async_op)


def reduce(tensor, dst: int | None = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: int | None = None):
    _check_tensor(tensor, "reduce")
    if not _member(group):
        return None
    g, name = _group(group), _op_name(op)
    root = _peer(g, dst, group_dst, "reduce")
    engine = _engine(g, tensor)
    buf = _buf(engine, tensor)
    post_avg = name == "AVG" and not getattr(engine, "native_avg", False)
    req = engine.reduce(buf, "SUM" if post_avg else name, root)

    def finish_reduce() -> None:
        if g.rank() == root:
            if post_avg:
                _avg(buf, g.size())
            _write_back(tensor, buf)
    return _run(g, req, finish_reduce, [tensor], async_op)


def _scatter_back(flat: np.ndarray, outputs: list, counts: list):
    """Copy consecutive pieces of `flat` into `outputs` (one per rank)."""
    def finish_pieces() -> None:
        start = 0
        for t, n in zip(outputs, counts):
            _write_back(t, flat[start:start + n].copy())
            start += n
    return finish_pieces


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False):
    """Every rank's `tensor` into `tensor_list[rank]`; ranks may contribute different sizes."""
    _check_tensor(tensor, "all_gather")
    if not _member(group):
        return None
    g = _group(group)
    if len(tensor_list) != g.size():
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors, the group has {g.size()} ranks")
    _same_dtype(tensor_list + [tensor], "all_gather")
    if tensor_list[g.rank()].numel() != tensor.numel():
        raise ValueError(f"all_gather: tensor_list[{g.rank()}] has {tensor_list[g.rank()].numel()} elements, the "
                         f"input has {tensor.numel()}")
    counts = [t.numel() for t in tensor_list]
    engine = _engine(g, tensor)
    send = _buf(engine, tensor)
    flat = _xp(send).empty(sum(counts), dtype=send.dtype)
    req = engine.all_gather(send, flat, counts)
    return _run(g, req, _scatter_back(flat, tensor_list, counts), tensor_list, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """Every rank's `input_tensor` concatenated (dim 0) into `output_tensor` (or stacked, same numel)."""
    _check_tensor(output_tensor, "all_gather_into_tensor")
    _check_tensor(input_tensor, "all_gather_into_tensor")
    if not _member(group):
        return None
    g = _group(group)
    if output_tensor._dtype is not input_tensor._dtype:
        _same_dtype([output_tensor, input_tensor], "all_gather_into_tensor")
    size, n_in = g.size(), input_tensor.numel()
    if output_tensor.numel() != n_in * size:
        raise ValueError(f"all_gather_into_tensor: output size {tuple(output_tensor.shape)} must hold world_size "
                         f"({size}) times the input size {tuple(input_tensor.shape)}")
    engine = _engine(g, output_tensor)
    out = _buf(engine, output_tensor)
    req = engine.all_gather(_buf(engine, input_tensor), out, [n_in] * size)
    return _run(g, req, lambda: _write_back(output_tensor, out), [output_tensor], async_op)


def _reduce_scatter_flat(g, engine, flat, out, counts: list, op, async_op, finish_out, result):
    name = _op_name(op)
    post_avg = name == "AVG" and not getattr(engine, "native_avg", False)
    req = engine.reduce_scatter(flat, out, counts, "SUM" if post_avg else name)

    def finish_reduce_scatter() -> None:
        if post_avg:
            _avg(out, g.size())
        finish_out()
    return _run(g, req, finish_reduce_scatter, result, async_op)


def reduce_scatter(output, input_list: list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """`output` = the reduction over ranks of their `input_list[rank]`; sizes may differ per rank."""
    _check_tensor(output, "reduce_scatter")
    if not _member(group):
        return None
    g = _group(group)
    if len(input_list) != g.size():
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors, the group has {g.size()} ranks")
    _same_dtype(input_list + [output], "reduce_scatter")
    counts = [t.numel() for t in input_list]
    if counts[g.rank()] != output.numel():
        raise ValueError(f"reduce_scatter: input_list[{g.rank()}] has {counts[g.rank()]} elements, the output "
                         f"has {output.numel()}")
    engine = _engine(g, output)
    out = _buf(engine, output)
    flat = _xp(out).concatenate([_buf(engine, t).reshape(-1) for t in input_list])
    return _reduce_scatter_flat(g, engine, flat, out, counts, op, async_op, lambda: _write_back(output, out),
                                [output])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """`output` = this rank's 1/world_size slice (dim 0) of the reduction of every rank's `input`."""
    _check_tensor(output, "reduce_scatter_tensor")
    _check_tensor(input, "reduce_scatter_tensor")
    if not _member(group):
        return None
    g = _group(group)
    if output._dtype is not input._dtype:
        _same_dtype([output, input], "reduce_scatter_tensor")
    size, n_out = g.size(), output.numel()
    if input.numel() != n_out * size:
        raise ValueError(f"reduce_scatter_tensor: input size {tuple(input.shape)} must be world_size ({size}) "
                         f"times the output size {tuple(output.shape)}")
    engine = _engine(g, output)
    out = _buf(engine, output)
    return _reduce_scatter_flat(g, engine, _buf(engine, input), out, [n_out] * size, op, async_op,
                                lambda: _write_back(output, out), [output])


def all_to_all(output_tensor_list: list, input_tensor_list: list, group=None, async_op: bool = False):
    """`output_tensor_list[j]` on rank i = `input_tensor_list[i]` of rank j (sizes may differ)."""
    if not _member(group):
        return None
    g = _group(group)
    if len(output_tensor_list) != g.size() or len(input_tensor_list) != g.size():
        raise ValueError(f"all_to_all: both lists need {g.size()} tensors, got {len(output_tensor_list)} outputs "
                         f"and {len(input_tensor_list)} inputs")
    _same_dtype(output_tensor_list + input_tensor_list, "all_to_all")
    engine = _engine(g, input_tensor_list[0])
    parts = [_buf(engine, t).reshape(-1) for t in input_tensor_list]
    send = _xp(parts[0]).concatenate(parts)
    recv_counts = [t.numel() for t in output_tensor_list]
    recv = _xp(send).empty(sum(recv_counts), dtype=send.dtype)
    req = engine.all_to_all(send, [t.numel() for t in input_tensor_list], recv, recv_counts)
    return _run(g, req, _scatter_back(recv, output_tensor_list, recv_counts), output_tensor_list, async_op)


def _split_counts(t, splits, n: int, what: str) -> list:
    row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 0
    if splits is None:
        if t.dim() == 0 or t.shape[0] % n:
            raise ValueError(f"all_to_all_single: {what} dim 0 ({tuple(t.shape)}) must divide by world size {n} "
                             "when no split sizes are given")
        return [t.numel() // n] * n
    if len(splits) != n or sum(splits) != t.shape[0]:
        raise ValueError(f"all_to_all_single: {what} split sizes {list(splits)} must be {n} sizes summing to "
                         f"dim 0 ({t.shape[0]})")
    return [s * row for s in splits]


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False):
    """Split `input` along dim 0 (by `input_split_sizes`), send piece j to rank j, concatenate what arrives."""
    _check_tensor(output, "all_to_all_single")
    _check_tensor(input, "all_to_all_single")
    if not _member(group):
        return None
    g = _group(group)
    _same_dtype([output, input], "all_to_all_single")
    send_counts = _split_counts(input, input_split_sizes, g.size(), "input")
    recv_counts = _split_counts(output, output_split_sizes, g.size(), "output")
    engine = _engine(g, output)
    out = _buf(engine, output)
    req = engine.all_to_all(_buf(engine, input), send_counts, out, recv_counts)
    return _run(g, req, lambda: _write_back(output, out), [output], async_op)


def gather(tensor, gather_list: list | None = None, dst: int | None = None, group=None, async_op: bool = False,
           group_dst: int | None = None):
    _check_tensor(tensor, "gather")
    if not _member(group):
        return None
    g = _group(group)
    root = _peer(g, 0 if dst is None and group_dst is None else dst, group_dst, "gather")
    engine = _engine(g, tensor)
    send = _buf(engine, tensor)
    if g.rank() == root:
        if not gather_list or len(gather_list) != g.size():
            raise ValueError(f"gather: the destination needs gather_list with {g.size()} tensors")
        _same_dtype(gather_list + [tensor], "gather")
        counts = [t.numel() for t in gather_list]
        flat = _xp(send).empty(sum(counts), dtype=send.dtype)
        req = engine.gather(send, flat, counts, root)
        return _run(g, req, _scatter_back(flat, gather_list, counts), gather_list, async_op)
    if gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
    return _run(g, engine.gather(send, None, [], root), None, [], async_op)


def scatter(tensor, scatter_list: list | None = None, src: int | None = None, group=None, async_op: bool = False,
            group_src: int | None = None):
    _check_tensor(tensor, "scatter")
    if not _member(group):
        return None
    g = _group(group)
    root = _peer(g, 0 if src is None and group_src is None else src, group_src, "scatter")
    engine = _engine(g, tensor)
    out = _buf(engine, tensor)
    if g.rank() == root:
        if not scatter_list or len(scatter_list) != g.size():
            raise ValueError(f"scatter: the source needs scatter_list with {g.size()} tensors")
        _same_dtype(scatter_list + [tensor], "scatter")
        send = _xp(out).concatenate([_buf(engine, t).reshape(-1) for t in scatter_list])
        req = engine.scatter(send, [t.numel() for t in scatter_list], out, root)
    else:
        if scatter_list:
            raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source ranks.")
        req = engine.scatter(None, [], out, root)
    return _run(g, req, lambda: _write_back(tensor, out), [tensor], async_op)


def isend(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> Work | None:
    _check_tensor(tensor, "isend")
    if not _member(group):
        return None
    g = _group(group)
    engine = _engine(g, tensor)
    return _run(g, engine.send(_buf(engine, tensor), _peer(g, dst, group_dst, "isend"), tag), None, [tensor], True)


def irecv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> Work | None:
    _check_tensor(tensor, "irecv")
    if not _member(group):
        return None
    g = _group(group)
    peer = None if src is None and group_src is None else _peer(g, src, group_src, "irecv")
    engine = _engine(g, tensor)
    buf = _buf(engine, tensor)
    return _run(g, engine.recv(buf, peer, tag), lambda: _write_back(tensor, buf), [tensor], True)


def send(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> None:
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait(_group(group).timeout)


def recv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into `tensor`; returns the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    g = _group(group)
    work.wait(g.timeout)
    return g.ranks[work.source_rank()]


class P2POp:
    """One point-to-point operation for `batch_isend_irecv`: `P2POp(dist.isend, tensor, peer)`."""

    def __init__(self, op, tensor, peer: int | None = None, group=None, tag: int = 0,
                 group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             "``torch.distributed.irecv``.")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Start every send and receive of the list (nonblocking, so their order cannot deadlock)."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    grouped = []             # NCCL engines: their sends and receives are one NCCL group call
    for p in p2p_op_list:
        if _member(p.group):
            engine = _engine(_group(p.group), p.tensor)
            if hasattr(engine, "group_start") and all(e is not engine for e in grouped):
                grouped.append(engine)
    for engine in grouped:
        engine.group_start()
    works = []
    try:
        for p in p2p_op_list:
            if p.op is isend:
                works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
            else:
                works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    finally:
        for engine in reversed(grouped):
            engine.group_end()
    return works


def barrier(group=None, async_op: bool = False, device_ids=None):
    if not _member(group):
        return None
    g = _group(group)
    return _run(g, g.engine.barrier(), None, [], async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier through the store that names the ranks that did not arrive within `timeout`."""
    if not _member(group):
        return
    g = _group(group)
    if g.store is None:
        raise RuntimeError("monitored_barrier needs a store (init_process_group without one)")
    seconds = _seconds(g.timeout if timeout is None else timeout)
    rounds = g.store.add(f"monitored_barrier/{g.group_name}/{g.rank()}", 1)
    key = f"monitored_barrier/{g.group_name}/{{}}/{rounds}"
    g.store.set(key.format(g.rank()), b"1")
    if g.rank() != 0:
        g.store.wait([key.format("released")], timeout)
        return
    missing = []
    for r in range(1, g.size()):
        try:
            g.store.wait([key.format(r)], seconds)
        except DistStoreError:
            missing.append(g.ranks[r])
            if not wait_all_ranks:
                break
    if missing:
        raise RuntimeError(f"Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {seconds} s")
    g.store.set(key.format("released"), b"1")


def all_gather_object(object_list: list, obj, group=None) -> None:
    if not _member(group):
        return
    g = _group(group)
    if len(object_list) != g.size():
        raise ValueError(f"all_gather_object: object_list needs {g.size()} entries")
    object_list[:] = g.engine.all_gather_object(obj)


def broadcast_object_list(object_list: list, src: int | None = None, group=None, device=None,
                          group_src: int | None = None) -> None:
    if not _member(group):
        return
    g = _group(group)
    root = _peer(g, 0 if src is None and group_src is None else src, group_src, "broadcast_object_list")
    object_list[:] = g.engine.broadcast_object(list(object_list) if g.rank() == root else None, root)


def gather_object(obj, object_gather_list: list | None = None, dst: int | None = None, group=None,
                  group_dst: int | None = None) -> None:
    if not _member(group):
        return
    g = _group(group)
    root = _peer(g, 0 if dst is None and group_dst is None else dst, group_dst, "gather_object")
    got = g.engine.gather_object(obj, root)
    if g.rank() == root:
        object_gather_list[:] = got


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int | None = None, group=None, group_src: int | None = None) -> None:
    if not _member(group):
        return
    g = _group(group)
    root = _peer(g, 0 if src is None and group_src is None else src, group_src, "scatter_object_list")
    scatter_object_output_list[0] = g.engine.scatter_object(
        list(scatter_object_input_list) if g.rank() == root else None, root)
