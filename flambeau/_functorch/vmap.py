"""`flambeau.func.vmap`: map a function over a dimension of its inputs (PyTorch's `torch.func.vmap`:
`in_dims`/`out_dims` as nested pytrees, `randomness`, `chunk_size`, its argument checks and messages).

The function runs once, on `BatchedTensor`s (`batched.py`), under a new vmap level; the results'
batch dimensions are moved to `out_dims`. With `chunk_size` the batch is split and each chunk runs
the function once; the results are concatenated. An outermost vmap call allocates its arrays from
flambeau's caching allocator (`config.vmap_cache_allocator`).
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from .. import _dispatch
from .._backends import cpu_allocator
from .._tensor import Tensor
from ..utils._pytree import tree_flatten, tree_unflatten
from .._ops.shape import cat
from . import batched as _batched
from . import config


def _fname(func) -> str:
    return getattr(func, "__name__", repr(func))


def _broadcast(dims, tree, what: str, err) -> list:
    """`dims` (a prefix of `tree`'s structure, or one int/None for everything) as one entry per leaf."""
    if dims is None or isinstance(dims, int):
        return [dims] * len(tree_flatten(tree)[0])
    if isinstance(dims, (tuple, list)) and isinstance(tree, (tuple, list)) and len(dims) == len(tree):
        return [d for sub_d, sub_t in zip(dims, tree) for d in _broadcast(sub_d, sub_t, what, err)]
    if isinstance(dims, dict) and isinstance(tree, dict) and set(dims) == set(tree):
        return [d for k in tree for d in _broadcast(dims[k], tree[k], what, err)]
    raise err()


def vmap(func: Callable, in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable:
    """`func` mapped over dimension `in_dims` of its inputs; outputs batched along `out_dims`."""
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")
    if not isinstance(in_dims, (int, tuple)) and in_dims is not None:
        raise ValueError(f"vmap({_fname(func)}, in_dims={in_dims}, ...): expected `in_dims` to be int or a (potentially "
                         f"nested) tuple matching the structure of inputs, got: {type(in_dims)}.")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        name = _fname(func)
        if isinstance(in_dims, tuple) and len(in_dims) != len(args):
            raise ValueError(f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible with the "
                             f"structure of `inputs`. in_dims has structure {tree_flatten(in_dims)[1]} but inputs "
                             f"has structure {tree_flatten(args)[1]}.")
        flat, spec = tree_flatten(args)
        dims = _broadcast(in_dims, args, "in_dims", lambda: ValueError(
            f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible with the structure of "
            f"`inputs`. in_dims has structure {tree_flatten(in_dims)[1]} but inputs has structure {spec}."))
        size = None
        sizes = []
        for x, d in zip(flat, dims):
            if d is None:
                continue
            if not isinstance(d, int):
                raise ValueError(f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims must be int or None, "
                                 f"got {type(d)}")
            if not isinstance(x, Tensor):
                raise ValueError(f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for an input but "
                                 f"the input is of type {type(x)}. We cannot vmap over non-Tensor arguments, please "
                                 "use None as the respective in_dim")
            n = x.dim()
            if not -n <= d < n:
                raise ValueError(f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for some input, but "
                                 f"that input is a Tensor of dimensionality {n} so expected in_dim to satisfy "
                                 f"-{n} <= in_dim < {n}.")
            sizes.append(x.shape[d])
        if not sizes:
            raise ValueError(f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): at least one input must be a Tensor "
                             "with a non-None in_dim" if flat else "vmap: Expected at least one Tensor to vmap over")
        if len(set(sizes)) != 1:
            raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                             f"{sizes} for the mapped dimension")
        size = sizes[0]
        dims = [d % x.dim() if d is not None else None for x, d in zip(flat, dims)]
        memory = _cached_memory()
        try:
            if chunk_size is None or chunk_size >= size:
                return _run(func, flat, dims, spec, kwargs, size, out_dims, randomness, name)
            parts = []
            for start in range(0, size, chunk_size):
                stop = min(start + chunk_size, size)
                chunk = [x.narrow(d, start, stop - start) if d is not None else x for x, d in zip(flat, dims)]
                parts.append(_run(func, chunk, dims, spec, kwargs, stop - start, out_dims, randomness, name))
            return _concat(parts, out_dims, name)
        finally:
            _restore_memory(memory)
    wrapped._flambeau_dynamo_disable = True
    return wrapped


class _KernelRunnerUsers:
    """The outermost vmap calls running in any thread (vmap levels are per thread): the first one to
    start installs the caching allocator's kernel runner, the last one to end puts back the runner it
    replaced, in whatever order the threads' calls end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.replaced = None

    def enter(self, runner) -> None:
        with self.lock:
            if self.count == 0:
                self.replaced = _dispatch.use_kernel_runner(runner)
            self.count += 1

    def exit(self) -> None:
        with self.lock:
            self.count -= 1
            if self.count == 0:
                _dispatch.use_kernel_runner(self.replaced)
                self.replaced = None


_runner_users = _KernelRunnerUsers()


def _cached_memory():
    """For an outermost vmap call (config.vmap_cache_allocator): NumPy arrays made in this context and by
    eager kernels come from flambeau's caching allocator; returns what `_restore_memory` puts back."""
    if not config.vmap_cache_allocator or _batched.depth():
        return None
    runner = cpu_allocator.kernel_runner()
    if runner is None:
        return None
    _runner_users.enter(runner)
    return cpu_allocator.using_cache()


def _restore_memory(token) -> None:
    if token is not None:
        _runner_users.exit()
        cpu_allocator.restore(token)


def _run(func, flat, dims, spec, kwargs, size, out_dims, randomness, name):
    mode = _batched.push_level(size, randomness)
    try:
        inputs = [_batched.make(x, d, mode.level) if d is not None else x for x, d in zip(flat, dims)]
        out = func(*tree_unflatten(inputs, spec), **kwargs)
    finally:
        _batched.pop_level(mode)
    flat_out, out_spec = tree_flatten(out)
    o_dims = _broadcast(out_dims, out, "out_dims", lambda: ValueError(
        f"vmap({name}, ..., out_dims={out_dims})(<inputs>): out_dims is not compatible with the structure of "
        f"`outputs`. out_dims has structure {tree_flatten(out_dims)[1]} but outputs has structure {out_spec}."))
    res = []
    for o, d in zip(flat_out, o_dims):
        if d is None:
            if _batched.level_of(o) == mode.level:
                raise ValueError(f"vmap({name}, ..., out_dims=None)(<inputs>): Cannot return a BatchedTensor when "
                                 "out_dim is None")
            res.append(o)
            continue
        if not isinstance(o, Tensor):
            raise ValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got type {type(o)}. Did you mean "
                             "to set out_dims= to None for output?")
        n = o.dim() + 1
        if not -n <= d < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
        if _batched.level_of(o) == mode.level:
            v = o._value
            res.append(v.movedim(o._bdim, d % n) if o._bdim != d % n else v)
        else:
            res.append(o.unsqueeze(d % n).expand(*(size if i == d % n else s
                                                   for i, s in enumerate(o.unsqueeze(d % n).shape))))
    return tree_unflatten(res, out_spec)


def _concat(parts, out_dims, name):
    flat0, spec = tree_flatten(parts[0])
    o_dims = _broadcast(out_dims, parts[0], "out_dims", lambda: ValueError(f"vmap({name}): out_dims mismatch"))
    columns = [tree_flatten(p)[0] for p in parts]
    res = []
    for k, d in enumerate(o_dims):
        items = [c[k] for c in columns]
        res.append(items[0] if d is None else cat(items, d))
    return tree_unflatten(res, spec)


__all__ = ["vmap"]
