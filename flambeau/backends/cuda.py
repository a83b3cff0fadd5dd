"""torch.backends.cuda: the cuBLAS switches read by the cuda matrix products, and the attention ones.

`matmul.allow_tf32` is a view of `flambeau.set_float32_matmul_precision` (True: "high", False:
"highest"; reading it says whether the precision is not "highest"), False by default as in PyTorch.
`matmul.allow_fp16_reduced_precision_reduction` / `allow_bf16_reduced_precision_reduction` (default
True) let cuBLASLt reduce split-K partial sums in the half type; False keeps them in fp32.
The attention switches (enable_{flash,mem_efficient,math,cudnn}_sdp, their queries and the older
`sdp_kernel` context manager) set the flags scaled_dot_product_attention's backend choice reads
(flambeau/_ops/attention.py), the same flags `flambeau.nn.attention.sdpa_kernel` sets for a block.
"""
from __future__ import annotations

import contextlib
import warnings

from .. import _state
from .._backends import cublaslt, cudnn_attention, cupy_available, triton_launch
from .._ops.attention import SDPBackend, backend_enabled, set_backend_enabled, sdpa_kernel

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


__all__ = ["matmul", "is_built", "enable_flash_sdp", "flash_sdp_enabled", "enable_mem_efficient_sdp", "mem_efficient_sdp_enabled",
           "enable_math_sdp", "math_sdp_enabled", "enable_cudnn_sdp", "cudnn_sdp_enabled",
           "is_flash_attention_available", "sdp_kernel"]


def enable_flash_sdp(enabled: bool) -> None:
    """Enable or disable the flash attention backend (flambeau's Triton kernel on cuda)."""
    set_backend_enabled(SDPBackend.FLASH_ATTENTION, enabled)


def flash_sdp_enabled() -> bool:
    return backend_enabled(SDPBackend.FLASH_ATTENTION)


def enable_mem_efficient_sdp(enabled: bool) -> None:
    """Enable or disable the memory-efficient backend (the Triton kernel with masks on cuda)."""
    set_backend_enabled(SDPBackend.EFFICIENT_ATTENTION, enabled)


def mem_efficient_sdp_enabled() -> bool:
    return backend_enabled(SDPBackend.EFFICIENT_ATTENTION)


def enable_math_sdp(enabled: bool) -> None:
    set_backend_enabled(SDPBackend.MATH, enabled)


def math_sdp_enabled() -> bool:
    return backend_enabled(SDPBackend.MATH)


def enable_cudnn_sdp(enabled: bool) -> None:
    """Enable or disable cuDNN's fused attention (through nvidia-cudnn-frontend)."""
    set_backend_enabled(SDPBackend.CUDNN_ATTENTION, enabled)


def cudnn_sdp_enabled() -> bool:
    return backend_enabled(SDPBackend.CUDNN_ATTENTION)


def is_flash_attention_available() -> bool:
    """Whether the flash kernel can be built here (Triton and CuPy importable)."""
    return triton_launch.available()


def is_cudnn_attention_available() -> bool:
    """Whether cuDNN's fused attention can be used here (the frontend package and libcudnn)."""
    return cudnn_attention.available()


@contextlib.contextmanager
def sdp_kernel(enable_flash: bool = True, enable_math: bool = True, enable_mem_efficient: bool = True,
               enable_cudnn: bool = True):
    """Deprecated in PyTorch for torch.nn.attention.sdpa_kernel; enables the named backends in a block."""
    warnings.warn("torch.backends.cuda.sdp_kernel() is deprecated. In the future, this context manager will be "
                  "removed. Please see torch.nn.attention.sdpa_kernel() for the new context manager, with updated "
                  "signature.", FutureWarning, stacklevel=3)
    chosen = [b for b, on in ((SDPBackend.FLASH_ATTENTION, enable_flash), (SDPBackend.MATH, enable_math),
                              (SDPBackend.EFFICIENT_ATTENTION, enable_mem_efficient),
                              (SDPBackend.CUDNN_ATTENTION, enable_cudnn)) if on]
    with sdpa_kernel(chosen):
        yield {}
