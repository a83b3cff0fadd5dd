"""Activation modules: thin wrappers over `nn.functional` activations, with PyTorch's reprs, and
MultiheadAttention (PyTorch keeps it here too: `torch.nn.modules.activation.MultiheadAttention`).

Without attention weights (`need_weights=False`, as the encoder/decoder layers ask) attention runs
through F.scaled_dot_product_attention, hence the fused kernels on cuda; with weights it is computed
with flambeau ops (scaled scores, additive float mask from attn_mask/key_padding_mask, softmax)."""
from __future__ import annotations

import math

from ... import _dtype as D
from ... import _ops
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .linear import NonDynamicallyQuantizableLinear
from .module import Module

__all__ = ["Threshold", "ReLU", "RReLU", "Hardtanh", "ReLU6", "Sigmoid", "Hardsigmoid", "Tanh", "SiLU", "Mish",
           "Hardswish", "ELU", "CELU", "SELU", "GLU", "GELU", "Hardshrink", "LeakyReLU", "LogSigmoid", "Softplus",
           "Softshrink", "PReLU", "Softsign", "Tanhshrink", "Softmin", "Softmax", "Softmax2d", "LogSoftmax",
           "MultiheadAttention"]


def _inplace_repr(inplace: bool) -> str:
    return "inplace=True" if inplace else ""


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self):
        return _inplace_repr(self.inplace)


class RReLU(Module):
    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace
        if self.max_val <= self.min_val:
            raise AssertionError("max_val must be greater than min_val")

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)

    def forward(self, input):
        return F.relu6(input, self.inplace)

    def extra_repr(self):
        return _inplace_repr(self.inplace)


class _Simple(Module):
    """Activation without arguments: calls `F.<_fn>(input)`."""
    _fn = ""

    def forward(self, input):
        return getattr(F, self._fn)(input)


class Sigmoid(_Simple):
    _fn = "sigmoid"


class Tanh(_Simple):
    _fn = "tanh"


class LogSigmoid(_Simple):
    _fn = "logsigmoid"


class Softsign(_Simple):
    _fn = "softsign"


class Tanhshrink(_Simple):
    _fn = "tanhshrink"


class _InplaceSimple(Module):
    """Activation with only an `inplace` flag: calls `F.<_fn>(input, inplace=...)`."""
    _fn = ""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return getattr(F, self._fn)(input, inplace=self.inplace)

    def extra_repr(self):
        return _inplace_repr(self.inplace)


class Hardsigmoid(_InplaceSimple):
    _fn = "hardsigmoid"


class SiLU(_InplaceSimple):
    _fn = "silu"


class Mish(_InplaceSimple):
    _fn = "mish"


class Hardswish(_InplaceSimple):
    _fn = "hardswish"


class SELU(_InplaceSimple):
    _fn = "selu"


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Hardshrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.hardshrink(input, self.lambd)

    def extra_repr(self):
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    def forward(self, input):
        return F.softshrink(input, self.lambd)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class PReLU(Module):
    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(_ops.EXPORTS["empty"](num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class _SoftmaxBase(Module):
    _fn = ""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input):
        return getattr(F, self._fn)(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmin(_SoftmaxBase):
    _fn = "softmin"


class Softmax(_SoftmaxBase):
    _fn = "softmax"


class LogSoftmax(_SoftmaxBase):
    _fn = "log_softmax"


class Softmax2d(Module):
    def forward(self, input):
        if input.dim() not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.dim()}D instead")
        return F.softmax(input, -3)


def _float_mask(mask, dtype):
    """Bool masks (True = masked out) become additive float masks; float masks pass through."""
    if mask is None:
        return None
    if mask.dtype == D.bool:
        return _ops.EXPORTS["zeros"](mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


class MultiheadAttention(Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        fk = dict(device=device, dtype=dtype)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(_ops.EXPORTS["empty"](embed_dim, embed_dim, **fk))
            self.k_proj_weight = Parameter(_ops.EXPORTS["empty"](embed_dim, self.kdim, **fk))
            self.v_proj_weight = Parameter(_ops.EXPORTS["empty"](embed_dim, self.vdim, **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(_ops.EXPORTS["empty"](3 * embed_dim, embed_dim, **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(_ops.EXPORTS["empty"](3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = Parameter(_ops.EXPORTS["empty"](1, 1, embed_dim, **fk))
            self.bias_v = Parameter(_ops.EXPORTS["empty"](1, 1, embed_dim, **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def _projections(self):
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight.chunk(3, 0)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self.in_proj_bias is not None:
            bq, bk, bv = self.in_proj_bias[:E], self.in_proj_bias[E:2 * E], self.in_proj_bias[2 * E:]
        else:
            bq = bk = bv = None
        return (wq, bq), (wk, bk), (wv, bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        batched = query.dim() == 3
        if self.batch_first and batched:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        L, N, E = query.shape
        H, hd = self.num_heads, self.head_dim
        (wq, bq), (wk, bk), (wv, bv) = self._projections()
        q = F.linear(query, wq, bq)
        k = F.linear(key, wk, bk)
        v = F.linear(value, wv, bv)
        # without weights, a causal hint with no other mask goes to the fused kernels as is_causal (as PyTorch)
        sdpa_causal = is_causal and not need_weights and key_padding_mask is None and self.bias_k is None \
            and not self.add_zero_attn
        mask = None if sdpa_causal else _float_mask(attn_mask, q.dtype)
        if mask is None and is_causal and not sdpa_causal:
            mask = Transformer.generate_square_subsequent_mask(L, device=q.device, dtype=q.dtype)
        kpm = _float_mask(key_padding_mask, q.dtype)
        if self.bias_k is not None:
            k = _ops.EXPORTS["cat"]([k, self.bias_k.expand(1, N, E)], 0)
            v = _ops.EXPORTS["cat"]([v, self.bias_v.expand(1, N, E)], 0)
            if mask is not None:
                mask = F.pad(mask, (0, 1))
            if kpm is not None:
                kpm = F.pad(kpm, (0, 1))
        if self.add_zero_attn:
            k = _ops.EXPORTS["cat"]([k, _ops.EXPORTS["zeros"](1, N, E, dtype=k.dtype, device=k.device)], 0)
            v = _ops.EXPORTS["cat"]([v, _ops.EXPORTS["zeros"](1, N, E, dtype=v.dtype, device=v.device)], 0)
            if mask is not None:
                mask = F.pad(mask, (0, 1))
            if kpm is not None:
                kpm = F.pad(kpm, (0, 1))
        S = k.shape[0]
        q = q.reshape(L, N * H, hd).transpose(0, 1)
        k = k.reshape(S, N * H, hd).transpose(0, 1)
        v = v.reshape(S, N * H, hd).transpose(0, 1)
        if not need_weights:
            return self._sdpa_forward(q, k, v, mask, kpm, sdpa_causal, (L, N, S, E, H, hd), batched), None
        scores = _ops.EXPORTS["matmul"](q * (1.0 / math.sqrt(hd)), k.transpose(1, 2))
        if mask is not None:
            scores = scores + (mask.unsqueeze(0) if mask.dim() == 2 else mask)
        if kpm is not None:
            scores = (scores.reshape(N, H, L, S) + kpm.reshape(N, 1, 1, S)).reshape(N * H, L, S)
        attn = F.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            attn = F.dropout(attn, self.dropout, True)
        out = _ops.EXPORTS["matmul"](attn, v).transpose(0, 1).reshape(L * N, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).reshape(L, N, E)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        w = attn.reshape(N, H, L, S)
        if average_attn_weights:
            w = w.mean(1)
        if not batched:
            w = w.squeeze(0)
        return out, w

    def _sdpa_forward(self, q, k, v, mask, kpm, is_causal, dims, batched):
        """Attention without weights through F.scaled_dot_product_attention (fused kernels on cuda)."""
        L, N, S, E, H, hd = dims
        if mask is not None and mask.dim() == 3:
            mask = mask.reshape(N, H, L, S)
        if kpm is not None:
            kpm = kpm.reshape(N, 1, 1, S)
            mask = kpm if mask is None else mask + kpm
        out = F.scaled_dot_product_attention(q.reshape(N, H, L, hd), k.reshape(N, H, S, hd), v.reshape(N, H, S, hd),
                                             attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                             is_causal=is_causal)
        out = out.permute(2, 0, 1, 3).reshape(L * N, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).reshape(L, N, E)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        return out
