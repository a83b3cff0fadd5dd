"""Many device-to-device copies as one Triton kernel launch (PyTorch's `_foreach_copy_`).

`copy_many(srcs, dsts)` copies each contiguous CuPy array of `srcs` into the array of `dsts` at the same
position (same element size and count; the bytes are moved, so any dtype goes, bfloat16 too);
`copy_addresses` does the same for runs given by device address (pieces of larger arrays: FSDP2's flat
buffers, with no array made per piece). The
programs find their pair through a `multi_tensor` table of (source, destination) addresses, uploaded
once per set of addresses and reused while the caching allocator gives the arrays the same memory step
after step: DDP's gradient buckets fill from, and copy back into, the same gradients every iteration,
one launch per bucket instead of one cudaMemcpyAsync (and its Python) per parameter.
"""
from __future__ import annotations

import operator
import sys

import triton
import triton.language as tl

from . import multi_tensor, triton_launch as TL

CHUNK = 65536           # elements per program
BLOCK = 2048            # elements per inner iteration of a program
NUM_WARPS = 4
ROWS = 2                # table rows of addresses: source, destination
TABLE_LIMIT = 1024      # tables kept: DDP needs one per bucket and one for the copy back, every step
_WORDS = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}     # element size -> the integer type copied
_ptr_of, _size_of, _itemsize_of = operator.attrgetter("data.ptr"), operator.attrgetter("size"), \
    operator.attrgetter("itemsize")
_tables: dict = {}
_kernels: dict = {}


@triton.jit
def _copy_chunks(TABLE, NUMEL, CHUNK_T, CHUNK_I, N_TENSORS, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                 WORD: tl.constexpr):
    c = tl.program_id(0)
    t = tl.load(CHUNK_T + c)
    start = tl.load(CHUNK_I + c) * CHUNK
    n = tl.load(NUMEL + t)
    src = tl.load(TABLE + t).to(tl.pointer_type(WORD))
    dst = tl.load(TABLE + N_TENSORS + t).to(tl.pointer_type(WORD))
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        mask = idx < n
        tl.store(dst + idx, tl.load(src + idx, mask=mask), mask=mask)


def copy_many(srcs: list, dsts: list) -> None:
    """dsts[i][...] = srcs[i] for every i, on the current stream, as one launch per element size (each pair
    C-contiguous, of one element size and count; sizes of 1, 2, 4 or 8 bytes)."""
    if not srcs:
        return
    if len(set(map(_itemsize_of, srcs))) > 1:
        for size in set(map(_itemsize_of, srcs)):
            pairs = [(s, d) for s, d in zip(srcs, dsts) if s.itemsize == size]
            copy_many([s for s, _ in pairs], [d for _, d in pairs])
        return
    copy_addresses(srcs[0], tuple(map(_ptr_of, srcs)), tuple(map(_ptr_of, dsts)), tuple(map(_size_of, srcs)))


address_of = _ptr_of           # a CuPy array's device address (what `copy_addresses` takes): no Python call


def copy_addresses(like, srcs: tuple, dsts: tuple, numels: tuple) -> None:
    """`numels[i]` elements of `like`'s element size from device address `srcs[i]` to `dsts[i]`, for every
    i, as one launch on the current stream of `like`'s device (contiguous runs: pieces of larger arrays
    given by address, with no array made for each)."""
    item, device = like.itemsize, like.device.id
    addresses = (srcs, dsts)
    tab, n_chunks = multi_tensor.device_table(_cupy(like), _tables, (device, item, numels, addresses), addresses,
                                              numels, CHUNK, ROWS, TABLE_LIMIT)
    kern = _kernels.get((device, item))
    if kern is None:
        kern = _kernels[(device, item)] = TL.compile_kernel(
            _copy_chunks, SIGNATURE, dict(CHUNK=CHUNK, BLOCK=BLOCK, WORD=_WORDS[item]), num_warps=NUM_WARPS,
            num_stages=1)
    base = tab.data.ptr
    rows, num, ct, ci = (TL.Ptr(base + 8 * o) for o in multi_tensor.offsets(len(numels), n_chunks, ROWS))
    TL.launch(kern, (n_chunks,), rows, num, ct, ci, len(numels))


def _cupy(array):
    """The CuPy module of a CuPy array (found through its type: no import here)."""
    return sys.modules[type(array).__module__.split(".")[0]]


SIGNATURE = {"TABLE": "*i64", "NUMEL": "*i64", "CHUNK_T": "*i64", "CHUNK_I": "*i64", "N_TENSORS": "i32",
             "CHUNK": "constexpr", "BLOCK": "constexpr", "WORD": "constexpr"}
