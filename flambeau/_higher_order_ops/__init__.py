"""Higher-order operators: `cond` and `map` take functions and are captured as one graph node holding
their traced subgraphs (PyTorch's `torch.cond`, `torch._higher_order_ops.map`).

Layer 10 (functorch) of tests/test_layers.py's order: traces with make_fx's recorder and functionalization.
"""
from __future__ import annotations

from ._cond import cond, cond_op, UnsupportedAliasMutationException  # noqa: F401
from ._map import map, map_op  # noqa: F401,A004

__all__ = ["cond", "map"]
