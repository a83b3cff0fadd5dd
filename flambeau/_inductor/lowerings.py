"""Every lowering rule, attached to its op: the rules of `lowering` (pointwise, reductions,
conversions, externs), `lowering_views` (views, indexing, data movement) and `lowering_scatter`
(scatters, index_put, `copy_`); then each op that declares a pointwise formula and has no rule of
its own gets the formula as its lowering (`lowering.spelled`). The graph lowering imports this.
"""
from __future__ import annotations

from .._ops import OPS
from . import lowering_views, lowering_scatter  # noqa: F401  (their rules attach as they load)
from .lowering import spelled

for _op in OPS.values():
    if _op.pointwise is not None and _op.lowering is None:
        _op.def_lowering(spelled)
