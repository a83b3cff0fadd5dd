"""Functional collectives (PyTorch's `torch.distributed._functional_collectives`): collectives that return
a new tensor rather than write into their argument, so `flambeau.compile` can record them.

Each is an operator of the `_c10d_functional` namespace (`flambeau.ops._c10d_functional.all_reduce`, ...,
PyTorch's schemas), defined as a custom operator: dynamo records it as one call_function node, AOT autograd
keeps it, Inductor calls it as an extern kernel, and eager mode runs its kernel, which calls the collective
of `collectives.py` on a fresh output (so any backend works: MPI, NCCL). Groups travel through graphs by
name (`ProcessGroup.group_name`). The operators are differentiable (all_reduce <-> all_reduce,
all_gather <-> reduce_scatter, all_to_all_single <-> all_to_all_single with the splits swapped), which is
what `flambeau.distributed.nn.functional` builds on.

Eager calls return an `AsyncCollectiveTensor` (a Tensor sharing the result's memory; `wait()` gives the
plain tensor). Our collectives finish in stream order when they return (NCCL: the current stream waits on
the collective; MPI: the host waits), so waiting costs nothing more; `wait_tensor` exists for PyTorch code.
"""
from __future__ import annotations

from .. import library
from .._ops import functions as _functions       # the operator functions flambeau exports
from .._tensor import Tensor
from ..fx._aten import CUSTOM_OPS
from .._dynamo import is_compiling
from . import collectives as c
from .distributed_c10d import GroupMember, ProcessGroup, ReduceOp, _World

__all__ = ["all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
           "wait_tensor", "AsyncCollectiveTensor", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
           "all_gather_tensor_autograd", "reduce_scatter_tensor_autograd", "all_to_all_single_autograd"]

NAMESPACE = "_c10d_functional"
_SCHEMAS = {
    "all_reduce": "(Tensor input, str reduce_op, str group_name) -> Tensor",
    "all_gather_into_tensor": "(Tensor input, int group_size, str group_name) -> Tensor",
    "reduce_scatter_tensor": "(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
    "all_to_all_single": "(Tensor input, int[] output_split_sizes, int[] input_split_sizes, str group_name) "
                         "-> Tensor",
    "broadcast": "(Tensor input, int src, str group_name) -> Tensor",
}
_REDUCE_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
               "max": ReduceOp.MAX, "band": ReduceOp.BAND, "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR}


# ---- groups by name ------------------------------------------------------------------------------
def _resolve_group_name(group) -> str:
    """The name of `group`: a ProcessGroup, a name, None (the default group), a list of ranks (an existing
    group of exactly those ranks), a 1-D DeviceMesh or (DeviceMesh, dim)."""
    if group is None:
        group = GroupMember.WORLD
    if isinstance(group, str):
        return group
    if isinstance(group, ProcessGroup):
        return group.group_name
    if isinstance(group, tuple) and len(group) == 2 and hasattr(group[0], "get_group"):
        return group[0].get_group(group[1]).group_name
    if hasattr(group, "get_group"):
        return group.get_group().group_name
    if isinstance(group, list):
        for g in _World.groups:
            if g.ranks == sorted(group):
                return g.group_name
        raise ValueError(f"functional collectives: no process group of ranks {group}; make it with new_group first")
    raise ValueError(f"functional collectives: unsupported group {group!r} (a ProcessGroup, its name, a list of "
                     "ranks, a DeviceMesh or (DeviceMesh, dim))")


def _resolve_group(group_name: str) -> ProcessGroup:
    for g in _World.groups:
        if g.group_name == group_name:
            return g
    raise ValueError(f"functional collectives: no process group named {group_name!r} in this process")


def _reduce_op(name: str):
    if name.lower() not in _REDUCE_OPS:
        raise ValueError(f"Unrecognized reduce_op {name!r} (expected one of {sorted(_REDUCE_OPS)})")
    return _REDUCE_OPS[name.lower()]


# ---- the operators' kernels (eager) and shape functions (fake tensors, tracing) -------------------
def _all_reduce_kernel(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    out = input.contiguous().clone()
    c.all_reduce(out, _reduce_op(reduce_op), _resolve_group(group_name))
    return out


def _all_reduce_fake(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    return input.new_empty(input.shape)


def _gathered_shape(input: Tensor, group_size: int) -> tuple:
    shape = tuple(input.shape)
    return (shape[0] * group_size,) + shape[1:] if shape else (group_size,)


def _all_gather_kernel(input: Tensor, group_size: int, group_name: str) -> Tensor:
    out = input.new_empty(_gathered_shape(input, group_size))
    c.all_gather_into_tensor(out, input.contiguous(), _resolve_group(group_name))
    return out


def _all_gather_fake(input: Tensor, group_size: int, group_name: str) -> Tensor:
    return input.new_empty(_gathered_shape(input, group_size))


def _scattered_shape(input: Tensor, group_size: int) -> tuple:
    shape = tuple(input.shape)
    if not shape or shape[0] % group_size:
        raise ValueError(f"reduce_scatter_tensor: input dim 0 ({shape}) must divide by the group size {group_size}")
    return (shape[0] // group_size,) + shape[1:]


def _reduce_scatter_kernel(input: Tensor, reduce_op: str, group_size: int, group_name: str) -> Tensor:
    out = input.new_empty(_scattered_shape(input, group_size))
    c.reduce_scatter_tensor(out, input.contiguous(), _reduce_op(reduce_op), _resolve_group(group_name))
    return out


def _reduce_scatter_fake(input: Tensor, reduce_op: str, group_size: int, group_name: str) -> Tensor:
    return input.new_empty(_scattered_shape(input, group_size))


def _all_to_all_kernel(input: Tensor, output_split_sizes: list, input_split_sizes: list, group_name: str) -> Tensor:
    out = input.new_empty((sum(output_split_sizes),) + tuple(input.shape[1:]))
    c.all_to_all_single(out, input.contiguous(), list(output_split_sizes), list(input_split_sizes),
                        _resolve_group(group_name))
    return out


def _all_to_all_fake(input: Tensor, output_split_sizes: list, input_split_sizes: list, group_name: str) -> Tensor:
    return input.new_empty((sum(output_split_sizes),) + tuple(input.shape[1:]))


def _broadcast_kernel(input: Tensor, src: int, group_name: str) -> Tensor:
    out = input.contiguous().clone()
    c.broadcast(out, group=_resolve_group(group_name), group_src=src)
    return out


def _broadcast_fake(input: Tensor, src: int, group_name: str) -> Tensor:
    return input.new_empty(input.shape)


# ---- derivatives -----------------------------------------------------------------------------------
def _save_arguments(ctx, inputs, output) -> None:
    ctx.arguments = inputs[1:]


def _all_reduce_backward(ctx, grad):
    reduce_op, group_name = ctx.arguments
    if reduce_op.lower() not in ("sum", "avg"):
        raise RuntimeError(f"all_reduce: no derivative for reduce_op {reduce_op!r} (only sum and avg)")
    return _op("all_reduce")(grad, reduce_op, group_name), None, None


def _all_gather_backward(ctx, grad):
    group_size, group_name = ctx.arguments
    return _op("reduce_scatter_tensor")(grad.contiguous(), "sum", group_size, group_name), None, None


def _reduce_scatter_backward(ctx, grad):
    reduce_op, group_size, group_name = ctx.arguments
    if reduce_op.lower() not in ("sum", "avg"):
        raise RuntimeError(f"reduce_scatter_tensor: no derivative for reduce_op {reduce_op!r} (only sum and avg)")
    full = _op("all_gather_into_tensor")(grad.contiguous(), group_size, group_name)
    return (full / group_size if reduce_op.lower() == "avg" else full), None, None, None


def _all_to_all_backward(ctx, grad):
    output_split_sizes, input_split_sizes, group_name = ctx.arguments
    back = _op("all_to_all_single")(grad.contiguous(), list(input_split_sizes), list(output_split_sizes), group_name)
    return back, None, None, None


def _broadcast_backward(ctx, grad):
    """PyTorch's `_Broadcast.backward`: the source receives the sum of every rank's gradient (a reduce to
    it), the others their own gradient."""
    src, group_name = ctx.arguments
    summed = _op("all_reduce")(grad.contiguous(), "sum", group_name)
    return (summed if _resolve_group(group_name).rank() == src else grad), None, None


_RULES = {
    "all_reduce": (_all_reduce_kernel, _all_reduce_fake, _all_reduce_backward),
    "all_gather_into_tensor": (_all_gather_kernel, _all_gather_fake, _all_gather_backward),
    "reduce_scatter_tensor": (_reduce_scatter_kernel, _reduce_scatter_fake, _reduce_scatter_backward),
    "all_to_all_single": (_all_to_all_kernel, _all_to_all_fake, _all_to_all_backward),
    "broadcast": (_broadcast_kernel, _broadcast_fake, _broadcast_backward),
}


def _define_operators() -> None:
    for name, (kernel, fake, backward) in _RULES.items():
        qualname = f"{NAMESPACE}::{name}"
        if name in CUSTOM_OPS.get(NAMESPACE, {}):
            continue
        library.define(qualname, _SCHEMAS[name])
        library.register_kernel(qualname, None, kernel)
        library.register_fake(qualname, fake)
        library.register_autograd(qualname, backward, setup_context=_save_arguments)


_define_operators()
_OPS = {name: library.get_op(f"{NAMESPACE}::{name}") for name in _RULES}     # flambeau.ops._c10d_functional.*


def _op(name: str):
    return _OPS[name]


# ---- the public functions ---------------------------------------------------------------------------
class AsyncCollectiveTensor(Tensor):
    """The eager result of a functional collective (PyTorch's class): a Tensor sharing the result's memory.
    Operators on it return plain Tensors; `wait()`/`trigger_wait()` give the plain result."""

    def __new__(cls, elem: Tensor):
        t = cls._from(elem)
        t.elem = elem
        return t

    def trigger_wait(self) -> Tensor:
        return self.elem

    def wait(self) -> Tensor:
        return self.elem


def _maybe_wrap(t: Tensor):
    if is_compiling():
        return t
    return AsyncCollectiveTensor(t)


def wait_tensor(tensor: Tensor) -> Tensor:
    """The finished result of a functional collective (a no-op on a plain tensor)."""
    return tensor.wait() if isinstance(tensor, AsyncCollectiveTensor) else tensor


def all_reduce(self: Tensor, reduceOp: str, group, tag: str = "") -> Tensor:  # noqa: N803  PyTorch's names
    """The reduction of `self` over the ranks of `group` (a new tensor; `self` is unchanged)."""
    return _maybe_wrap(_op("all_reduce")(self, str(reduceOp).lower(), _resolve_group_name(group)))


def all_gather_tensor(self: Tensor, gather_dim: int, group, tag: str = "") -> Tensor:
    """Every rank's `self` concatenated along `gather_dim`."""
    name = _resolve_group_name(group)
    size = _resolve_group(name).size()
    out = _op("all_gather_into_tensor")(self.contiguous(), size, name)
    if gather_dim != 0:
        out = _functions.cat(out.chunk(size), gather_dim)
    return _maybe_wrap(out)


def reduce_scatter_tensor(self: Tensor, reduceOp: str, scatter_dim: int, group,  # noqa: N803  PyTorch's names
                          tag: str = "") -> Tensor:
    """This rank's piece (along `scatter_dim`) of the reduction of every rank's `self`."""
    name = _resolve_group_name(group)
    size = _resolve_group(name).size()
    if self.shape[scatter_dim] % size:
        raise ValueError(f"reduce_scatter_tensor: input dimension {scatter_dim} ({self.shape[scatter_dim]}) must be "
                         f"divisible by the group size {size}")
    x = self
    if scatter_dim != 0:
        x = _functions.cat(self.chunk(size, dim=scatter_dim), 0)
    return _maybe_wrap(_op("reduce_scatter_tensor")(x.contiguous(), str(reduceOp).lower(), size, name))


def all_to_all_single(self: Tensor, output_split_sizes, input_split_sizes, group, tag: str = "") -> Tensor:
    """Pieces of `self` (dim 0, by `input_split_sizes`) sent to each rank; what arrives, concatenated."""
    name = _resolve_group_name(group)
    size = _resolve_group(name).size()
    if input_split_sizes is None:
        input_split_sizes = [self.shape[0] // size] * size
    if output_split_sizes is None:
        output_split_sizes = [self.shape[0] // size] * size
    return _maybe_wrap(_op("all_to_all_single")(self, list(output_split_sizes), list(input_split_sizes), name))


def broadcast(self: Tensor, src: int, group, tag: str = "") -> Tensor:
    """Rank `src`'s `self` on every rank (`src` a global rank, as PyTorch's)."""
    name = _resolve_group_name(group)
    return _maybe_wrap(_op("broadcast")(self, _resolve_group(name).ranks.index(src), name))


def all_reduce_coalesced(self: list, reduceOp: str, group, tag: str = "") -> list:  # noqa: N803  PyTorch's
    return [all_reduce(t, reduceOp, group, tag) for t in self]


def all_gather_into_tensor_coalesced(self: list, group, tag: str = "") -> list:
    return [all_gather_tensor(t, 0, group, tag) for t in self]


def all_gather_tensor_autograd(self: Tensor, gather_dim: int, group, tag: str = "") -> Tensor:
    """`all_gather_tensor` (differentiable like every functional collective here, as PyTorch's `*_autograd`)."""
    return all_gather_tensor(self, gather_dim, group, tag)


def reduce_scatter_tensor_autograd(self: Tensor, reduceOp: str, scatter_dim: int, group,  # noqa: N803
                                   tag: str = "") -> Tensor:
    """`reduce_scatter_tensor` (differentiable, as PyTorch's `*_autograd`)."""
    return reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag)


def all_to_all_single_autograd(self: Tensor, output_split_sizes, input_split_sizes, group, tag: str = "") -> Tensor:
    """`all_to_all_single` (differentiable, as PyTorch's `*_autograd`)."""
    return all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag)
