"""The COO/CSR operations (CSC/BSR/BSC through `_compressed.py`): construction, conversions, coalesce, `sparse.mm` (with `reduce=`),
`sparse.sum`, and the handlers that `SparseTensor.__torch_dispatch__` runs for operators called on a
sparse tensor (mm/addmm/matmul, add/sub/mul/div/neg, sum, clone, zeros_like, `to`, t/transpose).

Each op computes its new pattern with NumPy (np.unique, argsort, nonzero) and its new values with
differentiable flambeau operators over `values_of(S)`, wrapped back by `with_values`, so gradients
come from the operators' derivatives and a sparse input's gradient is sparse with its own pattern
(PyTorch's semantics for torch.sparse.mm, sparse.sum, to_dense). Kernels run on cpu.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._device import canonical
from .._tensor import Tensor, sparse_coo, sparse_csc, sparse_csr, strided
from .._dispatch import type_name
from .._ops.creation import tensor as _tensor, zeros
from .._ops.shape import cat
from ._compressed import (batched_compressed_tensor, blocked_to_coo, check_blocksize, compress, compress_batched,
                          dense_blocks)
from ._tensor import (BLOCKED, COMPRESSED, INDEX_DTYPE, SparsePattern, SparseTensor, SparseMMDenseGrad, gather_at,
                      layout_kind, values_of, with_values)

REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin", "max": "amax", "min": "amin"}


def _as_tensor(x, dtype=None) -> Tensor:
    return x if isinstance(x, Tensor) else _tensor(x, dtype=dtype)


def _check_cpu(what: str, device) -> None:
    if device.type != "cpu":
        raise NotImplementedError(f"{what}: flambeau's sparse COO/CSR tensors run on cpu only, got device "
                                  f"{device}; build the tensor on cpu (2:4 sparsity on cuda: "
                                  "flambeau.sparse.to_sparse_semi_structured)")


# ---- construction -----------------------------------------------------------------------------------------
def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, pin_memory=False,
                      requires_grad: bool = False, check_invariants=None, is_coalesced=None) -> SparseTensor:
    """`torch.sparse_coo_tensor`: entries `values[k]` at `indices[:, k]` (duplicates sum when coalesced)."""
    indices = _as_tensor(indices)
    values = _as_tensor(values, dtype)
    if dtype is not None and values.dtype is not dtype:
        values = values.to(dtype)
    dev = canonical(device) if device is not None else values.device
    _check_cpu("sparse_coo_tensor", dev)
    if indices.dim() != 2:
        raise RuntimeError(f"indices must be sparse_dim x nnz, but got: {list(indices.shape)}")
    if indices.dtype is not D.int64:
        raise RuntimeError(f"indices must be an int64 tensor, got {indices.dtype}")
    if values.dim() == 0:
        values = values.reshape(1) if indices.shape[1] == 1 else values
    if indices.shape[1] != values.shape[0]:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: {indices.shape[1]}, "
                           f"nnz from values: {values.shape[0]}")
    idx = np.ascontiguousarray(indices.detach().numpy(), dtype=INDEX_DTYPE)
    sdim = idx.shape[0]
    if size is None:
        size = tuple(int(r.max()) + 1 if r.size else 0 for r in idx) + tuple(values.shape[1:])
    size = tuple(int(s) for s in size)
    if len(size) != sdim + values.dim() - 1:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({sdim}) + dense_dim ({values.dim() - 1}), "
                           f"but got {len(size)}")
    if tuple(values.shape[1:]) != size[sdim:]:
        raise RuntimeError(f"values has incorrect size, expected {[values.shape[0], *size[sdim:]]}, "
                           f"got {list(values.shape)}")
    for d in range(sdim):
        if idx.shape[1] and (idx[d].min() < 0 or idx[d].max() >= size[d]):
            bad = idx[d].max() if idx[d].max() >= size[d] else idx[d].min()
            raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is {size[d]} but found "
                               f"index {bad}")
    lin = np.ravel_multi_index(tuple(idx), size[:sdim]) if idx.shape[1] else idx[0]
    coalesced = bool(is_coalesced) if is_coalesced is not None else idx.shape[1] <= 1 or \
        bool(np.all(np.diff(lin) > 0))
    pattern = SparsePattern(sparse_coo, size, idx, None, coalesced, dev)
    out = with_values(values, pattern)
    if requires_grad:
        out = out.detach().requires_grad_()
    return out


def sparse_csr_tensor(crow_indices, col_indices, values, size=None, *, dtype=None, device=None,
                      pin_memory=False, requires_grad: bool = False, check_invariants=None) -> SparseTensor:
    """`torch.sparse_csr_tensor`: row i holds entries crow[i]:crow[i+1] of col_indices/values."""
    crow = np.asarray(_as_tensor(crow_indices).detach().numpy(), dtype=INDEX_DTYPE)
    if crow.ndim > 1:
        return batched_compressed_tensor(crow, col_indices, values, size, dtype, sparse_csr, device, requires_grad)
    col = np.asarray(_as_tensor(col_indices).detach().numpy(), dtype=INDEX_DTYPE)
    values = _as_tensor(values, dtype)
    if dtype is not None and values.dtype is not dtype:
        values = values.to(dtype)
    dev = canonical(device) if device is not None else values.device
    _check_cpu("sparse_csr_tensor", dev)
    nrows = crow.shape[0] - 1
    if col.shape[0] != values.shape[0] or crow[-1] != col.shape[0] or np.any(np.diff(crow) < 0):
        raise RuntimeError(f"sparse_csr_tensor: crow_indices ({crow.shape[0]}), col_indices ({col.shape[0]}) and "
                           f"values ({values.shape[0]}) do not describe one CSR matrix: crow_indices must be "
                           "non-decreasing, start at 0 and end at nnz")
    if size is None:
        size = (nrows, int(col.max()) + 1 if col.size else 0) + tuple(values.shape[1:])
    size = tuple(int(s) for s in size)
    if col.size and (col.min() < 0 or col.max() >= size[1]):
        raise RuntimeError(f"sparse_csr_tensor: col_indices must be in [0, {size[1]}), got a maximum of {col.max()}")
    rows = np.repeat(np.arange(nrows, dtype=INDEX_DTYPE), np.diff(crow))
    pattern = SparsePattern(sparse_csr, size, np.stack([rows, col]), crow.copy(), True, dev)
    out = with_values(values, pattern)
    if requires_grad:
        out = out.detach().requires_grad_()
    return out


# ---- conversions --------------------------------------------------------------------------------------------
def coalesce(s: SparseTensor) -> SparseTensor:
    """Sorted, unique coordinates; duplicate entries summed (differentiably, by index_add)."""
    p = s._pattern
    if p.layout is not sparse_coo:
        raise RuntimeError(f"coalesce expected sparse coordinate tensor layout but got {p.layout}")
    if p.coalesced:
        return s
    uniq, inverse = np.unique(p.linear(), return_inverse=True)
    idx = np.stack(np.unravel_index(uniq, p.shape[:p.sparse_dim])).astype(INDEX_DTYPE) if uniq.size else \
        np.zeros((p.sparse_dim, 0), INDEX_DTYPE)
    vals = values_of(s)
    new = zeros((uniq.shape[0],) + tuple(vals.shape[1:]), dtype=vals.dtype).index_add(0, _tensor(inverse.reshape(-1)), vals)
    return with_values(new, SparsePattern(sparse_coo, p.shape, idx.reshape(p.sparse_dim, -1), None, True, p.device))


def to_dense(t: Tensor, dtype=None, *, masked_grad=None) -> Tensor:
    """The dense tensor; its gradient reaches a sparse input as a sparse gradient with its pattern."""
    if not isinstance(t, SparseTensor):
        return t if dtype is None else t.to(dtype)
    t = _elements(t)
    p = t._pattern
    vals = values_of(t)
    if dtype is not None:
        vals = vals.to(dtype)
    return zeros(p.shape, dtype=vals.dtype).index_put(p.index_tensors(), vals, accumulate=True)


def _elements(s: SparseTensor) -> SparseTensor:
    """A blocked (BSR/BSC) tensor as COO (`blocked_to_coo`); the others as they are (their coordinates
    are of elements)."""
    return blocked_to_coo(s) if isinstance(s, SparseTensor) and s._pattern.block else s


def dense_to_sparse(x: Tensor, sparse_dim: int | None = None, *, layout=None, blocksize=None,
                    dense_dim=None) -> SparseTensor:
    """`Tensor.to_sparse(sparse_dim)` / `to_sparse(layout=..., blocksize=...)` on a dense tensor or a sparse one."""
    if layout in COMPRESSED:
        return to_compressed(x, layout, check_blocksize(layout, blocksize), dense_dim)
    if layout is not None and layout not in (sparse_coo, strided):
        raise NotImplementedError(f"to_sparse: conversion to {layout} is not supported by flambeau")
    if isinstance(x, SparseTensor):
        p = x._pattern
        if p.layout is sparse_coo:
            return x
        if p.block:
            return blocked_to_coo(x)
        # CSC: the entries in column order, uncoalesced (as PyTorch's)
        return with_values(values_of(x), SparsePattern(sparse_coo, p.shape, p.idx, None, p.layout is sparse_csr,
                                                       p.device))
    _check_cpu("to_sparse", x.device)
    sdim = x.dim() if sparse_dim is None else int(sparse_dim)
    if not 0 <= sdim <= x.dim():
        raise RuntimeError(f"sparse_dim must be in [0, {x.dim()}] for a tensor of {x.dim()} dimensions, got {sdim}")
    a = x.detach().numpy()
    mask = a != 0
    if sdim < x.dim():
        mask = mask.any(axis=tuple(range(sdim, x.dim())))
    idx = np.stack(np.nonzero(mask)).astype(INDEX_DTYPE).reshape(sdim, -1)
    pattern = SparsePattern(sparse_coo, x.shape, idx, None, True, x.device)
    vals = x[pattern.index_tensors()] if sdim else x.unsqueeze(0)
    return with_values(vals, pattern)


def to_compressed(x: Tensor, layout, blocksize: tuple | None = None, dense_dim: int | None = None) -> SparseTensor:
    """CSR/CSC/BSR/BSC from a dense tensor (2-D, or hybrid: 2 sparse dimensions then `dense_dim` dense
    ones, an entry stored where any of its dense elements is non-zero) or a sparse one, through a
    coalesced COO tensor."""
    name = "to_sparse_" + layout.name[len("sparse_"):]
    if isinstance(x, SparseTensor):
        p = x._pattern
        if p.layout is layout and (blocksize is None or p.block == tuple(blocksize)):
            return x
        if p.block and layout not in BLOCKED:
            raise RuntimeError(f"sparse_compressed_{name}: expected SparseCsr or SparseCsc layout but got "
                               f"{layout_kind(p.layout)}")
        if p.block and p.block != tuple(blocksize):
            where = name if p.layout is layout else f"sparse_compressed_{name}"
            raise RuntimeError(f"{where}: conversion from {layout_kind(p.layout)} to {layout_kind(layout)} with "
                               f"blocksize changed from {list(p.block)} to {list(blocksize)} is not supported")
    if isinstance(x, SparseTensor):
        if p.layout is sparse_coo and p.sparse_dim != 2:
            raise RuntimeError(f"coo_{name}: conversion from Sparse to {layout_kind(layout)} for input tensors with "
                               "sparse_dim()!=2 is not supported")
        coo = coalesce(dense_to_sparse(x))
        if p.batch_shape and layout not in BLOCKED:       # batched CSR <-> CSC
            return compress_batched(coo, layout, len(p.batch_shape))
        return compress(coo, layout, blocksize)
    dense_dim = 0 if dense_dim is None else int(dense_dim)
    if dense_dim < 0 or x.dim() - dense_dim < 2:
        raise RuntimeError(f"{name}: expected 2 sparse dimensions and dense_dim={dense_dim} dense ones, got a "
                           f"{x.dim()}-D tensor")
    n_batch = x.dim() - dense_dim - 2
    if n_batch:
        if layout in BLOCKED:
            raise RuntimeError(f"{name}: batched blocked layouts are not supported by flambeau: a {x.dim()}-D "
                               f"tensor with dense_dim={dense_dim} has {n_batch} batch dimension(s)")
        return compress_batched(dense_to_sparse(x, n_batch + 2), layout, n_batch)
    if layout in BLOCKED and not dense_dim:
        return dense_blocks(x, layout, blocksize)
    return compress(dense_to_sparse(x, 2), layout, blocksize)


def to_sparse_csr(x: Tensor, dense_dim=None) -> SparseTensor:
    """CSR from a dense 2-D (or hybrid, `dense_dim`) tensor or a COO/CSC one (coalesced first)."""
    return to_compressed(x, sparse_csr, None, dense_dim)


def to_sparse_csc(x: Tensor, dense_dim=None) -> SparseTensor:
    """`Tensor.to_sparse_csc()`: CSC from a dense 2-D tensor or a COO/CSR one."""
    return to_compressed(x, sparse_csc, None, dense_dim)


def to_sparse_bsr(x: Tensor, blocksize, dense_dim=None) -> SparseTensor:
    """`Tensor.to_sparse_bsr(blocksize)`: the blocks (bh, bw) holding a stored or non-zero entry."""
    return to_compressed(x, BLOCKED[0], check_blocksize(BLOCKED[0], blocksize), dense_dim)


def to_sparse_bsc(x: Tensor, blocksize, dense_dim=None) -> SparseTensor:
    """`Tensor.to_sparse_bsc(blocksize)`: as `to_sparse_bsr`, blocks ordered by block column."""
    return to_compressed(x, BLOCKED[1], check_blocksize(BLOCKED[1], blocksize), dense_dim)


# ---- products -----------------------------------------------------------------------------------------------
def _check_mm(name: str, a: Tensor, b: Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise RuntimeError(f"{name}: expected 2-D matrices, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"{name}: mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                           f"{b.shape[0]}x{b.shape[1]})")
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{name}: expected scalar type {type_name(a.dtype)} but found {type_name(b.dtype)}")
    if isinstance(a, SparseTensor) and a._pattern.sparse_dim != 2:
        raise RuntimeError(f"{name}: the sparse operand must have 2 sparse dimensions and no dense ones")


def _contributions(s: SparseTensor, d: Tensor):
    """(rows, values[:, None] * D[cols]) of S @ D, differentiable in S's values and D."""
    p = s._pattern
    rows, cols = _tensor(p.idx[0]), _tensor(p.idx[1])
    return rows, values_of(s).unsqueeze(1) * d.index_select(0, cols)


def mm(mat1: Tensor, mat2: Tensor, reduce: str | None = None) -> Tensor:
    """`torch.sparse.mm`: S @ D (dense result, S's gradient sparse with its pattern), S @ S2 (sparse
    result), or with `reduce` ("sum", "mean", "amax"/"max", "amin"/"min") over each row's entries (CSR)."""
    if reduce is not None:
        if reduce not in REDUCTIONS:
            raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
        if not isinstance(mat1, SparseTensor) or mat1._pattern.layout is not sparse_csr:
            raise NotImplementedError(f"Could not run 'aten::_sparse_mm_reduce_impl' with arguments from the "
                                      f"'{'SparseCPU' if isinstance(mat1, SparseTensor) else 'CPU'}' backend: "
                                      "sparse.mm with reduce= needs a CSR mat1 (to_sparse_csr())")
    if not isinstance(mat1, SparseTensor):
        return mat1.mm(mat2)
    mat1 = _elements(mat1)
    _check_mm("sparse.mm", mat1, mat2)
    if isinstance(mat2, SparseTensor):
        return dense_to_sparse(mm(mat1, to_dense(mat2)))
    s = coalesce(mat1) if mat1._pattern.layout is sparse_coo else mat1
    rows, contrib = _contributions(s, mat2)
    out = zeros((s.shape[0], mat2.shape[1]), dtype=contrib.dtype)
    how = REDUCTIONS[reduce or "sum"]
    if how == "sum":
        return out.index_add(0, rows, contrib)
    return out.scatter_reduce(0, rows.unsqueeze(1).expand(contrib.shape), contrib, how, include_self=False)


def addmm(mat: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """`torch.sparse.addmm`: beta * mat + alpha * sparse.mm(mat1, mat2)."""
    return mat * beta + mm(mat1, mat2) * alpha


def sampled_addmm(input: SparseTensor, mat1: Tensor, mat2: Tensor, *, beta=1.0, alpha=1.0) -> SparseTensor:
    """`torch.sparse.sampled_addmm`: beta * input + alpha * (mat1 @ mat2) at input's entries (CSR), each
    entry (r, c) the dot product of mat1's row r and mat2's column c."""
    if not isinstance(input, SparseTensor) or input._pattern.layout is not sparse_csr:
        raise NotImplementedError("Could not run 'aten::sparse_sampled_addmm' with arguments from the "
                                  f"'{'SparseCPU' if isinstance(input, SparseTensor) else 'CPU'}' backend: "
                                  "sparse.sampled_addmm needs a CSR input (to_sparse_csr())")
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0] or \
            (mat1.shape[0], mat2.shape[1]) != tuple(input.shape):
        raise RuntimeError(f"sampled_addmm: expected mat1 {list(mat1.shape)} @ mat2 {list(mat2.shape)} to have the "
                           f"input's shape {list(input.shape)}")
    p = input._pattern
    rows, cols = _tensor(p.idx[0]), _tensor(p.idx[1])
    dots = (mat1.index_select(0, rows) * mat2.t().index_select(0, cols)).sum(1)
    return with_values(values_of(input) * beta + dots * alpha, p)


def sparse_mm_dense_grad(name: str, s: SparseTensor, d: Tensor) -> Tensor:
    """torch.mm / @ / addmm with a sparse left operand: S's gradient is dense, as in PyTorch."""
    if isinstance(d, SparseTensor):
        return mm(s, d)
    _check_mm(name, s, d)
    return SparseMMDenseGrad.apply(coalesce(s) if s._pattern.layout is sparse_coo else s, d)


# ---- reductions -----------------------------------------------------------------------------------------------
def sum(input: Tensor, dim=None, dtype=None) -> Tensor:  # noqa: A001 (torch.sparse.sum)
    """`torch.sparse.sum`: all dimensions -> a dense 0-d tensor; some -> sparse over the kept sparse
    dimensions (dense once every sparse dimension is summed). The gradient is sparse with S's pattern."""
    if not isinstance(input, SparseTensor):
        return input.sum() if dim is None else input.sum(dim)
    input = _elements(input)
    vals = values_of(input)
    if dtype is not None:
        vals = vals.to(dtype)
    if dim is None:
        return vals.sum()
    p = input._pattern
    nd = len(p.shape)
    dims = sorted({d % nd for d in ((dim,) if isinstance(dim, int) else dim)})
    sdims = [d for d in dims if d < p.sparse_dim]
    ddims = [d - p.sparse_dim + 1 for d in dims if d >= p.sparse_dim]
    if ddims:
        vals = vals.sum(ddims)
    if len(sdims) == p.sparse_dim:
        return vals.sum(0)
    if not sdims:
        shape = tuple(s for i, s in enumerate(p.shape) if i not in dims)
        return with_values(vals, SparsePattern(sparse_coo, shape, p.idx, None, p.coalesced, p.device))
    kept = [d for d in range(p.sparse_dim) if d not in sdims]
    shape = tuple(p.shape[d] for d in kept) + tuple(s for i, s in enumerate(p.shape)
                                                     if i >= p.sparse_dim and i not in dims)
    sub = SparsePattern(sparse_coo, shape, p.idx[kept], None, False, p.device)
    return coalesce(with_values(vals, sub))


# ---- handlers for operators called on a sparse tensor (SparseTensor.__torch_dispatch__) ---------------------
def _mm_handler(op, a, b):
    if not isinstance(a, SparseTensor):
        return to_dense_mm(a, b)
    return sparse_mm_dense_grad("mm", a, b)


def to_dense_mm(a: Tensor, b: SparseTensor) -> Tensor:
    """dense @ sparse: (S^T @ D^T)^T."""
    return sparse_mm_dense_grad("mm", transpose(b, 0, 1), a.t()).t()


def batched_mm(name: str, s: SparseTensor, d: Tensor) -> Tensor:
    """A batched CSR/CSC tensor (*batch, M, K) times a dense (*batch, K, N) (or, for matmul, (K, N) for every
    batch): the dense (*batch, M, N) product, as PyTorch's `bmm` of a batched CSR tensor (cuda there; its
    cpu has none). Each entry (b, r, c, v) adds v * D[b, c] to row (b, r), by index_select and index_add,
    so gradients reach D (and S's values) through their derivatives."""
    p = s._pattern
    batch, nb = p.batch_shape, len(p.batch_shape)
    if isinstance(d, SparseTensor) or p.sparse_dim != nb + 2 or len(p.shape) != nb + 2:
        raise NotImplementedError(f"{name}: flambeau multiplies a batched {s.layout} tensor without dense dimensions "
                                  "by a dense tensor only")
    M, K = p.shape[nb:]
    B = int(np.prod(batch))
    if name == "bmm" and (nb != 1 or d.dim() != 3):
        raise RuntimeError("batch1 must be a 3D tensor" if nb != 1 else "batch2 must be a 3D tensor")
    if d.dim() == 2 and name == "matmul":
        d = d.expand(batch + tuple(d.shape))
    if tuple(d.shape[:-2]) != batch or d.dim() != nb + 2:
        raise RuntimeError(f"{name}: batch1 and batch2 must have same number of batches, got {B} and "
                           f"{int(np.prod(d.shape[:-2])) if d.dim() > 2 else d.shape}")
    if d.shape[-2] != K:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{B}, {K}] but got: "
                           f"[{int(np.prod(d.shape[:-2]))}, {d.shape[-2]}].")
    if s.dtype is not d.dtype:
        raise RuntimeError(f"{name}: expected scalar type {type_name(s.dtype)} but found {type_name(d.dtype)}")
    N = d.shape[-1]
    flat = np.ravel_multi_index(tuple(p.idx[:nb]), batch).astype(INDEX_DTYPE) if p.nnz else np.zeros(0, INDEX_DTYPE)
    src = _tensor(flat * K + p.idx[nb + 1])
    dst = _tensor(flat * M + p.idx[nb])
    terms = values_of(s).unsqueeze(1) * d.reshape(B * K, N).index_select(0, src)
    out = zeros((B * M, N), dtype=d.dtype, device=d.device).index_add(0, dst, terms)
    return out.reshape(batch + (M, N))


def _bmm_handler(op, a, b):
    if not isinstance(a, SparseTensor) or not a._pattern.batch_shape:
        raise NotImplementedError(f"Could not run 'aten::bmm.out' with arguments from the "
                                  f"'{'SparseCsrCPU' if isinstance(a, SparseTensor) else 'SparseCPU'}' backend: "
                                  "flambeau's bmm takes a batched CSR/CSC left operand and a dense right one")
    return batched_mm("bmm", a, b)


def _matmul_handler(op, a, b):
    if isinstance(a, SparseTensor) and a._pattern.batch_shape:
        return batched_mm("matmul", a, b)
    if isinstance(a, SparseTensor) and b.dim() == 1:
        return sparse_mm_dense_grad("matmul", a, b.unsqueeze(1)).squeeze(1)
    return _mm_handler(op, a, b)


def _addmm_handler(op, bias, a, b, *, beta=1, alpha=1):
    if isinstance(bias, SparseTensor):
        raise NotImplementedError("addmm: a sparse `self` (bias) is not supported by flambeau; pass a dense one")
    return bias * beta + _mm_handler(op, a, b) * alpha


def _add_handler(op, a, b, *, alpha=1):
    if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
        if isinstance(b, Tensor) and b.dim() > 0:
            raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")
        raise RuntimeError(f"add: adding a scalar to a {a.layout} tensor would make it dense; use to_dense() first")
    if not isinstance(a, SparseTensor):
        return a + to_dense(b) * alpha
    if a.shape != b.shape:
        raise RuntimeError(f"add: expected sizes of self and other to match, got {list(a.shape)} and {list(b.shape)}")
    if a._pattern is b._pattern:          # one pattern (gradients of one tensor): add the values entry by entry
        vb = values_of(b)
        return with_values(values_of(a) + (vb * alpha if alpha != 1 else vb), a._pattern)
    csr = a._pattern.layout is sparse_csr
    a, b = dense_to_sparse(a), dense_to_sparse(b)
    pa, pb = a._pattern, b._pattern
    vb = values_of(b)
    vals = values_of(a).to(vb.dtype) if vb.dtype is not a.dtype else values_of(a)
    cat_vals = cat([vals, (vb * alpha if alpha != 1 else vb).to(vals.dtype)])
    pattern = SparsePattern(sparse_coo, pa.shape, np.concatenate([pa.idx, pb.idx], axis=1), None, False, pa.device)
    out = coalesce(with_values(cat_vals, pattern))
    return to_sparse_csr(out) if csr else out


def _sub_handler(op, a, b, *, alpha=1):
    return _add_handler(op, a, b, alpha=-alpha)


def _scale(s: SparseTensor, factor) -> SparseTensor:
    """S * a scalar, a 0-d tensor, or a dense tensor of S's shape (read at S's entries): S's pattern."""
    if isinstance(factor, SparseTensor):
        raise NotImplementedError(f"mul: flambeau multiplies a {s.layout} tensor by a scalar or a dense tensor, not by "
                                  "another sparse tensor")
    if isinstance(factor, Tensor) and factor.dim() > 0:
        s = _elements(s)
        if tuple(factor.shape) != tuple(s.shape):
            raise RuntimeError(f"mul: a sparse tensor of shape {list(s.shape)} multiplies a dense tensor of its own "
                               f"shape only, got {list(factor.shape)}")
        return with_values(values_of(s) * gather_at(factor, s._pattern), s._pattern)
    return with_values(values_of(s) * factor, s._pattern)


def _mul_handler(op, a, b):
    return _scale(a, b) if isinstance(a, SparseTensor) else _scale(b, a)


def _div_handler(op, a, b, *, rounding_mode=None):
    if not isinstance(a, SparseTensor) or rounding_mode is not None:
        raise NotImplementedError("div: flambeau divides a sparse tensor by a scalar only")
    return with_values(values_of(a) / b, a._pattern)


def _neg_handler(op, a):
    return with_values(-values_of(a), a._pattern)


def _clone_handler(op, a, *, memory_format=None):
    return with_values(values_of(a).clone(), a._pattern)


def _zeros_like_handler(op, a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    p = a._pattern
    if layout is strided:
        return zeros(p.shape, dtype=dtype or a.dtype)
    empty_idx = np.zeros((p.sparse_dim, 0), INDEX_DTYPE)
    pattern = SparsePattern(sparse_coo, p.shape, empty_idx, None, True, p.device)
    return with_values(zeros((0,) + p.shape[p.sparse_dim:], dtype=dtype or a.dtype), pattern)


def _to_copy_handler(op, a, *, dtype=None, device=None, non_blocking=False, layout=None, memory_format=None):
    if device is not None and canonical(device) != a.device:
        _check_cpu("to", canonical(device))
    return with_values(values_of(a).to(dtype) if dtype is not None else values_of(a).clone(), a._pattern)


def transpose(s: SparseTensor, dim0: int, dim1: int) -> SparseTensor:
    """A COO tensor with two sparse dimensions swapped (the values are shared)."""
    p = s._pattern
    d0, d1 = dim0 % len(p.shape), dim1 % len(p.shape)
    if max(d0, d1) >= p.sparse_dim or p.layout is not sparse_coo:
        s = dense_to_sparse(s)
        p = s._pattern
        if max(d0, d1) >= p.sparse_dim:
            raise NotImplementedError("transpose: flambeau swaps sparse dimensions of a sparse tensor only")
    idx = p.idx.copy()
    idx[[d0, d1]] = idx[[d1, d0]]
    shape = list(p.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return with_values(values_of(s), SparsePattern(sparse_coo, shape, idx, None, False, p.device))


def index_select(s: SparseTensor, dim: int, index: Tensor) -> SparseTensor:
    """COO `index_select` along a sparse dimension: entry e appears once per position p with index[p] equal
    to its coordinate, at coordinate p (uncoalesced, as PyTorch's)."""
    s = dense_to_sparse(s)
    p = s._pattern
    dim = dim % len(p.shape)
    if dim >= p.sparse_dim:
        raise NotImplementedError("index_select: flambeau selects along a sparse dimension of a sparse tensor only")
    ix = np.asarray(index.detach().cpu().numpy(), dtype=INDEX_DTYPE).reshape(-1)
    if ix.size and (ix.min() < -p.shape[dim] or ix.max() >= p.shape[dim]):
        raise IndexError(f"index_select(): index out of range in self (dim {dim} of size {p.shape[dim]})")
    ix = ix % max(p.shape[dim], 1)
    order = np.argsort(ix, kind="stable")
    coord = p.idx[dim]
    lo, hi = np.searchsorted(ix[order], coord, "left"), np.searchsorted(ix[order], coord, "right")
    counts = hi - lo
    entries = np.repeat(np.arange(p.nnz), counts)
    starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
    positions = order[starts + np.arange(entries.shape[0])]
    idx = p.idx[:, entries].copy()
    idx[dim] = positions
    shape = list(p.shape)
    shape[dim] = ix.shape[0]
    vals = values_of(s).index_select(0, _tensor(entries))
    return with_values(vals, SparsePattern(sparse_coo, shape, idx, None, False, p.device))


def select(s: SparseTensor, dim: int, i: int) -> SparseTensor:
    """COO `select` (`S[i]`) along a sparse dimension: that slice, one dimension fewer."""
    s = dense_to_sparse(s)
    p = s._pattern
    dim = dim % len(p.shape)
    if dim >= p.sparse_dim:
        raise NotImplementedError("select: flambeau selects along a sparse dimension of a sparse tensor only")
    if not -p.shape[dim] <= i < p.shape[dim]:
        raise IndexError(f"select(): index {i} out of range for tensor of size {list(p.shape)} at dimension {dim}")
    keep = np.nonzero(p.idx[dim] == i % p.shape[dim])[0]
    idx = np.delete(p.idx[:, keep], dim, axis=0)
    shape = p.shape[:dim] + p.shape[dim + 1:]
    vals = values_of(s).index_select(0, _tensor(keep))
    if p.sparse_dim == 1:
        return vals.sum(0)
    return with_values(vals, SparsePattern(sparse_coo, shape, idx, None, p.coalesced, p.device))


def _index_select_handler(op, a, dim, index):
    return index_select(a, dim, index)


def _select_handler(op, a, dim, index):
    return select(a, dim, index)


def _transpose_handler(op, a, dim0, dim1):
    return transpose(a, dim0, dim1)


def _t_handler(op, a):
    if a.dim() < 2:
        return a
    return transpose(a, 0, 1)


def _sum_handler(op, a, dim=None, keepdim=False, *, dtype=None):
    if keepdim:
        raise NotImplementedError("sum: keepdim=True is not supported for sparse tensors")
    return sum(a, dim, dtype)


SparseTensor._handlers.update({
    "mm": _mm_handler, "matmul": _matmul_handler, "bmm": _bmm_handler, "addmm": _addmm_handler, "add": _add_handler,
    "sub": _sub_handler, "mul": _mul_handler, "div": _div_handler, "neg": _neg_handler,
    "clone": _clone_handler, "zeros_like": _zeros_like_handler, "_to_copy": _to_copy_handler,
    "transpose": _transpose_handler, "t": _t_handler, "sum": _sum_handler, "index_select": _index_select_handler,
    "select": _select_handler,
})


# ---- Tensor methods (a dense tensor's conversions; a sparse tensor's own) ------------------------------------
def _coalesce_method(self: Tensor) -> Tensor:
    if not isinstance(self, SparseTensor):
        raise RuntimeError(f"coalesce expected sparse coordinate tensor layout but got {strided}")
    return coalesce(self)


def _is_coalesced_method(self: Tensor) -> bool:
    if not isinstance(self, SparseTensor):
        raise RuntimeError(f"is_coalesced expected sparse coordinate tensor layout but got {strided}")
    return self.is_coalesced()


def _to_sparse_coo_method(self: Tensor) -> SparseTensor:
    return dense_to_sparse(self)


def _is_sparse_csr_dense(self: Tensor) -> bool:
    return False


def install_methods() -> None:
    """Tensor.to_sparse / to_sparse_coo / to_sparse_csr / _csc / _bsr / _bsc / to_dense / coalesce / is_coalesced."""
    Tensor.to_sparse = dense_to_sparse
    Tensor.to_sparse_coo = _to_sparse_coo_method
    Tensor.to_sparse_csr = to_sparse_csr
    Tensor.to_sparse_csc = to_sparse_csc
    Tensor.to_sparse_bsr = to_sparse_bsr
    Tensor.to_sparse_bsc = to_sparse_bsc
    Tensor.to_dense = to_dense
    Tensor.coalesce = _coalesce_method
    Tensor.is_coalesced = _is_coalesced_method
    Tensor.is_sparse_csr = property(_is_sparse_csr_dense)
