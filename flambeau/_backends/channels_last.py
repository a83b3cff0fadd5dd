"""Channels-last CuPy arrays made in one step: CuPy's constructor over a fresh allocation with the packed
NHWC (NDHWC) byte strides, not an NHWC array and its transposed view (two array objects, an axes tuple
and a transpose call: the eager cuDNN convolutions and Triton BatchNorms make ~200 a ResNet-50 step)."""
from __future__ import annotations

import math

_layouts: dict = {}      # (shape, itemsize) -> (bytes, byte strides) of a packed channels-last array
_MAX_LAYOUTS = 4096


def strides(shape) -> tuple:
    """Element strides of a packed channels-last (N, C, *spatial) shape: C fastest, then the last spatial
    dim, ..., N slowest (PyTorch's channels_last / channels_last_3d strides)."""
    st, acc = [0] * len(shape), 1
    for d in (1,) + tuple(range(len(shape) - 1, 1, -1)) + (0,):
        st[d] = acc
        acc *= shape[d]
    return tuple(st)


def empty(xp, shape: tuple, dtype):
    """A new array of CuPy namespace `xp`, of `shape` (a tuple) and NumPy `dtype`, packed channels-last."""
    it = dtype.itemsize
    layout = _layouts.get((shape, it))
    if layout is None:
        if len(_layouts) >= _MAX_LAYOUTS:
            _layouts.clear()
        layout = _layouts[(shape, it)] = (math.prod(shape) * it, tuple(s * it for s in strides(shape)))
    return xp.ndarray(shape, dtype, memptr=xp.cuda.alloc(layout[0]), strides=layout[1])
