"""2:4 semi-structured sparsity: `to_sparse_semi_structured(W)` -> `SparseSemiStructuredTensor`.

A 2-D weight in which at most 2 of every 4 consecutive elements of a row are nonzero is stored as its
kept values, shape (m, k/2), and metadata, shape (m, k/16) int16: per group of 4 the two kept column
offsets (2 bits each), four groups per int16. Used as an `nn.Linear` weight (through `nn.Parameter`),
or in `mm`/`addmm`/`matmul`/`linear`, it multiplies:
  - on cuda through cuSPARSELt (`_cusparselt.py`, ctypes) for float16/bfloat16/int8, unless
    `SparseSemiStructuredTensor._FORCE_CUTLASS` is set (flambeau has no CUTLASS kernel: that class runs
    the dense fallback) or the library is missing;
  - elsewhere (cpu, and cuda without cuSPARSELt) by the dense fallback: the weight rebuilt from values
    and metadata and multiplied densely, so the numbers are those of the masked dense product.
PyTorch accepts cuda tensors only; flambeau also takes cpu ones (dense fallback) so the format, the
checks and the products are testable anywhere. The validation follows PyTorch's (2-D, contiguous,
dtype, shape multiples per backend) and also checks the 2:4 pattern itself.
"""
from __future__ import annotations

import warnings
from collections import namedtuple

import numpy as np

from .. import _dtype as D
from .._backends import MetaArray, get as backend_of
from .._dispatch import WRAPPER_DEVICE
from .._tensor import Size, Tensor
from .._ops.creation import tensor as _tensor
from ..autograd.function import Function
from ..nn.parameter import Parameter
from . import _cusparselt

_SEMI_STRUCTURED_SPARSE_CONFIG = namedtuple(
    "_SEMI_STRUCTURED_SPARSE_CONFIG", "sparse_min_rows sparse_min_cols dense_min_rows dense_min_cols")
GROUP = 4                 # 2:4: two of every GROUP consecutive elements of a row are kept
KEPT = 2
GROUPS_PER_META = 4       # one int16 of metadata holds the two 2-bit offsets of four groups
_DEFAULT_ALG_ID = 0


def _kept_offsets_table() -> np.ndarray:
    """For each 4-bit nonzero pattern of a group, its two kept offsets (ascending): the nonzero ones, then
    the first zeros; (-1, -1) for patterns with more than two nonzeros."""
    table = np.full((1 << GROUP, KEPT), -1, np.int64)
    for bits in range(1 << GROUP):
        nz = [i for i in range(GROUP) if bits >> i & 1]
        if len(nz) <= KEPT:
            table[bits] = sorted(nz + [i for i in range(GROUP) if i not in nz][:KEPT - len(nz)])
    return table


_KEPT_OFFSETS = _kept_offsets_table()


def compress(dense, what: str = "to_sparse_semi_structured", xp=np) -> tuple:
    """(values (m, k/2), meta (m, k/16) int16) of a 2:4-sparse (m, k) array of namespace `xp` (NumPy or
    CuPy: the work stays on the array's device). Raises naming the first group with more than two nonzeros."""
    m, k = dense.shape
    groups = dense.reshape(m, k // GROUP, GROUP)
    bits = ((groups != 0) * (1 << xp.arange(GROUP))).sum(-1)
    offsets = xp.asarray(_KEPT_OFFSETS)[bits]
    bad = offsets[..., 0] < 0
    if bool(bad.any()):
        r, g = (int(i) for i in xp.argwhere(bad)[0])
        n = int((groups[r, g] != 0).sum())
        raise RuntimeError(f"{what}: the {m}x{k} tensor is not 2:4 sparse: row {r}, columns {GROUP * g}..{GROUP * g + 3} "
                           f"hold {n} nonzeros (at most {KEPT} of every {GROUP} consecutive elements of a row may be "
                           "nonzero); prune it first (flambeau.sparse.semi_structured_mask)")
    values = xp.take_along_axis(groups, offsets, axis=-1).reshape(m, k // 2)
    codes = (offsets[..., 0] | (offsets[..., 1] << 2)).astype(xp.uint16).reshape(m, -1, GROUPS_PER_META)
    meta = xp.zeros(codes.shape[:2], xp.uint16)
    for j in range(GROUPS_PER_META):
        meta |= codes[..., j] << (4 * j)
    return values, meta.view(xp.int16)


def decompress(values: np.ndarray, meta: np.ndarray, shape: tuple, xp=np) -> np.ndarray:
    """The dense (m, k) array of `compress`'s output."""
    m, k = shape
    meta = meta.view(xp.uint16).astype(xp.int64)
    shifts = 4 * xp.arange(GROUPS_PER_META)
    codes = ((meta[..., None] >> shifts) & 0xF).reshape(m, k // GROUP)
    offsets = xp.stack([codes & 3, codes >> 2], axis=-1)
    out = xp.zeros((m, k // GROUP, GROUP), dtype=values.dtype)
    rows = xp.arange(m)[:, None, None]
    groups = xp.arange(k // GROUP)[None, :, None]
    out[rows, groups, offsets] = values.reshape(m, k // GROUP, KEPT)
    return out.reshape(m, k)


def semi_structured_mask(weight: Tensor) -> Tensor:
    """The 2:4 magnitude mask of a 2-D weight: in every group of 4 consecutive elements of a row, the
    2 of largest absolute value (the tutorial's / torch.ao.pruning's rule, sparse_block_shape=(1, 4),
    zeros_per_block=2; ties keep the earlier element). A bool tensor of the weight's shape."""
    if weight.dim() != 2 or weight.shape[1] % GROUP:
        raise RuntimeError(f"semi_structured_mask: expected a 2-D weight with columns a multiple of {GROUP}, got "
                           f"{list(weight.shape)}")
    a = np.abs(weight.detach().cpu().float().numpy()).reshape(weight.shape[0], -1, GROUP)
    keep = np.argsort(-a, axis=-1, kind="stable")[..., :KEPT]
    mask = np.zeros(a.shape, bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    return _tensor(mask.reshape(tuple(weight.shape))).to(weight.device)


class SparseSemiStructuredTensor(Tensor):
    """A 2:4-sparse 2-D tensor (see module docstring). `t()` gives the transposed view used by linear."""

    _FORCE_CUTLASS = False
    _DEFAULT_ALG_ID = _DEFAULT_ALG_ID
    _DTYPE_SHAPE_CONSTRAINTS: dict = {}
    BACKEND = "dense"
    _wrapper_owns_autograd = True
    _handlers: dict = {}

    @classmethod
    def from_dense(cls, original_tensor: Tensor, alg_id: int = _DEFAULT_ALG_ID) -> "SparseSemiStructuredTensor":
        cls._validate_device_dim_dtype_shape(original_tensor)
        w = original_tensor.detach()
        xp = backend_of(w.device.type).xp
        values, meta = compress(w._data, f"{cls.__name__}.from_dense", xp)
        t = object.__new__(cls)
        t._dtype = w.dtype
        t._device = WRAPPER_DEVICE
        t._version = [0]
        t._requires_grad = False
        t._fw_grad = None
        t._shape = tuple(w.shape)
        t._data = MetaArray(t._shape, w._data.dtype)
        t._real_device = w.device
        t.packed = Tensor._make(values, w.device, w.dtype)
        t.meta = Tensor._make(meta, w.device, D.int16)
        t._transposed = False
        t.alg_id_cusparselt = alg_id
        t.fuse_transpose_cusparselt = False
        t._dense_cache = None
        t._cslt = None
        return t

    @classmethod
    def _validate_device_dim_dtype_shape(cls, original_tensor: Tensor) -> None:
        if not isinstance(original_tensor, Tensor) or original_tensor.device.type not in ("cuda", "cpu"):
            raise RuntimeError(f"Error original_tensor.device= {getattr(original_tensor, 'device', None)} is not "
                               "supported! Only CUDA tensors (and, in flambeau, cpu ones) are currently supported.")
        if original_tensor.dim() != 2:
            raise RuntimeError(f"Error original_tensor.dim = {original_tensor.dim()} is not supported! "
                               "Only 2d tensors are currently supported.")
        if not original_tensor.is_contiguous():
            raise RuntimeError("Error original_tensor is not contiguous!Only contiguous tensors are currently supported.")
        if original_tensor.dtype not in cls._DTYPE_SHAPE_CONSTRAINTS:
            raise RuntimeError(f"Error original_tensor.dtype {original_tensor.dtype} is not a supported dtype for {cls}!")
        m, n = original_tensor.shape
        c = cls._DTYPE_SHAPE_CONSTRAINTS[original_tensor.dtype]
        if m < c.sparse_min_rows or m % c.sparse_min_rows or n < c.sparse_min_cols or n % c.sparse_min_cols:
            raise RuntimeError(f"Error original_tensor.shape {original_tensor.shape} is not supported! Both dimensions "
                               f"must be larger or equal than and a multiple of ({c.sparse_min_rows}, {c.sparse_min_cols})")

    # -- metadata ----------------------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._shape[::-1] if self._transposed else self._shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def device(self):
        return self._real_device

    @property
    def is_cuda(self) -> bool:
        return self._real_device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self._real_device.type == "cpu"

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"{type(self).__name__}(shape={self.shape})"

    def _host(self):
        raise RuntimeError(f"a {type(self).__name__} has no single array to save or copy out: use to_dense() "
                           "(or values()/indices())")

    def values(self) -> Tensor:
        return self.packed.detach()

    def indices(self) -> Tensor:
        return self.meta

    def detach(self) -> "SparseSemiStructuredTensor":
        t = object.__new__(type(self))
        t.__dict__.update(self.__dict__)
        t._requires_grad = False
        t._grad_fn = None
        return t

    def t(self) -> "SparseSemiStructuredTensor":
        t = self.detach()
        t._transposed = not self._transposed
        return t

    def to_dense(self) -> Tensor:
        """The dense tensor (rebuilt from values and metadata; cached)."""
        if self._dense_cache is None:
            xp = backend_of(self._real_device.type).xp
            dense = decompress(self.packed._data, self.meta._data, self._shape, xp)
            self._dense_cache = Tensor._make(dense, self._real_device, self._dtype)
        return self._dense_cache.t() if self._transposed else self._dense_cache

    @classmethod
    def _wrapper_parameter(cls, data: "SparseSemiStructuredTensor", requires_grad: bool):
        """`nn.Parameter(sst)`: the tensor itself, marked as a parameter (PyTorch keeps the subclass)."""
        p = data.detach()
        p.__class__ = _PARAMETER_CLASSES[type(data)]
        p._requires_grad = bool(requires_grad)
        return p

    def _wrapper_meta(self) -> tuple:
        return (self.shape, self._dtype, self._real_device)

    @classmethod
    def __torch_dispatch__(cls, op, types, args, kwargs):
        handler = cls._handlers.get(op.__name__)
        if handler is None:
            raise NotImplementedError(f"{cls.__name__} only supports a specific set of operations, can't perform "
                                      f"requested op ({op.__name__})")
        return handler(op, *args, **kwargs)

    # -- products ------------------------------------------------------------------------------------------
    def _uses_sparse_kernel(self, b: Tensor) -> bool:
        """Whether W @ B runs a 2:4 kernel (cuSPARSELt on cuda, for either class: flambeau has no CUTLASS one;
        the saturating int8 product elsewhere) rather than the dense operator on the rebuilt weight."""
        return self._dtype is D.int8 or self._uses_cusparselt(b)

    def _uses_cusparselt(self, b: Tensor) -> bool:
        if self._real_device.type != "cuda" or self._dtype not in _cusparselt.SUPPORTED or not _cusparselt.available():
            return False
        c = SparseSemiStructuredTensorCUSPARSELT._DTYPE_SHAPE_CONSTRAINTS[self._dtype]
        m, k = self._shape
        return (m % c.sparse_min_rows == 0 and k % c.sparse_min_cols == 0 and b.shape[1] % c.dense_min_cols == 0
                and b.dtype is self._dtype)

    def _check_operand(self, b: Tensor) -> None:
        if isinstance(b, SparseSemiStructuredTensor):
            raise ValueError("`SparseSemiStructuredTensor @ SparseSemiStructuredTensor` is not supported by the hardware")
        if b.dim() != 2:
            raise NotImplementedError(f"`{type(self).__name__}` matmul: Broadcasting is not implemented")
        if b.dtype is not self._dtype:
            raise NotImplementedError(f"`{type(self).__name__}` matmul: trying to do `A={tuple(self._shape)} @ "
                                      f"B={tuple(b.shape)}`, with A.dtype={self._dtype} and B.dtype={b.dtype}. This "
                                      "operation is only supported when A and B have the same data type.")
        if b.shape[0] != self._shape[1]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({self._shape[0]}x{self._shape[1]} and "
                               f"{b.shape[0]}x{b.shape[1]})")

    def _sparse_mm(self, b: Tensor, bias: Tensor | None = None) -> Tensor:
        """W @ B (+ bias per output row) by the 2:4 kernel, for this untransposed W (m, k)."""
        return SemiStructuredMM.apply(b, bias, self)

    def _dense_product(self, b: Tensor, bias: Tensor | None) -> Tensor:
        """W @ B (+ bias[:, None]) from the rebuilt dense W; int8 accumulated in int32 and saturated to int8
        (cuSPARSELt's int8 numbers), float types accumulated in float32 and rounded once."""
        w = self.to_dense() if not self._transposed else self.t().to_dense()
        if self._dtype is D.int8:
            out = w.to(D.int32).mm(b.to(D.int32))
            if bias is not None:
                out = out + bias.to(D.int32).unsqueeze(1)
            return out.clamp(-128, 127).to(D.int8)
        acc = D.float32 if self._dtype in (D.float16, D.bfloat16) else self._dtype
        out = w.to(acc).mm(b.to(acc))
        if bias is not None:
            out = out + bias.to(acc).unsqueeze(1)
        return out.to(self._dtype)


class SemiStructuredMM(Function):
    """(B, bias, W) -> W @ B + bias[:, None]: cuSPARSELt or the saturating int8 product. B's gradient is W^T @ G
    and bias's the row sums of G (the weight gets none: it is a frozen, inference-time weight)."""

    @staticmethod
    def forward(ctx, b: Tensor, bias, w: SparseSemiStructuredTensor) -> Tensor:
        ctx.w = w
        if w._uses_cusparselt(b):
            return _cusparselt.matmul(w, b, bias)
        return w._dense_product(b, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w = ctx.w.to_dense() if not ctx.w._transposed else ctx.w.t().to_dense()
        gb = w.t().mm(grad) if ctx.needs_input_grad[0] else None
        gbias = grad.sum(1) if ctx.needs_input_grad[1] else None
        return gb, gbias, None


class SparseSemiStructuredTensorCUTLASS(SparseSemiStructuredTensor):
    """PyTorch's CUTLASS-backed class (`_FORCE_CUTLASS`): its dtypes and shape rules; flambeau has no CUTLASS
    kernel, so its products run on cuSPARSELt where that can take them, else the dense fallback."""
    BACKEND = "cutlass"
    _DTYPE_SHAPE_CONSTRAINTS = {
        D.int8: _SEMI_STRUCTURED_SPARSE_CONFIG(16, 128, 16, 16),
        D.float16: _SEMI_STRUCTURED_SPARSE_CONFIG(32, 64, 8, 8),
        D.bfloat16: _SEMI_STRUCTURED_SPARSE_CONFIG(32, 64, 8, 8),
        D.float32: _SEMI_STRUCTURED_SPARSE_CONFIG(32, 32, 4, 4),
    }


class SparseSemiStructuredTensorCUSPARSELT(SparseSemiStructuredTensor):
    """The cuSPARSELt-backed class: cuSPARSELt on cuda where the library loads, else the dense fallback."""
    BACKEND = "cusparselt"
    _DTYPE_SHAPE_CONSTRAINTS = {
        D.int8: _SEMI_STRUCTURED_SPARSE_CONFIG(32, 32, 16, 16),
        D.float16: _SEMI_STRUCTURED_SPARSE_CONFIG(16, 16, 8, 8),
        D.bfloat16: _SEMI_STRUCTURED_SPARSE_CONFIG(16, 16, 8, 8),
    }


def _parameter_class(cls: type) -> type:
    def parameter_repr(self) -> str:
        return "Parameter containing:\n" + cls.__repr__(self)
    return type(cls.__name__, (cls, Parameter), {"__repr__": parameter_repr, "__module__": cls.__module__,
                                                 "__new__": object.__new__})


_PARAMETER_CLASSES = {c: _parameter_class(c) for c in (SparseSemiStructuredTensorCUTLASS,
                                                       SparseSemiStructuredTensorCUSPARSELT)}


def to_sparse_semi_structured(original_tensor: Tensor, transposed: bool = False,
                              alg_id: int = _DEFAULT_ALG_ID) -> SparseSemiStructuredTensor:
    """`torch.sparse.to_sparse_semi_structured`: the CUTLASS class when `_FORCE_CUTLASS` is set, else the
    cuSPARSELt one."""
    if transposed:
        warnings.warn("Setting transpose from `to_sparse_semi_structured` is deprecated and will be removed in a "
                      "future release. `SparseSemiStructuredTensor` only support contiguous input tensors.",
                      FutureWarning, stacklevel=2)
    cls = SparseSemiStructuredTensorCUTLASS if SparseSemiStructuredTensor._FORCE_CUTLASS else \
        SparseSemiStructuredTensorCUSPARSELT
    return cls.from_dense(original_tensor, alg_id=alg_id)


# ---- operators on a SparseSemiStructuredTensor ------------------------------------------------------------------
# Each product takes the 2:4 kernel when `_uses_sparse_kernel`, else calls the operator itself on the rebuilt
# dense weight: the numbers (and gradients) of the dense nn.Linear / mm / addmm, on any device.
def _as_dense(a):
    return a.to_dense() if isinstance(a, SparseSemiStructuredTensor) else a


def _left_and_right(a, b):
    """(W untransposed, dense B, whether the result is transposed) of `a @ b` with one sparse operand."""
    if isinstance(a, SparseSemiStructuredTensor):
        if a._transposed:
            raise NotImplementedError("`SparseSemiStructuredTensor` matmul: a transposed sparse tensor can only be "
                                      "the right operand")
        a._check_operand(b)
        return a, b, False
    if not b._transposed:
        raise NotImplementedError("`SparseSemiStructuredTensor` matmul: the right operand must be a transposed "
                                  "sparse tensor (A @ W.t(), as nn.Linear computes)")
    w = b.t()
    if a.dim() != 2:
        raise NotImplementedError(f"`{type(w).__name__}` matmul: Broadcasting is not implemented")
    w._check_operand(a.t())
    return w, a.t(), True


def _mm_handler(op, a, b):
    """W @ B, or A @ W^T (linear's product: computed as (W @ A^T)^T, cuSPARSELt's sparse-left form)."""
    w, rhs, flipped = _left_and_right(a, b)
    if not w._uses_sparse_kernel(rhs):
        return op(_as_dense(a), _as_dense(b))
    out = w._sparse_mm(rhs)
    return out.t() if flipped else out


def _addmm_handler(op, bias, a, b, *, beta=1, alpha=1):
    if isinstance(a, SparseSemiStructuredTensor):
        raise NotImplementedError("`SparseSemiStructuredTensor` matmul: only operand B of `addmm` can be sparse")
    if bias.dim() != 1:
        raise NotImplementedError(f"`SparseSemiStructuredTensor` matmul: only bias dim=1 supported. Shape={bias.shape}")
    w, rhs, _ = _left_and_right(a, b)
    if not w._uses_sparse_kernel(rhs) or beta != 1 or alpha != 1:
        return op(bias, a, _as_dense(b), beta=beta, alpha=alpha)
    return w._sparse_mm(rhs, bias).t()


def _linear_handler(op, x, w, bias=None):
    if isinstance(x, SparseSemiStructuredTensor) or not isinstance(w, SparseSemiStructuredTensor) or w._transposed:
        raise NotImplementedError("`SparseSemiStructuredTensor` linear: only the (untransposed) weight can be sparse")
    x2 = x.reshape(-1, x.shape[-1])
    w._check_operand(x2.t())
    if not w._uses_sparse_kernel(x2.t()):
        return op(x, w.to_dense(), bias)
    out = w._sparse_mm(x2.t(), bias).t()
    return out.reshape(tuple(x.shape[:-1]) + (w.shape[0],))


def _detach_handler(op, a):
    return a.detach()


def _t_handler(op, a):
    return a.t()


SparseSemiStructuredTensor._handlers.update({
    "mm": _mm_handler, "matmul": _mm_handler, "addmm": _addmm_handler, "linear": _linear_handler,
    "detach": _detach_handler, "t": _t_handler,
})
