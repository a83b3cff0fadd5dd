"""torch._dynamo._trace_wrapped_higher_order_op: `TransformGetItemToIndex`, the context under which
`x[i]` with integer and integer-tensor indices is advanced indexing (the `index` op, a copy) instead
of turning a 0-dim index tensor into a Python int and taking a view. Model libraries enter it
around mask functions that index with scalar tensors (`q_idx`), so the indexing stays a tensor
operation. PyTorch does this with a TorchFunctionMode; flambeau swaps `Tensor.__getitem__` for the
extent of the `with` block.
"""
from __future__ import annotations

from .._ops.creation import tensor
from .._ops.indexing import index
from .._tensor import Tensor
from ..utils._pytree import tree_leaves


class TransformGetItemToIndex:
    """`with TransformGetItemToIndex(): x[q_idx]` indexes with `index(x, [q_idx])`."""

    def __enter__(self) -> TransformGetItemToIndex:
        self._saved = Tensor.__getitem__
        saved = self._saved

        def getitem_as_index(t: Tensor, key):
            leaves = tree_leaves(key)
            if all(isinstance(x, Tensor) or type(x) is int for x in leaves):
                return index(t, [x if isinstance(x, Tensor) else tensor(x, device=t.device) for x in leaves])
            return saved(t, key)

        Tensor.__getitem__ = getitem_as_index
        return self

    def __exit__(self, *exc) -> None:
        Tensor.__getitem__ = self._saved
