"""FSDP2: `fully_shard(module)` shards the module's parameters over a mesh as DTensors (`Shard(0)`).

Each call makes one parameter group: the parameters of `module` not already in a group of a submodule
sharded before it (shard the blocks, then the root). Between uses the module holds the sharded
parameters, so `module.parameters()` are DTensors, the optimizer steps shards and its state is sharded.
Around the group's forward:
  - pre-forward: all-gather (one collective for the group's flat shards in the padded layout of
    `_FlatLayout`, whose buffer holds the shards themselves, cast to `mp_policy.param_dtype` first;
    uneven pieces as torch.chunk cuts them) into plain leaf tensors swapped in as the
    module's parameters; floating inputs cast to the param dtype; the next group's all-gather started
    asynchronously (forward prefetch: `set_modules_to_forward_prefetch`, by default the group that ran
    next in the first iteration);
  - post-forward: the sharded parameters put back; with `reshard_after_forward` (not for the root) the
    gathered memory is dropped and a hook on the outputs gathers it again before their backward runs
    (prefetching the group that runs backward next);
  - as backward accumulates each gathered parameter's gradient, once the whole group has them: one
    reduce-scatter of the flat gradients (cast to `mp_policy.reduce_dtype`), averaged over the mesh,
    started asynchronously (on cuda on the NCCL engine's stream, overlapping the rest of backward); the
    group reshards at once. At the end of backward (an autograd final callback) the reductions are waited
    for and accumulated into the sharded parameters' `.grad` (DTensors, Shard(0)); a group some of whose
    parameters got no gradient in this backward is reduced there with the gradients it has (instead of
    waiting for ever), those parameters' `.grad` left as they were.
On a 2-D mesh (HSDP) parameters are `(Replicate(), Shard(0))`: gathered and reduce-scattered within
mesh dimension 1, and each reduced shard averaged over dimension 0 (its replicas) by an all-reduce.
FSDP x TP (a 1-D dp mesh, parameters already DTensors on the tp slice of the same 2-D mesh): each rank's TP
piece is sharded on dim 0 over dp, `(Shard(0), tp placement)`, or `(_StridedShard(0, sf=tp), Shard(0))` for
colwise pieces, so every parameter's memory is divided by the dp size (a Partial(sum/avg) TP parameter, whose
pieces add up to it, is `(Shard(0), Partial())` as PyTorch's; its gradient, Replicate, is made Partial before
the reduce-scatter: `_Param.local_grad`); `mp_policy` applies to them as to
plain parameters (the gathered TP piece in param_dtype, its gradient reduced in reduce_dtype).
`set_requires_gradient_sync(False)` keeps the gathered gradients for the next synchronised backward.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from ... import _state, cuda
from ..._backends import multi_tensor
from ..._ops.creation import empty
from ..._ops.shape import cat
from ..._tensor import Tensor
from ...autograd import engine
from ...nn.parameter import Parameter
from ..collectives import all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from ..device_mesh import DeviceMesh, init_device_mesh
from ..distributed_c10d import ReduceOp, _xp, get_world_size
from ..tensor._api import DTensor, DTensorSpec
from ..tensor._redistribute import redistribute_local
from ..tensor.placement_types import Partial, Replicate, Shard, _StridedShard

PARTIAL_PARAMETER_OPS = ("sum", "avg")   # Partial TP parameters FSDP shards: their pieces' sum or mean
_ARRAY_NATIVE_KINDS = "biufc"     # NumPy dtype kinds NumPy and CuPy both copy (not bfloat16's 'V')
_data_of, _sharded_of, _unsharded_of = (operator.attrgetter(a) for a in ("_data", "sharded", "unsharded"))
_requires_grad_of, _dtype_of = operator.attrgetter("_requires_grad"), operator.attrgetter("_dtype")
_c_contiguous_of = operator.attrgetter("flags.c_contiguous")

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "UnshardHandle"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """param_dtype: the dtype parameters are gathered and computed in; reduce_dtype: the dtype gradients
    are reduced in (default: param_dtype); output_dtype: the forward outputs' dtype; cast_forward_inputs:
    cast floating inputs to param_dtype."""
    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: bool = True


class OffloadPolicy:
    """No offloading (the default policy)."""


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """Keep sharded parameters on the host: what a cpu mesh does anyway (refused on cuda, not built)."""
    pin_memory: bool = True


class _Param:
    """One managed parameter: where it lives, its sharded DTensor and its gathered leaf tensor.

    `shape` is the shape FSDP gathers (the whole parameter, or this rank's tensor-parallel piece);
    `layout` the sharded DTensor's (mesh, placements, global shape); `tp` the tensor-parallel layout of the
    gathered leaf, (tp mesh, placement, global shape), or None when the leaf is a plain tensor. `slots` are
    the (module, attribute name) pairs holding it: more than one for a tied parameter (GPT-2's wte and
    lm_head weight), which stays one parameter, sharded, gathered and reduced once."""
    __slots__ = ("slots", "sharded", "shape", "unsharded", "layout", "tp", "ready", "spec", "held")

    def __init__(self, owner, name: str, sharded: DTensor, shape: tuple, layout: tuple, tp=None) -> None:
        self.slots, self.sharded, self.shape = [(owner, name)], sharded, shape
        self.layout, self.tp = layout, tp
        self.unsharded = None
        self.ready = False                # its gradient accumulated in the backward now running
        self.spec = DTensorSpec(*layout)  # the sharded layout, shared by each step's `.grad`
        self.held = None                  # `holder()`, once gathered

    def install(self, t: Tensor) -> None:
        """Make `t` the parameter in every module slot holding this one."""
        for owner, name in self.slots:
            owner._parameters[name] = t

    def leaf(self, full: Tensor) -> Tensor:
        """The gathered parameter the forward uses: `full`, or a DTensor of the TP layout around it."""
        if self.tp is not None:
            mesh, placement, shape = self.tp
            full = DTensor._make(full, mesh, (placement,), shape)
        return full.detach().requires_grad_(self.sharded.requires_grad)

    def holder(self) -> Tensor:
        """The plain tensor whose memory a reshard drops and an unshard refills."""
        return self.unsharded._local_tensor if self.tp is not None else self.unsharded

    def local_grad(self) -> Tensor:
        """This rank's gradient of the gathered piece, in the piece's TP placement (PyTorch's
        `_get_grad_inner_tensor`): a gradient laid out otherwise is redistributed to it first. A Partial
        parameter's gradient is Replicate (each piece's gradient is the whole parameter's); made Partial, the
        tp group's rank 0 keeps it and the others get zeros (sum; avg: every piece keeps it), so the optimizer
        moves the pieces' sum as one process moves the whole parameter (AdamW too: zero gradients, zero step)."""
        g = self.unsharded.grad
        if not isinstance(g, DTensor):
            return g
        mesh, placement, shape = self.tp
        if g.placements == (placement,):
            return g._local_tensor
        return _no_grad(redistribute_local, g._local_tensor, mesh, g.placements, (placement,), shape)


class UnshardHandle:
    """An all-gather in flight (`unshard(async_op=True)`); `wait()` installs the gathered parameters."""

    def __init__(self, group: "_ParamGroup", work) -> None:
        self._group, self._work = group, work

    def wait(self) -> None:
        if self._group._pending is self:
            self._work.wait()
            self._group._finish_unshard()


def _raw_ok(tensors: list, dtype=None) -> bool:
    """Whether `tensors` can be flattened, cut and joined as arrays (off the dispatcher): one dtype that
    NumPy and CuPy both copy, and no cast to another dtype asked for."""
    if not tensors or tensors[0]._data.dtype.kind not in _ARRAY_NATIVE_KINDS:
        return False
    first = tensors[0]._dtype
    return (dtype is None or dtype == first) and all(map(operator.eq, map(_dtype_of, tensors), repeat(first)))


def _array_tensor(arr, like: Tensor) -> Tensor:
    """A tensor of array `arr` on `like`'s device, of its dtype."""
    return Tensor._make(arr, like._device, like._dtype)


def _copied_out(chunks, out: Tensor, numel: int, even: bool, shape: tuple):
    """A parameter's array copied out of its columns `chunks` of the gathered (n, width) buffer `out` through
    the dispatcher (a dtype NumPy/CuPy do not copy), the padding cut off."""
    data = _no_grad(lambda: _array_tensor(chunks, out).clone().contiguous())._data
    return data.reshape(shape) if even else data.reshape(-1)[:numel].reshape(shape)


def _no_grad(fn, *args):
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False
    try:
        return fn(*args)
    finally:
        _state.tls.grad_enabled = prev


class _FlatLayout:
    """Where a group's parameters sit in its flat all-gather and reduce-scatter buffers (PyTorch FSDP2's
    padded layout), worked out once by `fully_shard`. Each rank's piece of a flat buffer holds, parameter
    after parameter, that rank's rows of it (torch.chunk's cut: chunks of ceil(rows / n) rows) padded to a
    whole chunk, so every piece has `width` elements and a group needs one all_gather_into_tensor and one
    reduce_scatter_tensor, whatever the sizes. Seen as an (n, width) array, parameter i's chunks are the
    columns `offsets[i]:offsets[i] + widths[i]`, whose first `numels[i]` elements in row-major order are
    the whole parameter (all of them when `even[i]`); this rank's shard is the first `mine[i]` elements of
    its chunk, of shape `local_shapes[i]`."""

    def __init__(self, params: list, n: int) -> None:
        self.offsets, self.widths, self.numels, self.mine, self.local_shapes = [], [], [], [], []
        at = 0
        for fp in params:
            rows, row_numel = (fp.shape[0] if fp.shape else 1), 1
            for s in fp.shape[1:]:
                row_numel *= s
            local = fp.sharded._local_tensor
            self.offsets.append(at)
            self.widths.append(-(-rows // n) * row_numel)
            self.numels.append(rows * row_numel)
            self.mine.append(local.numel())
            self.local_shapes.append(tuple(local.shape))
            at += self.widths[-1]
        self.width = at
        self.even = [k == n * w for k, w in zip(self.numels, self.widths)]
        # every non-empty piece of the (n, width) buffer, parameter by parameter and rank by rank, as four
        # lists: the parameter's index, the piece's offset in the flat buffer, its offset in the parameter's
        # elements (rank r's chunk holds elements r * width_i onwards) and its length: the contiguous runs
        # one batched copy (`triton_copy_many`) moves on cuda
        self.pieces = index, flat_at, param_at, lengths = [], [], [], []
        for i, (o, w, k) in enumerate(zip(self.offsets, self.widths, self.numels)):
            for r in range(n):
                length = min(w, k - r * w)
                if length <= 0:
                    break
                index.append(i)
                flat_at.append(r * self.width + o)
                param_at.append(r * w)
                lengths.append(length)
        # the gathered parameters side by side in one buffer (`_finish_unshard` on cuda): where each starts,
        # and where each piece lands in it
        self.starts, at = [], 0
        for k in self.numels:
            self.starts.append(at)
            at += k
        self.total = at
        self.shapes = [fp.shape for fp in params]
        self.whole_at = [self.starts[i] + b for i, b in zip(index, param_at)]
        self.lengths = tuple(lengths)

    def pack(self, tensors: list, n: int) -> Tensor:
        """The flat buffer of `tensors`, one a parameter: each its local shard (n = 1: this rank's piece of
        the all-gather) or its whole gradient (the reduce-scatter's input), zero-padded to its n chunks, laid
        out as the (n, width) array, flattened. On cuda (n > 1, one dtype, no cast: any dtype, the kernel moves
        bytes) one batched copy of the `pieces` given by address (`copy_addresses`: no array made per piece);
        else where NumPy and CuPy copy the dtype one array copy each into its columns (not `concatenate`, whose
        one-kernel path for small arrays on CuPy uploads a table of pointers from pageable memory: a stream
        synchronisation); else through the dispatcher."""
        widths = self.widths
        first = tensors[0]._data if tensors else None
        batched = multi_tensor.copy_many_for(tensors[0]._device) if n > 1 and tensors else None
        if batched is not None and all(map(operator.is_, map(_dtype_of, tensors), repeat(tensors[0]._dtype))):
            arrays = list(map(_data_of, tensors))
            if all(map(_c_contiguous_of, arrays)):
                flat = _xp(first).empty((n * self.width,), dtype=first.dtype)
                if not all(self.even):
                    flat.view(np.uint8).fill(0)     # the padding after short pieces (as bytes: any dtype)
                item, address_of = first.itemsize, batched.address_of
                base, sources = address_of(flat), list(map(address_of, arrays))
                index, flat_at, param_at, _ = self.pieces
                if self.lengths:
                    batched.copy_addresses(first, tuple([sources[i] + b * item for i, b in zip(index, param_at)]),
                                           tuple([base + a * item for a in flat_at]), self.lengths)
                return _array_tensor(flat, tensors[0])
        if _raw_ok(tensors):
            out = _xp(first).empty((n, self.width), dtype=first.dtype)
            for t, o, w in zip(tensors, self.offsets, widths):
                a, dst = t._data.reshape(-1), out[:, o:o + w]
                if a.size == n * w:
                    dst[...] = a.reshape(n, w)
                    continue
                rows, rest = divmod(a.size, w)      # a short piece: its elements first, zeros after
                dst[:rows] = a[:rows * w].reshape(rows, w)
                if rest:
                    dst[rows, :rest] = a[rows * w:]
                    dst[rows, rest:] = 0
                dst[rows + bool(rest):] = 0
            return _array_tensor(out.reshape(-1), tensors[0])
        return _no_grad(lambda: cat([(t.reshape(-1) if t.numel() == n * w else cat(
            [t.reshape(-1), t.new_zeros(n * w - t.numel())])).reshape(n, w) for t, w in zip(tensors, widths)],
            1).reshape(-1))


class _ParamGroup:
    """The parameters one `fully_shard` call manages, and their gather / reduce-scatter (module docstring)."""

    def __init__(self, module, mesh: DeviceMesh, reshard_after_forward: bool, mp: MixedPrecisionPolicy) -> None:
        self.module, self.mesh, self.mp = module, mesh, mp
        self.reshard_after_forward = reshard_after_forward
        self.params: list = []
        self.layout = None                    # _FlatLayout, once every parameter is added
        self.unsharded = False
        self.sync_grads = True
        self.is_root = None
        self.forward_prefetch = None          # groups to gather when this one's forward starts
        self.backward_prefetch = None
        self._pending = None
        self._gathered = None                 # the all-gather's output, kept from gather to gather
        self._chunks = None                   # per parameter: its columns of `_gathered` as an (n, width) array
        self._gather_srcs = None              # cuda: the addresses of `_gathered`'s pieces (`_FlatLayout.pieces`)
        self._shards = None                   # this rank's piece of the all-gather, holding the shards
        self._shard_views = None              # the shards' arrays: views of `_shards`
        self._installed_sharded = True        # which parameters the modules hold now
        self._n_ready = 0                     # parameters whose gradient this backward has accumulated
        self._n_wanted = 0
        self._slot_list = None                # (parameter dict, name, _Param) per slot: `_slots`
        self._helds = None                    # each parameter's `holder()`, once gathered
        self._empties = None                  # the holders' arrays while resharded, made once per dtype
        self._tensor_parallel = False         # whether a parameter is a tensor-parallel piece (FSDP x TP)
        shard_dim = mesh.ndim - 1           # HSDP (2-D mesh): replicate over mesh dim 0, shard over dim 1
        self.placements = (Replicate(),) * shard_dim + (Shard(0),)
        self.group = mesh.get_group(shard_dim)
        self.replicate_group = mesh.get_group(0) if shard_dim else None
        self.n, self.rank = mesh.size(shard_dim), mesh.get_local_rank(shard_dim)

    def add(self, owner, name: str, p) -> _Param:
        shape = tuple(p.shape)
        local = _no_grad(redistribute_local, p.detach(), self.mesh, (Replicate(),) * self.mesh.ndim,
                         self.placements, shape)
        sharded = Parameter(DTensor._make(local.contiguous(), self.mesh, self.placements, shape), p.requires_grad)
        owner._parameters[name] = sharded
        self.params.append(_Param(owner, name, sharded, shape, (self.mesh, self.placements, shape)))
        return self.params[-1]

    def add_tensor_parallel(self, owner, name: str, p: DTensor) -> _Param:
        """FSDP x TP: `p` is a DTensor on a 1-D tensor-parallel mesh; this group's 1-D mesh and that one are
        slices of one 2-D root mesh. This rank's TP piece is sharded on dim 0 over this mesh, the result a
        DTensor on the 2-D (fsdp, tp) mesh: `(Shard(0), tp placement)`, or, when the TP placement is Shard(0)
        too (colwise weights and biases: the fsdp cut is a cut of the TP piece), `(_StridedShard(0,
        sf=tp size), Shard(0))` as PyTorch's."""
        tp_mesh, (tp_p,) = p.device_mesh, p.placements
        if self.mesh.ndim != 1 or tp_mesh.ndim != 1 or not (self.mesh.mesh_dim_names and tp_mesh.mesh_dim_names) \
                or self.mesh._get_root_mesh() is not tp_mesh._get_root_mesh():
            raise NotImplementedError(f"fully_shard: parameter '{name}' is a DTensor on {tp_mesh}; FSDP x TP needs "
                                      "1-D named sub-meshes of one 2-D mesh (mesh['dp'], mesh['tp'])")
        if isinstance(tp_p, Partial) and tp_p.reduce_op not in PARTIAL_PARAMETER_OPS:
            raise NotImplementedError(f"fully_shard: parameter '{name}' is {tp_p}: a Partial tensor-parallel "
                                      f"parameter must reduce by {' or '.join(PARTIAL_PARAMETER_OPS)}")
        mesh2d = self.mesh._get_root_mesh()[self.mesh.mesh_dim_names[0], tp_mesh.mesh_dim_names[0]]
        local, gshape, tp = p._local_tensor.detach(), tuple(p.shape), (tp_mesh, tp_p, tuple(p.shape))
        fsdp_p = _StridedShard(0, split_factor=tp_mesh.size()) if tp_p == Shard(0) else Shard(0)
        piece = _no_grad(redistribute_local, local, self.mesh, (Replicate(),), (Shard(0),), tuple(local.shape))
        layout = (mesh2d, (fsdp_p, tp_p), gshape)
        sharded = Parameter(DTensor._make(piece.contiguous(), *layout), p.requires_grad)
        fp = _Param(owner, name, sharded, tuple(local.shape), layout, tp)
        self.params.append(fp)
        self._tensor_parallel = True
        owner._parameters[name] = sharded
        return fp

    # -- all-gather ------------------------------------------------------------------------------------
    def unshard(self, async_op: bool = False):
        if self._pending is not None and not async_op:
            self._pending.wait()
        if self.unsharded or self._pending is not None:
            return self._pending
        if not self.params:
            self.unsharded = True
            return None
        flat = self._flat_shards()
        out = self._gathered
        if out is None or out._dtype != flat._dtype or out._device != flat._device:
            out = self._gathered = empty((self.n * self.layout.width,), dtype=flat.dtype, device=flat.device)
            grid = out._data.reshape(self.n, self.layout.width)
            self._chunks = [grid[:, o:o + w] for o, w in zip(self.layout.offsets, self.layout.widths)]
            self._gather_srcs = None
        work = all_gather_into_tensor(out, flat, group=self.group, async_op=True)
        self._pending = UnshardHandle(self, work)
        if not async_op:
            self._pending.wait()
            return None
        return self._pending

    def adopt_loaded(self) -> None:
        """After `load_state_dict(..., assign=True)` (a model made on the meta device, then loaded from
        `distribute_tensor` pieces, as PyTorch's FSDP2 examples do): a module slot holding a new DTensor
        parameter in place of the group's makes it the group's, its layout checked; the next gather packs its
        local piece (`_flat_shards` sees new arrays)."""
        if not self._installed_sharded:
            return
        for fp in self.params:
            new = fp.slots[0][0]._parameters.get(fp.slots[0][1])
            if new is fp.sharded:
                continue
            name = fp.slots[0][1]
            if not isinstance(new, DTensor) or new.device_mesh is not fp.layout[0] or \
                    tuple(new.placements) != tuple(fp.layout[1]) or tuple(new.shape) != tuple(fp.layout[2]):
                got = (f"a DTensor on {new.device_mesh} with placements {new.placements} and shape "
                       f"{list(new.shape)}" if isinstance(new, DTensor) else type(new).__name__)
                raise RuntimeError(f"fully_shard: load_state_dict(assign=True) put {got} in parameter '{name}', "
                                   f"which FSDP manages as a DTensor on {fp.layout[0]} with placements "
                                   f"{fp.layout[1]} and shape {list(fp.layout[2])}: load `distribute_tensor(full, "
                                   f"param.device_mesh, param.placements)` pieces (or assign=False to copy)")
            setattr(new, FSDP_SHARDED_ATTR, True)
            fp.sharded = new
            fp.install(new)                   # a tied parameter's other slots too

    def _flat_shards(self) -> Tensor:
        """This rank's piece of the all-gather (`_FlatLayout`) in param_dtype. The shards live in it: after
        the first gather their arrays are views of one flat buffer (the optimizer steps them in place), so
        a gather copies nothing in; a shard whose array was replaced since (`p.data = ...`) is copied back
        in and viewed again."""
        locals_ = [fp.sharded._local_tensor for fp in self.params]
        flat = self._shards
        if flat is None or not all(map(operator.is_, map(_data_of, locals_), self._shard_views)):
            flat = self.layout.pack(locals_, 1)
            if _raw_ok(locals_):
                self._shards = flat
                for t, o, m, shape in zip(locals_, self.layout.offsets, self.layout.mine, self.layout.local_shapes):
                    t._data = flat._data[o:o + m].reshape(shape)
                self._shard_views = list(map(_data_of, locals_))
        dtype = self.mp.param_dtype
        return _no_grad(flat.to, dtype) if dtype is not None and flat.dtype != dtype else flat

    def _finish_unshard(self) -> None:
        """Copy each parameter's chunks out of the gathered buffer into its own memory (on cuda one
        `triton_copy_many` launch for the whole group over `_FlatLayout.pieces`, by address, into one new
        buffer of the group's parameters side by side, each a view of it; else one strided copy a parameter),
        installed in the gathered leaf (made on the first gather, refilled after)."""
        self._pending = None
        out, lay = self._gathered, self.layout
        raw = out._data.dtype.kind in _ARRAY_NATIVE_KINDS
        batched = multi_tensor.copy_many_for(out._device)      # cuda: bytes moved, any dtype
        if batched is not None:                 # cuda: every piece of the group in one launch, into one buffer
            src = out._data
            item = src.itemsize
            whole = _xp(src).empty((lay.total,), dtype=src.dtype)
            if self._gather_srcs is None:
                base = batched.address_of(src)
                self._gather_srcs = tuple([base + a * item for a in lay.pieces[1]])
            base = batched.address_of(whole)
            if lay.lengths:
                batched.copy_addresses(src, self._gather_srcs, tuple([base + a * item for a in lay.whole_at]),
                                       lay.lengths)
            datas = [whole[start:start + numel].reshape(shape)
                     for start, numel, shape in zip(lay.starts, lay.numels, lay.shapes)]
        elif raw:                               # one array copy a parameter, the padding cut off
            datas = [chunks.copy().reshape(shape) if even else chunks.copy().reshape(-1)[:numel].reshape(shape)
                     for chunks, numel, even, shape in zip(self._chunks, lay.numels, lay.even, lay.shapes)]
        else:
            datas = [_copied_out(chunks, out, numel, even, shape)
                     for chunks, numel, even, shape in zip(self._chunks, lay.numels, lay.even, lay.shapes)]
        if self._helds is not None:         # the same tensors (autograd saved them): new memory, same version
            dtype = out._dtype
            for held, data in zip(self._helds, datas):
                held._data = data
                held._dtype = dtype
        else:
            for fp, data in zip(self.params, datas):
                fp.unsharded = fp.leaf(Tensor._make(data, out._device, out._dtype))
                fp.held = fp.holder()
                if fp.sharded.requires_grad:
                    fp.unsharded.register_post_accumulate_grad_hook(self._on_grad(fp))
            self._helds = [fp.held for fp in self.params]
        self.unsharded = True

    def _slots(self) -> list:
        """(module's parameter dict, name, _Param) of every slot of the group's parameters, made once (tied
        parameters have several): installing is then a loop of dict stores, no call per parameter."""
        if self._slot_list is None:
            self._slot_list = [(owner._parameters, name, fp) for fp in self.params for owner, name in fp.slots]
        return self._slot_list

    def use_unsharded(self) -> None:
        self._installed_sharded = False
        for params, name, fp in self._slots():
            params[name] = fp.unsharded

    def use_sharded(self) -> None:
        if not self._installed_sharded:
            self._installed_sharded = True
            for params, name, fp in self._slots():
                params[name] = fp.sharded

    def reshard(self) -> None:
        """Drop the gathered memory (the tensors stay, for autograd's saved references)."""
        if self._pending is not None:
            self._pending.wait()
        self.use_sharded()
        if self.unsharded:                  # each holder gets an empty array of its own, made once per dtype
            helds, empties = self._helds, self._empties     # (a `[:0]` view would keep the gathered array alive)
            if empties is None or empties[0].dtype != helds[0]._data.dtype:
                empties = self._empties = [_xp(h._data).empty((0,) + h._data.shape[1:], dtype=h._data.dtype)
                                           for h in helds]
            for held, empty_ in zip(helds, empties):
                held._data = empty_
            self.unsharded = False

    # -- gradients -----------------------------------------------------------------------------------------
    def _on_grad(self, fp: _Param):
        def reduce_when_group_ready(t: Tensor) -> None:
            if not self.sync_grads or fp.ready:   # accumulating locally: the synchronised backward counts afresh
                return
            if not self._n_ready:
                _BACKWARD.track(self)
                self._n_wanted = sum(map(_requires_grad_of, map(_sharded_of, self.params)))
            fp.ready = True
            self._n_ready += 1
            if self._n_ready >= self._n_wanted:
                self.reduce_grads()
        return reduce_when_group_ready

    def reduce_grads(self) -> None:
        """Start the reduce-scatter of the gathered gradients (finished by `_BACKWARD` at the end of backward):
        one flat buffer in the `_FlatLayout` (the whole gradient of a parameter is its n chunks; a parameter
        without a gradient contributes zeros), cast to reduce_dtype."""
        self._n_ready = 0
        for fp in self.params:
            fp.ready = False
        grads = [None if u is None else u._grad for u in map(_unsharded_of, self.params)]
        has = [g is not None for g in grads]
        if not any(has):
            return
        if self._tensor_parallel:
            grads = [fp.local_grad() if h else None for fp, h in zip(self.params, has)]
        n = self.n
        if not all(has):
            first = next(g for g in grads if g is not None)
            grads = [g if g is not None else first.new_zeros((n * w,)) for g, w in zip(grads, self.layout.widths)]
        flat = self.layout.pack(grads, n)
        dtype = self.mp.reduce_dtype or self.mp.param_dtype
        if dtype is not None and flat.dtype != dtype:
            flat = _no_grad(flat.to, dtype)
        out = _array_tensor(_xp(flat._data).empty((self.layout.width,), dtype=flat._data.dtype), flat)   # no dispatch
        work = reduce_scatter_tensor(out, flat, op=ReduceOp.AVG, group=self.group, async_op=True)
        for u in map(_unsharded_of, self.params):
            if u is not None:
                u._grad = None
        self.reshard()
        _BACKWARD.pending.append((self, work, out, has))

    def finish_reduce(self, work, out, has: list) -> None:
        """Wait for a reduce-scatter (on cuda: the current stream waits) and accumulate the shards' `.grad`
        (views of the reduced buffer, cast once to the shards' dtype where it differs)."""
        work.wait()
        if self.replicate_group is not None:           # HSDP: then the mean over the replicas of the shard
            all_reduce(out, op=ReduceOp.AVG, group=self.replicate_group)
        lay, cast = self.layout, {out._dtype: out}
        make, of_spec = Tensor._make, DTensor._of_spec
        for fp, h, o, m, shape in zip(self.params, has, lay.offsets, lay.mine, lay.local_shapes):
            if not h:
                continue
            sharded = fp.sharded
            dtype = sharded._local_tensor._dtype
            src = cast.get(dtype)
            if src is None:
                src = cast[dtype] = _no_grad(out.to, dtype)
            sharded_grad = of_spec(make(src._data[o:o + m].reshape(shape), src._device, dtype), fp.spec)
            if sharded._grad is None:
                sharded._grad = sharded_grad        # made to match: the setter's checks cost more than the rest
            else:
                _no_grad(sharded._grad.add_, sharded_grad)


class _BackwardReductions:
    """The groups that got gradients in the backward pass now running and their reduce-scatters in flight;
    `finish` (queued as an autograd final callback when the first group gets a gradient) completes them."""

    def __init__(self) -> None:
        self.groups: list = []
        self.pending: list = []
        self.queued_on = None             # the callback list of the backward pass `finish` is queued on

    def track(self, group: _ParamGroup) -> None:
        running = engine.running_callbacks()
        if self.queued_on is not running:
            engine.queue_callback(self.finish)
            self.queued_on = running
        if group not in self.groups:
            self.groups.append(group)

    def finish(self) -> None:
        groups, self.groups, self.queued_on = self.groups, [], None
        for g in groups:
            if g._n_ready:                   # parameters without a gradient this time: reduce what came
                g.reduce_grads()
        pending, self.pending = self.pending, []
        for group, work, out, ps in pending:
            group.finish_reduce(work, out, ps)


_BACKWARD = _BackwardReductions()


class FSDPModule:
    """What `fully_shard` mixes into the module's class: PyTorch's FSDPModule methods."""

    def reshard(self) -> None:
        """Free the gathered parameters (the module holds its sharded ones)."""
        self._fsdp_group.reshard()

    def unshard(self, async_op: bool = False):
        """All-gather the parameters now (and install them); with async_op, a handle to `wait()` on."""
        handle = self._fsdp_group.unshard(async_op)
        if not async_op:
            self._fsdp_group.use_unsharded()
        return handle

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: backward keeps the gathered gradients (accumulating) instead of reduce-scattering."""
        for m in (self.modules() if recurse else [self]):
            if isinstance(m, FSDPModule):
                m._fsdp_group.sync_grads = requires_gradient_sync

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        for m in (self.modules() if recurse else [self]):
            if isinstance(m, FSDPModule):
                m._fsdp_group.reshard_after_forward = reshard_after_forward

    def set_modules_to_forward_prefetch(self, modules: list) -> None:
        self._fsdp_group.forward_prefetch = [m._fsdp_group for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list) -> None:
        self._fsdp_group.backward_prefetch = [m._fsdp_group for m in modules]


class _Iteration:
    """Which groups ran forward, in order, during the current root forward (for default prefetching)."""
    active_root = None
    order: list = []


def _cast(x, dtype):
    if isinstance(x, Tensor) and x.dtype.is_floating_point and dtype is not None and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _pre_forward(module, args, kwargs):
    g = module._fsdp_group
    if _Iteration.active_root is None:
        _Iteration.active_root, _Iteration.order = g, []
        if g.is_root is None:
            g.is_root = True
    elif g.is_root is None:
        g.is_root = False
    if _Iteration.order:
        prev = _Iteration.order[-1]
        if prev.forward_prefetch is None:
            prev.forward_prefetch = [g]             # first iteration: learn the order
    _Iteration.order.append(g)
    g.unshard()
    g.use_unsharded()
    for nxt in g.forward_prefetch or ():
        nxt.unshard(async_op=True)
    if g.mp.cast_forward_inputs and g.mp.param_dtype is not None:
        args, kwargs = _cast(args, g.mp.param_dtype), {k: _cast(v, g.mp.param_dtype) for k, v in kwargs.items()}
    return args, kwargs


def _post_forward(module, args, output):
    g = module._fsdp_group
    if g.reshard_after_forward and not g.is_root:
        g.reshard()
        _register_pre_backward(g, output)
    else:
        g.use_sharded()
    if _Iteration.active_root is g:
        _Iteration.active_root = None
        _link_backward_prefetch(_Iteration.order)
    return _cast(output, g.mp.output_dtype) if g.mp.output_dtype is not None else output


def _link_backward_prefetch(order: list) -> None:
    for i in range(1, len(order)):
        if order[i].backward_prefetch is None:
            order[i].backward_prefetch = [order[i - 1]]


def _register_pre_backward(g: _ParamGroup, output) -> None:
    tensors = [output] if isinstance(output, Tensor) else [o for o in output if isinstance(o, Tensor)] \
        if isinstance(output, (tuple, list)) else []

    def unshard_before_backward(grad):
        g.unshard()
        for prev in g.backward_prefetch or ():
            if prev.reshard_after_forward and not prev.is_root:
                prev.unshard(async_op=True)
        return None
    for t in tensors:
        if t.requires_grad:
            t.register_hook(unshard_before_backward)


# run eagerly under flambeau.compile, around the compiled forward (PyTorch's `skip_fsdp_hooks`): the unshard,
# reshard and backward registration are host decisions and collectives, not graph operations
_pre_forward._flambeau_dynamo_disable = _post_forward._flambeau_dynamo_disable = True
_FSDP_CLASSES: dict = {}
FSDP_SHARDED_ATTR = "_fsdp_sharded"     # set on the sharded parameters a fully_shard call made


def fully_shard(module, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool = True,
                shard_placement_fn=None, mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                offload_policy=None, ignored_params=None):
    """Shard `module`'s parameters (those not in a group already) over `mesh` (by default a 1-D mesh of
    every rank on the parameters' device type); the module becomes an `FSDPModule` (module docstring)."""
    if shard_placement_fn is not None:
        raise NotImplementedError("fully_shard: shard_placement_fn is not supported (parameters shard on dim 0)")
    if mesh is None:    # PyTorch's default: the accelerator's type when there is one, else cpu (not the
        #                 parameters': a model made on the meta device shards over the accelerator)
        mesh = init_device_mesh("cuda" if cuda.is_available() else "cpu", (get_world_size(),))
    if isinstance(offload_policy, CPUOffloadPolicy) and mesh.device_type != "cpu":
        raise NotImplementedError("fully_shard: CPUOffloadPolicy on a cuda mesh is not supported")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard: expected a 1-D mesh (FSDP) or a 2-D mesh (HSDP: replicate over "
                         f"dim 0, shard over dim 1), got {mesh.ndim}-D")
    ignored = {id(p) for p in (ignored_params or ())}
    group = _ParamGroup(module, mesh, reshard_after_forward, mp_policy)
    managed: dict = {}                  # id of an original parameter -> its _Param (tied parameters stay one)
    for owner in module.modules():
        for name, p in list(owner._parameters.items()):
            if p is None or id(p) in ignored or getattr(p, FSDP_SHARDED_ATTR, False):   # a nested group's
                continue
            fp = managed.get(id(p))
            if fp is not None:
                fp.slots.append((owner, name))
                owner._parameters[name] = fp.sharded
                continue
            managed[id(p)] = group.add_tensor_parallel(owner, name, p) if isinstance(p, DTensor) \
                else group.add(owner, name, p)
    for fp in group.params:
        setattr(fp.sharded, FSDP_SHARDED_ATTR, True)
    group.layout = _FlatLayout(group.params, group.n)
    cls = type(module)
    if cls not in _FSDP_CLASSES:
        _FSDP_CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    module.__class__ = _FSDP_CLASSES[cls]
    module._fsdp_group = group
    module.register_forward_pre_hook(_pre_forward, with_kwargs=True)
    module.register_forward_hook(_post_forward)
    module.register_load_state_dict_post_hook(_adopt_loaded)
    return module


def _adopt_loaded(module, incompatible_keys) -> None:
    module._fsdp_group.adopt_loaded()
