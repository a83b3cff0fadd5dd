"""ShapeProp: run a GraphModule on example inputs and record each node's tensor metadata.

Each node gets `meta['tensor_meta']` (a `TensorMetadata`: shape, dtype, requires_grad, stride,
memory_format, is_quantized, qparams) and `meta['val']`, a FakeTensor with the same metadata.
With `fake_mode`, the inputs are converted to fake tensors and nothing is computed.
"""
from __future__ import annotations

from typing import NamedTuple

from ..._tensor import Tensor, contiguous_format
from ..._subclasses.fake_tensor import FakeTensorMode
from ..interpreter import Interpreter
from ..node import map_aggregate
from ..._backends import MetaArray
from ..._device import META


class TensorMetadata(NamedTuple):
    shape: tuple
    dtype: object
    requires_grad: bool
    stride: tuple
    memory_format: object
    is_quantized: bool
    qparams: dict


def _extract_tensor_metadata(t: Tensor) -> TensorMetadata:
    fmt = contiguous_format if t.is_contiguous() else None
    return TensorMetadata(tuple(t.shape), t.dtype, t.requires_grad, tuple(t.stride()), fmt, False, {})


class ShapeProp(Interpreter):
    """`ShapeProp(gm).propagate(*args)` (see module docstring)."""

    def __init__(self, gm, fake_mode: FakeTensorMode | None = None):
        super().__init__(gm)
        self.fake_mode = fake_mode
        self._snap = fake_mode or FakeTensorMode()

    def run_node(self, n):
        result = super().run_node(n)
        found = [False]

        def meta(x):
            if isinstance(x, Tensor):
                found[0] = True
                return _extract_tensor_metadata(x)
            return x
        tm = map_aggregate(result, meta)
        if found[0]:
            n.meta["tensor_meta"] = tm
        n.meta["val"] = map_aggregate(result, lambda x: self._fake(x) if isinstance(x, Tensor) else x)
        return result

    def _fake(self, t: Tensor) -> Tensor:
        if t.device.type == "meta" or getattr(t, "fake_device", None) is not None:
            return t
        f = Tensor._make(MetaArray(tuple(t.shape), t._dtype.np, t.stride(), t.storage_offset()), META, t._dtype)
        self._snap._register(f, t.device)
        return f

    def propagate(self, *args):
        if self.fake_mode is not None:
            args = tuple(self.fake_mode.from_tensor(a) if isinstance(a, Tensor) else a for a in args)
            with self.fake_mode:
                return self.run(*args)
        return self.run(*args)
