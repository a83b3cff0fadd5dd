"""Separable "taps" resampling, the engine under interpolate, avg/adaptive-avg pooling and the
reflect/replicate/circular pads, plus the plane gather/scatter pair under max pooling.

`_taps_gather(x, indices, weights)` maps each of x's trailing dims independently: along trailing
dim i, output position o is `sum_t x[indices[i][o, t]] * weights[i][o, t]` (a pure gather when
`weights` is empty). Every separable linear resampling is one such call, with small index/weight
tables built on the host by the caller. Its backward is the adjoint (a scatter-add, done with
`bincount`; on cuda with `cuda_index_kernels.scatter_add`, which needs no host read of the indices),
and the backward's derivative is the forward again, so higher orders come for free.

`_plane_gather(x, idx)` / `_plane_scatter_add(g, idx, size)` index each (n, c) plane by flat
position (as max pooling numbers its indices); they are each other's adjoints. On the CPU a float32
scatter-add is one C++ pass adding in ATen's order (`cpu_kernels.plane_scatter_add`).
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D
from .._backends import cpu_kernels, cuda_index_kernels
from ._registry import defop, TensorSpec, Tag
from ._helpers import opmath
from .memory_format import as_format, meta_strides, suggest_memory_format


def _check_tables(self_shape, indices, weights):
    n = len(indices)
    if n > len(self_shape):
        raise RuntimeError(f"_taps_gather: {n} index tables for a {len(self_shape)}-dimensional input")
    if weights and len(weights) != n:
        raise RuntimeError("_taps_gather: weights must be empty or one table per index table")
    return tuple(self_shape[:len(self_shape) - n]) + tuple(i.shape[0] for i in indices)


def _gather_axis(xp, x, idx, w, ax):
    if w is None:
        return xp.take(x, idx[:, 0], axis=ax)
    shp = (-1,) + (1,) * (x.ndim - ax - 1)
    r = None
    for t in range(idx.shape[1]):
        term = xp.take(x, idx[:, t], axis=ax) * w[:, t].reshape(shp)
        r = term if r is None else r + term
    return r


def _bincount(xp, flat, weights, length):
    """bincount(flat, weights, minlength=length) where every index is below `length`."""
    if getattr(xp, "__name__", "") == "cupy":
        return cuda_index_kernels.scatter_add(flat, weights, length)
    return xp.bincount(flat, weights=weights, minlength=length)


def _scatter_axis(xp, g, idx, w, ax, n):
    """Adjoint of `_gather_axis` along axis `ax` whose input length is n."""
    g = xp.moveaxis(g, ax, -1)
    lead = g.shape[:-1]
    R, O = math.prod(lead), g.shape[-1]
    g2 = g.reshape(R, O).astype(xp.float64)
    T = idx.shape[1]
    rows = (xp.arange(R, dtype=xp.int64) * n)[:, None, None]
    flat = rows + idx[None, :, :]
    vals = g2[:, :, None] * (w[None, :, :].astype(xp.float64) if w is not None else xp.ones((1, O, T)))
    r = _bincount(xp, flat.reshape(-1), vals.reshape(-1), R * n)
    return xp.moveaxis(r.reshape(lead + (n,)), -1, ax)


def _taps_format(x, n):
    """The memory format of a gather over x's last `n` dims (pooling, upsampling, padding), as PyTorch's
    CPU kernels: channels-last for 2-d ones of a 4-d channels-last input; 3-d ones stay contiguous."""
    return suggest_memory_format(x, (4,) if n == 2 else ())


@defop("_taps_gather(Tensor self, Tensor[] indices, Tensor[] weights) -> Tensor", function=False,
       tags=(Tag.core, Tag.extern))
def _taps_gather(xp, self, indices, weights):
    _check_tables(self.shape, indices, weights)
    dt = D.FROM_NP[self.dtype]
    x = self
    cd = opmath(dt) if weights else self.dtype
    x = x.astype(cd, copy=False)
    n = len(indices)
    for i in range(n):
        x = _gather_axis(xp, x, indices[i], weights[i].astype(cd, copy=False) if weights else None,
                         self.ndim - n + i)
    return as_format(xp, xp.ascontiguousarray(x).astype(self.dtype, copy=False), _taps_format(self, len(indices)))


@_taps_gather.def_meta
def _(self, indices, weights):
    shape = _check_tables(self.shape, indices, weights)
    return TensorSpec(shape, self.dtype, meta_strides(shape, _taps_format(self, len(indices))))


@_taps_gather.def_derivative
def _(grad, self_meta, indices, weights):
    return _taps_gather_backward(grad, indices, weights, tuple(self_meta.shape)), None, None


@defop("_taps_gather_backward(Tensor grad, Tensor[] indices, Tensor[] weights, SymInt[] self_size) -> Tensor",
       function=False, tags=(Tag.core, Tag.extern))
def _taps_gather_backward(xp, grad, indices, weights, self_size):
    n = len(indices)
    nd = len(self_size)
    g = grad
    for i in range(n):
        ax = nd - n + i
        g = _scatter_axis(xp, g, indices[i], weights[i] if weights else None, ax, self_size[ax])
    return as_format(xp, xp.ascontiguousarray(g).astype(grad.dtype, copy=False),
                     _taps_format(grad, len(indices)))


@_taps_gather_backward.def_meta
def _(grad, indices, weights, self_size):
    return TensorSpec(tuple(self_size), grad.dtype,
                      meta_strides(tuple(self_size), _taps_format(grad, len(indices))))


@_taps_gather_backward.def_derivative
def _(grad, indices, weights):
    return _taps_gather(grad, indices, weights), None, None


def _planes(shape, nplane):
    lead = tuple(shape[:len(shape) - nplane])
    return lead, math.prod(lead), math.prod(shape[len(shape) - nplane:])


@defop("_plane_gather(Tensor self, Tensor indices, int plane_dims) -> Tensor", function=False,
       tags=(Tag.core, Tag.extern))
def _plane_gather(xp, self, indices, plane_dims):
    lead, R, P = _planes(self.shape, plane_dims)
    idx = indices.reshape(R, -1) if R else indices.reshape(0, 0)
    r = xp.take_along_axis(self.reshape(R, P), idx, axis=1) if R else xp.empty(indices.shape, self.dtype)
    return as_format(xp, r.reshape(indices.shape), suggest_memory_format(self))


@_plane_gather.def_meta
def _(self, indices, plane_dims):
    return TensorSpec(tuple(indices.shape), self.dtype,
                      meta_strides(tuple(indices.shape), suggest_memory_format(self)))


@_plane_gather.def_derivative
def _(grad, self_meta, indices, plane_dims):
    return _plane_scatter_add(grad, indices, tuple(self_meta.shape), plane_dims), None


@defop("_plane_scatter_add(Tensor self, Tensor indices, SymInt[] size, int plane_dims, bool unique=False) -> Tensor",
       function=False, tags=(Tag.core, Tag.extern))
def _plane_scatter_add(xp, self, indices, size, plane_dims, unique=False):
    """`unique`: the caller knows no two indices of a plane are equal (max pooling whose windows do
    not overlap), so the sum is an indexed assignment; `+ 0` turns a -0.0 gradient into the +0.0
    that adding it to a zero gives (as ATen's `grad_input[index] += grad`). The result takes the
    memory format of `indices` (max pooling's are in its input's format)."""
    return as_format(xp, _plane_scatter_add_planes(xp, self, indices, size, plane_dims, unique),
                     suggest_memory_format(indices))


def _plane_scatter_add_planes(xp, self, indices, size, plane_dims, unique):
    lead, R, P = _planes(tuple(size), plane_dims)
    if R == 0 or self.size == 0:
        return xp.zeros(tuple(size), self.dtype)
    if xp is np:
        r = cpu_kernels.plane_scatter_add(self, indices, R, P)
        if r is not None:
            return r.reshape(tuple(size))
    idx = indices.reshape(R, -1)
    flat = (xp.arange(R, dtype=xp.int64) * P)[:, None] + idx
    if unique:
        r = xp.zeros(R * P, self.dtype)
        r[flat.reshape(-1)] = self.reshape(-1) + self.dtype.type(0)
        return r.reshape(tuple(size))
    r = _bincount(xp, flat.reshape(-1), self.reshape(-1).astype(xp.float64), R * P)
    return r.reshape(tuple(size)).astype(self.dtype)


@_plane_scatter_add.def_meta
def _(self, indices, size, plane_dims, unique=False):
    return TensorSpec(tuple(size), self.dtype,
                      meta_strides(tuple(size), suggest_memory_format(indices)))


@_plane_scatter_add.def_derivative
def _(grad, indices, plane_dims):
    return _plane_gather(grad, indices, plane_dims), None
