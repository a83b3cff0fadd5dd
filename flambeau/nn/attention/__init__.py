"""flambeau.nn.attention: choose the scaled_dot_product_attention implementation.

`with sdpa_kernel(SDPBackend.MATH):` forces the math path (materialises the L×S score matrix).
On cuda, CUDNN_ATTENTION is cuDNN's fused attention, FLASH_ATTENTION and EFFICIENT_ATTENTION the
Triton flash kernel (the latter with masks); on cpu those two mean the blocked online-softmax
path, which never materialises the scores. The choice is made in flambeau/_ops/attention_fused.py.
"""
from ..._ops.attention import SDPBackend, sdpa_kernel  # noqa: F401

__all__ = ["SDPBackend", "sdpa_kernel"]
