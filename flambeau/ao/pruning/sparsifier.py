"""Sparsifiers: masks on module weights, updated by `step()` and folded in by `squash_mask()`.

`prepare(model, config)` parametrizes each configured weight as PyTorch does: the parameter moves to
`module.parametrizations.<name>.original`, `module.<name>` becomes `original * mask` (a property of a
per-module subclass, so forward sees the masked weight and `original` gets the masked gradient), and
`module.parametrizations.<name>[0]` is the `FakeSparsity` holding the mask. `WeightNormSparsifier`
computes masks as torch.ao.pruning's: the `sparsity_level` fraction of `sparse_block_shape` blocks with
the smallest mean norm are sparsified, `zeros_per_block` smallest elements in each (2:4 is
`sparse_block_shape=(1, 4), zeros_per_block=2`); masks are computed with NumPy on the host.
"""
from __future__ import annotations

import math

import numpy as np

from ... import _dtype as D
from ..._ops.creation import ones, tensor as _tensor
from ...nn.modules.container import ModuleDict, ModuleList
from ...nn.modules.module import Module
from ...nn.parameter import Parameter

_PARAMETRIZED = "_pruning_parametrized"        # marks the per-module subclass prepare() makes


class FakeSparsity(Module):
    """The parametrization: weight -> weight * mask (the mask a buffer)."""

    def __init__(self, mask) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.mask * x


class _ParametrizationList(ModuleList):
    """`module.parametrizations.<name>`: the parametrizations, and the `original` parameter."""


def _masked_property(name: str) -> property:
    def get(module):
        plist = module.parametrizations[name]
        x = plist.original
        for p in plist:
            x = p(x)
        return x
    return property(get)


def _parametrize(module: Module, name: str, fake: FakeSparsity) -> None:
    original = getattr(module, name)
    if not hasattr(module, "parametrizations"):
        module.parametrizations = ModuleDict()
        cls = module.__class__
        module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), {_PARAMETRIZED: cls})
    del module._parameters[name]
    plist = _ParametrizationList([fake])
    plist.original = original if isinstance(original, Parameter) else Parameter(original)
    module.parametrizations[name] = plist
    setattr(module.__class__, name, _masked_property(name))


def _squash(module: Module, name: str) -> None:
    with_mask = getattr(module, name).detach()
    delattr(module.__class__, name)
    del module.parametrizations[name]
    if len(module.parametrizations) == 0:
        del module.parametrizations
        module.__class__ = getattr(module.__class__, _PARAMETRIZED)
    module.register_parameter(name, Parameter(with_mask))


def _resolve(model: Module, fqn: str) -> tuple:
    path, _, name = fqn.rpartition(".")
    module = model.get_submodule(path) if path else model
    return module, name


class BaseSparsifier:
    """prepare / step / squash_mask over `groups` (one dict per configured tensor: its module, tensor
    name, fqn, and the sparsifier's defaults overridden by the config entry)."""

    def __init__(self, defaults: dict | None = None) -> None:
        self.defaults = dict(defaults or {})
        self.groups: list = []
        self.enable_mask_update = True
        self.model = None

    def prepare(self, model: Module, config: list | None) -> None:
        self.model = model
        if config is None:
            config = [{"tensor_fqn": f"{n}.weight" if n else "weight"} for n, m in model.named_modules()
                      if type(m).__name__ in ("Linear", "Conv2d") and not list(m.children())]
        for entry in config:
            entry = {"tensor_fqn": entry} if isinstance(entry, str) else dict(entry)
            if "tensor_fqn" not in entry:
                raise ValueError("prepare: each config entry needs a 'tensor_fqn' (e.g. 'linear1.weight')")
            module, name = _resolve(model, entry["tensor_fqn"])
            group = dict(self.defaults, **entry, module=module, tensor_name=name)
            weight = getattr(module, name)
            _parametrize(module, name, FakeSparsity(ones(tuple(weight.shape), dtype=D.bool, device=weight.device)))
            self.groups.append(group)

    def step(self, use_path: bool = True) -> None:
        if not self.enable_mask_update:
            return
        for g in self.groups:
            self.update_mask(**g)

    def update_mask(self, module: Module, tensor_name: str, **kwargs) -> None:
        raise NotImplementedError

    def squash_mask(self, params_to_keep=None, params_to_keep_per_layer=None, *args, **kwargs) -> None:
        for g in self.groups:
            _squash(g["module"], g["tensor_name"])
        self.groups = []


def _tensor_mask(data: np.ndarray, level: float, block: tuple) -> np.ndarray:
    """1 where kept: the `level` fraction of blocks with the smallest mean (ceil-mode pooling) are 0."""
    h, w = data.shape
    bh, bw = block
    if level >= 1.0:
        return np.zeros((h, w), bool)
    if level <= 0.0:
        return np.ones((h, w), bool)
    nbh, nbw = math.ceil(h / bh), math.ceil(w / bw)
    padded = np.zeros((nbh * bh, nbw * bw))
    counts = np.zeros_like(padded)
    padded[:h, :w], counts[:h, :w] = data, 1
    means = padded.reshape(nbh, bh, nbw, bw).sum((1, 3)) / counts.reshape(nbh, bh, nbw, bw).sum((1, 3))
    k = max(0, min(nbh * nbw - 1, round(level * nbh * nbw)))
    chosen = np.zeros(nbh * nbw, bool)
    chosen[np.argsort(means.reshape(-1), kind="stable")[:k]] = True
    mask = ~np.repeat(np.repeat(chosen.reshape(nbh, nbw), bh, 0), bw, 1)
    return mask[:h, :w]


def _block_mask(data: np.ndarray, block: tuple, zeros_per_block: int) -> np.ndarray:
    """1 where kept: in every block its `zeros_per_block` smallest elements are 0."""
    h, w = data.shape
    bh, bw = block
    nbh, nbw = math.ceil(h / bh), math.ceil(w / bw)
    padded = np.full((nbh * bh, nbw * bw), np.inf)          # padding is never among the smallest
    padded[:h, :w] = data
    blocks = padded.reshape(nbh, bh, nbw, bw).transpose(0, 2, 1, 3).reshape(nbh, nbw, bh * bw)
    order = np.argsort(blocks, axis=-1, kind="stable")[..., :zeros_per_block]
    keep = np.ones(blocks.shape, bool)
    np.put_along_axis(keep, order, False, axis=-1)
    keep = keep.reshape(nbh, nbw, bh, bw).transpose(0, 2, 1, 3).reshape(nbh * bh, nbw * bw)
    return keep[:h, :w]


def _abs(t):
    return t.abs()


def _square(t):
    return t * t


class WeightNormSparsifier(BaseSparsifier):
    """`torch.ao.pruning.WeightNormSparsifier` (see module docstring); `norm` 1 (|w|), 2 (w*w) or a callable."""

    def __init__(self, sparsity_level: float = 0.5, sparse_block_shape: tuple = (1, 4),
                 zeros_per_block: int | None = None, norm=None) -> None:
        if zeros_per_block is None:
            zeros_per_block = int(np.prod(sparse_block_shape))
        norm = 2 if norm is None else norm
        if callable(norm):
            self.norm_fn = norm                       # called on the weight tensor, as in PyTorch
        elif norm in (1, 2):
            self.norm_fn = _abs if norm == 1 else _square
        else:
            raise NotImplementedError(f"L-{norm} is not yet implemented.")
        super().__init__({"sparsity_level": sparsity_level, "sparse_block_shape": tuple(sparse_block_shape),
                          "zeros_per_block": zeros_per_block})

    def update_mask(self, module: Module, tensor_name: str, sparsity_level: float, sparse_block_shape: tuple,
                    zeros_per_block: int, **kwargs) -> None:
        per_block = int(np.prod(sparse_block_shape))
        if zeros_per_block > per_block:
            raise ValueError("Number of zeros per block cannot be more than the total number of elements in that block.")
        if zeros_per_block < 0:
            raise ValueError("Number of zeros per block should be positive.")
        fake = module.parametrizations[tensor_name][0]
        weight = getattr(module, tensor_name).detach()
        if sparsity_level <= 0 or zeros_per_block == 0:
            keep = np.ones(tuple(weight.shape), bool)
        elif sparsity_level >= 1.0 and zeros_per_block == per_block:
            keep = np.zeros(tuple(weight.shape), bool)
        else:
            data = self.norm_fn(weight).cpu().to(D.float64).numpy()
            keep = _tensor_mask(data, sparsity_level, tuple(sparse_block_shape))
            if per_block != zeros_per_block:
                keep = keep | _block_mask(data, tuple(sparse_block_shape), zeros_per_block)
        fake.mask = _tensor(keep).to(fake.mask.device)
