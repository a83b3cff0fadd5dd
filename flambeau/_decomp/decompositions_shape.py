"""Decompositions of view/shape ops (transpose, diagonal, unfold, split, unbind), data movement
(flip, roll, tril/triu, repeat, padding, masked/index variants, take/put, fill, embedding), small
factories (eye) and the random distributions (expressed through the core generators `rand`,
`randn` and `randint`).
"""
from __future__ import annotations

import math
import numpy as np

from .. import _dtype as D, _state
from ._table import aten, register_decomposition, maximum, to, compute_dtype, full, scalar_tensor, reshape, wrap
from .._ops._helpers import broadcast_shapes


# ---- views ---------------------------------------------------------------------------------------
@register_decomposition(aten.alias)
def alias(self):
    return aten.view(self, tuple(self.shape))


@register_decomposition(aten.transpose.int)
def transpose(self, dim0, dim1):
    n = self.ndim
    if n == 0:
        return aten.view(self, ()) if dim0 in (0, -1) and dim1 in (0, -1) else NotImplemented
    d0, d1 = wrap(dim0, n), wrap(dim1, n)
    perm = list(range(n))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return aten.permute(self, perm)


@register_decomposition(aten.diagonal)
def diagonal(self, offset=0, dim1=0, dim2=1):
    n = self.ndim
    if n < 2:
        return NotImplemented
    d1, d2 = wrap(dim1, n), wrap(dim2, n)
    if d1 == d2:
        return NotImplemented
    shape, strides = tuple(self.shape), self.stride()
    if offset >= 0:
        size = max(min(shape[d1], shape[d2] - offset), 0)
        start = offset * strides[d2]
    else:
        size = max(min(shape[d1] + offset, shape[d2]), 0)
        start = -offset * strides[d1]
    keep = [i for i in range(n) if i not in (d1, d2)]
    new_shape = [shape[i] for i in keep] + [size]
    new_strides = [strides[i] for i in keep] + [strides[d1] + strides[d2]]
    return aten.as_strided(self, new_shape, new_strides, self.storage_offset() + (start if size else 0))


@register_decomposition(aten.unfold)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return NotImplemented
    d = wrap(dimension, self.ndim)
    n = self.shape[d]
    if size > n or step <= 0:
        return NotImplemented
    shape, strides = list(self.shape), list(self.stride())
    shape[d] = (n - size) // step + 1
    st = strides[d]
    strides[d] = st * step
    return aten.as_strided(self, shape + [size], strides + [st], self.storage_offset())


@register_decomposition(aten.split_with_sizes)
def split_with_sizes(self, split_sizes, dim=0):
    d = wrap(dim, self.ndim)
    if sum(split_sizes) != self.shape[d]:
        return NotImplemented
    out, start = [], 0
    for s in split_sizes:
        out.append(aten.slice(self, d, start, start + s))
        start += s
    return out


@register_decomposition(aten.unbind.int)
def unbind(self, dim=0):
    d = wrap(dim, self.ndim)
    return tuple(aten.select(self, d, i) for i in range(self.shape[d]))


# ---- data movement ---------------------------------------------------------------------------------
def _along(x, d, index):
    """x indexed by the 1-D tensor `index` along dim d (advanced indexing on one dim)."""
    return aten.index(x, [None] * d + [index])


def _arange(n, like, dtype=D.int64):
    return aten.arange(0, n, 1, dtype=dtype, device=like.device)


@register_decomposition(aten.flip)
def flip(self, dims):
    dims = (dims,) if isinstance(dims, int) else dims       # x.flip(0): int[] given as one int
    out = self
    for d in sorted({wrap(d, self.ndim) for d in dims}) if self.ndim else []:
        n = self.shape[d]
        out = _along(out, d, aten.arange(n - 1, -1, -1, dtype=D.int64, device=self.device))
    return aten.clone(out) if out is self else out


@register_decomposition(aten.roll)
def roll(self, shifts, dims=()):
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not dims:
        if len(shifts) != 1:
            return NotImplemented
        return aten.view(roll(reshape(self, (-1,)), shifts, (0,)), tuple(self.shape))
    if len(shifts) != len(dims):
        return NotImplemented
    out = self
    for s, d in zip(shifts, dims):
        d = wrap(d, self.ndim)
        n = self.shape[d]
        if n == 0:
            continue
        s %= n
        if s:
            out = aten.cat([aten.slice(out, d, n - s, n), aten.slice(out, d, 0, n - s)], d)
    return aten.clone(out) if out is self else out


def _triangle(self, diagonal, lower):
    if self.ndim < 2:
        return NotImplemented
    h, w = self.shape[-2], self.shape[-1]
    diff = aten.sub(aten.unsqueeze(_arange(w, self), 0), aten.unsqueeze(_arange(h, self), 1))
    keep = aten.le(diff, diagonal) if lower else aten.ge(diff, diagonal)
    return aten.where(keep, self, scalar_tensor(0, self))


@register_decomposition(aten.tril)
def tril(self, diagonal=0):
    return _triangle(self, diagonal, True)


@register_decomposition(aten.triu)
def triu(self, diagonal=0):
    return _triangle(self, diagonal, False)


@register_decomposition(aten.repeat)
def repeat(self, repeats):
    repeats = tuple(repeats)
    if len(repeats) < self.ndim:
        return NotImplemented
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    inter, big, final = [], [], []
    for r, s in zip(repeats, shape):
        inter += [1, s]
        big += [r, s]
        final.append(r * s)
    x = aten.expand(reshape(self, tuple(inter)), big)
    return reshape(aten.clone(x), tuple(final))


@register_decomposition(aten.constant_pad_nd)
def constant_pad_nd(self, pad, value=0):
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        return NotImplemented
    out = self
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = out.shape[d]
        if lo < 0 or hi < 0:
            out = aten.slice(out, d, max(-lo, 0), n - max(-hi, 0))
        parts = []
        for p in (lo, hi):
            shape = list(out.shape)
            shape[d] = max(p, 0)
            parts.append(full(shape, value, self))
        out = aten.cat([parts[0], out, parts[1]], d)
    return aten.clone(out) if out is self else out


@register_decomposition(aten.diag_embed)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    nd = self.ndim + 1
    d1, d2 = wrap(dim1, nd), wrap(dim2, nd)
    if d1 == d2 or self.ndim == 0:
        return NotImplemented
    n = self.shape[-1] + abs(offset)
    lead = list(self.shape[:-1])
    shape = []
    for i in range(nd):
        shape.append(n if i in (d1, d2) else lead.pop(0))
    return aten.diagonal_scatter(full(shape, 0, self), self, offset, d1, d2)


@register_decomposition(aten.masked_fill.Scalar)
def masked_fill(self, mask, value):
    return aten.where(mask, scalar_tensor(value, self), self)


@register_decomposition(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    if value.ndim != 0:
        return NotImplemented
    return aten.where(mask, to(value, self.dtype), self)


@register_decomposition(aten.masked_scatter)
def masked_scatter(self, mask, source):
    shape = tuple(self.shape)
    if source.numel() == 0:
        return aten.clone(self)
    m = reshape(aten.clone(aten.expand(mask, shape)), (-1,))
    idx = maximum(aten.sub(aten.cumsum(to(m, D.int64), 0), 1), 0)
    picked = aten.index(reshape(source, (-1,)), [idx])
    return aten.view(aten.where(m, to(picked, self.dtype), reshape(self, (-1,))), shape)


def _dim_index(self, dim, index):
    if self.ndim == 0 or index.ndim > 1:
        return None, None
    return wrap(dim, self.ndim), reshape(index, (-1,))


@register_decomposition(aten.index_select)
def index_select(self, dim, index):
    d, idx = _dim_index(self, dim, index)
    return NotImplemented if d is None else _along(self, d, idx)


@register_decomposition(aten.index_add)
def index_add(self, dim, index, source, alpha=1):
    d, idx = _dim_index(self, dim, index)
    if d is None or source.ndim != self.ndim:
        return NotImplemented
    src = source if alpha == 1 else aten.mul(source, alpha)
    return aten.index_put(self, [None] * d + [idx], to(src, self.dtype), True)


@register_decomposition(aten.index_copy)
def index_copy(self, dim, index, source):
    d, idx = _dim_index(self, dim, index)
    if d is None or source.ndim != self.ndim:
        return NotImplemented
    return aten.index_put(self, [None] * d + [idx], source, False)


@register_decomposition(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    d, idx = _dim_index(self, dim, index)
    if d is None:
        return NotImplemented
    v = to(value, self.dtype) if hasattr(value, "dtype") else scalar_tensor(value, self)
    return aten.index_put(self, [None] * d + [idx], v, False)


@register_decomposition(aten.take)
def take(self, index):
    return aten.index(reshape(self, (-1,)), [index])


@register_decomposition(aten.put)
def put(self, index, source, accumulate=False):
    flat = reshape(self, (-1,))
    r = aten.index_put(flat, [reshape(index, (-1,))], reshape(source, (-1,)), accumulate)
    return aten.view(r, tuple(self.shape))


@register_decomposition(aten.scatter.value)
def scatter_value(self, dim, index, value):
    return aten.scatter(self, dim, index, full(index.shape, value, self))


_REDUCE = {"add": "sum", "multiply": "prod"}


@register_decomposition(aten.scatter.reduce)
def scatter_reduce_src(self, dim, index, src, reduce):
    if reduce not in _REDUCE:
        return NotImplemented
    return aten.scatter_reduce(self, dim, index, src, _REDUCE[reduce], include_self=True)


@register_decomposition(aten.scatter.value_reduce)
def scatter_value_reduce(self, dim, index, value, reduce):
    return scatter_reduce_src(self, dim, index, full(index.shape, value, self), reduce)


@register_decomposition(aten.fill.Scalar)
def fill(self, value):
    return full(self.shape, value, self)


@register_decomposition(aten.fill.Tensor)
def fill_tensor(self, value):
    if value.ndim != 0:
        return NotImplemented
    return aten.clone(aten.expand(to(value, self.dtype), tuple(self.shape)))


@register_decomposition(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.ndim != 2:
        return NotImplemented
    if (padding_idx >= 0 or scale_grad_by_freq) and weight.requires_grad and _state.tls.grad_enabled:
        return NotImplemented       # the gradient rule differs from indexing's; the op keeps its own
    return aten.index(weight, [indices])


@register_decomposition(aten.embedding_dense_backward)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad_output.shape[-1]
    idx = to(reshape(indices, (-1,)), D.int64)
    cd = compute_dtype(grad_output.dtype)
    g = reshape(to(grad_output, cd), (-1, dim))
    if scale_grad_by_freq:
        counts = aten.index_put(full((num_weights,), 0, g), [idx], full(idx.shape, 1, g), True)
        g = aten.div(g, aten.unsqueeze(aten.index(counts, [idx]), 1))
    if padding_idx >= 0:
        g = aten.mul(g, aten.unsqueeze(aten.ne(idx, padding_idx), 1))
    r = aten.index_put(full((num_weights, dim), 0, g), [idx], g, True)
    return to(r, grad_output.dtype)


@register_decomposition(aten.one_hot)
def one_hot(self, num_classes=-1):
    if num_classes < 0 or self.dtype is not D.int64:
        return NotImplemented
    return to(aten.eq(aten.unsqueeze(self, -1), _arange(num_classes, self)), D.int64)


@register_decomposition(aten.eye.m)
def eye(n, m, dtype=None, device=None):
    rows = aten.arange(0, n, 1, dtype=D.int64, device=device)
    cols = aten.arange(0, m, 1, dtype=D.int64, device=device)
    return to(aten.eq(aten.unsqueeze(rows, 1), aten.unsqueeze(cols, 0)), dtype or _state.default_dtype)


@register_decomposition(aten.linalg_cross)
def linalg_cross(self, other, dim=-1):
    if self.ndim != other.ndim:
        return NotImplemented
    shape = broadcast_shapes(tuple(self.shape), tuple(other.shape))
    d = wrap(dim, len(shape))
    if shape[d] != 3:
        return NotImplemented
    a, b = aten.expand(self, shape), aten.expand(other, shape)
    a1, a2, a3 = (aten.select(a, d, i) for i in range(3))
    b1, b2, b3 = (aten.select(b, d, i) for i in range(3))
    parts = [aten.sub(aten.mul(a2, b3), aten.mul(a3, b2)), aten.sub(aten.mul(a3, b1), aten.mul(a1, b3)),
             aten.sub(aten.mul(a1, b2), aten.mul(a2, b1))]
    return aten.cat([aten.unsqueeze(p, d) for p in parts], d)


# ---- random distributions ----------------------------------------------------------------------------
def _uniform(self):
    dt = compute_dtype(self.dtype) if self.dtype.category >= D.FLOATING else _state.default_dtype
    return aten.rand(tuple(self.shape), dtype=dt, device=self.device)


@register_decomposition(aten.bernoulli)
def bernoulli(self, generator=None):
    return to(aten.lt(_uniform(self), self), self.dtype)


@register_decomposition(aten.bernoulli.p)
def bernoulli_p(self, p, generator=None):
    return to(aten.lt(_uniform(self), p), self.dtype)


@register_decomposition(aten.bernoulli.Tensor)
def bernoulli_tensor(self, p, generator=None):
    return to(aten.lt(_uniform(self), p), self.dtype)


@register_decomposition(aten.uniform)
def uniform(self, from_=0, to_=1, generator=None):
    return to(aten.add(aten.mul(_uniform(self), to_ - from_), from_), self.dtype)


def _normal_like(self):
    return aten.randn(tuple(self.shape), dtype=compute_dtype(self.dtype), device=self.device)


@register_decomposition(aten.normal.self)
def normal_self(self, mean=0, std=1, generator=None):
    return to(aten.add(aten.mul(_normal_like(self), std), mean), self.dtype)


@register_decomposition(aten.normal.Tensor_Tensor)
def normal_tensor(mean, std, generator=None):
    shape = broadcast_shapes(tuple(mean.shape), tuple(std.shape))
    z = aten.randn(shape, dtype=compute_dtype(mean.dtype), device=mean.device)
    return to(aten.add(aten.mul(z, std), mean), mean.dtype)


@register_decomposition(aten.log_normal)
def log_normal(self, mean=1, std=2, generator=None):
    return to(aten.exp(aten.add(aten.mul(_normal_like(self), std), mean)), self.dtype)


@register_decomposition(aten.exponential)
def exponential(self, lambd=1, generator=None):
    return to(aten.div(aten.neg(aten.log1p(aten.neg(_uniform(self)))), lambd), self.dtype)


@register_decomposition(aten.cauchy)
def cauchy(self, median=0, sigma=1, generator=None):
    t = aten.tan(aten.mul(aten.sub(_uniform(self), 0.5), math.pi))
    return to(aten.add(aten.mul(t, sigma), median), self.dtype)


@register_decomposition(aten.geometric)
def geometric(self, p, generator=None):
    k = aten.ceil(aten.div(aten.log1p(aten.neg(_uniform(self))), math.log1p(-p)))
    return to(maximum(k, 1), self.dtype)


@register_decomposition(aten.random)
def random(self, from_=0, to_=None, generator=None):
    if to_ is None:
        dt = self.dtype
        if dt is D.bool:
            to_ = 2
        elif dt.category == D.FLOATING:
            to_ = 2 ** {D.float16: 11, D.bfloat16: 8, D.float32: 24}.get(dt, 53) + 1
        else:
            to_ = int(np.iinfo(dt.np).max) + 1
    return to(aten.randint(from_, to_, tuple(self.shape), dtype=D.int64, device=self.device), self.dtype)
