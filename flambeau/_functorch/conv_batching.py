"""vmap of a convolution whose weight is shared by the batch: one ordinary convolution forward.

Under `vmap(grad(f))` with unbatched parameters, `grad` differentiates physical tensors
(`batched.peel`): a parameter becomes `expand`ed to `[B, *weight]`, a stride-0 view, so that its
gradient comes out per example. The convolution's own batching rule (`_ops.nn_conv`) then sees a
batched weight and runs a B-group convolution (one input channel per group for a first layer: the
slow depthwise path). All examples see the same weight values, so this rule (PyTorch's for an
unbatched weight) folds the vmap batch into the minibatch and runs ONE convolution with the shared
weight; a bias shared the same way is added by that convolution (a per-example bias is added after
it). The per-example weight gradient arises in the backward, where the output gradient is batched:
one grouped weight-gradient call (the groups trick, examples never mix); the bias gradient is the
output gradient summed per example.

The fold needs its own backward (a plain `w[0]` would sum the examples' gradients into one), hence
an `autograd.Function`, which lives above the operator layer: this module wraps the op's declared
rule and is installed by `batched` (the vmap interpreter) at import.
"""
from __future__ import annotations

from .. import _state
from .._tensor import Tensor
from ..autograd.function import Function
from .._ops.nn_conv import convolution, _convolution_batching, _convolution_weight_grad, _adjoint_output_padding
from .._ops import _batching


class SharedWeightConvolution(Function):
    """`x [B, N, C, *s]` convolved per example with `w [B, O, C/g, *k]` (+ bias `b [B, O]` or None),
    whose B rows are one weight (a stride-0 expand; the bias likewise): forward is one convolution
    of `[B*N, C, *s]`, the bias added by the convolution itself; backward gives the per-example
    weight and bias gradients. Under `create_graph` the input gradient uses the per-example
    weights (a grouped convolution), so second derivatives keep the examples apart."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups):
        ctx.save_for_backward(x, w)
        ctx.geometry = (stride, padding, dilation, groups)
        size, n = x.shape[0], x.shape[1]
        y = convolution(x.reshape((size * n,) + tuple(x.shape[2:])), w[0], None if b is None else b[0], stride,
                        padding, dilation, False, [0] * (w.dim() - 3), groups)
        return y.reshape((size, n) + tuple(y.shape[1:]))

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        size, n, c = x.shape[0], x.shape[1], x.shape[2]
        o, ks = w.shape[1], tuple(w.shape[3:])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            op = _adjoint_output_padding(x.shape[3:], gy.shape[3:], ks, stride, padding, dilation)
            if _state.tls.grad_enabled:
                g = gy.movedim(0, 1).reshape((n, size * o) + tuple(gy.shape[3:]))
                gx = convolution(g, w.reshape((size * o,) + tuple(w.shape[2:])), None, stride, padding, dilation,
                                 True, op, groups * size)
                gx = gx.reshape((n, size, c) + tuple(gx.shape[2:])).movedim(1, 0)
            else:
                gx = convolution(gy.reshape((size * n,) + tuple(gy.shape[2:])), w[0], None, stride, padding,
                                 dilation, True, op, groups)
                gx = gx.reshape((size, n) + tuple(gx.shape[1:]))
        if ctx.needs_input_grad[1]:
            xf = x.movedim(0, 1).reshape((n, size * c) + tuple(x.shape[3:]))
            gf = gy.movedim(0, 1).reshape((n, size * o) + tuple(gy.shape[3:]))
            gw = _convolution_weight_grad(xf, gf, (size * o,) + tuple(w.shape[2:]), stride, padding, dilation,
                                          groups * size).reshape(tuple(w.shape))
        if ctx.needs_input_grad[2]:
            gb = gy.sum([1] + list(range(3, gy.dim())))
        return gx, gw, gb, None, None, None, None


def _shared_weight(weight, dw) -> bool:
    return dw is not None and type(weight) is Tensor and weight.stride(dw) == 0


def convolution_batching(in_dims, input, weight, bias, stride, padding, dilation, transposed, output_padding,
                         groups):
    """The declared rule (`_ops.nn_conv`), except for a batched input with a shared (expanded) weight:
    one convolution over the folded batch (see module docstring)."""
    di, dw, db = in_dims[:3]
    if transposed or di is None or type(input) is not Tensor or not _shared_weight(weight, dw):
        return _convolution_batching(in_dims, input, weight, bias, stride, padding, dilation, transposed,
                                     output_padding, groups)
    w = _batching.front(weight, dw)
    x = _batching.front(input, di)
    minibatch = x.dim() == w.dim()
    if not minibatch:
        x = x.unsqueeze(1)
    b = None if bias is None else _batching.materialize(bias, db, x.shape[0])
    shared_bias = b is None or _shared_weight(b, 0)
    y = SharedWeightConvolution.apply(x, w, b if shared_bias else None, stride, padding, dilation, groups)
    if not shared_bias:
        y = y + b.reshape((b.shape[0], 1, b.shape[1]) + (1,) * (y.dim() - 3))
    return (y, 0) if minibatch else (y[:, 0], 0)


def install() -> None:
    """Make this the convolution's batching rule (called once by `batched` at import)."""
    convolution.def_batching_rule(convolution_batching)
