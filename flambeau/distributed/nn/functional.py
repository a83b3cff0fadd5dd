"""torch.distributed.nn.functional: collectives that autograd differentiates.

Each returns new tensors and is built on a functional collective (`_functional_collectives`), whose
operator carries the derivative PyTorch's autograd Functions here have: all_reduce's gradient is the
all_reduce of the gradient, all_gather's the reduce_scatter (sum) of the gradients, reduce_scatter's the
all_gather, all_to_all's the all_to_all back, broadcast's a sum onto the source. So these run eagerly,
train, and are captured by `flambeau.compile` as graph nodes (forward and backward).
"""
from __future__ import annotations

from ..._ops import functions as _functions       # the operator functions flambeau exports
from ..._tensor import Tensor
from .. import _functional_collectives as _fc
from ..distributed_c10d import ReduceOp, _group

__all__ = ["broadcast", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_single"]

_OP_NAMES = ("sum", "avg", "product", "min", "max")


def _name(op) -> str:
    """The functional collectives' name of ReduceOp `op` ("sum", ...)."""
    name = getattr(op, "name", str(op)).lower()
    if name not in _OP_NAMES:
        raise ValueError(f"distributed.nn.functional: unsupported ReduceOp {op!r}")
    return name


def broadcast(tensor: Tensor, src: int, group=None) -> Tensor:
    """Rank `src`'s `tensor` on every rank; the gradient flowing back is summed onto `src`."""
    return _fc.wait_tensor(_fc.broadcast(tensor, src, _group(group)))


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group=None) -> Tensor:
    """The reduction of `tensor` over the ranks (a new tensor); differentiable for SUM and AVG."""
    return _fc.wait_tensor(_fc.all_reduce(tensor, _name(op), _group(group)))


def all_gather(tensor: Tensor, group=None) -> tuple:
    """Every rank's `tensor` (same shape on every rank), one per rank."""
    g = _group(group)
    gathered = _fc.wait_tensor(_fc.all_gather_tensor(tensor.contiguous(), 0, g))
    if tensor.dim() == 0:
        return tuple(gathered.unbind(0))
    return tuple(gathered.chunk(g.size(), 0))


def reduce_scatter(output: Tensor, input_list: list, op=ReduceOp.SUM, group=None) -> Tensor:
    """The reduction over ranks of their `input_list[rank]` (equal shapes); `output` gives its shape."""
    g = _group(group)
    if len(input_list) != g.size():
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors, the group has {g.size()} ranks")
    flat = _functions.cat([t.reshape(-1) for t in input_list])
    out = _fc.wait_tensor(_fc.reduce_scatter_tensor(flat, _name(op), 0, g))
    return out.view(output.shape)


def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None) -> Tensor:
    """Pieces of `input` (dim 0) to each rank, what arrives concatenated; `output` gives the shape."""
    out = _fc.wait_tensor(_fc.all_to_all_single(input, output_split_sizes, input_split_sizes, _group(group)))
    return out.view(output.shape)


def all_to_all(output_tensor_list: list, input_tensor_list: list, group=None) -> tuple:
    """`input_tensor_list[j]` to rank j; what each rank sent, one tensor per rank."""
    flat = _functions.cat([t.reshape(-1) for t in input_tensor_list])
    out = _fc.wait_tensor(_fc.all_to_all_single(flat, [t.numel() for t in output_tensor_list],
                                                [t.numel() for t in input_tensor_list], _group(group)))
    pieces = out.split([t.numel() for t in output_tensor_list])
    return tuple(p.view(t.shape) for p, t in zip(pieces, output_tensor_list))
