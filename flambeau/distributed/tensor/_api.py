"""DTensor: a global tensor laid out over a DeviceMesh, each rank holding its local piece.

A DTensor is a wrapper subclass of Tensor (no data of its own: `_device` is the dispatcher's
`WRAPPER_DEVICE`), so every operator on it reaches `__torch_dispatch__` below autograd and runs by
the op's sharding rule (`_dispatch.py`); autograd records on the DTensors, so gradients are DTensors.
Its metadata queries answer globally (`shape`, `size()`, `numel()`, `stride()`); `_data` is the local
shard's array, which is what the optimizers step (a sharded optimizer state for free: `zeros_like`
of a DTensor is a DTensor of the same layout).

Entry points as PyTorch's: `distribute_tensor` (cut a full tensor), `DTensor.from_local` (declare
local pieces), `to_local`, `full_tensor`, `redistribute` (all differentiable: the backward of a
redistribution is the redistribution back).
"""
from __future__ import annotations

import numpy as np

from ... import _backends, _state
from ..._dispatch import WRAPPER_DEVICE
from ..._ops.creation import zeros
from ..._tensor import Size, Tensor
from ...autograd.function import Function
from ...nn.parameter import Parameter
from ..collectives import broadcast
from ..device_mesh import DeviceMesh
from . import _dispatch
from ._redistribute import REPLICATE, normalize, redistribute_local
from ._utils import check_strided, compute_local_shape_and_global_offset
from .placement_types import Partial, Placement, Replicate, Shard, _StridedShard

__all__ = ["DTensor", "DTensorSpec", "distribute_tensor"]


class DTensorSpec:
    """A DTensor's layout: its mesh, one placement per mesh dimension, and its global shape."""
    __slots__ = ("mesh", "placements", "shape")

    def __init__(self, mesh: DeviceMesh, placements: tuple, shape: tuple) -> None:
        self.mesh, self.placements, self.shape = mesh, tuple(placements), tuple(shape)

    def __eq__(self, other) -> bool:
        return isinstance(other, DTensorSpec) and self.mesh == other.mesh and \
            self.placements == other.placements and self.shape == other.shape

    def __repr__(self) -> str:
        return f"DTensorSpec({self.placements}, shape={self.shape})"

    def zeros(self, dtype) -> "DTensor":
        """A zero DTensor of this layout (autograd's gradient for an unused output)."""
        placements = tuple(REPLICATE if isinstance(p, Partial) else p for p in self.placements)
        local = zeros(compute_local_shape_and_global_offset(self.shape, self.mesh, placements)[0], dtype=dtype)
        return DTensor._make(local, self.mesh, placements, self.shape)


def _check_placements(placements, mesh: DeviceMesh, ndim: int, what: str) -> tuple:
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(f"{what}: `placements` must have the same length as `device_mesh.ndim`! Found "
                         f"placements length: {len(placements)}, and device_mesh.ndim: {mesh.ndim}.")
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{what}: placements must be Shard/Replicate/Partial, got {p!r}")
        if isinstance(p, (Shard, _StridedShard)) and not -ndim <= p.dim < max(ndim, 1):
            raise IndexError(f"{what}: {p} is out of range for a tensor of {ndim} dimensions")
    check_strided(placements, mesh.shape, what)
    return normalize(placements, ndim)


class DTensor(Tensor):
    """A tensor laid out over a device mesh (see module docstring)."""

    @staticmethod
    def _make(local: Tensor, mesh: DeviceMesh, placements: tuple, shape: tuple,
              requires_grad: bool = False) -> "DTensor":
        return DTensor._of_spec(local, DTensorSpec(mesh, placements, shape), requires_grad)

    @staticmethod
    def _of_spec(local: Tensor, spec: DTensorSpec, requires_grad: bool = False) -> "DTensor":
        """A DTensor of `local` laid out as `spec` (shared: specs are never changed in place)."""
        t = object.__new__(DTensor)
        t._local_tensor = local
        t._spec = spec
        t._dtype = local._dtype
        t._device = WRAPPER_DEVICE
        t._version = [0]
        t._requires_grad = requires_grad
        t._fw_grad = None
        return t

    # -- the local array is the data (optimizers step it) ------------------------------------------------
    @property
    def _data(self):
        return self._local_tensor._data

    @_data.setter
    def _data(self, value) -> None:
        self._local_tensor._data = value

    # -- global metadata ---------------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._spec.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._spec.shape)
        return self._spec.shape[dim]

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    def dim(self) -> int:
        return len(self._spec.shape)

    ndimension = dim

    def numel(self) -> int:
        return int(np.prod(self._spec.shape, dtype=np.int64))

    nelement = numel

    def stride(self, dim: int | None = None):
        """Global strides: contiguous in the order of the local tensor's strides."""
        local = self._local_tensor.stride()
        order = sorted(range(self.ndim), key=lambda d: (-local[d], -d)) if self.ndim else []
        strides, acc = [0] * self.ndim, 1
        for d in reversed(order):
            strides[d] = acc
            acc *= max(self._spec.shape[d], 1)
        strides = tuple(strides)
        return strides if dim is None else strides[dim]

    def is_contiguous(self, memory_format=None) -> bool:
        return self._local_tensor.is_contiguous(memory_format)

    @property
    def device(self):
        return self._local_tensor.device

    @property
    def is_cpu(self) -> bool:
        return self._local_tensor.is_cpu

    @property
    def is_cuda(self) -> bool:
        return self._local_tensor.is_cuda

    @property
    def is_meta(self) -> bool:
        return False

    def get_device(self) -> int:
        return self._local_tensor.get_device()

    def data_ptr(self) -> int:
        return self._local_tensor.data_ptr()

    def __len__(self) -> int:
        if not self._spec.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._spec.shape[0]

    # -- the DTensor API -----------------------------------------------------------------------------------
    @property
    def placements(self) -> tuple:
        return self._spec.placements

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @staticmethod
    def from_local(local_tensor: Tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                   run_check: bool = False, shape=None, stride=None) -> "DTensor":
        """A DTensor whose piece on this rank is `local_tensor` (differentiable). Without `shape`, the
        global shape assumes even pieces (local size times the mesh size on each sharded dimension)."""
        if device_mesh is None:
            raise RuntimeError("DTensor.from_local: device_mesh is required")
        mesh = device_mesh
        placements = (REPLICATE,) * mesh.ndim if placements is None else placements
        placements = _check_placements(placements, mesh, local_tensor.dim(), "DTensor.from_local")
        if shape is None:
            shape = list(local_tensor.shape)
            for i, p in enumerate(placements):
                if isinstance(p, Shard):
                    shape[p.dim] *= mesh.size(i)
        if run_check:
            _check_replicas(local_tensor, mesh, placements)
        return _FromLocal.apply(local_tensor, mesh, placements, tuple(shape))

    def to_local(self, *, grad_placements=None) -> Tensor:
        """This rank's piece (differentiable: its gradient becomes a DTensor of `grad_placements`,
        this DTensor's placements by default)."""
        return _ToLocal.apply(self, None if grad_placements is None else tuple(grad_placements))

    def redistribute(self, device_mesh: DeviceMesh | None = None, placements=None, *, async_op: bool = False,
                     forward_dtype=None, backward_dtype=None) -> "DTensor":
        """The same global tensor laid out by `placements` (collectives as needed; differentiable)."""
        mesh = device_mesh or self.device_mesh
        if mesh != self.device_mesh:
            raise NotImplementedError("DTensor.redistribute: moving to another mesh is not supported")
        if placements is None:
            raise RuntimeError("placements is needed for redistribute!")
        placements = _check_placements(placements, mesh, self.ndim, "DTensor.redistribute")
        for p in placements:
            if isinstance(p, Partial) and p not in self.placements:
                raise RuntimeError("Can not redistribute to Partial, redistributing to Partial is for internal use only!")
        return _Redistribute.apply(self, placements)

    def full_tensor(self, *, grad_placements=None) -> Tensor:
        """The whole tensor on every rank (an all-gather / all-reduce as the placements need)."""
        return self.redistribute(placements=(REPLICATE,) * self.device_mesh.ndim).to_local(
            grad_placements=grad_placements)

    # -- what the dispatcher and autograd ask of a wrapper subclass -----------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch.dispatch(func, args, kwargs or {}, DTensor)

    def _wrapper_write(self, res, opname: str) -> None:
        if not isinstance(res, DTensor):
            raise RuntimeError(f"{opname}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor "
                               "to DTensor before calling distributed operators!")
        if tuple(res.shape) != self._spec.shape:
            raise RuntimeError(f"output with shape {list(self._spec.shape)} doesn't match the broadcast shape "
                               f"{list(res.shape)}")
        src = redistribute_local(res._local_tensor, self.device_mesh, res.placements, self.placements,
                                 self._spec.shape)
        prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False
        try:
            self._local_tensor.copy_(src)
        finally:
            _state.tls.grad_enabled = prev

    def _wrapper_meta(self) -> tuple:
        return (Size(self._spec.shape), self._dtype, self._spec)

    def _wrapper_reduce_to(self, shape, dtype, layout) -> "DTensor":
        """A gradient brought to its input's metadata: broadcast dimensions summed, the dtype, and the
        input's placements (a Partial input takes a replicated gradient)."""
        g = self
        if not isinstance(layout, DTensorSpec):
            raise RuntimeError(f"a DTensor gradient reached a plain tensor input of shape {list(shape)}")
        if tuple(g.shape) != tuple(shape):
            nd = g.ndim - len(shape)
            dims = tuple(range(nd)) + tuple(nd + k for k, s in enumerate(shape) if s == 1 and g.shape[nd + k] != 1)
            if dims:
                g = g.sum(dims, keepdim=True)
            g = g.reshape(tuple(shape))
        if g._dtype is not dtype and dtype.is_floating_point:
            g = g.to(dtype)
        want = tuple(REPLICATE if isinstance(p, Partial) else p for p in layout.placements)
        if g.placements != want:
            g = DTensor._make(redistribute_local(g._local_tensor, g.device_mesh, g.placements, want, g._spec.shape),
                              g.device_mesh, want, g._spec.shape, requires_grad=g._requires_grad)
        return g

    def _wrapper_piece(self, arr):
        """`nn.init` on a DTensor (a model sharded by FSDP2 or tensor parallel, initialised in place): `arr` holds
        the whole tensor's values (ranks that seeded alike drew the same ones); returns this rank's piece of
        them, for its local tensor (None outside the mesh), so the sharded model starts as the one-process model
        would (PyTorch's DTensor random ops aim at that too)."""
        if any(isinstance(p, Partial) for p in self.placements):
            raise RuntimeError(f"nn.init: cannot initialise a DTensor with placements {self.placements}: a Partial "
                               "tensor holds pending sums, not values; redistribute it to Replicate or Shard first")
        if self.device_mesh.get_coordinate() is None:      # this rank is outside the mesh: it holds nothing
            return None
        shape, offset = compute_local_shape_and_global_offset(tuple(self.shape), self.device_mesh, self.placements)
        xp = _backends.get(self._local_tensor.device.type).xp or np
        return xp.broadcast_to(xp.asarray(arr), tuple(self.shape))[tuple(slice(o, o + n)
                                                                           for o, n in zip(offset, shape))]

    def _wrapper_like(self, fn, args: tuple, kwargs: dict) -> "DTensor":
        local = self._local_tensor
        # a `device=` given moves the local piece there (`Module.to_empty(device=...)` of a model sharded on meta)
        out = fn(tuple(local.shape), *args, dtype=kwargs.get("dtype") or self._dtype,
                 device=kwargs.get("device") or local.device)
        placements = tuple(REPLICATE if isinstance(p, Partial) else p for p in self.placements)
        return DTensor._make(out, self.device_mesh, placements, self._spec.shape,
                             requires_grad=bool(kwargs.get("requires_grad")))

    def _wrapper_new(self, fn, size: tuple, kwargs: dict) -> "DTensor":
        """`new_zeros`/`new_ones`/`new_empty` (PyTorch's new-factory rule): this DTensor's layout when the size
        is its own, else replicated (every rank makes the whole tensor)."""
        if tuple(size) == tuple(self._spec.shape):
            return self._wrapper_like(fn, (), kwargs)
        local = fn(tuple(size), dtype=kwargs.get("dtype") or self._dtype, device=self._local_tensor.device)
        return DTensor._make(local, self.device_mesh, (REPLICATE,) * self.device_mesh.ndim, tuple(size),
                             requires_grad=bool(kwargs.get("requires_grad")))

    @classmethod
    def _wrapper_parameter(cls, data: "DTensor", requires_grad: bool) -> "DTensor":
        p = _DTensorParameter._from(data.detach())
        p._requires_grad = False
        p.requires_grad = requires_grad
        return p

    # -- plain-tensor methods that must not read the local data as if it were global -----------------------
    def detach(self) -> "DTensor":
        t = DTensor._make(self._local_tensor.detach(), self.device_mesh, self.placements, self._spec.shape)
        t._version = self._version
        return t

    def item(self):
        return self.full_tensor().item()

    def tolist(self):
        return self.full_tensor().tolist()

    def numpy(self, *, force: bool = False):
        return self.detach().full_tensor().numpy(force=force)

    def _host(self):
        raise RuntimeError("a DTensor has no single host array: call to_local() or full_tensor() first")

    def __bool__(self) -> bool:
        return bool(self.full_tensor())

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = DTensor._make(self._local_tensor.detach().clone(), self.device_mesh, self.placements,
                            self._spec.shape, requires_grad=self._requires_grad)
        memo[id(self)] = new
        return new

    @property
    def data(self) -> "DTensor":
        return self.detach()

    @data.setter
    def data(self, other: "DTensor") -> None:
        if not isinstance(other, DTensor):
            raise RuntimeError("DTensor.data: assign a DTensor")
        self._local_tensor, self._spec, self._dtype = other._local_tensor, other._spec, other._dtype

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"DTensor(local_tensor={self._local_tensor!r}, device_mesh={self.device_mesh}, " \
               f"placements={self.placements})"


class _DTensorParameter(DTensor, Parameter):
    """`nn.Parameter(dtensor)`: a DTensor that modules register as a parameter."""

    def __repr__(self, *, tensor_contents=None) -> str:
        return "Parameter containing:\n" + DTensor.__repr__(self)


def _check_replicas(local: Tensor, mesh: DeviceMesh, placements: tuple) -> None:
    """run_check: replicated pieces must agree (rank 0's of each replicated mesh dimension is kept)."""
    for i, p in enumerate(placements):
        if isinstance(p, Replicate):
            broadcast(local, group_src=0, group=mesh.get_group(i))


class _FromLocal(Function):
    @staticmethod
    def forward(ctx, local, mesh, placements, shape):
        ctx.mesh, ctx.placements, ctx.shape = mesh, placements, shape
        return DTensor._make(local.detach(), mesh, placements, shape)

    @staticmethod
    def backward(ctx, grad):
        want = tuple(REPLICATE if isinstance(p, Partial) else p for p in ctx.placements)
        local = redistribute_local(grad._local_tensor, ctx.mesh, grad.placements, want, ctx.shape)
        return local, None, None, None


class _ToLocal(Function):
    @staticmethod
    def forward(ctx, dt, grad_placements):
        ctx.spec = dt._spec
        ctx.grad_placements = grad_placements
        return dt._local_tensor.view_as(dt._local_tensor)

    @staticmethod
    def backward(ctx, grad):
        spec = ctx.spec
        placements = ctx.grad_placements or spec.placements
        return DTensor._make(grad, spec.mesh, normalize(placements, len(spec.shape)), spec.shape), None


class _Redistribute(Function):
    @staticmethod
    def forward(ctx, dt, placements):
        ctx.src = dt.placements
        local = redistribute_local(dt._local_tensor, dt.device_mesh, dt.placements, placements, dt._spec.shape)
        if local is dt._local_tensor:
            local = local.view_as(local)
        return DTensor._make(local, dt.device_mesh, placements, dt._spec.shape)

    @staticmethod
    def backward(ctx, grad):
        want = tuple(REPLICATE if isinstance(p, Partial) else p for p in ctx.src)
        local = redistribute_local(grad._local_tensor, grad.device_mesh, grad.placements, want, grad._spec.shape)
        return DTensor._make(local, grad.device_mesh, want, grad._spec.shape), None


def distribute_tensor(tensor: Tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                      src_data_rank: int | None = 0) -> DTensor:
    """Cut the full `tensor` by `placements` over `device_mesh` (a leaf keeping its requires_grad). The
    data of rank `src_data_rank` (0) is what every rank gets (a broadcast first)."""
    if isinstance(tensor, DTensor):
        raise ValueError("distribute_tensor: the tensor is already a DTensor; use redistribute")
    if device_mesh is None:
        raise RuntimeError("distribute_tensor: device_mesh is required")
    if src_data_rank not in (None, 0):
        raise NotImplementedError("distribute_tensor: src_data_rank must be 0 or None")
    mesh = device_mesh
    placements = (REPLICATE,) * mesh.ndim if placements is None else placements
    placements = _check_placements(placements, mesh, tensor.dim(), "distribute_tensor")
    if any(isinstance(p, Partial) for p in placements):
        raise RuntimeError("distribute_tensor: Partial placements are not supported; use DTensor.from_local")
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False
    try:
        full = tensor.detach().contiguous().clone()
        if full.device.type != mesh.device_type and full.device.type != "meta":
            full = full.to(mesh.device_type)  # PyTorch's: onto the mesh's device type (a checkpoint loaded on cpu)
        if src_data_rank is not None and full.device.type != "meta":   # (a meta tensor holds nothing to send)
            # rank (0, ..., 0) of the mesh to every rank, a dimension at a time
            for i in range(mesh.ndim):
                broadcast(full, group_src=0, group=mesh.get_group(i))
        local = redistribute_local(full, mesh, (REPLICATE,) * mesh.ndim, placements, tuple(tensor.shape))
    finally:
        _state.tls.grad_enabled = prev
    return DTensor._make(local.contiguous(), mesh, placements, tuple(tensor.shape),
                         requires_grad=tensor.requires_grad)
