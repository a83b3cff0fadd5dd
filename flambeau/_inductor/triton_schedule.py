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


# ---- combo kernels ------------------------------------------------------------------------------
class ComboKernel(Kernel):
    """Independent flat pointwise kernels (`members`) launched as one: the grid is their program ranges one
    after the other, and each program runs the code of the member whose range holds it (codegen_triton)."""

    def __init__(self, members: list):
        super().__init__(members[0].name + "_combo", [n for m in members for n in m.nodes], ())
        self.members = members
        self.locals = set().union(*(m.locals for m in members))
        self.stores = [b for m in members for b in m.stores]
        seen: set = set()
        self.loads = [b for m in members for b in m.loads if not (b.name in seen or seen.add(b.name))]


def flat_pointwise(k) -> bool:
    """Whether kernel `k` is one pointwise step over static sizes without an outer loop: a combo member."""
    return type(k) is Kernel and not k.outer and k.scatter is None and len(k.steps) == 1 and \
        k.steps[0].kind == "pointwise" and isinstance(math.prod(k.steps[0].inner), int)


def _nbytes(b) -> int:
    n = b.layout.numel
    return n * b.dtype.itemsize if isinstance(n, int) else 1 << 62


def combine_pointwise(order: list, graph, printable=lambda k: True) -> list:
    """The schedule with independent flat pointwise kernels launched as ComboKernels (`config.triton_combo_kernels`):
    those that read only graph inputs join one at the first's place (hoisted), those whose values no later
    step reads (graph outputs only) one at the last's place (sunk), each combo extending at most
    `config.triton_combo_bytes` of buffer lifetimes (the hoisted ones' stores, the sunk ones' loads) and
    holding at most `config.triton_combo_members` kernels. `printable(k)` says whether a kernel prints as
    one plain launch (no error flag, no second kernel). Order and values are unchanged otherwise."""
    if not config.triton_combo_kernels:
        return order
    produced: dict = {}
    last_read: dict = {}
    for i, k in enumerate(order):
        if isinstance(k, Kernel):
            outs, ins = [b.name for b in k.stores], [b.name for b in k.loads]
        else:
            outs = [b.name for b in [k.node] + list(k.node.outputs or [])]
            ins = [b.name for b in k.node.inputs()]
        for name in ins:
            last_read[name] = i
        for name in outs:
            produced.setdefault(name, i)
    hoist: list = []            # groups of (index, kernel)
    sink: list = []
    for i, k in enumerate(order):
        if not flat_pointwise(k):
            continue
        if not any(b.name in produced for b in k.loads):
            groups, size = hoist, sum(map(_nbytes, k.stores))
        elif all(last_read.get(b.name, -1) < i for b in k.stores):
            groups, size = sink, sum(map(_nbytes, k.loads))
        else:
            continue
        if size > config.triton_combo_bytes or not printable(k):
            continue
        g = groups[-1] if groups else None
        if g is None or g[0] + size > config.triton_combo_bytes or len(g[1]) >= config.triton_combo_members:
            groups.append([0, []])
            g = groups[-1]
        g[0] += size
        g[1].append((i, k))
    place: dict = {}            # index -> the ComboKernel standing there
    drop: set = set()
    for groups, at in ((hoist, 0), (sink, -1)):
        for _, members in groups:
            if len(members) < 2:
                continue
            place[members[at][0]] = ComboKernel([k for _, k in members])
            drop.update(i for i, _ in members)
    if not place:
        return order
    return [place[i] if i in place else k for i, k in enumerate(order) if i in place or i not in drop]
