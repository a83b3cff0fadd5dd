"""Tensor-parallel styles: how one module's parameters and its inputs/outputs are laid out over a 1-D
mesh (PyTorch's `torch.distributed.tensor.parallel.style`).

`ColwiseParallel`: Linear weight rows (output features) sharded, `Shard(0)` (Embedding: its columns,
`Shard(1)`); the input replicated, the output sharded on its last dimension. `RowwiseParallel`:
Linear weight columns sharded, `Shard(1)`, bias replicated (Embedding: rows, `Shard(0)`, vocabulary
parallel); the input sharded on its last dimension (Embedding: replicated), the output a Partial sum
reduced to `output_layouts` (Replicate: an all-reduce; Shard(1): a reduce-scatter, sequence parallel).
`SequenceParallel`: parameters replicated (LayerNorm, RMSNorm, Dropout), activations sharded on the
sequence dimension. `input_layouts` say how the incoming plain tensors are laid out, `output_layouts`
what the output becomes, and `use_local_output` whether the module returns the local tensor.
"""
from __future__ import annotations

from .... import nn
from ....nn.parameter import Parameter
from .._api import DTensor, distribute_tensor
from ..placement_types import Replicate, Shard

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
           "PrepareModuleOutput"]


class ParallelStyle:
    """A way to parallelize one module: `_apply(module, device_mesh)` shards it and installs hooks."""

    def _apply(self, module, device_mesh):
        raise NotImplementedError


def _shard_parameters(module, mesh, layouts: dict) -> None:
    for name, placement in layouts.items():
        p = getattr(module, name, None)
        if p is None or isinstance(p, DTensor):
            continue
        module.register_parameter(name, Parameter(distribute_tensor(p.detach(), mesh, [placement]),
                                                  p.requires_grad))


def _to_dtensor(x, mesh, layout, desired):
    """An incoming activation as a DTensor laid out as `desired` (plain tensors are taken as `layout`)."""
    if not isinstance(x, DTensor):
        if not hasattr(x, "dim"):
            return x
        x = DTensor.from_local(x, mesh, [layout], run_check=False)
    if desired is not None and x.placements != (desired,):
        x = x.redistribute(mesh, [desired])
    return x


def _from_dtensor(x, mesh, layout, use_local: bool):
    if not isinstance(x, DTensor):
        return x
    if x.placements != (layout,):
        x = x.redistribute(mesh, [layout])
    return x.to_local() if use_local else x


def _install(module, mesh, input_layout, desired_input, output_layout, use_local: bool) -> None:
    def shard_input(mod, args):
        if not args:
            return None
        return (_to_dtensor(args[0], mesh, input_layout, desired_input),) + tuple(args[1:])

    def shard_output(mod, args, output):
        return _from_dtensor(output, mesh, output_layout, use_local)
    module.register_forward_pre_hook(shard_input)
    module.register_forward_hook(shard_output)


class ColwiseParallel(ParallelStyle):
    """Output features sharded (see module docstring)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True) -> None:
        self.input_layout = input_layouts or Replicate()
        self.output_layout = output_layouts or Shard(-1)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        if isinstance(module, nn.Linear):
            _shard_parameters(module, device_mesh, {"weight": Shard(0), "bias": Shard(0)})
        elif isinstance(module, nn.Embedding):
            _shard_parameters(module, device_mesh, {"weight": Shard(1)})
        else:
            raise NotImplementedError(f"ColwiseParallel supports nn.Linear and nn.Embedding, got {type(module).__name__}")
        _install(module, device_mesh, self.input_layout, Replicate(), self.output_layout, self.use_local_output)
        return module


class RowwiseParallel(ParallelStyle):
    """Input features sharded, the output reduced (see module docstring)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True) -> None:
        self.input_layout = input_layouts or Shard(-1)
        self.output_layout = output_layouts or Replicate()
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        if isinstance(module, nn.Linear):
            _shard_parameters(module, device_mesh, {"weight": Shard(1), "bias": Replicate()})
            desired = Shard(-1)
        elif isinstance(module, nn.Embedding):
            _shard_parameters(module, device_mesh, {"weight": Shard(0)})
            desired = Replicate()
        else:
            raise NotImplementedError(f"RowwiseParallel supports nn.Linear and nn.Embedding, got {type(module).__name__}")
        _install(module, device_mesh, self.input_layout, desired, self.output_layout, self.use_local_output)
        return module


class SequenceParallel(ParallelStyle):
    """Replicated parameters, activations sharded on `sequence_dim` (see module docstring)."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _shard_parameters(module, device_mesh, {n: Replicate() for n, _ in module.named_parameters(recurse=False)})
        layout = Shard(self.sequence_dim)
        _install(module, device_mesh, layout, layout, layout, self.use_local_output)
        return module


class PrepareModuleInput(ParallelStyle):
    """Lay out a module's positional inputs: `input_layouts[i]` (how they come) -> `desired_input_layouts[i]`."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, use_local_output: bool = False) -> None:
        self.input_layouts = _as_tuple(input_layouts)
        self.desired = _as_tuple(desired_input_layouts)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        def prepare_input(mod, args):
            out = []
            for x, have, want in zip(args, self.input_layouts + (None,) * len(args), self.desired + (None,) * len(args)):
                if have is None:
                    out.append(x)
                    continue
                x = _to_dtensor(x, device_mesh, have, want)
                out.append(x.to_local() if self.use_local_output else x)
            return tuple(out)
        module.register_forward_pre_hook(prepare_input)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lay out a module's output: `output_layouts` (how it comes) -> `desired_output_layouts`."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True) -> None:
        self.output_layout = _as_tuple(output_layouts)[0]
        self.desired = _as_tuple(desired_output_layouts)[0]
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        def prepare_output(mod, args, output):
            x = _to_dtensor(output, device_mesh, self.output_layout, self.desired)
            return x.to_local() if self.use_local_output and isinstance(x, DTensor) else x
        module.register_forward_hook(prepare_output)
        return module


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)
