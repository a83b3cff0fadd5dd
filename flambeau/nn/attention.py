"""flambeau.nn.attention: choose the scaled_dot_product_attention implementation.

`with sdpa_kernel(SDPBackend.MATH):` forces the math path (materialises the L×S score matrix);
`SDPBackend.EFFICIENT_ATTENTION` / `FLASH_ATTENTION` force the blocked online-softmax path, which
never materialises it. By default the blocked path is chosen when L·S is large.
"""
from .._ops.attention import SDPBackend, sdpa_kernel  # noqa: F401

__all__ = ["SDPBackend", "sdpa_kernel"]
