"""SparseTensor: COO, CSR, CSC, BSR and BSC tensors, a wrapper subclass of Tensor that runs its own autograd.

A sparse tensor is a `SparsePattern` (layout, size, the coordinates of its stored entries as a NumPy
int64 array, for the compressed layouts also the compressed pointers: of rows for CSR/BSR, of columns
for CSC/BSC, the entries ordered accordingly) and a dense `values` Tensor of shape (nnz, *dense_dims);
for the blocked layouts (BSR/BSC) the coordinates are those of blocks and the values (nnzb, bh, bw). Its `_device` is the dispatcher's `WRAPPER_DEVICE` and the class declares
`_wrapper_owns_autograd`, so an operator called with one reaches `SparseTensor.__torch_dispatch__`
above the autograd layer (PyTorch's sparse kernels carry their own derivative formulas): the handlers
in `flambeau.sparse._ops` compose every sparse op from two differentiable primitives defined here,

  `values_of(S)`            the values of S; the gradient is sparse with S's pattern,
  `with_values(v, pattern)`  a sparse tensor of a pattern; the gradient of v gathers the incoming
                             gradient (sparse or dense) at the pattern's coordinates,

plus dense flambeau operators (index_add, scatter_reduce, index_put), so gradients follow from the
operators' own derivatives. Only `torch.mm`/`@`/`addmm` need a Function of their own: PyTorch gives
a sparse left operand of those a dense gradient (`SparseMMDenseGrad`). COO/CSR kernels run on cpu.
"""
from __future__ import annotations

import numpy as np

from .._backends import MetaArray
from .._dispatch import WRAPPER_DEVICE
from .._tensor import Size, Tensor, sparse_bsc, sparse_bsr, sparse_coo, sparse_csc, sparse_csr, strided
from .._ops.creation import tensor as _tensor, zeros
from ..autograd.function import Function

INDEX_DTYPE = np.int64
COMPRESSED = (sparse_csr, sparse_csc, sparse_bsr, sparse_bsc)
BLOCKED = (sparse_bsr, sparse_bsc)
ROW_COMPRESSED = (sparse_csr, sparse_bsr)      # crow_indices / col_indices
COLUMN_COMPRESSED = (sparse_csc, sparse_bsc)   # ccol_indices / row_indices


class SparsePattern:
    """Where a sparse tensor's entries are: layout, size, sparse_dim, the (sparse_dim, nnz) int64
    coordinates `idx` (of blocks for BSR/BSC), the compressed pointers `crow` (of rows for CSR/BSR, of
    columns for CSC/BSC; None for COO), whether the coordinates are sorted and unique (`coalesced`),
    and the block size `block` ((bh, bw) for BSR/BSC, else None). Immutable: tensors and gradients
    share one pattern object."""
    __slots__ = ("layout", "shape", "sparse_dim", "idx", "crow", "coalesced", "device", "block")

    def __init__(self, layout, shape, idx: np.ndarray, crow: np.ndarray | None, coalesced: bool, device,
                 block: tuple | None = None) -> None:
        self.layout, self.shape, self.idx, self.crow = layout, tuple(int(s) for s in shape), idx, crow
        self.sparse_dim, self.coalesced, self.device = idx.shape[0], bool(coalesced), device
        self.block = block

    @property
    def nnz(self) -> int:
        return self.idx.shape[1]

    @property
    def batch_shape(self) -> tuple:
        """The batch dimensions of a batched compressed tensor (its compressed pointers (*batch, n + 1);
        the coordinates then lead with the batch ones), else ()."""
        return tuple(self.crow.shape[:-1]) if self.crow is not None else ()

    def linear(self) -> np.ndarray:
        """The coordinates as row-major linear positions in the sparse dimensions."""
        if self.nnz == 0:
            return np.zeros(0, INDEX_DTYPE)
        return np.ravel_multi_index(tuple(self.idx), self.shape[:self.sparse_dim]).astype(INDEX_DTYPE)

    def index_tensors(self) -> tuple:
        return tuple(_tensor(row, dtype=None) for row in self.idx)


def csr_row_pointers(rows: np.ndarray, nrows: int) -> np.ndarray:
    """crow_indices of sorted row coordinates: crow[r] is the number of entries in rows before r."""
    crow = np.zeros(nrows + 1, INDEX_DTYPE)
    np.cumsum(np.bincount(rows, minlength=nrows), out=crow[1:])
    return crow


def make_sparse(pattern: SparsePattern, values: Tensor) -> "SparseTensor":
    """A SparseTensor holding `values` (detached, shape (nnz, *dense_dims)) at `pattern`'s entries."""
    t = object.__new__(SparseTensor)
    t._pattern = pattern
    t._vals = values
    t._dtype = values._dtype
    t._device = WRAPPER_DEVICE
    t._version = [0]
    t._requires_grad = False
    t._fw_grad = None
    t._data = MetaArray(pattern.shape, values._data.dtype)
    return t


def layout_kind(layout) -> str:
    """PyTorch's name of a layout in messages: SparseCsr, SparseCsc, SparseBsr, SparseBsc, Sparse, Strided."""
    if layout is sparse_coo:
        return "Sparse"
    return "".join(part.capitalize() for part in layout.name.split("_"))


def _backend_name(t: "SparseTensor") -> str:
    kind = "SparseCsr" if t._pattern.layout in COMPRESSED else "Sparse"
    return kind + t._pattern.device.type.upper()


class SparseTensor(Tensor):
    """A sparse COO or CSR tensor (see module docstring)."""

    _wrapper_owns_autograd = True      # the dispatcher calls __torch_dispatch__ above autograd
    _handlers: dict = {}               # op name -> handler(op, args, kwargs), filled by flambeau.sparse._ops

    _blocked_to_coo = None             # BSR/BSC -> COO, set by flambeau.sparse._compressed
    # handlers that only transform the values, so they keep a blocked pattern (the modules registering
    # handlers add theirs); the others see a BSR/BSC argument as COO (`_blocked_to_coo`)
    _value_only_handlers: set = {"neg", "clone", "div", "_to_copy", "mul"}
    _batched_handlers: set = {"bmm", "matmul"}     # handlers that take a batched CSR/CSC left operand too

    @classmethod
    def __torch_dispatch__(cls, op, types, args, kwargs):
        handler = cls._handlers.get(op.__name__)
        batched = next((a for a in args if isinstance(a, SparseTensor) and a._pattern.batch_shape), None)
        if batched is not None and op.__name__ not in cls._value_only_handlers and \
                not (op.__name__ in cls._batched_handlers and args and args[0] is batched):
            raise NotImplementedError(
                f"Could not run 'aten::{op.name}' with arguments from the '{_backend_name(batched)}' backend: "
                f"flambeau's batched {batched.layout} tensors support to_dense, to_sparse, values, value-wise "
                "ops (mul, neg, the zero-preserving unary ops) and bmm/matmul by a dense tensor; call to_dense() "
                "first.")
        if handler is not None and op.__name__ not in cls._value_only_handlers:
            args = tuple(cls._blocked_to_coo(a) if isinstance(a, SparseTensor) and a._pattern.block else a
                         for a in args)
        if handler is None:
            s = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, SparseTensor))
            raise NotImplementedError(
                f"Could not run 'aten::{op.name}' with arguments from the '{_backend_name(s)}' backend. This could "
                f"be because the operator doesn't exist for this backend: flambeau's {s.layout} tensors support "
                f"mm/addmm/matmul, add/sub/mul/neg, sum, coalesce, to_dense and conversions; call to_dense() first.")
        return handler(op, *args, **kwargs)

    # -- metadata ---------------------------------------------------------------------------------------
    @property
    def layout(self):
        return self._pattern.layout

    @property
    def is_sparse(self) -> bool:
        return self._pattern.layout is sparse_coo

    @property
    def is_sparse_csr(self) -> bool:
        return self._pattern.layout is sparse_csr

    @property
    def device(self):
        return self._pattern.device

    @property
    def is_cpu(self) -> bool:
        return self._pattern.device.type == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self._pattern.device.type == "cuda"

    def get_device(self) -> int:
        return -1 if self.is_cpu else (self._pattern.device.index or 0)

    def sparse_dim(self) -> int:
        return 2 if self._pattern.layout in COMPRESSED else self._pattern.sparse_dim

    def dense_dim(self) -> int:
        return len(self._pattern.shape) - self._pattern.sparse_dim

    def _nnz(self) -> int:
        return self._pattern.nnz // max(1, int(np.prod(self._pattern.batch_shape)))

    def _per_batch(self, a: np.ndarray) -> np.ndarray:
        """An array over all entries (nnz of every batch, batch-major) as (*batch, nnz, ...)."""
        p = self._pattern
        return a.reshape(p.batch_shape + (self._nnz(),) + a.shape[1:]) if p.batch_shape else a

    def is_coalesced(self) -> bool:
        if self._pattern.layout is not sparse_coo:
            raise RuntimeError(f"is_coalesced expected sparse coordinate tensor layout but got {self.layout}")
        return self._pattern.coalesced

    def stride(self, dim: int | None = None):
        st = (0,) * self.ndim
        return st if dim is None else st[dim]

    def is_contiguous(self, memory_format=None) -> bool:
        raise RuntimeError(f"is_contiguous: {self.layout} tensors do not have is_contiguous")

    def data_ptr(self) -> int:
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")

    def storage_offset(self) -> int:
        raise RuntimeError(f"Cannot access storage of {type(self).__name__}Impl ({self.layout})")

    # -- components -------------------------------------------------------------------------------------
    def _indices(self) -> Tensor:
        self._need(sparse_coo, "_indices")
        return _tensor(self._pattern.idx)

    def indices(self) -> Tensor:
        self._need(sparse_coo, "indices")
        if not self._pattern.coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call .coalesce() first")
        return _tensor(self._pattern.idx)

    def _values(self) -> Tensor:
        return values_of(self)

    def values(self) -> Tensor:
        p = self._pattern
        if p.layout is sparse_coo and not p.coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call .coalesce() first")
        v = values_of(self)
        return v.reshape(p.batch_shape + (self._nnz(),) + tuple(v.shape[1:])) if p.batch_shape else v

    def crow_indices(self) -> Tensor:
        self._need(ROW_COMPRESSED, "crow_indices")
        return _tensor(self._pattern.crow)

    def col_indices(self) -> Tensor:
        self._need(ROW_COMPRESSED, "col_indices")
        return _tensor(self._per_batch(self._pattern.idx[-1]))

    def ccol_indices(self) -> Tensor:
        self._need(COLUMN_COMPRESSED, "ccol_indices")
        return _tensor(self._pattern.crow)

    def row_indices(self) -> Tensor:
        self._need(COLUMN_COMPRESSED, "row_indices")
        return _tensor(self._per_batch(self._pattern.idx[-2]))

    def _need(self, layouts, what: str) -> None:
        if self._pattern.layout is layouts or (isinstance(layouts, tuple) and self._pattern.layout in layouts):
            return
        if layouts is ROW_COMPRESSED:
            raise RuntimeError(f"{what} expected sparse row compressed tensor layout but got "
                               f"{layout_kind(self.layout)}")
        if layouts is COLUMN_COMPRESSED:
            raise RuntimeError(f"{what} expected sparse column compressed tensor layout but got "
                               f"{layout_kind(self.layout)}")
        raise RuntimeError(f"{what} expected sparse coordinate tensor layout but got {self.layout}")

    # -- what a dense tensor would read from `_data` --------------------------------------------------------
    def detach(self) -> "SparseTensor":
        return make_sparse(self._pattern, self._vals)

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {'Sparse' if self.is_sparse else 'SparseCsr'} layout tensor to numpy. "
                        "Use Tensor.to_dense() first.")

    def __array__(self, dtype=None, copy=None):
        self.numpy()

    def _host(self):
        raise RuntimeError(f"a {self.layout} tensor has no single array to copy out: NumPy conversions need "
                           "to_dense() (or its indices()/values())")

    def item(self):
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        return self.to_dense().item()

    def tolist(self):
        raise RuntimeError(f"tolist() is not supported for {self.layout} tensors: call to_dense() first")

    def reshape(self, *shape):
        raise RuntimeError("reshape is not implemented for sparse tensors")

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = make_sparse(self._pattern, self._vals.clone())
        new._requires_grad = self._requires_grad
        memo[id(self)] = new
        return new

    # -- autograd engine protocol of wrapper tensors (autograd.graph._meta_of, engine._reduce_to) ----------
    def _wrapper_meta(self) -> tuple:
        return (Size(self._pattern.shape), self._dtype, self._pattern.device)

    def _wrapper_reduce_to(self, shape, dtype, device) -> "SparseTensor":
        if tuple(shape) != self._pattern.shape:
            raise RuntimeError(f"a sparse gradient of shape {list(self._pattern.shape)} reached an input of shape "
                               f"{list(shape)}")
        return self if dtype is self._dtype else with_values(self._vals.to(dtype), self._pattern)

    def _wrapper_write(self, res, opname: str) -> None:
        if not isinstance(res, SparseTensor):
            raise RuntimeError(f"{opname}: the result is a dense tensor and cannot be written into a {self.layout} "
                               "tensor in place; use the out-of-place op")
        if res._pattern.shape != self._pattern.shape:
            raise RuntimeError(f"{opname}: output with shape {list(self.shape)} doesn't match the result shape "
                               f"{list(res.shape)}")
        self._pattern, self._vals = res._pattern, res._vals.to(self._dtype)

    def __repr__(self, *, tensor_contents=None):
        p = self._pattern
        vals = self.detach().values() if p.layout in COMPRESSED else self._vals
        if p.layout is sparse_coo:
            parts = [("indices", _tensor(p.idx)), ("values", self._vals)]
        elif p.layout in ROW_COMPRESSED:
            parts = [("crow_indices", self.crow_indices()), ("col_indices", self.col_indices()), ("values", vals)]
        else:
            parts = [("ccol_indices", self.ccol_indices()), ("row_indices", self.row_indices()), ("values", vals)]
        lines = []
        for name, comp in parts:
            pad = " " * (len("tensor(") + len(name) + 1)
            lines.append(f"{name}=" + repr(comp).replace("\n", "\n" + pad))
        dtype = "" if self._dtype.name == "float32" else f", dtype={self._dtype}"
        tail = f"size={p.shape}, nnz={self._nnz()}{dtype}, layout={p.layout}"
        if self._grad_fn is not None:
            tail += f", grad_fn=<{self._grad_fn.name()}>"
        elif self._requires_grad:
            tail += ", requires_grad=True"
        return "tensor(" + ",\n       ".join(lines + [tail]) + ")"


# ---- the two differentiable primitives ------------------------------------------------------------------
class ValuesOf(Function):
    """S -> S's values (an alias); the gradient is sparse with S's pattern."""

    @staticmethod
    def forward(ctx, s: SparseTensor) -> Tensor:
        ctx.pattern = s._pattern
        v = s._vals
        return Tensor._make(v._data, v._device, v._dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return make_sparse(ctx.pattern, grad)


class WithValues(Function):
    """(values, pattern) -> the sparse tensor; values' gradient gathers the gradient at the pattern."""

    @staticmethod
    def forward(ctx, values: Tensor, pattern: SparsePattern) -> SparseTensor:
        ctx.pattern = pattern
        return make_sparse(pattern, values.detach())

    @staticmethod
    def backward(ctx, grad: Tensor):
        return gather_at(grad, ctx.pattern), None


def values_of(s: SparseTensor) -> Tensor:
    return ValuesOf.apply(s)


def with_values(values: Tensor, pattern: SparsePattern) -> SparseTensor:
    return WithValues.apply(values, pattern)


def gather_at(g: Tensor, pattern: SparsePattern) -> Tensor:
    """The entries of gradient `g` (dense or sparse) at `pattern`'s coordinates, shape (nnz, *dense)."""
    if not isinstance(g, SparseTensor):
        return g[pattern.index_tensors()] if pattern.sparse_dim else g.unsqueeze(0)
    if g._pattern is pattern:
        return values_of(g)
    glin, inverse = np.unique(g._pattern.linear(), return_inverse=True)
    gv = g._vals
    if glin.shape[0] != g._pattern.nnz:          # an uncoalesced gradient: sum its duplicates first
        gv = zeros((glin.shape[0],) + tuple(gv.shape[1:]), dtype=gv.dtype).index_add(0, _tensor(inverse.reshape(-1)), gv)
    lin = pattern.linear()
    pos = np.searchsorted(glin, lin)
    found = pos < glin.shape[0]
    found[found] = glin[pos[found]] == lin[found]
    out = zeros((pattern.nnz,) + tuple(gv.shape[1:]), dtype=gv.dtype)
    if found.any():
        out[_tensor(np.nonzero(found)[0])] = gv[_tensor(pos[found])]
    return out


# ---- torch.mm / @ / addmm: a dense gradient for the sparse operand ------------------------------------------
def spmm_forward(pattern: SparsePattern, values: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """S @ D for a 2-D pattern: each entry (r, c, v) adds v * D[c] to row r."""
    rows, cols = pattern.idx
    out = np.zeros((pattern.shape[0], dense.shape[1]), dtype=np.result_type(values, dense))
    if pattern.nnz:
        np.add.at(out, rows, values[:, None] * dense[cols])
    return out


class SparseMMDenseGrad(Function):
    """torch.mm(S, D) with S sparse: dense result; S's gradient is the dense G @ D^T (PyTorch's rule
    for mm, unlike torch.sparse.mm), D's is S^T @ G."""

    @staticmethod
    def forward(ctx, s: SparseTensor, d: Tensor) -> Tensor:
        ctx.pattern, ctx.values, ctx.dense = s._pattern, s._vals, d.detach()
        return Tensor._make(spmm_forward(s._pattern, s._vals._data, d._data), d._device)

    @staticmethod
    def backward(ctx, grad: Tensor):
        gs = gd = None
        if ctx.needs_input_grad[0]:
            gs = grad.mm(ctx.dense.t())
        if ctx.needs_input_grad[1]:
            p = ctx.pattern
            pt = SparsePattern(sparse_coo, (p.shape[1], p.shape[0]), p.idx[::-1].copy(), None, False, p.device)
            gd = Tensor._make(spmm_forward(pt, ctx.values._data, grad.detach()._data), grad._device)
        return gs, gd


def layout_of(t) -> object:
    return t._pattern.layout if isinstance(t, SparseTensor) else strided
