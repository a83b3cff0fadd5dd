"""`flambeau.sparse`: PyTorch's sparse tensors.

COO, CSR, CSC, BSR and BSC tensors (`flambeau.sparse_coo_tensor`, `sparse_csr_tensor`, `sparse_csc_tensor`,
`sparse_bsr_tensor`, `sparse_bsc_tensor`, `sparse_compressed_tensor`; `Tensor.to_sparse(layout=, blocksize=)`,
`to_sparse_csr()`, `to_sparse_csc()`, `to_sparse_bsr()`, `to_sparse_bsc()`, `to_dense()`; `_compressed.py`)
with `sparse.mm` (and `reduce=`), `sparse.sum`, `sparse.addmm` and `torch.mm`/`@`/`addmm` with a sparse
left operand, zero-preserving element-wise ops and `sparse.softmax`/`log_softmax`, forward and backward on
cpu (`_tensor.py`, `_ops.py`, `_elementwise.py`); 2:4 semi-structured sparsity
(`to_sparse_semi_structured`, `SparseSemiStructuredTensor`) in `semi_structured.py`.
"""
from __future__ import annotations

from ._tensor import SparseTensor
from ._compressed import sparse_bsc_tensor, sparse_bsr_tensor, sparse_compressed_tensor, sparse_csc_tensor
from ._ops import (addmm, coalesce, dense_to_sparse, install_methods, mm, sampled_addmm, sparse_coo_tensor,
                   sparse_csr_tensor, sum, to_dense, to_sparse_csr)
from ._elementwise import install_methods as _install_elementwise_methods, log_softmax, softmax

from .semi_structured import (SparseSemiStructuredTensor, SparseSemiStructuredTensorCUSPARSELT,
                              SparseSemiStructuredTensorCUTLASS, semi_structured_mask, to_sparse_semi_structured)

install_methods()
_install_elementwise_methods()

__all__ = ["SparseTensor", "addmm", "mm", "sampled_addmm", "sum", "softmax", "log_softmax", "sparse_coo_tensor", "sparse_csr_tensor",
           "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor", "sparse_compressed_tensor",
           "SparseSemiStructuredTensor", "SparseSemiStructuredTensorCUTLASS", "SparseSemiStructuredTensorCUSPARSELT", "to_sparse_semi_structured",
           "semi_structured_mask"]
