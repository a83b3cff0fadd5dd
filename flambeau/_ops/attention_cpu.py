"""scaled_dot_product_attention's fused CPU kernel as an op: `_sdpa_flash_cpu` (out, logsumexp) and
its backward, running the flash-attention kernels of `flambeau/_backends/cpu_attention.cpp`
(blocked online softmax, causal blocks skipped, bool or additive masks, grouped-query attention,
float32/bfloat16/float16 with float accumulation, O(L + S) memory per head, OpenMP over heads).
Under vmap both fold the batch into a new leading batch dim of attention, which the kernel broadcasts.

scaled_dot_product_attention (attention_fused.py) picks it on cpu for float32/bfloat16/float16
inputs without dropout when the flash or memory-efficient backend is enabled (`cpu_flash_reasons`
says why not otherwise); dropout, float64 and a mask that requires grad keep the math and blocked
paths of attention.py. Tagged extern, so compiled graphs call the kernel as a library call.
"""
from __future__ import annotations

from .. import _dtype as D
from .._backends import cpu_attention
from ._registry import defop, TensorSpec, Tag
from . import _batching
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
       tags=(Tag.core, Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision,
             Tag.optional_output_grads))
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


# ---- vmap batching rules ----------------------------------------------------------------------------
def _lead(x, d, nd: int, size=None):
    """`x` (logical rank <= nd) as `[B or 1, 1.., *logical]` with nd logical dims; broadcast to `size`
    at dim 0 when given (so gradients and saved outputs stay per example)."""
    if x is None:
        return None
    if d is None:
        x = x.reshape((1,) * (nd + 1 - x.dim()) + tuple(x.shape))
    else:
        x = _batching.pad_front(x, d, nd)
    if size is not None and x.shape[0] != size:
        x = x.expand((size,) + tuple(x.shape[1:]))
    return x


def _mask_lead(mask, d, nd: int):
    """An unbatched mask broadcasts from the right as it is; a batched one gets the new leading dim."""
    if mask is None or d is None:
        return mask
    return _lead(mask, d, nd)


@_sdpa_flash_cpu.def_batching_rule
def _sdpa_flash_cpu_batching(in_dims, query, key, value, attn_mask=None, is_causal=False, scale=None,
                             enable_gqa=False):
    dq, dk, dv, dm = in_dims[:4]
    nd = max(_batching.logical_dim(t, d) for t, d in ((query, dq), (key, dk), (value, dv)))
    if attn_mask is not None and _batching.logical_dim(attn_mask, dm) > nd:
        return NotImplemented
    out, lse = _sdpa_flash_cpu(_lead(query, dq, nd), _lead(key, dk, nd), _lead(value, dv, nd),
                               _mask_lead(attn_mask, dm, nd), is_causal, scale, enable_gqa)
    return (out, lse), (0, 0)


@_sdpa_flash_cpu_backward.def_batching_rule
def _sdpa_flash_cpu_backward_batching(in_dims, grad_out, query, key, value, out, lse, attn_mask, is_causal,
                                      scale, enable_gqa):
    values = (grad_out, query, key, value, out, lse)
    size = _batching.batch_size(values + (attn_mask,), in_dims[:7])
    nd = max(_batching.logical_dim(t, d) for t, d in zip(values[1:4], in_dims[1:4]))
    if attn_mask is not None and _batching.logical_dim(attn_mask, in_dims[6]) > nd:
        return NotImplemented
    g, q, k, v, o = (_lead(t, d, nd, size) for t, d in zip(values[:5], in_dims[:5]))
    lse = _lead(lse, in_dims[5], nd - 1, size)
    grads = _sdpa_flash_cpu_backward(g, q, k, v, o, lse, _mask_lead(attn_mask, in_dims[6], nd), is_causal,
                                     scale, enable_gqa)
    shapes = [(size,) + tuple(s for i, s in enumerate(t.shape) if i != d) for t, d in zip(values[1:4], in_dims[1:4])]
    return tuple(gr.reshape(s) for gr, s in zip(grads, shapes)), (0, 0, 0)
