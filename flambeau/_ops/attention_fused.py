"""scaled_dot_product_attention: the choice of backend, and the fused cuda kernels.

`select_backend` decides from metadata alone (device, dtype after autocast, shapes, mask, flags),
as PyTorch's sdp_utils: on cuda it tries the enabled backends in priority order (default cuDNN,
flash, memory-efficient, math) and takes the first whose constraints hold (memory-efficient forced
without math, on inputs the kernel cannot take, runs the blocked path); on other devices
FLASH means the fused kernel of attention_cpu.py on cpu where it takes the inputs, else (and
EFFICIENT) the blocked path of attention.py. When no enabled backend can run, it raises
PyTorch's "No available kernel" RuntimeError with the reasons.

The fused op `_sdpa_fused` (and its backward) runs one of two kernels, `impl` naming which:
- CUDNN_ATTENTION: cuDNN's fused flash attention through nvidia-cudnn-frontend
  (flambeau/_backends/cudnn_attention.py); no attn_mask.
- FLASH_ATTENTION / EFFICIENT_ATTENTION: the Triton kernels of flambeau/_backends/triton_attention.py
  (flash: no attn_mask, as PyTorch's; efficient: boolean or additive masks).
Both need fp16/bf16 4-d inputs with equal batch sizes, a head dim the kernel supports, and a mask
that does not require grad. The op returns (out, logsumexp, rng): rng is the int64 [seed, offset]
pair on the device that seeded dropout, drawn on the host from the cuda generator (no device read),
and the backward replays the same draws from it.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D, _state, random as R
from .._device import canonical
from .._backends import cudnn_attention, triton_launch
from .._tensor import Tensor
from ._helpers import direct_device
from ._registry import defop, export, TensorSpec, Tag
from . import attention as A
from .attention import SDPBackend
from .attention_cpu import _sdpa_flash_cpu, cpu_flash_reasons
from .views import preserved_strides

FUSED_DTYPES = (D.float16, D.bfloat16)
TRITON_HEAD_DIMS = (16, 32, 64, 128)
_SEED_BOUND = 2 ** 62
CPU_FLASH = "cpu"           # _choose's answer for the fused cpu kernel


def _cudnn_ready() -> bool:
    return cudnn_attention.available()


def _cudnn_supports(query, key, dtype, is_causal, dropout_p) -> bool:
    return cudnn_attention.supports(tuple(query.shape), tuple(key.shape), dtype.name, is_causal, dropout_p)


def _triton_ready() -> bool:
    return triton_launch.available()


def _effective_dtype(t, device_type):
    """The dtype `t` will have inside the op: autocast's dtype for a float32 tensor under autocast."""
    cast = _state.tls.autocast.get(device_type)
    return cast if cast is not None and t.dtype == D.float32 else t.dtype


def _fused_reasons(query, key, value, attn_mask, enable_gqa, dtype):
    """Why no fused kernel can take these inputs (empty when one can)."""
    why = []
    if dtype not in FUSED_DTYPES:
        why.append(f"query dtype {dtype} is not float16 or bfloat16")
    if not (query.dim() == key.dim() == value.dim() == 4):
        why.append("query, key and value must be 4-d (batch, heads, length, head dim)")
        return why
    (B, Hq, L, E), (Bk, Hk, S, Ek), (Bv, Hv, Sv, Ev) = query.shape, key.shape, value.shape
    if not (B == Bk == Bv) or S != Sv:
        why.append(f"batch/length mismatch: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                   f"value {tuple(value.shape)}")
    if Hk != Hv or (Hq != Hk and not (enable_gqa and Hq % Hk == 0)):
        why.append(f"head counts query {Hq}, key {Hk}, value {Hv} need enable_gqa and a divisible count")
    if not (E == Ek == Ev):
        why.append(f"head dims differ: query {E}, key {Ek}, value {Ev}")
    if L == 0 or S == 0 or B * Hq == 0:
        why.append("empty input")
    if attn_mask is not None and attn_mask.requires_grad:
        why.append("attn_mask requires grad")
    return why


def _backend_reasons(backend, query, key, attn_mask, dtype, is_causal, dropout_p):
    E = query.shape[-1]
    why = []
    if backend == SDPBackend.CUDNN_ATTENTION:
        if attn_mask is not None:
            why.append("cuDNN attention here takes no attn_mask")
        if E % cudnn_attention.HEAD_DIM_MULTIPLE or E > cudnn_attention.MAX_HEAD_DIM:
            why.append(f"head dim {E} is not a multiple of 8 up to 128")
        if not _cudnn_ready():
            why.append(f"the cuDNN frontend is not available ({cudnn_attention.load_error()})")
        elif not why and not _cudnn_supports(query, key, dtype, is_causal, dropout_p):
            why.append(f"cuDNN builds no plan for these sizes ({cudnn_attention.unsupported_reason()})")
    else:
        if backend == SDPBackend.FLASH_ATTENTION and attn_mask is not None:
            why.append("flash attention takes no attn_mask")
        if attn_mask is not None and attn_mask.dtype != D.bool and attn_mask.dtype not in (dtype, query.dtype):
            why.append(f"attn_mask dtype {attn_mask.dtype} is neither bool nor the query dtype")
        if E not in TRITON_HEAD_DIMS:
            why.append(f"head dim {E} is not one of {TRITON_HEAD_DIMS}")
        if not _triton_ready():
            why.append("Triton is not installed")
    return why


def _choose(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    """(backend, fused): the SDPBackend to run and whether a fused kernel runs it: True for a cuda
    kernel, CPU_FLASH for the cpu one (attention_cpu.py), False for the math or the blocked path of
    attention.py."""
    order = A.priority_order()
    dev = query.device.type
    if dev != "cuda":
        blocked = SDPBackend.FLASH_ATTENTION in order or SDPBackend.EFFICIENT_ATTENTION in order
        if dev == "cpu" and SDPBackend.FLASH_ATTENTION in order and not cpu_flash_reasons(query, key, value, attn_mask, dropout_p,
                                                              _effective_dtype(query, dev)):
            return SDPBackend.FLASH_ATTENTION, CPU_FLASH
        small = query.shape[-2] * key.shape[-2] < A.AUTO_BLOCKED_ELEMENTS
        if SDPBackend.MATH in order and (not blocked or small):
            return SDPBackend.MATH, False
        if blocked:
            return SDPBackend.EFFICIENT_ATTENTION, False
        raise RuntimeError(f"No available kernel. Aborting execution. (on {dev}, scaled_dot_product_attention "
                           f"runs the math or the blocked path; enabled: {[b.name for b in order]})")
    dtype = _effective_dtype(query, dev)
    common = _fused_reasons(query, key, value, attn_mask, enable_gqa, dtype)
    reasons = []
    for b in order:
        if b == SDPBackend.MATH:
            return b, False
        why = common or _backend_reasons(b, query, key, attn_mask, dtype, is_causal, dropout_p)
        if not why:
            return b, True
        if b == SDPBackend.EFFICIENT_ATTENTION and SDPBackend.MATH not in order:
            # forced memory-efficient attention the kernel cannot take (fp32, odd head dims): the
            # blocked path keeps its memory bound, as PyTorch's memory-efficient kernel would
            return b, False
        reasons.append(f"{b.name}: " + "; ".join(why))
    raise RuntimeError("No available kernel. Aborting execution. " + " | ".join(reasons or ["no backend enabled"]))


def select_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False):
    """The SDPBackend scaled_dot_product_attention runs for these arguments (metadata only)."""
    return _choose(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)[0]


@export("scaled_dot_product_attention", namespace="nn.functional", function=False)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    backend, fused = _choose(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if fused is CPU_FLASH:
        return _sdpa_flash_cpu(query, key, value, attn_mask, is_causal, scale, enable_gqa)[0]
    if fused:
        return _sdpa_fused(query, key, value, attn_mask, dropout_p, is_causal, scale, int(backend))[0]
    if backend == SDPBackend.MATH:
        return A._sdpa_math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]
    return A._sdpa_blocked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                           A.BLOCK[0], A.BLOCK[1])[0]


# ---- the fused op ------------------------------------------------------------------------------------
def _philox_state(xp, dropout_p):
    """[seed, offset] on the device: a fresh seed from the cuda generator's host stream when dropout
    is on (so manual_seed replays it), zeros otherwise."""
    state = xp.zeros(2, dtype=np.int64)
    if dropout_p > 0:       # written by a fill kernel: no host-to-device copy, no synchronisation
        state[:1] = int(R.generator_for(canonical("cuda")).xp_generator(np).integers(0, _SEED_BOUND))
    return state


def _cuda_only(name, *arrays):
    if any(isinstance(a, np.ndarray) for a in arrays):
        raise RuntimeError(f"{name}: a cuda kernel, got cpu tensors (scaled_dot_product_attention chooses it "
                           f"only for cuda inputs)")


def _softmax_scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


@defop("_sdpa_fused(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, "
       "bool is_causal=False, float? scale=None, int impl=3) -> (Tensor, Tensor, Tensor)", function=False,
       tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern, Tag.autocast_lower_precision,
             Tag.optional_output_grads))
def _sdpa_fused(xp, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, impl=3):
    A._check(query, key, value, attn_mask, is_causal)
    _cuda_only("_sdpa_fused", query, key, value)
    sc = _softmax_scale(query, scale)
    rng = _philox_state(xp, dropout_p)
    if impl == SDPBackend.CUDNN_ATTENTION:
        out, lse = cudnn_attention.forward(query, key, value, dropout_p, rng, is_causal, sc)
    else:
        from .._backends import triton_attention  # deferred: imports Triton, optional (cuda only)
        out, lse = triton_attention.forward(query, key, value, attn_mask, dropout_p, rng, is_causal, sc)
    return out, lse, rng


@_sdpa_fused.def_meta
def _sdpa_fused_meta(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, impl=3):
    A._check(query, key, value, attn_mask, is_causal)
    B, H, L, _ = query.shape
    out = (B, H, L, value.shape[-1])
    return (TensorSpec(out, query.dtype, preserved_strides(out, query.stride())),
            TensorSpec((B, H, L), D.float32), TensorSpec((2,), D.int64))


@defop("_sdpa_fused_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
       "Tensor rng, Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, int impl) "
       "-> (Tensor, Tensor, Tensor)", function=False, tags=(Tag.core, Tag.extern))
def _sdpa_fused_backward(xp, grad_out, query, key, value, out, lse, rng, attn_mask, dropout_p, is_causal, scale,
                         impl):
    _cuda_only("_sdpa_fused_backward", query, key, value)
    sc = _softmax_scale(query, scale)
    grad_out = grad_out.astype(out.dtype, copy=False)
    if impl == SDPBackend.CUDNN_ATTENTION:
        return cudnn_attention.backward(grad_out, query, key, value, out, lse, dropout_p, rng, is_causal, sc)
    from .._backends import triton_attention  # deferred: imports Triton, optional (cuda only)
    return triton_attention.backward(grad_out, query, key, value, out, lse, attn_mask, dropout_p, rng, is_causal, sc)


@_sdpa_fused_backward.def_meta
def _sdpa_fused_backward_meta(grad_out, query, key, value, out, lse, rng, attn_mask, dropout_p, is_causal, scale,
                              impl):
    """The gradients laid out as the kernels lay them out (so compiled code takes them without a copy):
    dense in the order of their input's strides (PyTorch's layout for a (B, L, H, E) projection viewed as
    (B, H, L, E)); the Triton kernel's dk and dv always (B, S, H, E) memory viewed as (B, H, S, E)."""
    def like(t):
        return TensorSpec(t.shape, t.dtype, preserved_strides(t.shape, t.stride()))

    def heads_inner(t):
        B, H, S, E = t.shape
        return TensorSpec(t.shape, t.dtype, (S * H * E, E, H * E, 1))
    if impl == SDPBackend.CUDNN_ATTENTION or key.shape[1] != query.shape[1]:
        return like(query), like(key), like(value)
    return like(query), heads_inner(key), heads_inner(value)


@_sdpa_fused.def_derivative
def _sdpa_fused_derivative(grad, query, key, value, attn_mask, dropout_p, is_causal, scale, impl, result):
    if impl == SDPBackend.CUDNN_ATTENTION and (dev := direct_device(grad[0], query, key, value)) is not None \
            and dev.type == "cuda" and isinstance(result[0], Tensor):
        # nothing sees the call (`direct_device`): cuDNN's backward on the arrays, its gradients laid out as
        # the pieces of one buffer when q, k and v are (GPT-2's split qkv projection), so the split's
        # backward takes their concatenation without a copy (`cudnn_attention.claim_joined`)
        go = grad[0]._data
        out = result[0]._data
        grads = cudnn_attention.backward(go.astype(out.dtype, copy=False), query._data, key._data, value._data, out,
                                         result[1]._data, dropout_p, result[2]._data, is_causal,
                                         _softmax_scale(query, scale), joint=True)
        return tuple(Tensor._make(g, dev) for g in grads) + (None,)
    dq, dk, dv = _sdpa_fused_backward(grad[0], query, key, value, result[0], result[1], result[2], attn_mask,
                                      dropout_p, is_causal, scale, impl)
    return dq, dk, dv, None
