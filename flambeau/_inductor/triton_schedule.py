"""The schedule cut for Triton's grid (codegen_triton.py prints each kernel as one or two grids).

A Triton program can't wait for the others between the steps of a kernel, and a kernel whose
reductions have few outputs (BatchNorm's per-channel statistics: 64 channels, 800K elements each)
runs far too few programs; codegen_triton *splits* such reductions over a 2-D grid when they are
independent reductions followed by pointwise steps. `split_for_grid` cuts the scheduler's kernels
so that they are:
  - a kernel without an outer loop: one kernel per step;
  - a kernel that would split: segments of [independent reductions, the pointwise steps after
    them], a new segment at a reduction that reads a value of its segment (BatchNorm's forward:
    the mean, then the variance around it) or that follows a pointwise step.
A value one part passes to the next is then stored (locals are reassigned).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import config
from .scheduler import Kernel, _assign_locals


@dataclass
class SplitPlan:
    """A split reduction: `parts` programs per x block; part p reduces the inner blocks (of `rblock`
    elements) p, p + parts, p + 2 * parts, ..."""
    parts: int
    xblock: int
    rblock: int
    reductions: int                 # the kernel's leading steps split (reductions); the rest run in the final kernel


SPLIT_MIN_BLOCKS = 4                # a part loops over at least this many blocks
SPLIT_MAX_PARTS = 1024              # the final kernel loads every part of an output in one block


def split_programs(interpret: bool) -> int:
    """Programs a split reduction aims at (the interpreter runs them one by one: few)."""
    return config.triton_interpret_split_programs if interpret else config.triton_split_programs


def would_split(xnumel, rnumel, column: bool, interpret: bool) -> bool:
    """Whether reductions of `rnumel` elements into `xnumel` outputs have too few programs for the GPU."""
    least = min(config.triton_split_min, config.triton_split_min_column) if column else config.triton_split_min
    if not isinstance(xnumel, int) or not isinstance(rnumel, int) or rnumel < least:
        return False
    xblock = config.triton_column_block[0] if column else 1
    return 2 * -(-xnumel // xblock) <= split_programs(interpret)


def _segments(k, interpret: bool) -> list:
    """The steps of kernel `k` as segments (lists of steps), one segment when `k` stays whole."""
    if not k.outer and k.scatter is None and len(k.steps) > 1:
        return [[s] for s in k.steps]
    reds = [s for s in k.steps if s.kind == "reduction"]
    if k.scatter is not None or len(k.steps) < 2 or not reds or \
            not would_split(math.prod(k.outer), math.prod(reds[0].inner), k.column, interpret):
        return [k.steps]
    segs, names, pointwise = [[]], set(), False
    for s in k.steps:
        if s.kind == "reduction" and segs[-1] and (pointwise or any(n.read_names & names for n in s.nodes)):
            segs.append([])
            names, pointwise = set(), False
        segs[-1].append(s)
        names |= {n.name for n in s.nodes}
        pointwise = pointwise or s.kind == "pointwise"
    return segs


def split_for_grid(order, graph, interpret: bool = False) -> list:
    """The schedule with kernels cut as the module docstring says, locals reassigned."""
    cuts = {id(k): _segments(k, interpret) for k in order if isinstance(k, Kernel)}
    if all(len(c) == 1 for c in cuts.values()):
        return order
    out = []
    for k in order:
        if not isinstance(k, Kernel):
            out.append(k)
            continue
        segs = cuts[id(k)]                      # (every kernel is rebuilt: _assign_locals fills it afresh)
        for i, steps in enumerate(segs):
            nk = Kernel(f"{k.name}_{i}" if len(segs) > 1 else k.name, [n for s in steps for n in s.nodes]
                        if steps else k.nodes, k.outer)
            nk.steps, nk.outer_groups, nk.column, nk.scatter = steps, k.outer_groups, k.column, k.scatter
            out.append(nk)
    _assign_locals(out, graph)
    return out
