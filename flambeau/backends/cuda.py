"""torch.backends.cuda: the cuBLAS switches read by the cuda matrix products.

`matmul.allow_tf32` is a view of `flambeau.set_float32_matmul_precision` (True: "high", False:
"highest"; reading it says whether the precision is not "highest"), False by default as in PyTorch.
`matmul.allow_fp16_reduced_precision_reduction` / `allow_bf16_reduced_precision_reduction` (default
True) let cuBLASLt reduce split-K partial sums in the half type; False keeps them in fp32.
"""
from __future__ import annotations

from .. import _state
from .._backends import cublaslt, cupy_available

_REDUCTION_FLAGS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


class cuBLASModule:
    """`flambeau.backends.cuda.matmul`: unknown attributes raise AttributeError, as PyTorch's."""

    def __getattr__(self, name):
        if name == "allow_tf32":
            return _state.float32_matmul_precision != "highest"
        if name in _REDUCTION_FLAGS:
            return getattr(cublaslt, name)
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name, value):
        if name == "allow_tf32":
            _state.float32_matmul_precision = "high" if value else "highest"
        elif name in _REDUCTION_FLAGS:
            setattr(cublaslt, name, bool(value))
        else:
            raise AttributeError(f"Unknown attribute {name}")


matmul = cuBLASModule()


def is_built() -> bool:
    """Whether flambeau can run cuda tensors here (CuPy importable and a GPU visible)."""
    return cupy_available()
