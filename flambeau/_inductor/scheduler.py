"""The scheduler: group realised buffers into kernels (fusion), decide which stay in registers,
and plan memory.

A kernel is a loop nest with a shared *outer* loop and a sequence of *steps* inside it:

    for x in outer:                        # parallel
        acc = reduce(... for r in R1)      # a reduction step: one value per outer index
        for y in inner: out[x, y] = ...    # a pointwise step (several fused nodes share it)
        ...

Buffers are visited in execution order; a buffer joins the current kernel when its iteration
space splits as (the kernel's outer loop, an inner part) and every element it reads from buffers
computed in the same kernel was written in the same outer iteration (proved on the affine index
forms: the outer coefficients are the producer's outer strides and the rest stays inside one
outer block). So pointwise chains fuse, pointwise producers fuse into reductions, and a reduction
fuses with its pointwise epilogue (LayerNorm -> GELU -> tanh is one kernel: per row, passes for
mean and variance, then one pass writing the activated output).

A `Scatter` (scatter, index_put, a copy into a strided view) is a kernel of its own: a copy loop
then a store loop, never fused (its elements are not written in loop order).

A buffer used only inside its kernel, at the index where it is produced, is never stored: a
reduction result becomes a scalar of the outer loop body, a pointwise value a temporary of the
inner loop. Extern kernels are scheduled alone. `plan_memory` then assigns storage to the rest,
reusing freed buffers of the same size and dtype.

With symbolic sizes the same reasoning runs on `SizeExpr` polynomials: sizes compare as
polynomials and legality needs facts provable for every size, else the buffers don't fuse.
"""
from __future__ import annotations

import math

from . import config
from .index import Index, Sym, contiguous_strides
from .sizevars import Unsupported, exact_div, known_lt, known_nonneg
from .ir import ComputedBuffer, ExternKernel, Reduction, Scatter, StridedView


def strip(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


class SNode:
    """A ComputedBuffer to schedule, with its reads in its own analysis symbols a0, a1, ..."""

    def __init__(self, buf: ComputedBuffer):
        self.buf = buf
        self.name = buf.name
        self.is_reduction = isinstance(buf.data, Reduction)
        self.ranges = tuple(buf.data.ranges)
        self.reduction_ranges = tuple(buf.data.reduction_ranges) if self.is_reduction else ()
        self.sizes = strip(self.ranges)
        self.reads = buf.data.reads()
        self.read_names = {b.name for b, _ in self.reads}
        self.column = self.is_reduction and _is_column(self)
        self.scatter = isinstance(buf.data, Scatter)

    def outer_syms(self, n_outer: int) -> list:
        names = [f"a{i}" for i, s in enumerate(self.ranges) if s != 1]
        return names[:n_outer]

    def canonical(self, index: Index) -> Index:
        """Rename analysis symbols of non-1 dims to c0, c1, ... (shared by same-shape nodes)."""
        mapping, k = {}, 0
        for i, s in enumerate(self.ranges):
            if s != 1:
                mapping[f"a{i}"] = Index.of(Sym(f"c{k}", s))
                k += 1
        return index.subs(mapping)

    def write_index(self) -> Index:
        out, k = Index(), 0
        for s, st in zip(self.ranges, contiguous_strides(self.ranges)):
            if s != 1:
                out = out + Index.of(Sym(f"c{k}", s)) * st
                k += 1
        return out


class Step:
    def __init__(self, kind: str, nodes: list, inner: tuple):
        self.kind = kind            # "reduction" | "pointwise"
        self.nodes = nodes
        self.inner = inner          # stripped inner sizes (reduction: stripped reduction ranges)
        self.inner_groups: list = []   # inner dims merged into single loops (see merge_dims)


class Kernel:
    """A fused group of SNodes: outer sizes, steps, and which of its buffers are locals."""

    def __init__(self, name: str, nodes: list, outer: tuple):
        self.name = name
        self.nodes = nodes
        self.outer = outer
        self.steps: list = []
        self.outer_groups: list = []
        self.column = nodes[0].column          # (with column reductions and pointwise values only: _may_join)
        self.scatter = nodes[0] if len(nodes) == 1 and nodes[0].scatter else None
        self.locals: set = set()
        self.stores: list = []      # ComputedBuffers written to memory
        self.loads: list = []       # Buffers read from memory (not produced here)

    def work(self) -> int:
        inner = sum(math.prod(s.inner) for s in self.steps)
        return math.prod(self.outer) * (max(1, inner) if isinstance(inner, int) else inner)


class ExternStep:
    def __init__(self, node: ExternKernel):
        self.node = node
        self.name = node.name


# ---- legality -----------------------------------------------------------------------------------
def _read_legal(node: SNode, index: Index, producer: SNode, n_outer: int, outer_size: int) -> bool:
    if len(producer.sizes) < n_outer:
        return False
    syms = node.outer_syms(n_outer)
    if not index.is_affine_in(set(syms)):
        return False
    pdims = [i for i, s in enumerate(producer.ranges) if s != 1][:n_outer]
    pstrides = contiguous_strides(producer.ranges)
    for sname, pd in zip(syms, pdims):
        if index.coeff(Sym(sname, 0)) != pstrides[pd]:
            return False
    rest = index.without(set(syms))
    if rest.uses(set(syms)):
        return False
    try:
        lo, hi = rest.bounds()
    except Unsupported:              # a symbolic coefficient of unknown sign: can't prove it stays inside
        return False
    inner = exact_div(math.prod(producer.ranges), max(outer_size, 1) if isinstance(outer_size, int) else outer_size)
    return inner is not None and known_nonneg(lo) and known_lt(hi, inner)


def _legal(nodes: list, outer: tuple) -> bool:
    produced = {}
    n_outer, osize = len(outer), math.prod(outer)
    for n in nodes:
        if n.is_reduction:
            if n.sizes != outer:
                return False
        elif n.sizes[:n_outer] != outer:
            return False
        for b, idx in n.reads:
            p = produced.get(b.name)
            if p is not None and not _read_legal(n, idx, p, n_outer, osize):
                return False
        produced[n.name] = n
    return True


def _default_outer(sizes: tuple) -> tuple:
    """A group of pointwise nodes only has no outer loop: its steps loop over everything."""
    return ()


# ---- grouping -----------------------------------------------------------------------------------
def schedule(graph) -> list:
    """Kernels and ExternSteps in execution order.

    Each buffer joins the earliest kernel, at or after the step producing its last input, where it
    fits; otherwise it starts a new kernel. Extern calls stay in place."""
    order: list = []                       # [nodes list, outer or None] groups and ExternSteps
    columns = getattr(graph, "triton", False)
    pos_of: dict = {}
    for buf in graph.buffers:
        if isinstance(buf, ExternKernel):
            order.append(ExternStep(buf))
            for b in [buf] + buf.outputs:
                pos_of[b.name] = len(order) - 1
            continue
        n = SNode(buf)
        first = max([pos_of[r] for r in n.read_names if r in pos_of], default=0)
        placed = False
        for i in range(first, len(order) if config.fuse else 0):
            grp = order[i]
            if isinstance(grp, ExternStep) or not _may_join(grp, n, columns):
                continue
            cand = _candidate_outer(grp[0], grp[1], n)
            if cand is not None and _legal(grp[0] + [n], cand[0]):
                grp[0].append(n)
                grp[1] = cand[1]
                pos_of[n.name] = i
                placed = True
                break
        if not placed:
            outer = n.sizes if n.is_reduction else None
            if not _legal([n], outer if outer is not None else _default_outer(n.sizes)):
                raise AssertionError(f"{n.name} cannot be scheduled")
            order.append([[n], outer])
            pos_of[n.name] = len(order) - 1
    out, nk = [], 0
    for grp in order:
        if isinstance(grp, ExternStep):
            out.append(grp)
            continue
        k = Kernel(f"kernel{nk}", grp[0], grp[1] if grp[1] is not None else _default_outer(grp[0][0].sizes))
        nk += 1
        if k.scatter is None:
            _plan_steps(k)
        out.append(k)
    _assign_locals(out, graph)
    return out


def _may_join(grp, n: SNode, columns: bool) -> bool:
    """Whether `n` may join group `grp` at all. A scatter is a kernel of its own; so is a column
    reduction, except for the Triton generator (`columns`: it computes every kernel a block of outer
    indices at a time), where column reductions over the same outer loop share a kernel with each other
    and with pointwise values over that outer loop only (BatchNorm's statistics of a channels-last
    activation: sum, mean, sum of squares, rstd in one kernel, not four)."""
    first = grp[0][0]
    if n.scatter or first.scatter:
        return False
    if not (n.column or first.column):
        return True
    if not columns or not first.column:
        return False
    return n.column or (not n.is_reduction and n.sizes == grp[1])


def _candidate_outer(cur, outer, n):
    """(outer to check legality with, outer to keep) if n's iteration space fits, else None."""
    if outer is None:
        pw = cur[0].sizes
        if not n.is_reduction:
            return (_default_outer(pw), None) if n.sizes == pw else None
        if pw[:len(n.sizes)] == n.sizes:
            return n.sizes, n.sizes
        return None
    if n.is_reduction:
        return (outer, outer) if n.sizes == outer else None
    return (outer, outer) if n.sizes[:len(outer)] == outer else None


def _plan_steps(k: Kernel):
    n_outer = len(k.outer)
    k.outer_groups = merge_dims(k.outer, [(n, _dim_syms(n)[:n_outer]) for n in k.nodes])
    for n in k.nodes:
        if n.is_reduction:
            k.steps.append(Step("reduction", [n], strip(n.reduction_ranges)))
            continue
        inner = n.sizes[n_outer:]
        last = k.steps[-1] if k.steps else None
        if last is not None and last.kind == "pointwise" and last.inner == inner and \
                _same_index_reads(n, last.nodes):
            last.nodes.append(n)
        else:
            k.steps.append(Step("pointwise", [n], inner))
    for s in k.steps:
        if s.kind == "reduction":
            n = s.nodes[0]
            rs = [f"a{len(n.ranges) + j}" for j, sz in enumerate(n.reduction_ranges) if sz != 1]
            s.inner_groups = merge_dims(s.inner, [(n, rs)])
        else:
            s.inner_groups = merge_dims(s.inner, [(n, _dim_syms(n)[n_outer:]) for n in s.nodes])


COLUMN_TYPES = ("sum", "prod", "max", "min", "any", "all")


def _is_column(n: SNode) -> bool:
    """A reduction whose reads are contiguous along its innermost output dim and strided along
    every reduced dim (a column sum): better computed a block of outputs at a time. A read that does
    not depend on that output dim may run along a reduced dim (a layer norm's row statistics in its
    weight's gradient): the block loop reads it once per reduced index."""
    outs = _dim_syms(n)
    rs = [f"a{len(n.ranges) + j}" for j, s in enumerate(n.reduction_ranges) if s != 1]
    if n.buf.data.reduction_type not in COLUMN_TYPES or not outs or not rs:
        return False
    contiguous = False
    for _, idx in n.reads:
        if not idx.is_affine_in(set(outs + rs)):
            return False
        c = idx.coeff(Sym(outs[-1], 0))
        if c not in (0, 1) or (c == 1 and any(idx.coeff(Sym(r, 0)) in (1, -1) for r in rs)):
            return False
        contiguous |= c == 1
    return contiguous


def _dim_syms(n: SNode) -> list:
    return [f"a{i}" for i, s in enumerate(n.ranges) if s != 1]


def merge_dims(sizes: tuple, scopes: list) -> list:
    """Group consecutive dims into single loops where every access is contiguous across them.

    scopes: (SNode, [its analysis symbol per dim]). Dims i and i+1 merge when, in every read and
    in the write, coeff(i) == coeff(i+1) * size(i+1) and both are affine: the index of the merged
    loop variable m, (m // size(i+1)) * coeff(i) + (m % size(i+1)) * coeff(i+1), then simplifies
    to m * coeff(i+1). Merging never changes results, only the loop structure."""
    groups = [[i] for i in range(len(sizes))]
    for i in range(len(sizes) - 2, -1, -1):
        if all(_pair_ok(n, names[i], names[i + 1], sizes[i + 1]) for n, names in scopes):
            groups[i] = groups[i] + groups.pop(i + 1)
    return [tuple(sizes[d] for d in g) for g in groups]


def _pair_ok(n: SNode, a: str, b: str, size_b: int) -> bool:
    write = Index()
    for i, (s, st) in enumerate(zip(n.ranges, contiguous_strides(n.ranges))):
        if s != 1:
            write = write + Index.of(Sym(f"a{i}", s)) * st
    pair = {a, b}
    for _, idx in n.reads + [(None, write)]:
        if not idx.is_affine_in(pair):
            return False
        if idx.coeff(Sym(a, 0)) != idx.coeff(Sym(b, 0)) * size_b:
            return False
    return True


def expand_groups(groups: list, syms: list) -> list:
    """Per-dim index expressions from merged loop symbols (one per group)."""
    out = []
    for g, m in zip(groups, syms):
        for k in range(len(g)):
            below = math.prod(g[k + 1:])
            e = m // below if not isinstance(below, int) or below > 1 else m
            out.append(e % g[k] if k > 0 else e)
    return out


def _same_index_reads(n: SNode, step_nodes: list) -> bool:
    """Every read of a buffer produced in this loop is at exactly the index it was written."""
    prod = {m.name: m for m in step_nodes}
    for b, idx in n.reads:
        p = prod.get(b.name)
        if p is not None and n.canonical(idx).key() != p.write_index().key():
            return False
    return True


def _assign_locals(order, graph):
    """Decide which computed buffers are never stored, and each kernel's loads/stores."""
    needed_outside: dict = {}               # buffer name -> set of kernel names reading it
    for k in order:
        if isinstance(k, Kernel):
            for n in k.nodes:
                for b in n.read_names:
                    needed_outside.setdefault(b, set()).add(k.name)
        else:
            for b in k.node.inputs():
                needed_outside.setdefault(b.name, set()).add(k.name)
    out_names = set()
    for o in graph.flat_outputs():
        if isinstance(o, StridedView):
            out_names.add(o.base.name)
        elif hasattr(o, "name"):
            out_names.add(o.name)
    for k in order:
        if not isinstance(k, Kernel):
            continue
        step_of = {}
        for si, s in enumerate(k.steps):
            for n in s.nodes:
                step_of[n.name] = si
        own = {n.name for n in k.nodes}
        if k.scatter is not None:
            k.stores.append(k.scatter.buf)
        for si, s in enumerate(k.steps):
            for n in s.nodes:
                readers = needed_outside.get(n.name, set())
                if n.name in out_names or readers - {k.name} or not config.keep_locals:
                    k.stores.append(n.buf)
                    continue
                scalar = s.kind == "reduction" or not s.inner
                same_loop = all(step_of.get(m.name) == si for m in k.nodes if n.name in m.read_names)
                if scalar or same_loop:
                    k.locals.add(n.name)
                else:
                    k.stores.append(n.buf)
        seen = set()
        for n in k.nodes:
            for b, _ in n.reads:
                if b.name not in own and b.name not in seen:
                    seen.add(b.name)
                    k.loads.append(b)


# ---- memory planning ----------------------------------------------------------------------------
def plan_memory(order, graph) -> dict:
    """{buffer name: (action, other)} where action is 'alloc' or ('reuse', freed buffer name), plus
    'free' lists: returns (allocs, frees) with frees[i] the buffers dead after step i."""
    last_use: dict = {}
    for i, k in enumerate(order):
        reads = k.loads if isinstance(k, Kernel) else k.node.inputs()
        for b in reads:
            last_use[b.name] = i
    keep = set()
    for o in graph.flat_outputs():
        if isinstance(o, StridedView):
            keep.add(o.base.name)
        elif hasattr(o, "name"):
            keep.add(o.name)
    pool: dict = {}
    allocs: dict = {}
    frees: list = [[] for _ in order]
    produced_at: dict = {}
    for i, k in enumerate(order):
        if isinstance(k, Kernel):
            for b in k.stores:
                key = (b.layout.numel, b.dtype)
                cands = pool.get(key) if config.reuse_buffers else None
                allocs[b.name] = ("reuse", cands.pop()) if cands else ("alloc", None)
                produced_at[b.name] = (i, key)
        else:
            outs = k.node.outputs or [k.node]
            for b in outs:
                if b.layout is not None:
                    produced_at[b.name] = (i, None)
        for name, li in list(last_use.items()):
            if li == i and name in produced_at and name not in keep:
                frees[i].append(name)
                key = produced_at[name][1]
                if key is not None:
                    pool.setdefault(key, []).append(name)
                del last_use[name]
        for name, (pi, key) in produced_at.items():
            if pi == i and name not in last_use and name not in keep and key is not None \
                    and name not in frees[i]:
                pool.setdefault(key, []).append(name)
    return {"allocs": allocs, "frees": frees, "keep": keep}


ARENA_ALIGN = 512                    # bytes: each arena view's offset (CuPy's pool rounds blocks to 512 too)


def plan_arena(order, memory: dict) -> tuple:
    """({buffer name: byte offset}, total bytes): the kernels' temporaries of a graph with static sizes
    (stored by a kernel, dead before the call returns: in `memory`'s free lists) placed in one arena,
    first fit, so two that are live at once never overlap. A temporary lives from the step storing it
    through the step that last reads it (its free list's step; the storing step when nothing reads it),
    so a step's stores never share memory with what that step reads."""
    dies: dict = {}
    for i, names in enumerate(memory["frees"]):
        for name in names:
            dies[name] = i
    offsets: dict = {}
    live: list = []                  # (offset, end, last step) of the placed temporaries
    total = 0
    for i, k in enumerate(order):
        if not isinstance(k, Kernel):
            continue
        live = [blk for blk in live if blk[2] >= i]
        for b in k.stores:
            if b.name in memory["keep"] or b.name not in memory["allocs"] or b.layout.is_symbolic():
                continue
            size = -(-b.layout.numel * b.dtype.itemsize // ARENA_ALIGN) * ARENA_ALIGN or ARENA_ALIGN
            at = 0
            for off, end, _ in sorted(live):
                if at + size <= off:
                    break
                at = max(at, end)
            offsets[b.name] = at
            live.append((at, at + size, dies.get(b.name, i)))
            total = max(total, at + size)
    return offsets, total

