"""scaled_dot_product_attention's fused CPU kernel as an op: `_sdpa_flash_cpu` (out, logsumexp) and
its backward, running the flash-attention kernels of `flambeau/_backends/cpu_attention.cpp`
(blocked online softmax, causal blocks skipped, bool or additive masks, grouped-query attention,
float32/bfloat16/float16 with float accumulation, O(L + S) memory per head, OpenMP over heads).

scaled_dot_product_attention (attention_fused.py) picks it on cpu for float32/bfloat16/float16
inputs without dropout when the flash or memory-efficient backend is enabled (`cpu_flash_reasons`
says why not otherwise); dropout, float64 and a mask that requires grad keep the math and blocked
paths of attention.py. Tagged extern, so compiled graphs call the kernel as a library call.
"""
from __future__ import annotations

from .. import _dtype as D
from .._backends import cpu_attention
from ._registry import defop, TensorSpec, Tag
from . import attention as A

CPU_FLASH_DTYPES = (D.float32, D.bfloat16, D.float16)


def cpu_flash_reasons(query, key, value, attn_mask, dropout_p, dtype) -> list:
    """Why the fused CPU kernel can't take these inputs (empty when it can); metadata only."""
    why = []
    if dtype not in CPU_FLASH_DTYPES:
        why.append(f"dtype {dtype} is not float32, bfloat16 or float16")
    if dropout_p > 0:
        why.append("dropout_p > 0")
    if min(query.dim(), key.dim(), value.dim()) < 3:
        why.append("query, key and value must be at least 3-d")
    elif key.shape[-2] == 0 or query.shape[-2] == 0 or query.shape[-1] != key.shape[-1]:
        why.append("empty or mismatched lengths or head dims")
    if attn_mask is not None and attn_mask.requires_grad:
        why.append("attn_mask requires grad")
    if not why and not cpu_attention.available():
        why.append("no C++ compiler to build the kernel")
    return why


def _on_cpu(name, *arrays):
    if any(type(a).__module__.startswith("cupy") for a in arrays):
        raise RuntimeError(f"{name}: a cpu kernel, got cuda tensors")


@defop("_sdpa_flash_cpu(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, bool is_causal=False, "
       "float? scale=None, bool enable_gqa=False) -> (Tensor, Tensor)", function=False,
       tags=(Tag.core, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def _sdpa_flash_cpu(xp, query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    A._check(query, key, value, attn_mask, is_causal)
    _on_cpu("_sdpa_flash_cpu", query, key, value)
    return cpu_attention.forward(query, key, value, attn_mask, is_causal, scale, enable_gqa)


@_sdpa_flash_cpu.def_meta
def _sdpa_flash_cpu_meta(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    A._check(query, key, value, attn_mask, is_causal)
    batch, L, S, ev = A._out_shape(query, key, value, enable_gqa)
    return TensorSpec(batch + (L, ev), query.dtype), TensorSpec(batch + (L,), D.float32)


@defop("_sdpa_flash_cpu_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
       "Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa) -> (Tensor, Tensor, Tensor)",
       function=False, tags=(Tag.core, Tag.extern))
def _sdpa_flash_cpu_backward(xp, grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa):
    _on_cpu("_sdpa_flash_cpu_backward", query, key, value)
    return cpu_attention.backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa)


@_sdpa_flash_cpu_backward.def_meta
def _sdpa_flash_cpu_backward_meta(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa):
    return (TensorSpec(query.shape, query.dtype), TensorSpec(key.shape, key.dtype),
            TensorSpec(value.shape, value.dtype))


@_sdpa_flash_cpu.def_derivative
def _sdpa_flash_cpu_derivative(grad, query, key, value, attn_mask, is_causal, scale, enable_gqa, result):
    dq, dk, dv = _sdpa_flash_cpu_backward(grad[0], query, key, value, result[0], result[1], attn_mask, is_causal,
                                          scale, enable_gqa)
    return dq, dk, dv, None
