"""PyTorch's default DDP comm hooks: `allreduce_hook`, `fp16_compress_hook`, `bf16_compress_hook`.

A hook gets `(process_group, bucket)` and returns a Future of the bucket's averaged flat gradient. The
compressing hooks cast the bucket to 16 bits before the all-reduce (half the bytes on the wire; MPICH
reduces float16 natively, bfloat16 through a user-defined MPI operation) and cast back after.
"""
from __future__ import annotations

from .... import _dtype
from ... import collectives, distributed_c10d

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


def _group(process_group):
    return process_group if process_group is not None else distributed_c10d.GroupMember.WORLD


def allreduce_hook(process_group, bucket):
    """Average the bucket over the group (what DDP does without a hook)."""
    group = _group(process_group)
    buf = bucket.buffer()
    buf.div_(group.size())
    return collectives.all_reduce(buf, group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def _compress_hook(dtype, process_group, bucket):
    group = _group(process_group)
    buf = bucket.buffer()
    compressed = buf.to(dtype).div_(group.size())
    fut = collectives.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):
        buf.copy_(f.value()[0])
        return buf
    return fut.then(decompress)


def fp16_compress_hook(process_group, bucket):
    """All-reduce the bucket in float16 (divided by the world size first, as PyTorch's)."""
    return _compress_hook(_dtype.float16, process_group, bucket)


def bf16_compress_hook(process_group, bucket):
    """All-reduce the bucket in bfloat16."""
    return _compress_hook(_dtype.bfloat16, process_group, bucket)
