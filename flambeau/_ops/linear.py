"""Dense layers: `linear` (an op with a BLAS kernel and a fused derivative) and `bilinear`.
On cuda, `linear` is one cuBLASLt product with the bias as its epilogue (`linalg.lt_gemm`); bfloat16 on
the CPU runs on its BF16 dot products where it has them (`cpu_kernels.matmul_bf16`)."""
from __future__ import annotations

from .. import _dtype as D
from .._backends import cpu_kernels
from .._backends.cpu_kernels import matmul_for
from ._registry import defop, export, TensorSpec, Tag
from ._helpers import opmath, direct_device, direct_call
from .linalg import einsum, lt_gemm, matmul
from .reduction import sum as sum_op, cuda_rows_sum
from .._tensor import Tensor
from .._dispatch import type_name
from . import _batching, _sharding


def _check(input, weight, bias):
    if input.dtype != weight.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {type_name(D.FROM_NP[input.dtype]) if not isinstance(input.dtype, D.dtype) else type_name(input.dtype)} and "
                           f"{type_name(D.FROM_NP[weight.dtype]) if not isinstance(weight.dtype, D.dtype) else type_name(weight.dtype)}")
    if input.ndim == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D and "
                           f"{weight.ndim}D")
    if input.shape[-1] != weight.shape[-1]:
        rows = 1
        for s in input.shape[:-1]:
            rows *= s
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x{input.shape[-1]} and "
                           f"{weight.shape[-1]}x{weight.shape[0] if weight.ndim > 1 else 1})")


@defop("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", namespace="nn.functional",
       function=False, tags=(Tag.extern, Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def linear(xp, input, weight, bias=None):
    _check(input, weight, bias)
    if weight.ndim == 2:
        r = lt_gemm(xp, input.reshape(1, -1) if input.ndim == 1 else input, weight.T, bias=bias)
        if r is not None:
            shape = tuple(input.shape[:-1]) + (weight.shape[0],)
            return r if r.shape == shape else r.reshape(shape)     # (a CuPy reshape is a new view object)
    dt = D.FROM_NP[input.dtype]
    if dt is D.bfloat16 and weight.ndim == 2 and input.ndim >= 2 and (bias is None or bias.ndim <= 1) and \
            matmul_for(xp) is cpu_kernels.matmul:       # the CPU's BF16 dot products, bias before the rounding
        r = cpu_kernels.matmul_bf16(input.reshape(-1, input.shape[-1]), weight.T,
                                    None if bias is None else bias.reshape(-1))
        if r is not None:
            return r.reshape(tuple(input.shape[:-1]) + (weight.shape[0],))
    cd = opmath(dt)
    x = input.astype(cd, copy=False)
    w = weight.astype(cd, copy=False)
    mm = matmul_for(xp)
    out = mm(x, w.T) if w.ndim == 2 else mm(x, w)
    if bias is not None:
        out += bias.astype(cd, copy=False)
    return out.astype(dt.np, copy=False)


@linear.def_meta
def _(input, weight, bias=None):
    _check(input, weight, bias)
    shape = tuple(input.shape[:-1]) + ((weight.shape[0],) if weight.ndim == 2 else ())
    return TensorSpec(shape, input.dtype)


@linear.def_derivative
def _linear_derivative(grad, input, weight, bias, output_mask):
    """Only the gradients `output_mask` asks for: no input gradient for a data input."""
    if weight.ndim == 2 and (dev := direct_device(grad, input, weight, bias)) is not None:
        return _linear_backward_direct(dev, grad, input, weight, bias, output_mask)
    gi = gw = gb = None
    if output_mask[0]:
        gi = grad @ weight if weight.ndim == 2 else grad.unsqueeze(-1) * weight
    if output_mask[1] and weight.ndim == 2:
        # a 2-D layer input (an MLP's) needs no reshape: each one is a dispatched view op
        g2 = grad if grad.ndim == 2 else grad.reshape(-1, weight.shape[0])
        gw = g2.t() @ (input if input.ndim == 2 else input.reshape(-1, weight.shape[1]))
    elif output_mask[1]:
        gw = (grad.unsqueeze(-1) * input).reshape(-1, weight.shape[0]).sum(0)
    if bias is not None and output_mask[2]:
        if grad.ndim > bias.ndim:
            gb = (grad if grad.ndim == 2 and bias.ndim == 1 else grad.reshape(-1, *bias.shape)).sum(0)
        else:
            gb = grad
    return gi, gw, gb


def _linear_backward_direct(dev, grad, input, weight, bias, output_mask):
    """`_linear_derivative` for a 2-D weight on arrays: the same matmul and sum kernels, no dispatched
    reshape/transpose/product/sum calls (six per layer, each a Tensor in and out; see `direct_device`)."""
    g, w = grad._data, weight._data
    gi = gw = gb = None
    if output_mask[0]:
        gi = direct_call(matmul, dev, g, w)
    if output_mask[1] or (bias is not None and output_mask[2]):
        g2 = g if g.ndim == 2 else g.reshape(-1, w.shape[0])
        if output_mask[1]:
            x = input._data
            gw = direct_call(matmul, dev, g2.T, x if x.ndim == 2 else x.reshape(-1, w.shape[1]))
        if bias is not None and output_mask[2]:
            if g.ndim <= bias.ndim:
                gb = grad
            elif bias.ndim == 1 and dev.type == "cuda" and (r := cuda_rows_sum(g2)) is not None:
                gb = Tensor._make(r, dev)             # `sum`'s cuda kernel for dim 0, without its frames
            else:
                gb = direct_call(sum_op, dev, g2 if bias.ndim == 1 else g.reshape(-1, *bias.shape), 0)
    return gi, gw, gb


@export("bilinear", namespace="nn.functional", tags=(Tag.autocast_promote,))
def bilinear(input1, input2, weight, bias=None):
    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out + bias if bias is not None else out


# ---- vmap batching rule -----------------------------------------------------------------------------
@linear.def_batching_rule
def _linear_batching(in_dims, input, weight, bias=None):
    di, dw, db = in_dims
    if dw is None and db is None:
        return linear(_batching.front(input, di), weight, bias), 0
    if _batching.logical_dim(weight, dw) != 2:
        return NotImplemented
    size = _batching.batch_size((input, weight, bias), in_dims)
    w = _batching.materialize(weight, dw, size)                    # [B, out, in]
    x = _batching.materialize(input, di, size)                     # [B, *lead, in]
    lead = tuple(x.shape[1:-1])
    y = x.reshape(size, -1, x.shape[-1]).matmul(w.transpose(1, 2))  # [B, L, out]
    y = y.reshape((size,) + lead + (w.shape[1],))
    if bias is not None:
        b = _batching.materialize(bias, db, size)
        y = y + b.reshape((size,) + (1,) * len(lead) + (w.shape[1],))
    return y, 0


# ---- DTensor sharding rule --------------------------------------------------------------------------
linear.def_sharding_rule(_sharding.linear_rule)
