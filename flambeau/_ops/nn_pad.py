"""Padding (constant, reflect, replicate, circular), pixel_shuffle/pixel_unshuffle, embedding
(padding_idx, max_norm, scale_grad_by_freq), embedding_bag and one_hot.

Constant padding is its own op (negative pads crop; its derivative is the same op with negated
pads). The other pad modes are index tables fed to `_taps_gather` (see nn_resample.py).
On cuda, embedding checks its indices on the device (`_backends.device_checks`: the error comes at
the next synchronisation) and its backward is one atomic-add kernel (`_backends.cuda_index_kernels`).
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._backends import cuda_index_kernels, device_checks
from ._registry import defop, export, autocast_policy, TensorSpec, Tag
from .memory_format import empty_strided_array, format_strides, meta_strides, suggest_memory_format
from .._tensor import contiguous_format
from .nn_resample import _taps_gather
from .._dispatch import type_name
from .._tensor import _no_grad
from .creation import tensor
from . import _batching, _sharding


def _padded_shape(shape, pad, name="constant_pad_nd"):
    pad = [int(p) for p in pad]
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > len(shape):
        raise RuntimeError(f"Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(pad)} and input of dimension {len(shape)}")
    out = list(shape)
    for i in range(len(pad) // 2):
        d = len(shape) - 1 - i
        new = shape[d] + pad[2 * i] + pad[2 * i + 1]
        if new < 0:
            raise RuntimeError(f"The input size {shape[d]}, plus negative padding {pad[2 * i]} and {pad[2 * i + 1]} "
                               f"resulted in a negative output size, which is invalid. Check dimension {d} of your input.")
        out[d] = new
    return tuple(out), pad


@defop("constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor")
def constant_pad_nd(xp, self, pad, value=0):
    shape, pad = _padded_shape(self.shape, pad)
    mf = suggest_memory_format(self)         # PyTorch: the input's memory format
    if mf is contiguous_format:
        out = xp.full(shape, value, dtype=self.dtype)
    else:
        out = empty_strided_array(xp, shape, format_strides(shape, mf), self.dtype)
        out[...] = value
    src, dst = [slice(None)] * self.ndim, [slice(None)] * self.ndim
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        lo, hi, n = pad[2 * i], pad[2 * i + 1], self.shape[d]
        src[d] = slice(max(-lo, 0), max(n - max(-hi, 0), max(-lo, 0)))
        dst[d] = slice(max(lo, 0), max(lo, 0) + max(src[d].stop - src[d].start, 0))
    if all(s.stop is None or s.stop > s.start for s in src):
        out[tuple(dst)] = self[tuple(src)]
    return out


@constant_pad_nd.def_meta
def _(self, pad, value=0):
    shape = _padded_shape(tuple(self.shape), pad)[0]
    return TensorSpec(shape, self.dtype, meta_strides(shape, suggest_memory_format(self)))


@constant_pad_nd.def_derivative
def _(grad, pad):
    return constant_pad_nd(grad, [-int(p) for p in pad], 0)


def _pad_index(n, lo, hi, mode):
    j = np.arange(-lo, n + hi)
    if mode == "reflect":
        j = np.abs(j)
        j = np.where(j > n - 1, 2 * (n - 1) - j, j)
    elif mode == "replicate":
        j = np.clip(j, 0, n - 1)
    else:
        c0, c1 = max(-lo, 0), n - max(-hi, 0)
        j = c0 + np.mod(np.arange(-max(lo, 0), c1 - c0 + max(hi, 0)), c1 - c0)
    return j.astype(np.int64)[:, None]


_MODE_DIMS = {2: (2, 3), 4: (3, 4), 6: (4, 5)}


@export("pad", namespace="nn.functional", function=False)
def pad(input, pad, mode="constant", value=None):
    if mode == "constant":
        return constant_pad_nd(input, list(pad), 0 if value is None else value)
    if value is not None and value != 0:
        raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument")
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pad = [int(p) for p in pad]
    if len(pad) not in _MODE_DIMS:
        raise NotImplementedError("Only 2D, 3D, 4D, 5D padding with non-constant padding are supported for now")
    nd = len(pad) // 2
    if input.dim() not in _MODE_DIMS[len(pad)]:
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {input.dim()}D input tensor.\nSupported combinations for "
            "non-constant padding:\n  - 2D or 3D input: padding size = 2 (pads last dimension)\n  - 3D or 4D input: "
            "padding size = 4 (pads last 2 dimensions)\n  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    tables = []
    for i in range(nd):
        d = input.dim() - nd + i
        n = input.shape[d]
        lo, hi = pad[2 * (nd - 1 - i)], pad[2 * (nd - 1 - i) + 1]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding input dimension, but "
                               f"got: padding ({lo}, {hi}) at dimension {d} of input {list(input.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        if n + lo + hi < 0 or n == 0:
            raise RuntimeError(f"input tensor must have non-zero size in dimension {d} and the padded size must be "
                               f"non-negative for {mode} padding")
        tables.append(_to_dev(_pad_index(n, lo, hi, mode), input))
    if mode == "replicate" or (mode == "reflect" and nd <= 2):
        return _pad_fp32_on_cpu(input, tables)
    return _taps_gather(input, tables, [])


@autocast_policy("reflection_replication_pad", (Tag.cpu_autocast_fp32,))
def _pad_fp32_on_cpu(input, tables):
    """PyTorch's cpu fp32 list has reflection_pad1d/2d and replication_pad1d/2d/3d."""
    return _taps_gather(input, tables, [])


def _to_dev(arr, like):
    return tensor(arr, device=like.device)


# ---- pixel shuffle -----------------------------------------------------------------------------
@export("pixel_shuffle", namespace="nn.functional")
def pixel_shuffle(input, upscale_factor):
    r = int(upscale_factor)
    if input.dim() < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.dim()} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                           f"upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    nb = len(lead)
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    perm = list(range(nb)) + [nb, nb + 3, nb + 1, nb + 4, nb + 2]
    return x.permute(*perm).reshape(*lead, c // (r * r), h * r, w * r)


@export("pixel_unshuffle", namespace="nn.functional")
def pixel_unshuffle(input, downscale_factor):
    r = int(downscale_factor)
    if input.dim() < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.dim()} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    *lead, c, h, w = input.shape
    if h % r:
        raise RuntimeError(f"pixel_unshuffle expects height to be divisible by downscale_factor, but input.size(-2)={h} "
                           f"is not divisible by {r}")
    if w % r:
        raise RuntimeError(f"pixel_unshuffle expects width to be divisible by downscale_factor, but input.size(-1)={w} "
                           f"is not divisible by {r}")
    nb = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    perm = list(range(nb)) + [nb, nb + 2, nb + 4, nb + 1, nb + 3]
    return x.permute(*perm).reshape(*lead, c * r * r, h // r, w // r)


# ---- embedding ---------------------------------------------------------------------------------
def _check_indices(indices, name="embedding"):
    dt = indices.dtype if hasattr(indices, "_dtype") else D.FROM_NP[indices.dtype]
    if dt not in (D.int64, D.int32):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got torch.{type_name(dt)}Tensor instead (while checking arguments for "
                           f"{name})")


@defop("embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, "
       "bool sparse=False) -> Tensor")
def embedding(xp, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_indices(indices)
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    device_checks.check_range(xp, indices, 0, weight.shape[0], IndexError, "index out of range in self")
    return xp.take(weight, indices.astype(xp.int64, copy=False), axis=0)


@embedding.def_meta
def _(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_indices(indices)
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    return TensorSpec(tuple(indices.shape) + (weight.shape[1],), weight.dtype)


@embedding.def_derivative
def _(grad, weight_meta, indices, padding_idx, scale_grad_by_freq):
    return embedding_dense_backward(grad, indices, weight_meta.shape[0], padding_idx, scale_grad_by_freq), None


@defop("embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, "
       "bool scale_grad_by_freq) -> Tensor", function=False)
def embedding_dense_backward(xp, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    if xp is not np and getattr(xp, "__name__", "") == "cupy":
        return cuda_index_kernels.embedding_backward(grad_output, indices, num_weights, padding_idx,
                                                     scale_grad_by_freq)
    Dm = grad_output.shape[-1]
    idx = indices.reshape(-1).astype(xp.int64, copy=False)
    g = grad_output.reshape(idx.shape[0], Dm).astype(xp.float64)
    if scale_grad_by_freq:
        counts = xp.bincount(idx, minlength=num_weights)
        g = g / counts[idx][:, None]
    if padding_idx >= 0:
        g = g * (idx != padding_idx)[:, None]
    flat = idx[:, None] * Dm + xp.arange(Dm, dtype=xp.int64)[None, :]
    r = xp.bincount(flat.reshape(-1), weights=g.reshape(-1), minlength=num_weights * Dm)
    return r.reshape(num_weights, Dm).astype(grad_output.dtype)


@embedding_dense_backward.def_meta
def _(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    return TensorSpec((num_weights, grad_output.shape[-1]), grad_output.dtype)


@defop("embedding_renorm(Tensor self, Tensor indices, float max_norm, float norm_type) -> Tensor",
       function=False, inplace=True, tags=(Tag.core, Tag.nondifferentiable, Tag.extern))
def embedding_renorm(xp, self, indices, max_norm, norm_type):
    out = self.copy()
    rows = xp.unique(indices.reshape(-1))
    w = out[rows].astype(xp.float64)
    if norm_type == float("inf"):
        norms = xp.abs(w).max(axis=1)
    else:
        norms = (xp.abs(w) ** norm_type).sum(axis=1) ** (1.0 / norm_type)
    scale = xp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    out[rows] = (w * scale[:, None]).astype(self.dtype)
    return out


embedding_renorm.def_meta(lambda self, indices, max_norm, norm_type: TensorSpec(tuple(self.shape), self.dtype))


@export("embedding_renorm_")
def embedding_renorm_(input, indices, max_norm, norm_type):
    return embedding_renorm.inplace(input, indices, max_norm, norm_type)


@export("embedding", namespace="nn.functional", function=False)
def embedding_fn(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False):
    n = weight.shape[0]
    if padding_idx is not None:
        if padding_idx > 0 and padding_idx >= n:
            raise AssertionError("Padding_idx must be within num_embeddings")
        if padding_idx < 0:
            if padding_idx < -n:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = n + padding_idx
    else:
        padding_idx = -1
    if max_norm is not None:
        with _no_grad():
            embedding_renorm.inplace(weight, input.contiguous(), float(max_norm), float(norm_type))
    return embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)


def _embedding_bag_traced(input, weight, offsets, max_norm, mode, per_sample_weights, padding_idx):
    """embedding_bag of a traced (exported, compiled) call in operators a graph holds: the bags of a 2-D
    input (one length) gathered by `embedding` and reduced over dim 1, padding_idx entries left out (an
    empty bag is zeros), per_sample_weights scaling each row (sum). 1-D input with offsets (bags of data-
    dependent lengths) and max_norm (an in-place renormalisation of the weight) are refused."""
    if input.dim() != 2 or offsets is not None:
        raise NotImplementedError(
            f"embedding_bag: a traced (exported or compiled) call takes a 2-D input of bags of one length, got a "
            f"{input.dim()}-D input{' with offsets' if offsets is not None else ''} (bag sizes that depend on the "
            "data); pad the bags to one length with padding_idx and pass a 2-D input")
    if max_norm is not None:
        raise NotImplementedError("embedding_bag: max_norm renormalises the weight in place, which a traced call "
                                  "can't do; renormalise the weight before exporting and drop max_norm")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    rows = embedding(weight, input, -1, False, False)                # (B, L, D)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(-1).to(rows.dtype)
    if padding_idx is None:
        return rows.sum(1) if mode == "sum" else rows.mean(1) if mode == "mean" else rows.amax(1)
    keep = (input != padding_idx).unsqueeze(-1)                      # (B, L, 1)
    if mode == "max":
        top = rows.masked_fill(~keep, float("-inf")).amax(1)
        return top.masked_fill(~keep.any(1), 0.0)
    total = rows.masked_fill(~keep, 0.0).sum(1)
    return total if mode == "sum" else total / keep.sum(1).clamp(min=1).to(rows.dtype)


@export("embedding_bag", namespace="nn.functional", function=False)
def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """Bags of embeddings reduced by sum/mean/max: the bags become an index table for `_taps_gather`
    (sum/mean) or for a gather followed by a max (max)."""
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, but got {mode}")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
                                  "the Pytorch GitHub.")
    _check_indices(input, "embedding_bag")
    if input._device.type == "meta" or (offsets is not None and offsets._device.type == "meta"):
        return _embedding_bag_traced(input, weight, offsets, max_norm, mode, per_sample_weights, padding_idx)
    idx = input._host().astype(np.int64)
    if idx.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             "fixed length sequences.")
        B, Lb = idx.shape
        offs = np.arange(B + 1) * Lb
        idx = idx.reshape(-1)
    elif idx.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        offs = offsets._host().astype(np.int64)
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        offs = offs if include_last_offset else np.append(offs, idx.shape[0])
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.ndim}")
    n = weight.shape[0]
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        with _no_grad():
            embedding_renorm.inplace(weight, input.reshape(-1).contiguous(), float(max_norm), float(norm_type))
    B = len(offs) - 1
    lens = np.diff(offs)
    T = max(int(lens.max()) if B else 0, 1)
    pos = offs[:-1, None] + np.arange(T)[None, :]
    valid = np.arange(T)[None, :] < lens[:, None]
    pos = np.where(valid, pos, 0)
    table = np.where(valid, idx[np.minimum(pos, max(len(idx) - 1, 0))] if len(idx) else 0, 0)
    if padding_idx is not None:
        valid = valid & (table != padding_idx)
    wt = weight.transpose(0, 1)
    if mode == "max":
        big = _taps_gather(wt, [_to_dev(table.reshape(-1, 1), weight)], [])
        big = big.reshape(wt.shape[0], B, T)
        mask = _to_dev(np.where(valid, 0.0, -np.inf), weight).to(weight.dtype)
        vals = (big + mask).max(-1)
        empty = _to_dev(valid.any(1), weight)
        out = vals.values.transpose(0, 1) * empty.unsqueeze(1).to(weight.dtype)
        return out.nan_to_num(0.0) if (~valid.any(1)).any() else out
    w = valid.astype(np.float64)
    if mode == "mean":
        cnt = w.sum(1, keepdims=True)
        w = w / np.maximum(cnt, 1)
    wtab = _to_dev(w, weight)
    if per_sample_weights is not None:
        psw = _taps_gather(per_sample_weights.unsqueeze(0), [_to_dev(pos.reshape(-1, 1), weight)], [])
        gathered = _taps_gather(wt, [_to_dev(table.reshape(-1, 1), weight)], []).reshape(wt.shape[0], B, T)
        return (gathered * (psw.reshape(1, B, T) * wtab.to(weight.dtype))).sum(-1).transpose(0, 1)
    return _taps_gather(wt, [_to_dev(table, weight)], [wtab]).transpose(0, 1).contiguous()


@defop("one_hot(Tensor self, int num_classes=-1) -> Tensor", namespace="nn.functional", function=False,
       tags=(Tag.nondifferentiable,))
def one_hot(xp, self, num_classes=-1):
    if self.dtype != np.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if self.size == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(self.max()) + 1
    if self.size:
        if int(self.min()) < 0:
            raise RuntimeError("Class values must be non-negative.")
        if int(self.max()) >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    return (self[..., None] == xp.arange(num_classes, dtype=np.int64)).astype(np.int64)


@one_hot.def_meta
def _(self, num_classes=-1):
    if num_classes == -1:
        raise NotImplementedError("one_hot with num_classes=-1 has a data-dependent output shape")
    return TensorSpec(tuple(self.shape) + (num_classes,), D.int64)


# ---- vmap batching rules ----------------------------------------------------------------------------
@embedding.def_batching_rule
def _embedding_batching(in_dims, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if in_dims[0] is not None:
        return NotImplemented
    return embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse), in_dims[1]


constant_pad_nd.def_batching_rule(_batching.dim_rule(constant_pad_nd))


# ---- DTensor sharding rule --------------------------------------------------------------------------
embedding.def_sharding_rule(_sharding.embedding_rule)
