"""Triton code generation: one `@triton.jit` function per scheduled kernel.

The same scheduler.Kernel the C++ backend prints as a loop nest becomes a Triton program over 2-D
blocks: the kernel's outer loop (all outer dims flattened into `xindex`) is the program grid, a
block of XBLOCK outer indices per program; each step loops over its inner dims (flattened into
`r<i>index`) in blocks of R<i>BLOCK, or takes them in one block when they fit (a *persistent*
step: the whole row is in registers). Values are `[XBLOCK, R<i>BLOCK]` blocks; a reduction
step's result is `[XBLOCK, 1]` and broadcasts into the steps after it (LayerNorm: mean, variance,
then the normalised output, one kernel). A kernel without an outer loop and with one pointwise
step takes its elements as `xindex` (a flat 1-D grid). A lone reduction with too few outputs to
fill the GPU (a full reduction: one) is *split*: a 2-D grid of (x block, part) programs reduces
the parts into a workspace, and a second kernel combines each output's parts (`SplitPlan`); so are
several independent reductions over the same elements (BatchNorm's per-channel sums, the pointwise
steps after them running in the second kernel).
Scatter kernels (index_put, scatter_add) copy the destination, then write every scattered element
at once (atomic adds for sums; plain stores, where duplicates land in an unspecified order as on
PyTorch's cuda); products, min/max and narrow-dtype sums store element by element in one program.

`TritonHandler` interprets the `ops` namespace by emitting Triton statements: every pointwise op
prints its declared Triton spelling (`op.pointwise.triton`, `flambeau._ops._spelling`), whose
helpers (`TRITON_HELPERS`) head the generated module. bfloat16/float16 values are loaded, computed
and kept in float32 and stored in their own dtype; an explicit cast to them rounds.

Index arithmetic prints the `Index` expressions over the loop variables; sizes of a dynamic graph
are the kernel's trailing integer arguments, so one kernel serves every size. An index read from a
tensor (gather, embedding) is bounds-checked: a bad one sets the graph's error flag (`fl_err`), which
the wrapper reads after the kernels and raises as the C++ path does.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .. import _dtype as D
from .._ops._spelling import KIND, TRITON_HELPERS
from . import config
from .index import FloorDiv, Index, Indirect, Sym, contiguous_strides, offset_of
from .ir import CAST, Handler, Unsupported, ops, set_handler
from .scheduler import expand_groups, strip
from .triton_schedule import SPLIT_MAX_PARTS, SPLIT_MIN_BLOCKS, ComboKernel, SplitPlan, split_programs, would_split
from .sizevars import SizeExpr, known_nonneg

LOWP = (D.bfloat16, D.float16)
TL = {D.float32: "tl.float32", D.float64: "tl.float64", D.int64: "tl.int64", D.int32: "tl.int32",
      D.int16: "tl.int16", D.int8: "tl.int8", D.uint8: "tl.uint8", D.bool: "tl.int1",
      D.bfloat16: "tl.bfloat16", D.float16: "tl.float16"}
# pointer types of the kernel signature (triton_launch.compile_kernel), by storage dtype
SIGNATURE = {D.float32: "*fp32", D.float64: "*fp64", D.int64: "*i64", D.int32: "*i32", D.int16: "*i16",
             D.int8: "*i8", D.uint8: "*u8", D.bool: "*i1", D.bfloat16: "*bf16", D.float16: "*fp16"}
DTYPES = frozenset(TL)
INT32_LIMIT = 2 ** 31 - 1           # index arithmetic switches to int64 above this many elements

# Triton helpers of the code generator itself (the op spellings' helpers are TRITON_HELPERS).
REDUCE_HELPERS = '''
@triton.jit
def fl_add(a, b):
    return a + b


@triton.jit
def fl_mul(a, b):
    return a * b


@triton.jit
def fl_argmax_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    better = (a > b) | (a_nan & (b_nan == 0))
    same = (a == b) | (a_nan & b_nan)
    take_a = (bi < 0) | ((ai >= 0) & (better | (same & (ai < bi))))
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)


@triton.jit
def fl_argmin_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    better = (a < b) | (a_nan & (b_nan == 0))
    same = (a == b) | (a_nan & b_nan)
    take_a = (bi < 0) | ((ai >= 0) & (better | (same & (ai < bi))))
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)
'''

HEADER = """import triton
import triton.language as tl
from triton.language.extra import libdevice
"""


COLUMN_MIN_XBLOCK = 16          # outputs a column reduction's block spans at least (contiguous loads)


def compute_dtype(dt):
    """The dtype a value of `dt` is computed in (bfloat16/float16 in float32)."""
    return D.float32 if dt in LOWP else dt


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def literal(v, dtype) -> str:
    """A 0-d Triton constant of `dtype` (its compute dtype)."""
    cd = compute_dtype(dtype)
    if isinstance(v, SizeExpr):
        return f"tl.full([], {v}, {TL[cd]})"
    if cd is D.bool:
        return f"tl.full([], {1 if v else 0}, tl.int1)"
    if cd.category == D.FLOATING:
        f = float(v)
        s = repr(f) if math.isfinite(f) else f'float("{f}")'
        return f"tl.full([], {s}, {TL[cd]})"
    iv = int(v) if not isinstance(v, float) or math.isfinite(v) else 0
    iv = int(np.array(iv & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(cd.np)[()])
    return f"tl.full([], {iv}, {TL[cd]})"


class TVar:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name = name
        self.dtype = dtype          # the IR dtype; the Triton value has compute_dtype(dtype)


def _names(index: Index) -> set:
    return {a.name for a in index.atoms() if isinstance(a, (Sym, Indirect))}


def render(e: Index) -> str:
    """Triton source of an index: `//` and `%` truncate, so operands that may be negative go
    through the floor helpers."""
    parts = []
    for a, c in e.terms.values():
        if isinstance(a, (Sym, Indirect)):
            s = a.name
        else:
            inner = render(a.arg)
            try:
                nonneg = known_nonneg(a.arg.bounds()[0])
            except Unsupported:
                nonneg = False
            if isinstance(a, FloorDiv):
                s = f"(({inner}) // {a.div})" if nonneg else f"fl_floordiv_int({inner}, {a.div})"
            else:
                s = f"(({inner}) % {a.div})" if nonneg else f"fl_remainder_int({inner}, {a.div})"
        parts.append(s if c == 1 else f"{c}*{s}" if isinstance(c, int) else f"({c})*{s}")
    if e.const != 0 or not parts:
        parts.append(str(e.const))
    return " + ".join(parts)


class TritonHandler(Handler):
    def __init__(self, printer: "TritonKernelPrinter"):
        self.p = printer
        self.masks: list = []          # enclosing `ops.masked` conditions (TVar names)

    def _emit(self, expr: str, dtype) -> TVar:
        p = self.p
        hit = p.cse.get(expr)
        if hit is not None:
            return hit
        v = TVar(f"tmp{p.n_tmp}", dtype)
        p.n_tmp += 1
        p.line(f"{v.name} = {expr}")
        p.cse[expr] = v
        return v

    def _op(self, op, args, dtype):
        sp = op.pointwise
        t = args[0].dtype
        if op.name == "nextafter" and dtype in LOWP:
            raise Unsupported("nextafter steps in the storage dtype; the Triton backend computes half precision in "
                              "float32")
        tmpl = sp.by_kind["triton"][KIND[dtype if sp.by_result else t]]
        if tmpl is None:
            raise Unsupported(f"{op.name} has no Triton spelling for {t.name} operands")
        expr = tmpl.format(*(x.name for x in args), T=TL[compute_dtype(dtype)])
        if op is CAST and dtype in LOWP:           # a cast to half precision rounds, then computes on in fp32
            expr = f"({args[0].name}).to({TL[dtype]}).to(tl.float32)"
        return self._emit(expr, dtype)

    def _mask_for(self, names: set, full: bool) -> str | None:
        p = self.p
        parts = []
        if full or names & p.x_names:
            parts.append("xmask")
        if p.r_mask and (full or names & p.r_names):
            parts.append(p.r_mask)
        if self.masks:
            parts.append(self.masks[-1])
        return " & ".join(parts) if parts else None

    def _address(self, buf_name: str, index: Index) -> tuple:
        """(pointer expression, mask) of element `index` of a buffer: a pointer block as wide as
        the index's variables, or the full block where an indirect index or an enclosing mask
        decides which lanes are live."""
        names = _names(index)
        full = bool(self.masks) or bool(names - self.p.x_names - self.p.r_names)
        ptr = f"{buf_name} + ({render(index)})"
        if full:
            ptr = f"tl.broadcast_to({ptr}, {self.p.block_shape()})"
        return ptr, self._mask_for(names, full)

    def load(self, buf, index):
        loc = self.p.locals.get(buf.name)
        if loc is not None:
            return loc
        ptr, mask = self._address(buf.name, index)
        m = f", mask={mask}, other=0" if mask else ""
        up = ".to(tl.float32)" if buf.dtype in LOWP else ""
        return self._emit(f"tl.load({ptr}{m}){up}", buf.dtype)

    def constant(self, value, dtype):
        return self._emit(literal(value, dtype), dtype)

    def index_expr(self, index, dtype):
        return self._emit(f"({render(index)} + tl.zeros([], tl.int32)).to({TL[compute_dtype(dtype)]})", dtype)

    def indirect_indexing(self, value, size, wrap=True):
        p = self.p
        p.uses_error_flag = True
        v = self._emit(f"({value.name}).to(tl.int64)", D.int64)
        if wrap:
            v = self._emit(f"tl.where({v.name} < 0, {v.name} + {size}, {v.name})", D.int64)
        bad = self._emit(f"({v.name} < 0) | ({v.name} >= {size})", D.bool)
        live = [m for m in ("xmask", p.r_mask, self.masks[-1] if self.masks else None) if m]
        cond = " & ".join([bad.name] + live)
        code = 1 if wrap else 3
        p.line(f"tl.store(tl.broadcast_to(fl_err, {p.block_shape()}), "
               f"tl.full({p.block_shape()}, {code}, tl.int32), mask={cond})")
        safe = self._emit(f"tl.where({bad.name}, 0, {v.name})", D.int64)
        return Index.of(Indirect(safe.name, size))

    def masked(self, mask, body, other):
        p = self.p
        saved = p.cse
        p.cse = dict(saved)
        outer = self.masks[-1] if self.masks else None
        m = mask.name if outer is None else self._emit(f"{outer} & {mask.name}", D.bool).name
        self.masks.append(m)
        try:
            v = body()
        finally:
            self.masks.pop()
            p.cse = saved
        o = literal(other, v.dtype)
        return self._emit(f"tl.where({mask.name}, {v.name}, {o})", v.dtype)


def node_index(n, syms_iter, ranges) -> list:
    return [next(syms_iter) if s != 1 else Index() for s in ranges]


class LaunchBuffer(NamedTuple):
    """A buffer a kernel takes as a pointer: what a Launch keeps of it (not the IR node, whose
    lowering state is freed once the graph is compiled)."""
    name: str
    dtype: object


@dataclass
class Launch:
    """How the wrapper launches one generated kernel: its name, pointer and size arguments, the
    grid's x extent (an int or Python source over the size symbols), its block sizes."""
    name: str
    buffers: list                   # LaunchBuffers passed as pointers, in order (loads, then stores)
    size_names: list
    xnumel: object                  # int | SizeExpr: outer elements
    xblock: int
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    error_flag: bool = False
    single_program: bool = False
    then: "Launch | None" = None     # a second kernel launched after this one, on the same arguments
    splits: int = 1                  # programs along the grid's second axis (a split reduction's parts)
    workspace: list = field(default_factory=list)   # [(name, dtype, numel)]: scratch arrays passed last
    num_stages: int = 1              # software pipelining stages (mm_template.py's products use more)

    def grid(self, sizes: dict) -> tuple:
        """The launch grid, given the size symbols' values."""
        if self.single_program:
            return (1,)
        n = self.xnumel if isinstance(self.xnumel, int) else self.xnumel.evaluate(sizes)
        g = -(-n // self.xblock)
        return (g, self.splits) if self.splits > 1 else (g,)

    def signature(self) -> dict:
        sig = {b.name: SIGNATURE[b.dtype] for b in self.buffers}
        sig.update({s: "i64" for s in self.size_names})
        if self.error_flag:
            sig["fl_err"] = "*i32"
        sig.update({w: SIGNATURE[dt] for w, dt, _ in self.workspace})
        sig.update({k: "constexpr" for k in self.constexprs})
        return sig


class TritonKernelPrinter:
    """Print one scheduler.Kernel as a `@triton.jit` function and its `Launch`."""

    def __init__(self, kernel, size_names=(), interpret: bool = False):
        self.k = kernel
        self.size_names = list(size_names)
        self.interpret = interpret
        self.lines: list = []
        self.cse: dict = {}
        self.locals: dict = {}
        self.n_tmp = 0
        self.depth = 1
        self.x_names: set = set()
        self.r_names: set = set()
        self.r_mask: str | None = None
        self.r_block: str | None = None
        self.uses_error_flag = False
        self.int64 = False
        self.sources: list = []

    def line(self, s: str):
        self.lines.append("    " * self.depth + s)

    def block_shape(self) -> str:
        return f"[XBLOCK, {self.r_block}]" if self.r_block else "[XBLOCK, 1]"

    # ---- sizes and blocks ----------------------------------------------------------------------
    def _target_elems(self) -> int:
        return config.triton_interpret_block if self.interpret else config.triton_block

    def generate(self) -> tuple:
        """(source of the jit function(s), Launch): a parallel scatter is two functions, the copy
        and then the scatter (`Launch.then`)."""
        k = self.k
        numels = [b.layout.numel for b in k.loads + k.stores]
        self.int64 = any(not isinstance(n, int) or n > INT32_LIMIT for n in numels)     # (symbolic: any size)
        with set_handler(TritonHandler(self)):
            if k.scatter is not None and _parallel_scatter(k.scatter.buf.data):
                first = self._function(k.name, self._scatter_copy)
                first.then = self._function(k.name + "_scatter", self._scatter_parallel)
                return "\n\n".join(self.sources), first
            plan = self._split_plan()
            if plan is not None:
                first = self._function(k.name, lambda: self._split_partials(plan))
                first.then = self._function(k.name + "_final", lambda: self._split_final(plan))
                return "\n\n".join(self.sources), first
            if k.scatter is not None:
                launch = self._function(k.name, self._scatter)
            elif not k.outer and len(k.steps) == 1 and k.steps[0].kind == "pointwise":
                launch = self._function(k.name, lambda: self._flat(k.steps[0]))
            else:
                launch = self._function(k.name, self._rows)
        return "\n\n".join(self.sources), launch

    def _function(self, name, body) -> Launch:
        """Print one jit function named `name` whose statements `body()` emits (returning its Launch)."""
        self.lines, self.cse, self.n_tmp, self.uses_error_flag = [], {}, 0, False
        self.x_names, self.r_names = set(), set()
        launch = body()
        launch.name = name
        launch.error_flag = self.uses_error_flag
        params = [b.name for b in launch.buffers] + self.size_names + (["fl_err"] if self.uses_error_flag else []) + \
            [w for w, _, _ in launch.workspace] + [f"{c}: tl.constexpr" for c in launch.constexprs]
        self.sources.append(f"@triton.jit\ndef {name}({', '.join(params)}):\n" + "\n".join(self.lines) + "\n")
        return launch

    def _launch(self, xnumel, xblock, consts, warps=4, single=False) -> Launch:
        return Launch(self.k.name, [LaunchBuffer(b.name, b.dtype) for b in (*self.k.loads, *self.k.stores)],
                      self.size_names, xnumel, xblock,
                      dict(XBLOCK=xblock, **consts), warps, single_program=single)

    def _x_vars(self, groups, xnumel):
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        self.line(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.line(f"xmask = xindex < {xnumel}")
        return self._split("x", "xindex", groups, self.x_names)

    def _split(self, prefix, flat, groups, names: set) -> list:
        """Per-dim index expressions of the flat index `flat` over merged dim groups."""
        sizes = [math.prod(g) for g in groups]
        syms = []
        for j, s in enumerate(sizes):
            below = math.prod(sizes[j + 1:])
            e = flat if below == 1 else f"({flat} // {below})"
            if j > 0:
                e = f"({e} % {s})"
            name = f"{prefix}{j}"
            self.line(f"{name} = {e}")
            names.add(name)
            syms.append(Index.of(Sym(name, s)))
        return expand_groups(groups, syms)

    def _flat(self, step) -> Launch:
        """A kernel of one pointwise step without an outer loop: its elements are the grid."""
        n = math.prod(step.inner)
        xblock = self._block_for(n)
        self.r_block = None
        idx_all = self._x_vars(step.inner_groups, n)
        self._store_step(step, [], idx_all)
        return self._launch(n, xblock, {}, self._warps(xblock))

    def _block_for(self, n) -> int:
        target = self._target_elems()
        return min(target, next_pow2(n)) if isinstance(n, int) else target

    def _warps(self, elems: int) -> int:
        return 8 if elems >= 2048 else 4 if elems >= 256 else 2 if elems >= 64 else 1

    def _rows(self) -> Launch:
        """A kernel with an outer loop (or a full reduction): XBLOCK outer indices per program."""
        k = self.k
        xnumel = math.prod(k.outer)
        rn = [math.prod(s.inner) for s in k.steps]
        static = all(isinstance(r, int) for r in rn)
        persistent = static and next_pow2(max(rn, default=1)) <= config.triton_persistent_limit
        target = self._target_elems()
        if persistent and k.column and target // next_pow2(max(rn, default=1)) < COLUMN_MIN_XBLOCK:
            # a column reduction's outputs are the contiguous dim: a persistent block of few outputs reads
            # each row with a stride (one element per memory sector: a channels-last ResNet-50 BatchNorm
            # backward over 3136x2048 as [1, 4096] blocks took 0.67 ms on the H100); loop over row blocks
            persistent = False
        if persistent:
            rblocks = [next_pow2(r) if r > 1 else 1 for r in rn]
            xblock = max(1, target // max(rblocks, default=1))
            if isinstance(xnumel, int):
                xblock = min(xblock, next_pow2(xnumel))
        elif k.column:
            xblock, rblocks = config.triton_column_block
            rblocks = [rblocks if (r != 1) else 1 for r in rn]
        else:
            xblock = 1
            rblocks = [min(config.triton_loop_block, next_pow2(r)) if isinstance(r, int) else config.triton_loop_block
                       for r in rn]
            rblocks = [b if r != 1 else 1 for b, r in zip(rblocks, rn)]
        single = not k.outer
        if single:
            xblock = 1
        xouter = self._x_vars(k.outer_groups, xnumel)
        consts = {f"R{i}BLOCK": rb for i, rb in enumerate(rblocks)}
        for run in self.reduction_groups(0, len(k.steps)):
            i, step = run[0]
            rb, r = rblocks[i], rn[i]
            self.cse = {}
            self._barrier_if_needed(i)
            name = f"R{i}BLOCK"
            loop = not (persistent or (isinstance(r, int) and r <= rb))
            if step.kind == "reduction":
                for n, idx, res in self._accumulate_many(run, xouter, name, r, loop):
                    self._reduced(n, idx, res)
            else:
                self._pointwise(step, xouter, i, name, r, loop)
        widest = max(rblocks, default=1) * xblock
        return self._launch(xnumel, xblock, consts, self._warps(widest), single)

    # ---- split reductions ------------------------------------------------------------------------
    def _split_steps(self) -> int:
        """How many leading steps of the kernel a split can take: its reductions, each of one node,
        over the same number of inner elements, none reading another's result (BatchNorm's backward:
        sum(dy) and sum(dy * x_hat) over (N, H, W) per channel), followed only by pointwise steps
        (run by the final kernel); 0 when the kernel is not of that form."""
        k = self.k
        n_red = 0
        while n_red < len(k.steps) and k.steps[n_red].kind == "reduction":
            n_red += 1
        reds, rest = k.steps[:n_red], k.steps[n_red:]
        if not reds or any(s.kind != "pointwise" for s in rest) or any(len(s.nodes) != 1 or not s.inner_groups
                                                                       for s in reds):
            return 0
        rn = {math.prod(s.inner) for s in reds + rest}
        names = {s.nodes[0].name for s in reds}
        if (n_red > 1 or rest) and (not all(isinstance(r, int) for r in rn) or len({math.prod(s.inner) for s in reds})
                                    > 1 or any(s.nodes[0].read_names & names for s in reds)):
            return 0
        return n_red

    def _split_plan(self) -> "SplitPlan | None":
        """How to cut the reductions of a kernel with too few programs for the GPU (a full reduction
        is one program; a column sum over many rows, or BatchNorm's per-channel sums, a handful) into
        parts: None to keep one pass."""
        k = self.k
        n_red = self._split_steps() if k.scatter is None else 0
        if not n_red:
            return None
        xnumel, rnumel = math.prod(k.outer), math.prod(k.steps[0].inner)
        if not isinstance(xnumel, int):
            return None
        target = split_programs(self.interpret)
        if k.column:
            xblock, rblock = config.triton_column_block
        else:
            xblock, rblock = 1, config.triton_loop_block if not self.interpret else self._target_elems()
        if not isinstance(rnumel, int):                # sizes known at run time: full reductions only
            return SplitPlan(target, xblock, rblock, 1) if xnumel == 1 and len(k.steps) == 1 else None
        if not would_split(xnumel, rnumel, k.column, self.interpret):
            return None
        rblock = min(rblock, next_pow2(rnumel))
        parts = min(target // -(-xnumel // xblock), -(-rnumel // (rblock * SPLIT_MIN_BLOCKS)), SPLIT_MAX_PARTS)
        parts = 1 << (parts.bit_length() - 1) if parts > 0 else 0
        return SplitPlan(parts, xblock, rblock, n_red) if parts >= 2 else None

    def _split_workspace(self, plan) -> list:
        """[(name, dtype, numel)]: each split reduction's partial results (`ws<i>_v`; an arg reduction's
        indices `ws<i>_i`), one per (part, output)."""
        n = plan.parts * math.prod(self.k.outer)
        out = []
        for i, step in enumerate(self.k.steps[:plan.reductions]):
            red = step.nodes[0].buf.data
            rt = red.reduction_type
            if rt in ("any", "all"):
                out.append((f"ws{i}_v", D.int8, n))
                continue
            out.append((f"ws{i}_v", _ACC_DTYPES[_acc_init(rt, compute_dtype(red.src_dtype))[0]], n))
            if rt in ("argmax", "argmin"):
                out.append((f"ws{i}_i", D.int64, n))
        return out

    def _split_partials(self, plan) -> Launch:
        """The first kernel of a split reduction: program (x block, part) reduces its part of the
        inner elements of each reduction into the workspace, at [part, x]."""
        k = self.k
        xnumel, rnumel = math.prod(k.outer), math.prod(k.steps[0].inner)
        pid = "tl.program_id(1).to(tl.int64)" if self.int64 else "tl.program_id(1)"
        self.line(f"rpart = {pid}")
        xouter = self._x_vars(k.outer_groups, xnumel)
        at = f"rpart * {xnumel} + xindex"
        ws = dict((w, dt) for w, dt, _ in self._split_workspace(plan))
        consts = {f"R{i}BLOCK": plan.rblock for i in range(plan.reductions)}
        for run in self.reduction_groups(0, plan.reductions):
            i0 = run[0][0]
            self.cse = {}
            done = self._accumulate_many(run, xouter, f"R{i0}BLOCK", rnumel, True,
                                         span=(f"rpart * R{i0}BLOCK", plan.parts * plan.rblock))
            for (i, _), (n, idx, res) in zip(run, done):
                if n.buf.data.reduction_type in ("argmax", "argmin"):
                    self.line(f"tl.store(ws{i}_v + ({at}), acc{i}_v[:, None], mask=xmask)")
                    self.line(f"tl.store(ws{i}_i + ({at}), acc{i}_r[:, None], mask=xmask)")
                else:
                    self.line(f"tl.store(ws{i}_v + ({at}), ({res}).to({TL[ws[f'ws{i}_v']]})[:, None], mask=xmask)")
        la = self._launch(xnumel, plan.xblock, consts, self._warps(plan.xblock * plan.rblock))
        la.splits, la.workspace = plan.parts, self._split_workspace(plan)
        return la

    def _split_final(self, plan) -> Launch:
        """The second kernel: each output reduces its parts' partial results, then the kernel's
        pointwise steps after the reductions run on them."""
        k = self.k
        xnumel = math.prod(k.outer)
        rest = k.steps[plan.reductions:]
        rn = [math.prod(s.inner) for s in rest]
        rblocks = [min(self._target_elems() if self.interpret else config.triton_loop_block, next_pow2(r))
                   if r > 1 else 1 for r in rn]
        xblock = max(1, min(config.triton_block // max([plan.parts] + rblocks), next_pow2(xnumel)))
        xouter = self._x_vars(k.outer_groups, xnumel)
        self.line(f"rp = tl.arange(0, {next_pow2(plan.parts)})[None, :]")
        self.line(f"rpmask = rp < {plan.parts}")
        at = f"rp * {xnumel} + xindex"
        for i, step in enumerate(k.steps[:plan.reductions]):
            n = step.nodes[0]
            red = n.buf.data
            rt = red.reduction_type
            init = "0" if rt in ("any", "all") else _acc_init(rt, compute_dtype(red.src_dtype))[1]
            self.line(f"part{i} = tl.load(ws{i}_v + ({at}), mask=xmask & rpmask, other={init})")
            if rt in ("argmax", "argmin"):
                self.line(f"part{i}_i = tl.load(ws{i}_i + ({at}), mask=xmask & rpmask, other=-1)")
                self.line(f"_, part{i}_r = tl.reduce((part{i}, part{i}_i), 1, fl_{rt}_combine)")
                res = f"tl.where(part{i}_r < 0, 0, part{i}_r)"
            elif rt in ("any", "all"):
                res = f"tl.{'max' if rt == 'any' else 'min'}(tl.where(rpmask, part{i}, {1 if rt == 'all' else 0}), 1) != 0"
            else:
                res = _final(rt, f"part{i}")
            self._reduced(n, node_index(n, iter(xouter), n.ranges), res)
        consts = {}
        for j, (step, rb, r) in enumerate(zip(rest, rblocks, rn)):
            i = plan.reductions + j
            self.cse = {}
            self._barrier_if_needed(i)
            consts[f"R{i}BLOCK"] = rb
            self._pointwise(step, xouter, i, f"R{i}BLOCK", r, r > rb)
        la = self._launch(xnumel, xblock, consts, self._warps(xblock * max([plan.parts] + rblocks)))
        la.workspace = self._split_workspace(plan)
        return la

    def _barrier_if_needed(self, i):
        """Before a step reading memory an earlier step of this kernel stored (another lane wrote it)."""
        k = self.k
        stored = {b.name for s in k.steps[:i] for n in s.nodes for b in [n.buf] if b in k.stores}
        if any(r in stored for n in k.steps[i].nodes for r in n.read_names):
            self.line("tl.debug_barrier()")

    def _open_r(self, i, block, rnumel, loop, groups, span=None) -> list:
        """Open step i's inner loop (or block): its index variables. `span` (first, stride): the loop
        takes the blocks starting at first, first + stride, ... only (a split reduction's part)."""
        if rnumel == 1 or not groups:
            self.r_mask = self.r_block = None
            return []
        self.r_block = block
        if span is not None:
            self.line(f"for r{i}offset in range(0, {rnumel}, {span[1]}):")
            self.depth += 1
            self.line(f"r{i}index = {span[0]} + r{i}offset + tl.arange(0, {block})[None, :]")
        elif loop:
            self.line(f"for r{i}offset in range(0, {rnumel}, {block}):")
            self.depth += 1
            self.line(f"r{i}index = r{i}offset + tl.arange(0, {block})[None, :]")
        else:
            self.line(f"r{i}index = tl.arange(0, {block})[None, :]")
        self.line(f"r{i}mask = r{i}index < {rnumel}")
        self.r_mask = f"r{i}mask"
        self.r_names = set()
        return self._split(f"r{i}_", f"r{i}index", groups, self.r_names)

    def _pointwise(self, step, xouter, i, block, rnumel, loop):
        rsyms = self._open_r(i, block, rnumel, loop, step.inner_groups)
        self._store_step(step, xouter, xouter + rsyms)
        if loop and self.r_mask:
            self.depth -= 1
        if self.r_block:                  # values of this step's r block: later steps read memory (a
            for n in step.nodes:          # step without inner dims leaves [XBLOCK, 1] values, kept)
                self.locals.pop(n.name, None)
        self.r_mask = self.r_block = None

    def _store_step(self, step, xouter, all_syms):
        """Compute (and store, unless local) each node of a pointwise step. A later node of the step
        reads an earlier one's value from its register, never from the memory just stored: the
        lane that loads an element need not be the lane that stored it (a race on the GPU)."""
        for n in step.nodes:
            idx = node_index(n, iter(all_syms), n.ranges)
            v = ops.to_dtype(n.buf.data.inner_fn(idx), n.buf.dtype)
            self.locals[n.name] = v
            if n.name not in self.k.locals:
                self._store(n.name, offset_of(idx, contiguous_strides(n.ranges)), v, n.buf.dtype)

    def _store(self, name, off: Index, v, dtype):
        names = _names(off)
        mask = _store_mask(self, names)
        val = v.name if dtype not in LOWP and dtype is not D.bool else f"({v.name}).to({TL[dtype]})"
        ptr = f"{name} + ({render(off)})"
        if not names:                        # one element (a 0-d output): lanes past xnumel are masked
            ptr, mask = f"tl.broadcast_to({ptr}, [XBLOCK, 1])", "xmask"
        self.line(f"tl.store({ptr}, {val}{', mask=' + mask if mask else ''})")

    def _reduced(self, n, idx, res: str):
        """Bind (and store, unless local) a reduction node's result, `res` a [XBLOCK] expression."""
        dt = n.buf.data.dtype
        self.line(f"{n.name}_v = ({res}).to({TL[compute_dtype(dt)]})[:, None]")
        val = TVar(f"{n.name}_v", dt)
        self.locals[n.name] = val
        if n.name not in self.k.locals:
            self._store(n.name, offset_of(idx, contiguous_strides(n.ranges)), val, dt)

    def _accumulate_many(self, group, xouter, block, rnumel, loop, span=None) -> list:
        """Print the reductions of steps [(i, step)] over their (same) inner elements, those of `span`
        (see _open_r), in one loop: [(node, its output index, the reduced [XBLOCK] expression)]; an
        arg reduction also leaves `acc<i>_v`/`acc<i>_r`, the value and index of its winner. Several
        steps (`reduction_groups`) load each element's inputs once for all of them (BatchNorm's
        backward reduces dy, dy * x_hat and their scaled forms over the same (N, H, W) per channel:
        separate loops re-read every operand once per reduction). Loop and index names are the first
        step's."""
        i0, first = group[0]
        has_r = rnumel != 1 and bool(first.inner_groups)
        shape = f"[XBLOCK, {block}]" if has_r else "[XBLOCK, 1]"
        loop = (loop or span is not None) and has_r
        kinds = []
        for i, step in group:
            red = step.nodes[0].buf.data
            acc_t, init = _acc_init(red.reduction_type, compute_dtype(red.src_dtype))
            kinds.append((f"acc{i}", red.reduction_type, acc_t, init))
            if loop:
                self.line(f"acc{i} = tl.full({shape}, {init}, {acc_t})")
                if red.reduction_type in ("argmax", "argmin"):
                    self.line(f"acc{i}_i = tl.full({shape}, -1, tl.int64)")
        rsyms = self._open_r(i0, block, rnumel, loop, first.inner_groups, span)
        live = f"r{i0}mask" if has_r else None
        rflat = f"r{i0}index" if has_r else "0"
        out = []
        for (i, step), (acc, rt, acc_t, init) in zip(group, kinds):
            n = step.nodes[0]
            red = n.buf.data
            idx = node_index(n, iter(xouter), n.ranges)
            ridx = node_index(n, iter(rsyms), n.reduction_ranges)
            x = ops.to_dtype(red.inner_fn(idx, ridx), red.src_dtype).name
            xv = f"tl.broadcast_to(({x}).to({acc_t}), {shape})"
            if live:
                xv = f"tl.where({live}, {xv}, tl.full([], {init}, {acc_t}))"
            if rt in ("argmax", "argmin"):
                iv = f"tl.broadcast_to(({rflat} + tl.zeros([], tl.int64)), {shape})"
                if live:
                    iv = f"tl.where({live}, {iv}, tl.full([], -1, tl.int64))"
                if loop:
                    self.line(f"{acc}, {acc}_i = fl_{rt}_combine({acc}, {acc}_i, {xv}, {iv})")
                else:
                    self.line(f"{acc} = {xv}")
                    self.line(f"{acc}_i = {iv}")
            elif loop:
                self.line(f"{acc} = {_combine(rt, acc, xv)}")
            else:
                self.line(f"{acc} = {xv}")
            out.append((n, idx))
        if loop:
            self.depth -= 1
        self.r_mask = self.r_block = None
        done = []
        for (n, idx), (acc, rt, _, _) in zip(out, kinds):
            if rt in ("argmax", "argmin"):
                self.line(f"{acc}_v, {acc}_r = tl.reduce(({acc}, {acc}_i), 1, fl_{rt}_combine)")
                done.append((n, idx, f"tl.where({acc}_r < 0, 0, {acc}_r)"))
            else:
                done.append((n, idx, _final(rt, acc)))
        return done

    def reduction_groups(self, first: int, last: int) -> list:
        """Steps first..last-1 of the kernel as runs [(i, step)] printed together: consecutive
        reduction steps of one node each over the same inner dims, none reading another's result or
        memory an earlier step of the kernel stored, share one loop (`_accumulate_many`); every
        other step is a run of its own."""
        k = self.k
        runs: list = []
        for i in range(first, last):
            step = k.steps[i]
            run = runs[-1] if runs else None
            if run and step.kind == "reduction" and len(step.nodes) == 1 and self._joins(run, i, step):
                run.append((i, step))
            else:
                runs.append([(i, step)])
        return runs

    def _joins(self, run, i, step) -> bool:
        i0, head = run[0]
        if head.kind != "reduction" or len(head.nodes) != 1 or step.inner != head.inner or \
                step.inner_groups != head.inner_groups or not step.inner_groups:
            return False
        names = {s.nodes[0].name for _, s in run}
        k = self.k
        stored = {n.buf.name for s in k.steps[:i] for n in s.nodes if n.buf in k.stores}
        reads = step.nodes[0].read_names
        return not (reads & names) and not (reads & stored)

    def _scatter_copy(self) -> Launch:
        """The first kernel of a parallel scatter: the destination's initial values, a flat grid."""
        n = self.k.scatter
        sc = n.buf.data
        total = math.prod(sc.ranges)
        xblock = self._block_for(total)
        idx = node_index(n, iter(self._x_vars([(s,) for s in strip(sc.ranges)], total)), sc.ranges)
        v = ops.to_dtype(sc.init_fn(idx), sc.dtype)
        self._store(n.name, offset_of(idx, contiguous_strides(sc.ranges)), v, sc.dtype)
        return self._launch(total, xblock, {}, self._warps(xblock))

    def _scatter_parallel(self) -> Launch:
        """The second kernel of a parallel scatter: every scattered element at once, stored (the
        targets never collide) or added atomically."""
        n = self.k.scatter
        sc = n.buf.data
        count = math.prod(sc.scatter_ranges)
        xblock = self._block_for(count)
        idx = node_index(n, iter(self._x_vars([(s,) for s in strip(sc.scatter_ranges)], count)), sc.scatter_ranges)
        target = render(sc.target_fn(idx))
        v = ops.to_dtype(sc.value_fn(idx), sc.dtype)
        ptr = f"tl.broadcast_to({n.name} + ({target}), [XBLOCK, 1])"
        fn = "tl.atomic_add" if sc.reduce == "sum" else "tl.store"
        self.line(f"{fn}({ptr}, tl.broadcast_to({v.name}, [XBLOCK, 1]), mask=xmask)")
        return self._launch(count, xblock, {}, self._warps(xblock))

    def _scatter(self) -> Launch:
        """One program: copy the destination in blocks, then each scattered element in order (a
        scatter that is neither collision-free nor an atomic sum: products, min/max, stores that
        may hit one element twice, narrow dtypes)."""
        n = self.k.scatter
        sc = n.buf.data
        total = math.prod(sc.ranges)
        xblock = self._block_for(total)
        self.line(f"for xoffset in range(0, {total}, XBLOCK):")
        self.depth += 1
        self.line("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        self.line(f"xmask = xindex < {total}")
        idx = node_index(n, iter(self._split("x", "xindex", [(s,) for s in strip(sc.ranges)], self.x_names)), sc.ranges)
        v = ops.to_dtype(sc.init_fn(idx), sc.dtype)
        self._store(n.name, offset_of(idx, contiguous_strides(sc.ranges)), v, sc.dtype)
        self.depth -= 1
        self.cse = {}
        self.line("tl.debug_barrier()")
        count = math.prod(sc.scatter_ranges)
        self.line(f"for zflat in range(0, {count}):")
        self.depth += 1
        self.line("zindex = zflat + tl.zeros([1, 1], tl.int32)")
        self.line("xmask = zindex >= 0")
        self.x_names = set()
        dims = [(s,) for s in strip(sc.scatter_ranges)]
        idx = node_index(n, iter(self._split("z", "zindex", dims, self.x_names)), sc.scatter_ranges)
        target = render(sc.target_fn(idx))
        v = ops.to_dtype(sc.value_fn(idx), sc.dtype)
        ptr = f"tl.broadcast_to({n.name} + ({target}), [1, 1])"
        val = v.name
        if sc.reduce is not None:
            cur = f"tl.load({ptr})" + (".to(tl.float32)" if sc.dtype in LOWP else "")
            self.line(f"cur = {cur}")
            if sc.dtype is D.bool:
                val = f"(cur | {v.name})" if sc.reduce in ("sum", "max") else f"(cur & {v.name})"
            else:
                val = {"sum": f"cur + {v.name}", "prod": f"cur * {v.name}", "max": f"fl_max(cur, {v.name})",
                       "min": f"fl_min(cur, {v.name})"}[sc.reduce]
        if sc.dtype in LOWP or sc.dtype is D.bool:
            val = f"({val}).to({TL[sc.dtype]})"
        self.line(f"tl.store({ptr}, tl.broadcast_to({val}, [1, 1]))")
        self.line("tl.debug_barrier()")
        self.depth -= 1
        return self._launch(1, xblock, {}, 4, single=True)


_ACC_DTYPES = {t: d for d, t in TL.items() if d is not D.bool}     # accumulator type -> workspace dtype

ATOMIC_ADD_DTYPES = (D.float32, D.float64, D.int32, D.int64)


def _parallel_scatter(sc) -> bool:
    """Whether a Scatter's elements may be written all at once: plain stores (where two hit one
    element, which lands is unspecified, as PyTorch's index_put/scatter on cuda say), or sums
    through `tl.atomic_add`. Products, min/max and narrow-dtype sums keep the serial program."""
    if sc.reduce is None:
        return True
    return sc.reduce == "sum" and sc.dtype in ATOMIC_ADD_DTYPES


def _store_mask(p: TritonKernelPrinter, names: set) -> str | None:
    parts = []
    if names & p.x_names:
        parts.append("xmask")
    if p.r_mask and names & p.r_names:
        parts.append(p.r_mask)
    return " & ".join(parts) if parts else None


def _acc_init(rt, cs) -> tuple:
    """(Triton accumulator type, initial value) of a reduction over values of compute dtype `cs`."""
    if rt in ("any", "all"):
        return "tl.int1", "1" if rt == "all" else "0"
    at = D.int64 if cs is D.bool else cs
    if rt == "sum":
        return TL[at], "0"
    if rt == "prod":
        return TL[at], "1"
    if at.category == D.FLOATING:
        return TL[at], 'float("-inf")' if rt in ("max", "argmax") else 'float("inf")'
    info = np.iinfo(at.np)
    return TL[at], str(info.min if rt in ("max", "argmax") else info.max)


def _combine(rt, acc, x) -> str:
    return {"sum": f"{acc} + {x}", "prod": f"{acc} * {x}", "max": f"fl_max({acc}, {x})",
            "min": f"fl_min({acc}, {x})", "any": f"{acc} | {x}", "all": f"{acc} & {x}"}[rt]


def _final(rt, acc) -> str:
    return {"sum": f"tl.sum({acc}, 1)", "prod": f"tl.reduce({acc}, 1, fl_mul)",
            "max": f"tl.reduce({acc}, 1, fl_max)", "min": f"tl.reduce({acc}, 1, fl_min)",
            "any": f"tl.max({acc}.to(tl.int8), 1) != 0", "all": f"tl.min({acc}.to(tl.int8), 1) != 0"}[rt]


def plain_launch(k, size_names=(), interpret: bool = False) -> bool:
    """Whether kernel `k` prints as one launch of a flat grid with XBLOCK its only constexpr (no error flag,
    second kernel, scratch or second grid axis): what a ComboKernel member must be."""
    _, la = TritonKernelPrinter(k, size_names, interpret).generate()
    return la.then is None and not la.error_flag and not la.workspace and la.splits == 1 and \
        not la.single_program and isinstance(la.xnumel, int) and set(la.constexprs) == {"XBLOCK"}


_COMBO_LOCALS = re.compile(r"\b(tmp\d+|xindex|xmask|x\d+)\b")


def _combo(k, size_names, interpret: bool) -> tuple:
    """(source, Launch) of a ComboKernel: one function whose programs [start_i, end_i) run member i's code
    (its block size the constexpr XBLOCK<i>, its locals suffixed _<i>, its program id offset by start_i)."""
    lines, consts, warps, start = ["    pid = tl.program_id(0)"], {}, 1, 0
    for i, m in enumerate(k.members):
        src, la = TritonKernelPrinter(m, size_names, interpret).generate()
        body = src.split("):\n", 1)[1].rstrip("\n")
        body = _COMBO_LOCALS.sub(lambda g: f"{g.group(1)}_{i}", body)
        body = re.sub(r"\bXBLOCK\b", f"XBLOCK{i}", body.replace("tl.program_id(0)", f"(pid - {start})"))
        end = start + -(-la.xnumel // la.xblock)
        lines.append(f"    {'if' if i == 0 else 'elif'} pid < {end}:")
        lines += ["    " + line for line in body.split("\n") if line.strip()]
        consts[f"XBLOCK{i}"], warps, start = la.xblock, max(warps, la.num_warps), end
    bufs = [LaunchBuffer(b.name, b.dtype) for b in (*k.loads, *k.stores)]
    params = [b.name for b in bufs] + list(size_names) + [f"{c}: tl.constexpr" for c in consts]
    src = f"@triton.jit\ndef {k.name}({', '.join(params)}):\n" + "\n".join(lines) + "\n"
    return src, Launch(k.name, bufs, list(size_names), start, 1, consts, warps)


def generate(kernels, size_names=(), interpret: bool = False) -> tuple:
    """(module source, {kernel name: Launch}) for the kernels of one graph."""
    parts = [HEADER, TRITON_HELPERS, REDUCE_HELPERS]
    launches = {}
    for k in kernels:
        if isinstance(k, ComboKernel):
            src, launch = _combo(k, size_names, interpret)
        else:
            src, launch = TritonKernelPrinter(k, size_names, interpret).generate()
        parts.append(src)
        launches[k.name] = launch
    return "\n\n".join(parts), launches
