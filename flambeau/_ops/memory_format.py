"""Memory formats: PyTorch's rules for which layout a new tensor takes.

A 4-d tensor is channels-last when its strides order the dims C, W, H, N from fastest to slowest
(`x.contiguous(memory_format=channels_last)`, strides (HWC, 1, WC, C)); channels_last_3d is the
same for 5-d NCDHW. Ops keep the layout they are given, as PyTorch's do:
- `suggest_memory_format(x)`: c10's rule (`is_channels_last_strides_2d/3d`): the strides order the
  dims as channels-last does, with ambiguous cases (N111, a trivial C) read as contiguous.
- `conv_memory_format(input, weight)`: a convolution's output (and gradients) are channels-last
  when its input or its weight suggests it (PyTorch's cudnn/mkldnn/thnn rule).
- `like_strides(x, memory_format)`: the strides `empty_like`/`clone`/`to` give (preserve_format:
  x's own strides when x is dense and non-overlapping, else dense strides in x's stride order).
Kernels compute in whatever layout suits them and `as_format` lays the result out as asked
(no copy when it already is); meta functions give `format_strides` of the same format.
"""
from __future__ import annotations

import numpy as np

from .._tensor import Tensor, contiguous_format, channels_last, channels_last_3d, preserve_format

# fastest-moving dim first, as c10's loops over `{1, 3, 2, 0}` and `{1, 4, 3, 2, 0}`
_ORDER = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}
_FORMAT_OF_RANK = {4: channels_last, 5: channels_last_3d}
_RANK_OF_FORMAT = {channels_last: 4, channels_last_3d: 5}


def _strides_of(x) -> tuple:
    """Element strides of a Tensor, a NumPy/CuPy array, a MetaArray or an autograd `_geometry`."""
    if isinstance(x, Tensor):
        return tuple(x.stride())
    st = getattr(x, "strides", None)             # an array (read first: asking an array for `stride` raises)
    if type(st) is tuple:
        it = x.itemsize
        return tuple([b // it for b in st])
    if callable(getattr(x, "stride", None)):     # an autograd `_geometry`
        return tuple(x.stride())
    return tuple(x.estrides)                     # a MetaArray


def check_format(mf, ndim: int, op: str):
    """PyTorch's errors for a memory format a tensor of this rank cannot take."""
    want = _RANK_OF_FORMAT.get(mf)
    if want is not None and ndim != want:
        name = "channels_last" if want == 4 else "channels_last_3d"
        raise RuntimeError(f"required rank {want} tensor to use {name} format ({op} of a {ndim}-d tensor)")


def format_strides(shape, mf) -> tuple:
    """The dense strides of `shape` in memory format `mf` (contiguous, channels_last, channels_last_3d),
    as c10's get_channels_last_strides_2d/3d and contiguous strides compute them."""
    shape = tuple(shape)
    st = [0] * len(shape)
    acc = 1
    if mf in _RANK_OF_FORMAT and len(shape) == _RANK_OF_FORMAT[mf]:
        for d in _ORDER[len(shape)]:
            st[d] = acc
            acc *= shape[d]
        return tuple(st)
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= max(shape[d], 1)
    return tuple(st)


def meta_strides(shape, mf):
    """A meta function's strides for a result in format `mf`: None (C order) when contiguous, so
    symbolic sizes meet no comparisons."""
    return None if mf is contiguous_format or mf is None else format_strides(shape, mf)


def _channels_last_like(shape, strides) -> bool:
    """c10's is_channels_last_strides_2d/3d: the strides order the dims C, W, (D,) H, N."""
    order = _ORDER.get(len(shape))
    if order is None or strides[1] == 0:
        return False
    lo = 0
    for d in order:
        if shape[d] == 0 or strides[d] < lo:
            return False
        if d == 0 and lo == strides[1]:       # N111 and its slices: read as contiguous
            return False
        lo = strides[d] * (shape[d] if shape[d] > 1 else 1)
    return True


_SUGGESTED: dict = {}       # (shape, byte strides, itemsize) of an array -> its suggested format
_MAX_SUGGESTED = 4096


def suggest_memory_format(x, ranks=(4, 5)):
    """c10's `suggest_memory_format()` of a Tensor, an array or an autograd `_geometry`. `ranks=(4,)`:
    the rule of PyTorch's CPU pooling and resampling kernels, which keep 5-d results contiguous.
    A NumPy/CuPy array's (or a Tensor's) answer is remembered per layout: each eager convolution asks
    for its input's and weight's, forward and backward (about 420 calls a ResNet-50 step)."""
    a = x._data if type(x) is Tensor else x
    st = getattr(a, "strides", None)
    if type(st) is tuple:
        shape = a.shape
        if len(shape) not in ranks:
            return contiguous_format
        key = (shape, st, a.itemsize)
        mf = _SUGGESTED.get(key)
        if mf is None:
            mf = _suggest_uncached(a, ranks)
            if len(_SUGGESTED) >= _MAX_SUGGESTED:
                _SUGGESTED.clear()
            _SUGGESTED[key] = mf
        return mf
    return _suggest_uncached(x, ranks)


def _suggest_uncached(x, ranks):
    shape = tuple(x.shape)
    if len(shape) not in ranks:
        return contiguous_format
    strides = _strides_of(x)
    if not _all_ints(shape, strides):        # symbolic sizes: contiguous, as pointwise_perm (no new guards)
        return contiguous_format
    return _FORMAT_OF_RANK[len(shape)] if _channels_last_like(shape, strides) else contiguous_format


def _all_ints(*seqs) -> bool:
    for seq in seqs:                 # loops, not all(<genexpr>): this runs for every convolution call
        for v in seq:
            if type(v) is not int and not isinstance(v, (int, np.integer)):
                return False
    return True


_CONV_FORMATS: dict = {}    # (input's and weight's shapes, byte strides, itemsizes, on_cuda) -> conv_memory_format


def conv_memory_format(input, weight, on_cuda=False):
    """The layout of a convolution's output and gradients: channels-last when the input or the
    weight suggests it, else contiguous. 5-d: channels_last_3d on cuda (cuDNN) only; PyTorch's CPU
    3-d convolutions give contiguous results. For arrays (or tensors' arrays) the answer is remembered
    per (both layouts, on_cuda): one lookup for each eager convolution's calls (about 210 a ResNet-50
    step, forward and backward), not two `suggest_memory_format` calls."""
    a = input._data if type(input) is Tensor else input
    b = weight._data if type(weight) is Tensor else weight
    sa, sb = getattr(a, "strides", None), getattr(b, "strides", None)
    if type(sa) is tuple and type(sb) is tuple:
        key = (a.shape, sa, a.itemsize, b.shape, sb, b.itemsize, on_cuda)
        mf = _CONV_FORMATS.get(key)
        if mf is None:
            mf = _conv_memory_format(input, weight, on_cuda)
            if len(_CONV_FORMATS) >= _MAX_SUGGESTED:
                _CONV_FORMATS.clear()
            _CONV_FORMATS[key] = mf
        return mf
    return _conv_memory_format(input, weight, on_cuda)


def _conv_memory_format(input, weight, on_cuda):
    if input.ndim != 4 and not (on_cuda and input.ndim == 5):
        return contiguous_format
    mf = _FORMAT_OF_RANK[input.ndim]
    return mf if suggest_memory_format(input) is mf or suggest_memory_format(weight) is mf else contiguous_format


def _dense_non_overlapping(shape, strides) -> bool:
    dims = sorted((st, sz) for sz, st in zip(shape, strides) if sz != 1)
    acc = 1
    for st, sz in dims:
        if st != acc:
            return False
        acc *= sz
    return True


def dense_strides_like(shape, strides) -> tuple:
    """Dense strides keeping the order of `strides` (ties and size-1 dims: the later dim faster)."""
    order = sorted(range(len(shape)), key=lambda i: (strides[i], i), reverse=True)
    st = [0] * len(shape)
    acc = 1
    for i in reversed(order):
        st[i] = acc
        acc *= max(shape[i], 1)
    return tuple(st)


def like_strides(x, mf=None) -> tuple:
    """The strides of `empty_like(x, memory_format=mf)` (None: preserve_format)."""
    shape = tuple(x.shape)
    if mf is None or mf is preserve_format:
        strides = _strides_of(x)
        if not _all_ints(shape, strides):     # symbolic sizes: as the strides say when contiguous, else C order
            return tuple(strides) if x.is_contiguous() else format_strides(shape, contiguous_format)
        if _dense_non_overlapping(shape, strides):
            return tuple(strides)
        return dense_strides_like(shape, strides)
    return format_strides(shape, mf)


def is_plain(shape, strides) -> bool:
    """Whether these strides are C-contiguous (size-1 dims may have any stride)."""
    acc = 1
    for sz, st in zip(reversed(shape), reversed(strides)):
        if sz != 1 and st != acc:
            return False
        acc *= sz
    return True


def empty_strided_array(xp, shape, strides, dtype):
    """A fresh array of `shape` with exactly these dense element strides (size-1 dims included:
    c10's `suggest_memory_format` reads them)."""
    n = 1
    for d in shape:
        n *= d
    buf = xp.empty(n, dtype=dtype)
    it = buf.itemsize
    return xp.lib.stride_tricks.as_strided(buf, tuple(shape), tuple(s * it for s in strides))


def as_format(xp, r, mf):
    """`r` laid out in memory format `mf` with its exact strides: `r` itself when it has them, a view
    when only the strides of size-1 dims differ, else a copy."""
    if mf is None or mf is contiguous_format or mf is preserve_format or r.ndim != _RANK_OF_FORMAT.get(mf):
        return r
    want = format_strides(r.shape, mf)
    have = _strides_of(r)
    if tuple(have) == want:
        return r
    if all(a == b for a, b, n in zip(have, want, r.shape) if n != 1):
        return xp.lib.stride_tricks.as_strided(r, r.shape, tuple(s * r.itemsize for s in want))
    out = empty_strided_array(xp, r.shape, want, r.dtype)
    out[...] = r
    return out


def in_layout_of(xp, r, x):
    """`r` (an array of x's shape) laid out as `empty_like(x)` is: `r` itself when x is C-contiguous
    or r already has that layout, else a copy."""
    if x.flags.c_contiguous:
        return r
    want = like_strides(x)
    if all(a == b for a, b, n in zip(_strides_of(r), want, r.shape) if n != 1):
        return r
    out = empty_strided_array(xp, r.shape, want, r.dtype)
    out[...] = r
    return out
