"""Model and optimizer state dicts for distributed checkpoints (PyTorch's `torch.distributed.checkpoint.state_dict`).

`get_model_state_dict` is the module's state dict under its parameters' clean names (the `module.` of DDP
and `_orig_mod.` of a compiled module dropped); `get_optimizer_state_dict` keys the optimizer's state and
param_groups by those names instead of positions, so a checkpoint survives a change of wrapping or of
parameter order, and initializes an optimizer that has not stepped yet (a step at learning rate 0 over
zero gradients) so a fresh optimizer has tensors to load into. `set_*` go back the other way.

Options (`StateDictOptions`): `full_state_dict` gathers DTensors into whole tensors, `cpu_offload` moves
tensors to the cpu (with both, ranks other than 0 get empty dicts, as PyTorch), `ignore_frozen_params`
drops parameters without requires_grad, `strict` is passed to `load_state_dict`, `broadcast_from_rank0` (with
`full_state_dict`) makes the `set_*` functions read rank 0's dict alone and broadcast it. A full state dict loaded
into a model made on the meta device is assigned, on the default group's device (PyTorch's rule).
"""
from __future__ import annotations

import dataclasses

from ... import cuda
from ..._device import canonical
from ..._ops.creation import empty
from ..._tensor import Tensor
from ...autograd.grad_mode import no_grad
from ...nn.modules.module import Module
from ...optim.optimizer import Optimizer
from .. import distributed_c10d as c10d
from ..collectives import broadcast, broadcast_object_list
from ._traverse import _is_dtensor, tensor_piece

WRAPPER_ATTRS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


@dataclasses.dataclass
class StateDictOptions:
    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _options(options: StateDictOptions | None) -> StateDictOptions:
    options = options or StateDictOptions()
    if options.flatten_optimizer_state_dict:
        raise NotImplementedError("StateDictOptions: flatten_optimizer_state_dict is not supported yet")
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("full_state_dict must be True when broadcast_from_rank0 is True.")
    return options


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A tensor of rank 0's state dict, as the other ranks learn of it before its broadcast."""
    index: int
    shape: tuple
    dtype: object


def _group_device():
    """The device the default group's collectives take: the current cuda device for an NCCL group, else
    the cpu (PyTorch's `_get_pg_default_device`)."""
    if "nccl" in c10d.get_backend() and cuda.is_available():
        return canonical(f"cuda:{cuda.current_device()}")
    return canonical("cpu")


def _from_rank0(sd: dict, device) -> dict:
    """Rank 0's full state dict `sd` on every rank (`broadcast_from_rank0`; the others' `sd` is not read, an
    empty dict will do): its structure, tensors as shape and dtype, by `broadcast_object_list`, then each
    tensor by a broadcast on `device`."""
    rank, tensors = _rank(), []

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        if _is_dtensor(v):
            raise ValueError("broadcast_from_rank0: rank 0's state dict must hold whole tensors, got a DTensor")
        if isinstance(v, Tensor):
            tensors.append(v)
            return _Slot(len(tensors) - 1, tuple(v.shape), v.dtype)
        return v

    skeleton = [strip(sd) if rank == 0 else None]
    broadcast_object_list(skeleton, src=0)

    def fill(v):
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, _Slot):
            t = tensors[v.index].detach().to(device).contiguous() if rank == 0 else \
                empty(v.shape, dtype=v.dtype, device=device)
            broadcast(t, src=0)
            return t
        return v
    with no_grad():
        return fill(skeleton[0])


def _clean_name(model: Module, name: str) -> str:
    """`name` without the path parts that only name a wrapper (DDP's `module`, compile's `_orig_mod`)."""
    kept, node = [], model
    for part in name.split("."):
        child = getattr(node, part, None) if isinstance(node, Module) else None
        wrapper = part in WRAPPER_ATTRS and isinstance(child, Module) and node is not child and \
            type(node).__name__ in ("DistributedDataParallel", "OptimizedModule", "DataParallel",
                                    "CheckpointWrapper", "FullyShardedDataParallel")
        if not wrapper:
            kept.append(part)
        node = child
    return ".".join(kept)


def _parameter_names(model: Module) -> dict:
    """id(parameter) -> clean name."""
    return {id(p): _clean_name(model, n) for n, p in model.named_parameters(remove_duplicate=False)}


def _rank() -> int:
    return c10d.get_rank() if c10d.is_initialized() else 0


def _convert(value, options: StateDictOptions):
    if not isinstance(value, Tensor) and not _is_dtensor(value):
        return value
    if options.full_state_dict and _is_dtensor(value):
        value = value.full_tensor()
    if options.cpu_offload:
        value = value.cpu()
    return value.detach() if isinstance(value, Tensor) else value


def _convert_all(d: dict, options: StateDictOptions) -> dict:
    return {k: (_convert_all(v, options) if isinstance(v, dict) else _convert(v, options)) for k, v in d.items()}


def get_model_state_dict(model: Module, *, submodules=None, options: StateDictOptions | None = None) -> dict:
    """The model's state dict under clean parameter names, converted as `options` say."""
    options = _options(options)
    frozen = {_clean_name(model, n) for n, p in model.named_parameters() if not p.requires_grad}
    sd = {}
    for name, value in model.state_dict().items():
        clean = _clean_name(model, name)
        if options.ignore_frozen_params and clean in frozen:
            continue
        sd[clean] = value
    sd = _convert_all(sd, options)
    return {} if options.full_state_dict and options.cpu_offload and _rank() != 0 else sd


def _optimizers(optimizers) -> list:
    return [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)


def _init_optim_state(optim: Optimizer) -> None:
    """Give an optimizer that never stepped its state: one step at lr 0 over zero gradients."""
    if optim.state or any(p.grad is not None for g in optim.param_groups for p in g["params"]):
        return
    for group in optim.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.detach().new_zeros(p.shape) if not _is_dtensor(p) else p.detach() * 0
    lrs = [group.get("lr") for group in optim.param_groups]
    for group in optim.param_groups:
        if "lr" in group:
            group["lr"] = 0.0
    optim.step()
    for group, lr in zip(optim.param_groups, lrs):
        if lr is not None:
            group["lr"] = lr
    optim.zero_grad(set_to_none=True)


def get_optimizer_state_dict(model: Module, optimizers, *, submodules=None,
                             options: StateDictOptions | None = None) -> dict:
    """{"state": {name: {...}}, "param_groups": [{..., "params": [names]}]} of one or several optimizers."""
    options = _options(options)
    names = _parameter_names(model)
    state, groups = {}, []
    for optim in _optimizers(optimizers):
        _init_optim_state(optim)
        for group in optim.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError("get_optimizer_state_dict: the optimizer holds a parameter the model does not "
                                     f"have (shape {list(p.shape)})")
                if p in optim.state:
                    state[names[id(p)]] = _convert_all(dict(optim.state[p]), options)
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [names[id(p)] for p in group["params"]]
            groups.append(packed)
    sd = {"state": state, "param_groups": groups}
    return {} if options.full_state_dict and options.cpu_offload and _rank() != 0 else sd


def get_state_dict(model: Module, optimizers, *, submodules=None, options: StateDictOptions | None = None) -> tuple:
    """(model state dict, optimizer state dict), both keyed by clean parameter names."""
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def _into_like(value, current, device=None):
    """`value` made to fit where `current` lives: a whole tensor into a DTensor becomes its local shard. A
    `current` on the meta device (a model made there, loaded with assign) takes `device` instead."""
    if _is_dtensor(current) and isinstance(value, Tensor) and not _is_dtensor(value):
        piece = tensor_piece(current)
        where = device if device is not None and piece.local.device.type == "meta" else piece.local.device
        local = value[piece.region()].to(where, piece.local.dtype).contiguous()
        return type(current).from_local(local, current.device_mesh, current.placements, shape=current.shape,
                                        stride=current.stride())
    if device is not None and isinstance(current, Tensor) and isinstance(value, Tensor) and \
            current.device.type == "meta":
        return value.to(device, current.dtype)
    return value


def _full_load_device(values) -> tuple:
    """(device, assign) of a full state dict's load into tensors `values` (PyTorch's rule): their device, the
    default group's where all are on the meta device; assign where some are (a model made on meta)."""
    devices = {v.device for v in values if isinstance(v, Tensor) and v.dim() > 0}
    meta = any(d.type == "meta" for d in devices)
    devices = {d for d in devices if d.type != "meta"}
    if len(devices) > 1:
        raise ValueError(f"set_state_dict: the model's tensors are on several devices {sorted(map(str, devices))}; "
                         "a full state dict loads onto one")
    return (devices.pop() if devices else _group_device()), meta


def set_model_state_dict(model: Module, model_state_dict: dict, *, options: StateDictOptions | None = None):
    """Load a state dict keyed by clean names into the model; returns load_state_dict's result. With
    `full_state_dict`, a model on the meta device is loaded by assignment onto the group's device; with
    `broadcast_from_rank0` too, only rank 0's dict is read."""
    options = _options(options)
    by_clean = {_clean_name(model, n): n for n in model.state_dict()}
    current = model.state_dict()
    device, assign = None, False
    if options.full_state_dict:
        device, assign = _full_load_device(current.values())
        if options.broadcast_from_rank0:
            model_state_dict = _from_rank0(model_state_dict, device)
    sd = {}
    for clean, value in model_state_dict.items():
        name = by_clean.get(clean, clean)
        sd[name] = _into_like(value, current.get(name), device)
    return model.load_state_dict(sd, strict=options.strict and not options.ignore_frozen_params, assign=assign)


def set_optimizer_state_dict(model: Module, optimizers, optim_state_dict: dict, *,
                             options: StateDictOptions | None = None) -> None:
    """Load a name-keyed optimizer state dict into each optimizer (its params matched by name)."""
    options = _options(options)
    names = _parameter_names(model)
    if options.broadcast_from_rank0:
        optim_state_dict = _from_rank0(optim_state_dict, _full_load_device(list(model.parameters()))[0])
    saved_groups = optim_state_dict["param_groups"]
    for optim in _optimizers(optimizers):
        _init_optim_state(optim)
        index, state, groups = 0, {}, []
        for group in optim.param_groups:
            fqns = [names[id(p)] for p in group["params"]]
            match = next((g for g in saved_groups if fqns and fqns[0] in g["params"]), None)
            if match is None:
                raise ValueError(f"set_optimizer_state_dict: no saved param group holds parameter '{fqns[0]}'")
            packed = {k: v for k, v in match.items() if k != "params"}
            packed["params"] = list(range(index, index + len(fqns)))
            for i, (fqn, p) in enumerate(zip(fqns, group["params"]), index):
                if fqn in optim_state_dict["state"]:
                    have = optim.state.get(p, {})
                    state[i] = {k: _into_like(v, have.get(k)) for k, v in optim_state_dict["state"][fqn].items()}
            index += len(fqns)
            groups.append(packed)
        with no_grad():
            optim.load_state_dict({"state": state, "param_groups": groups})


def set_state_dict(model: Module, optimizers, *, model_state_dict: dict, optim_state_dict: dict,
                   options: StateDictOptions | None = None):
    """Load both; returns the model's load_state_dict result."""
    result = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result


__all__ = ["StateDictOptions", "get_state_dict", "get_model_state_dict", "get_optimizer_state_dict",
           "set_state_dict", "set_model_state_dict", "set_optimizer_state_dict"]
