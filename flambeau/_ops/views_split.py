"""Multi-output views (split_with_sizes, unbind) and their composites (split, chunk, tensor_split,
hsplit/vsplit/dsplit), and dimension shuffles built on views (flatten, unflatten, movedim, swapaxes, t).

Outputs share memory with the input; the dispatcher marks each as a view of the input's base.
"""
from __future__ import annotations

import math

from .._backends import cudnn_attention
from .._dtype import INTEGER
from .._tensor import Tensor
from ._registry import defop, export, TensorSpec
from ._helpers import direct_device, wrap_dim
from .views import _sel, take_view, _view, _permute, reshape, transpose, infer_size, slice_
from .shape import cat, stack
from . import _batching, _sharding


# ---- multi-output views: split_with_sizes, unbind and their composites ----------------------------
def _grads_tuple(grad):
    return grad if isinstance(grad, tuple) else (grad,)


@defop("split_with_sizes(Tensor(a) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]", method=True)
def split_with_sizes(xp, self, split_sizes, dim=0):
    d = _check_split(self.shape, split_sizes, dim)
    out, start = [], 0
    for s in split_sizes:
        out.append(self[_sel(d, slice(start, start + s))])
        start += s
    return tuple(out)


def _check_split(shape, sizes, dim):
    if not len(shape):
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    d = wrap_dim(dim, len(shape))
    if any(s < 0 for s in sizes) or sum(sizes) != shape[d]:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {shape[d]} (input tensor's "
                           f"size at dimension {d}), but got split_sizes={list(sizes)}")
    return d


@split_with_sizes.def_meta
def _(self, split_sizes, dim=0):
    d = _check_split(self.shape, split_sizes, dim)
    out, start, st = [], 0, self.stride()
    for s in split_sizes:
        shape = list(self.shape)
        shape[d] = s
        out.append(TensorSpec(shape, self.dtype, st, self.storage_offset() + start * st[d]))
        start += s
    return tuple(out)


@split_with_sizes.def_derivative
def _(grad, dim):
    grads = _grads_tuple(grad)
    dev = direct_device(*grads)
    if dev is not None and dev.type == "cuda" and all(g is not None for g in grads):
        # the pieces of one new buffer in order (cuDNN attention's gradients of GPT-2's split qkv): the
        # buffer is their concatenation, no copy (`cudnn_attention.claim_joined` checks it)
        joined = cudnn_attention.claim_joined([g._data for g in grads], wrap_dim(dim, grads[0].ndim))
        if joined is not None:
            return Tensor._make(joined, dev)
    return cat(list(grads), dim)


@defop("unbind.int(Tensor(a) self, int dim=0) -> Tensor(a)[]", method=True)
def unbind(xp, self, dim=0):
    if self.ndim == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, self.ndim)
    if d == 0:
        return tuple([self[i, ...] for i in range(self.shape[0])])     # take_view along dim 0, inlined
    return tuple([take_view(xp, self, d, i) for i in range(self.shape[d])])


@unbind.def_meta
def _(self, dim=0):
    if self.ndim == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, self.ndim)
    st = self.stride()
    return tuple(TensorSpec(self.shape[:d] + self.shape[d + 1:], self.dtype, st[:d] + st[d + 1:],
                            self.storage_offset() + i * st[d]) for i in range(self.shape[d]))


@unbind.def_derivative
def _(grad, dim):
    return stack(list(_grads_tuple(grad)), dim)


@export("split", method=True)
def split(self, split_size_or_sections, dim=0):
    if isinstance(split_size_or_sections, (list, tuple)):
        return split_with_sizes(self, list(split_size_or_sections), dim)
    s = int(split_size_or_sections)
    if self.ndim == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    size = self.shape[wrap_dim(dim, self.ndim)]
    if s <= 0 and not (s == 0 and size == 0):
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {size}")
    sizes = [s] * (size // s) + ([size % s] if size % s else []) if s and size else [0]
    return split_with_sizes(self, sizes, dim)


@export("chunk", method=True)
def chunk(self, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    if self.ndim == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    size = self.shape[wrap_dim(dim, self.ndim)]
    each = (size + chunks - 1) // chunks
    if each == 0:
        return split_with_sizes(self, [0] * chunks if size == 0 else [1] * size, dim)
    return split(self, each, dim)


@export("tensor_split", method=True)
def tensor_split(self, indices_or_sections, dim=0):
    if self.ndim == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
    d = wrap_dim(dim, self.ndim)
    size = self.shape[d]
    ios = indices_or_sections
    if isinstance(ios, Tensor):
        if ios.dtype.category != INTEGER or ios.ndim > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to have a long dtype and be "
                               "0-D or 1-D")
        ios = ios.tolist()
    if isinstance(ios, int):
        if ios <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {ios}")
        q, r = divmod(size, ios)
        return split_with_sizes(self, [q + 1] * r + [q] * (ios - r), d)
    bounds, prev = [], 0
    for i in list(ios) + [size]:
        i = min(max(i + size if i < 0 else i, 0), size)
        bounds.append((prev, max(i, prev)))
        prev = max(i, prev)
    return tuple(slice_(self, d, a, b) for a, b in bounds)


def _nsplit(name, min_dim, dim_of):
    def f(self, indices_or_sections):
        if self.ndim < min_dim:
            raise RuntimeError(f"torch.{name} requires a tensor with at least {min_dim} dimension, but got a "
                               f"tensor with {self.ndim} dimensions!")
        d = dim_of(self)
        if isinstance(indices_or_sections, int) and (indices_or_sections <= 0 or
                                                     self.shape[d] % indices_or_sections):
            raise RuntimeError(f"torch.{name} attempted to split along dimension {d}, but the size of the "
                               f"dimension {self.shape[d]} is not divisible by the split_size "
                               f"{indices_or_sections}!")
        return tensor_split(self, indices_or_sections, d)
    f.__name__ = name
    return f


export("hsplit", method=True)(_nsplit("hsplit", 1, lambda t: 1 if t.ndim > 1 else 0))
export("vsplit", method=True)(_nsplit("vsplit", 2, lambda t: 0))
export("dsplit", method=True)(_nsplit("dsplit", 3, lambda t: 2))


# ---- dimension shuffles that are composites of the views above -----------------------------------
@export("flatten", method=True)
def flatten(self, start_dim=0, end_dim=-1):
    n = self.ndim
    if n == 0:
        return reshape(self, (1,))
    s, e = wrap_dim(start_dim, n), wrap_dim(end_dim, n)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if s == e:
        return self
    shape = self.shape
    return reshape(self, tuple(shape[:s]) + (-1 if self.numel() == 0 and 0 not in shape[s:e + 1] else
                                            math.prod(shape[s:e + 1]),) + tuple(shape[e + 1:]))


@export("unflatten", method=True)
def unflatten(self, dim, sizes):
    d = wrap_dim(dim, self.ndim)
    sizes = tuple(sizes)
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    try:
        new = infer_size(sizes, self.shape[d])
    except RuntimeError:
        raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim "
                           f"{dim} ({self.shape[d]}) in the input tensor") from None
    return _view(self, tuple(self.shape[:d]) + new + tuple(self.shape[d + 1:]))


@export("movedim", method=True)
def movedim(self, source, destination):
    n = self.ndim
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
                           f"contain the same number of dims as destination ({list(dst)} dims)")
    src = tuple(wrap_dim(d, n) for d in src)
    dst = tuple(wrap_dim(d, n) for d in dst)
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise RuntimeError("movedim: repeated dim in `source` or `destination`")
    if n == 0:
        return _view(self, ())
    order = [-1] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(i for i in range(n) if i not in src)
    order = [o if o != -1 else next(rest) for o in order]
    return _permute(self, order) if n else self


export("moveaxis", method=True)(movedim)


@export("swapaxes", method=True)
def swapaxes(self, axis0, axis1):
    return transpose(self, axis0, axis1)


@export("swapdims", method=True)
def swapdims(self, dim0, dim1):
    return transpose(self, dim0, dim1)


@export("t", method=True)
def t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return transpose(self, 0, 1) if self.ndim == 2 else self


# ---- vmap batching rules ----------------------------------------------------------------------------
split_with_sizes.def_batching_rule(_batching.dim_rule(split_with_sizes, "dim"))
unbind.def_batching_rule(_batching.dim_rule(unbind, "dim"))


# ---- DTensor sharding rule --------------------------------------------------------------------------
split_with_sizes.def_sharding_rule(_sharding.split_rule)
