"""The compressed layouts beside CSR: CSC (column pointers, entries ordered by column), BSR and BSC
(CSR/CSC over blocks of a fixed (bh, bw) size, values (nnzb, bh, bw)): their constructors
(`sparse_csc_tensor`, `sparse_bsr_tensor`, `sparse_bsc_tensor`, `sparse_compressed_tensor`) and the
two differentiable moves the other operations build on:

    blocked_to_coo(S)           BSR/BSC -> COO holding every element of every block (uncoalesced,
                                as PyTorch's `to_sparse_coo`), values reshaped (gradients flow)
    compress(coo, layout, block) a coalesced COO (or dense) -> CSR/CSC/BSR/BSC (values gathered
                                or scattered into blocks by differentiable index ops)

Conversions between every pair of layouts go through COO (`_ops.dense_to_sparse` and friends).
"""
from __future__ import annotations

import numpy as np

from .._device import canonical
from .._ops.creation import tensor as _tensor, zeros
from .._tensor import Tensor, sparse_bsc, sparse_bsr, sparse_coo, sparse_csc, sparse_csr
from ._tensor import (BLOCKED, COLUMN_COMPRESSED, COMPRESSED, INDEX_DTYPE, SparsePattern, SparseTensor,
                      csr_row_pointers, values_of, with_values)

CONSTRUCTOR = {sparse_csr: "sparse_csr_tensor", sparse_csc: "sparse_csc_tensor", sparse_bsr: "sparse_bsr_tensor",
               sparse_bsc: "sparse_bsc_tensor"}


def _as_tensor(x, dtype=None) -> Tensor:
    return x if isinstance(x, Tensor) else _tensor(x, dtype=dtype)


def sparse_compressed_tensor(compressed_indices, plain_indices, values, size=None, *, dtype=None, layout=None,
                             device=None, pin_memory=False, requires_grad: bool = False,
                             check_invariants=None) -> SparseTensor:
    """`torch.sparse_compressed_tensor`: the compressed dimension's slice i (a row for CSR/BSR, a column
    for CSC/BSC; of blocks for BSR/BSC) holds entries compressed[i]:compressed[i+1] of plain/values."""
    if layout not in COMPRESSED:
        raise RuntimeError(f"sparse_compressed_tensor: expected layout sparse_csr, sparse_csc, sparse_bsr or "
                           f"sparse_bsc, got {layout}")
    name = CONSTRUCTOR[layout]
    comp = np.asarray(_as_tensor(compressed_indices).detach().numpy(), dtype=INDEX_DTYPE)
    if comp.ndim > 1:
        return batched_compressed_tensor(comp, plain_indices, values, size, dtype, layout, device, requires_grad)
    comp = comp.reshape(-1)
    plain = np.asarray(_as_tensor(plain_indices).detach().numpy(), dtype=INDEX_DTYPE).reshape(-1)
    values = _as_tensor(values, dtype)
    if dtype is not None and values.dtype is not dtype:
        values = values.to(dtype)
    dev = canonical(device) if device is not None else values.device
    if dev.type != "cpu":
        raise NotImplementedError(f"{name}: flambeau's sparse tensors run on cpu only, got device {dev}")
    blocked = layout in BLOCKED
    if blocked and values.dim() < 3:
        raise RuntimeError(f"{name}: expected values of shape (nnz, blocksize[0], blocksize[1]), got "
                           f"{list(values.shape)}")
    if comp.shape[0] < 1 or plain.shape[0] != values.shape[0] or comp[0] != 0 or comp[-1] != plain.shape[0] or \
            np.any(np.diff(comp) < 0):
        raise RuntimeError(f"{name}: compressed indices ({comp.shape[0]}), plain indices ({plain.shape[0]}) and values "
                           f"({values.shape[0]}) do not describe one matrix: the compressed indices must be "
                           "non-decreasing, start at 0 and end at nnz")
    block = tuple(int(b) for b in values.shape[1:3]) if blocked else None
    bh, bw = block or (1, 1)
    n_comp = comp.shape[0] - 1
    column_major = layout in COLUMN_COMPRESSED
    extra = tuple(values.shape[3 if blocked else 1:])
    if size is None:
        n_plain = int(plain.max()) + 1 if plain.size else 0
        rows, cols = (n_plain, n_comp) if column_major else (n_comp, n_plain)
        size = (rows * bh, cols * bw) + extra
    size = tuple(int(s) for s in size)
    if len(size) != 2 + len(extra):
        raise RuntimeError(f"{name}: flambeau builds 2-D matrices (no batch dimensions), got size {list(size)}")
    if size[0] % bh or size[1] % bw:
        raise RuntimeError(f"{name}: the size {list(size[:2])} is not a multiple of the block size {[bh, bw]}")
    grid = (size[0] // bh, size[1] // bw)
    comp_extent, plain_extent = (grid[1], grid[0]) if column_major else grid
    if n_comp != comp_extent:
        raise RuntimeError(f"{name}: expected {comp_extent + 1} compressed indices for size {list(size)}, got "
                           f"{n_comp + 1}")
    if plain.size and (plain.min() < 0 or plain.max() >= plain_extent):
        raise RuntimeError(f"{name}: plain indices must be in [0, {plain_extent}), got a maximum of {plain.max()}")
    major = np.repeat(np.arange(n_comp, dtype=INDEX_DTYPE), np.diff(comp))
    idx = np.stack([plain, major] if column_major else [major, plain])
    pattern = SparsePattern(layout, size, idx, comp.copy(), True, dev, block)
    out = with_values(values, pattern)
    if requires_grad:
        out = out.detach().requires_grad_()
    return out


def batched_compressed_tensor(comp, plain_indices, values, size, dtype, layout, device, requires_grad):
    """A batched CSR/CSC tensor: compressed (*batch, n + 1), plain (*batch, nnz) and values (*batch, nnz,
    *dense), every batch a matrix of the same nnz (PyTorch's rule); stored as the coordinates (batch...,
    row, col) of all entries, batch-major, with the compressed pointers kept per batch."""
    name = CONSTRUCTOR[layout]
    if layout in BLOCKED:
        raise NotImplementedError(f"{name}: batched blocked layouts are not supported by flambeau")
    plain = np.asarray(_as_tensor(plain_indices).detach().numpy(), dtype=INDEX_DTYPE)
    values = _as_tensor(values, dtype)
    if dtype is not None and values.dtype is not dtype:
        values = values.to(dtype)
    batch, nb = tuple(comp.shape[:-1]), comp.ndim - 1
    nnz = plain.shape[-1]
    if plain.shape[:-1] != batch or tuple(values.shape[:nb + 1]) != batch + (nnz,) or \
            np.any(comp[..., 0] != 0) or np.any(comp[..., -1] != nnz) or np.any(np.diff(comp, axis=-1) < 0):
        raise RuntimeError(f"{name}: batched compressed indices {list(comp.shape)}, plain indices {list(plain.shape)} "
                           f"and values {list(values.shape)} do not describe {batch} matrices of {nnz} entries each: "
                           "each batch's compressed indices must be non-decreasing, start at 0 and end at nnz")
    n_comp = comp.shape[-1] - 1
    column_major = layout in COLUMN_COMPRESSED
    extra = tuple(values.shape[nb + 1:])
    if size is None:
        n_plain = int(plain.max()) + 1 if plain.size else 0
        size = batch + ((n_plain, n_comp) if column_major else (n_comp, n_plain)) + extra
    size = tuple(int(v) for v in size)
    plain_extent = size[nb] if column_major else size[nb + 1]
    if len(size) != nb + 2 + len(extra) or size[:nb] != batch or n_comp != size[nb + (1 if column_major else 0)]:
        raise RuntimeError(f"{name}: size {list(size)} does not match batched compressed indices of shape "
                           f"{list(comp.shape)} and values of shape {list(values.shape)}")
    if plain.size and (plain.min() < 0 or plain.max() >= plain_extent):
        raise RuntimeError(f"{name}: plain indices must be in [0, {plain_extent}), got a maximum of {plain.max()}")
    B = int(np.prod(batch))
    flat_comp = comp.reshape(B, n_comp + 1)
    major = np.concatenate([np.repeat(np.arange(n_comp, dtype=INDEX_DTYPE), np.diff(c)) for c in flat_comp]) \
        if B else np.zeros(0, INDEX_DTYPE)
    coords = np.unravel_index(np.repeat(np.arange(B, dtype=INDEX_DTYPE), nnz), batch) if B else [np.zeros(0)] * nb
    minor = plain.reshape(-1)
    idx = np.stack([*coords, minor, major] if column_major else [*coords, major, minor]).astype(INDEX_DTYPE)
    dev = canonical(device) if device is not None else values.device
    pattern = SparsePattern(layout, size, idx.reshape(nb + 2, -1), comp.copy(), True, dev)
    out = with_values(values.reshape((B * nnz,) + extra), pattern)
    if requires_grad:
        out = out.detach().requires_grad_()
    return out


def compress_batched(coo: SparseTensor, layout, n_batch: int) -> SparseTensor:
    """A coalesced COO tensor whose first `n_batch` sparse dimensions are batches as batched CSR/CSC;
    PyTorch's refusal when the batches hold different numbers of entries."""
    p = coo._pattern
    batch = p.shape[:n_batch]
    B = int(np.prod(batch))
    bidx = np.ravel_multi_index(tuple(p.idx[:n_batch]), batch) if p.nnz else np.zeros(0, INDEX_DTYPE)
    counts = np.bincount(bidx, minlength=B)
    if B and np.any(counts != counts[0]):
        raise RuntimeError("Expect the same number of specified elements per batch.")
    column_major = layout in COLUMN_COMPRESSED
    rows, cols = p.idx[n_batch], p.idx[n_batch + 1]
    vals = values_of(coo)
    order = np.lexsort((rows, cols, bidx)) if column_major else np.arange(p.nnz)
    idx = p.idx[:, order]
    if column_major:
        vals = vals.index_select(0, _tensor(order))
    n_major = p.shape[n_batch + 1] if column_major else p.shape[n_batch]
    major = idx[n_batch + 1] if column_major else idx[n_batch]
    per_batch = np.bincount(bidx[order] * n_major + major, minlength=B * n_major).reshape(B, n_major)
    ptr = np.zeros((B, n_major + 1), INDEX_DTYPE)
    np.cumsum(per_batch, axis=1, out=ptr[:, 1:])
    return with_values(vals, SparsePattern(layout, p.shape, idx, ptr.reshape(batch + (n_major + 1,)), True, p.device))


def sparse_csc_tensor(ccol_indices, row_indices, values, size=None, **kw) -> SparseTensor:
    """`torch.sparse_csc_tensor`: column j holds entries ccol[j]:ccol[j+1] of row_indices/values."""
    return sparse_compressed_tensor(ccol_indices, row_indices, values, size, layout=sparse_csc, **kw)


def sparse_bsr_tensor(crow_indices, col_indices, values, size=None, **kw) -> SparseTensor:
    """`torch.sparse_bsr_tensor`: block row i holds blocks crow[i]:crow[i+1] (values (nnzb, bh, bw))."""
    return sparse_compressed_tensor(crow_indices, col_indices, values, size, layout=sparse_bsr, **kw)


def sparse_bsc_tensor(ccol_indices, row_indices, values, size=None, **kw) -> SparseTensor:
    """`torch.sparse_bsc_tensor`: block column j holds blocks ccol[j]:ccol[j+1] (values (nnzb, bh, bw))."""
    return sparse_compressed_tensor(ccol_indices, row_indices, values, size, layout=sparse_bsc, **kw)


def blocked_to_coo(s: SparseTensor) -> SparseTensor:
    """A BSR/BSC tensor as COO: every element of every stored block, in block order (module docstring)."""
    p = s._pattern
    bh, bw = p.block
    i, j = np.meshgrid(np.arange(bh, dtype=INDEX_DTYPE), np.arange(bw, dtype=INDEX_DTYPE), indexing="ij")
    rows = (p.idx[0][:, None, None] * bh + i).reshape(-1)
    cols = (p.idx[1][:, None, None] * bw + j).reshape(-1)
    vals = values_of(s)
    vals = vals.reshape((p.nnz * bh * bw,) + tuple(vals.shape[3:]))
    coalesced = p.nnz <= 1           # one block's elements are in row-major order
    return with_values(vals, SparsePattern(sparse_coo, p.shape, np.stack([rows, cols]), None, coalesced, p.device))


SparseTensor._blocked_to_coo = staticmethod(blocked_to_coo)


def compress(coo: SparseTensor, layout, block: tuple | None = None) -> SparseTensor:
    """A coalesced 2-D COO tensor in `layout` (CSR/CSC; BSR/BSC with `block` (bh, bw)), differentiably."""
    p = coo._pattern
    if p.sparse_dim != 2:
        raise RuntimeError(f"to_sparse: a hybrid COO tensor (dense dimensions) cannot become {layout}")
    column_major = layout in COLUMN_COMPRESSED
    vals = values_of(coo)
    if layout not in BLOCKED:
        rows, cols = p.idx
        order = np.lexsort((rows, cols)) if column_major else np.arange(p.nnz)
        idx = p.idx[:, order]
        ptr = csr_row_pointers(idx[1] if column_major else idx[0], p.shape[1] if column_major else p.shape[0])
        if column_major:
            vals = vals.index_select(0, _tensor(order))
        return with_values(vals, SparsePattern(layout, p.shape, idx, ptr, True, p.device))
    bh, bw = (int(b) for b in block)
    if bh < 1 or bw < 1 or p.shape[0] % bh or p.shape[1] % bw:
        raise RuntimeError(f"to_sparse: tensor sizes {list(p.shape)} must be divisible by the blocksize {[bh, bw]}")
    grid = (p.shape[0] // bh, p.shape[1] // bw)
    brow, bcol = p.idx[0] // bh, p.idx[1] // bw
    key = bcol * grid[0] + brow if column_major else brow * grid[1] + bcol
    blocks, which = np.unique(key, return_inverse=True)
    which = which.reshape(-1)
    idx = (np.stack([blocks % grid[0], blocks // grid[0]]) if column_major else
           np.stack([blocks // grid[1], blocks % grid[1]])).astype(INDEX_DTYPE).reshape(2, -1)
    ptr = csr_row_pointers(idx[1] if column_major else idx[0], grid[1] if column_major else grid[0])
    out = zeros((blocks.shape[0], bh, bw) + tuple(vals.shape[1:]), dtype=vals.dtype)
    out = out.index_put((_tensor(which), _tensor(p.idx[0] % bh), _tensor(p.idx[1] % bw)), vals, accumulate=True)
    return with_values(out, SparsePattern(layout, p.shape, idx, ptr, True, p.device, (bh, bw)))


def dense_blocks(x: Tensor, layout, block: tuple) -> SparseTensor:
    """A dense 2-D tensor as BSR/BSC: the blocks holding a non-zero, their values read from x (every
    element of such a block, -0.0 too, keeps its gradient path to x, as PyTorch's)."""
    bh, bw = (int(b) for b in block)
    if bh < 1 or bw < 1 or x.shape[0] % bh or x.shape[1] % bw:
        raise RuntimeError(f"to_sparse: tensor sizes {list(x.shape)} must be divisible by the blocksize {[bh, bw]}")
    grid = (x.shape[0] // bh, x.shape[1] // bw)
    tiles = x.reshape(grid[0], bh, grid[1], bw).permute(0, 2, 1, 3)
    keep = (tiles.detach() != 0).numpy().any(axis=(2, 3))
    column_major = layout in COLUMN_COMPRESSED
    brow, bcol = np.nonzero(keep.T)[::-1] if column_major else np.nonzero(keep)
    idx = np.stack([brow, bcol]).astype(INDEX_DTYPE).reshape(2, -1)
    ptr = csr_row_pointers(idx[1] if column_major else idx[0], grid[1] if column_major else grid[0])
    vals = tiles[(_tensor(idx[0]), _tensor(idx[1]))]
    return with_values(vals, SparsePattern(layout, x.shape, idx, ptr, True, x.device, (bh, bw)))


def check_blocksize(layout, blocksize) -> tuple:
    """PyTorch's check of `to_sparse(layout=, blocksize=)`: BSR/BSC need one of two ints, the others none."""
    if layout in BLOCKED:
        if blocksize is None or len(tuple(blocksize)) != 2:
            raise RuntimeError(f"to_sparse: blocksize needs to be a tuple of size 2 for {layout}, got {blocksize}")
        return tuple(int(b) for b in blocksize)
    if blocksize is not None:
        raise RuntimeError(f"to_sparse: blocksize is only supported for the blocked layouts, got {layout}")
    return None
