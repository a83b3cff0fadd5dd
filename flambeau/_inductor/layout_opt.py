"""Layout optimization: a Triton graph with 4-d convolutions runs channels-last (PyTorch's
`GraphLowering.layout_opt`), as `config.layout_optimization` asks.

cuDNN computes NHWC convolutions natively; fed NCHW operands it converts each operand to NHWC and
the result back (nchwToNhwc/nhwcToNchw kernels, 3.5 ms of a 25 ms ResNet-50 step on the H100), and a
per-channel reduction (BatchNorm's statistics) over an NCHW activation is a strided reduction. So,
in such a graph (GraphLowering):
- a convolution extern's activation and weight operands are channels-last buffers (`is_channels_last`;
  a value in another layout, a graph input or a weight, is copied into one by a generated kernel), so
  its output is channels-last too (the op's meta function says so; `GraphLowering._extern_layout`);
- a 4-d value that is realised and reads mostly channels-last memory (`reads_channels_last`) is
  computed over the permuted ranges (N, H, W, C) into a buffer contiguous in that order, C fastest
  (`permuted`), and presented to its users as a `StridedView` with channels-last strides of its
  logical (N, C, H, W) shape (`channels_last_view`): its kernel's loads and stores are coalesced, and
  a per-channel reduction over it is a column reduction (C innermost: codegen_triton's block of
  outputs, split when it has few programs);
- outputs the caller sees (a forward graph's user outputs: `gm.meta["num_fwd_outputs"]`, set by the
  partitioner; every output of an inference or backward graph: the gradients) keep the strides their
  FX value has, copied into them when needed; saved activations stay channels-last, and the backward
  graph, compiled for the real saved tensors, takes them so.
"""
from __future__ import annotations

from . import config
from .index import Sym
from .ir import Layout, Pointwise, Reduction

CONVOLUTIONS = ("convolution", "_convolution_weight_grad")


def channels_last_strides(shape) -> tuple:
    """Element strides of a packed NHWC buffer of the 4-d (N, C, H, W) `shape`."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def is_channels_last(layout: Layout) -> bool:
    """Whether `layout` is packed channels-last (a dim of size 1 may have any stride)."""
    return len(layout.shape) == 4 and layout.offset == 0 and all(
        st == want for st, want, s in zip(layout.strides, channels_last_strides(layout.shape), layout.shape)
        if s != 1)


def wants_layout_opt(gm, triton: bool, dynamic: bool) -> bool:
    """Whether a graph runs channels-last: the flag is on, it is lowered for the Triton generator with
    static sizes, and it has a convolution of 4-d operands."""
    if not (config.layout_optimization and triton) or dynamic:
        return False
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "name", None) in CONVOLUTIONS:
            v = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
            if v is not None and getattr(v, "ndim", 0) == 4:
                return True
    return False


def worth_permuting(ranges) -> bool:
    """A 4-d value with channels and a spatial extent (else both layouts are one)."""
    return len(ranges) == 4 and ranges[1] != 1 and (ranges[2] != 1 or ranges[3] != 1) and \
        all(type(s) is int for s in ranges)


def reads_channels_last(x) -> bool:
    """Whether the 4-d value `x` (Pointwise or Reduction) of a channels-last graph is best computed
    channels-last: it reads more operands laid out channels-last (C's coefficient 1, a spatial dim's
    not 0) than laid out contiguous (the last non-1 spatial dim's coefficient 1), or none of either
    (a per-channel vector broadcast over H and W: average pooling's gradient), whose users in such a
    graph are channels-last. Its loads as the analysis sees them."""
    ranges = x.ranges
    if not worth_permuting(ranges):
        return False
    spatial = [f"a{d}" for d in (2, 3) if ranges[d] != 1]
    cl = nchw = 0
    for _, idx in x.stats().loads:
        c = idx.coeff(Sym("a1", 0))
        sp = [idx.coeff(Sym(s, 0)) for s in spatial]
        if c == 1 and any(sp):
            cl += 1
        elif c and sp[-1] == 1:
            nchw += 1
    return cl > nchw or cl == nchw == 0


def permuted(x):
    """`x` (a 4-d Pointwise or Reduction) computed over the ranges (N, H, W, C)."""
    n, c, h, w = x.ranges
    fn = x.inner_fn

    def to_nchw(i):
        return [i[0], i[3], i[1], i[2]]
    if isinstance(x, Pointwise):
        return Pointwise((n, h, w, c), x.dtype, lambda i: fn(to_nchw(i)))
    assert isinstance(x, Reduction), x
    return Reduction((n, h, w, c), x.reduction_ranges, x.reduction_type, x.dtype, x.src_dtype,
                     lambda i, r: fn(to_nchw(i), r))


def channels_last_layout(shape, dtype) -> Layout:
    return Layout(shape, dtype, channels_last_strides(shape))
