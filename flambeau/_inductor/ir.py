"""The loop IR: buffers, lazily computed values (`Pointwise`, `Reduction`), extern calls, and the
`ops` namespace their element functions are written in.

An element function (`inner_fn(index)` of a Pointwise, `inner_fn(index, rindex)` of a Reduction)
computes ONE element from loop indices (`index.Index`), calling `ops.load`, `ops.add`, `ops.exp`...
`ops` forwards to the current *handler* (`set_handler`): the C++ printer, the NumPy printer, or
an analysis pass (which loads does it make, how many ops). This is Inductor's virtualised-ops
design: one element function, many interpretations, no expression tree to rewrite.

Values seen by an element function carry their dtype (`value.dtype`), so printers emit typed
code. Lowerings guarantee that binary operands share a dtype (they insert `ops.to_dtype`).

The arithmetic of element functions is the pointwise ops themselves: `ops.add(a, b)` is
`aten.add` and `ops.apply(op, *values)` any op that declares its formula (`op.pointwise`, a
`PointwiseSpelling`, see `flambeau._ops._spelling`); `ops.to_dtype` is `aten._to_copy`'s cast.
Each printer formats the op's spelling for its language, so a formula exists once, with its op.
"""
from __future__ import annotations

import contextlib
import itertools
import math

from .. import _dtype as D
from .._decomp._table import aten
from .index import Index, _size, contiguous_strides, offset_of, Indirect, Sym
from .sizevars import Unsupported, known_nonneg, is_symbolic

CAST = aten._to_copy          # `ops.to_dtype`: the element formula of a dtype conversion
SUPPORTED_DTYPES = frozenset({D.float32, D.float64, D.int64, D.int32, D.int16, D.int8, D.uint8, D.bool})


# ---- the ops namespace ------------------------------------------------------------------------
class _State:
    handler = None


_state = _State()


@contextlib.contextmanager
def set_handler(h):
    prev = _state.handler
    _state.handler = h
    try:
        yield h
    finally:
        _state.handler = prev


class _Ops:
    """`ops.add(a, b)` calls the current handler's `add` (looked up at call time, so lowerings may
    hold `ops.add` as a function before any handler is set)."""

    def __getattr__(self, name):
        def call(*args):
            return getattr(_state.handler, name)(*args)
        call.__name__ = name
        setattr(self, name, call)
        return call


ops = _Ops()


_SPELLED: dict = {}          # name -> Op, filled by spelled_op


def spelled_op(name: str):
    """The op `ops.<name>` applies: `aten.<name>`, which must declare its formula."""
    op = getattr(aten, name, None)
    if getattr(op, "pointwise", None) is None:
        raise AttributeError(f"ops.{name}: aten.{name} is no op with a pointwise spelling")
    _SPELLED[name] = op
    return op


class Handler:
    """Base of the interpretations of `ops`: dtype rules shared by all, `_op` implemented by each.

    `_op(op, args, dtype)` returns a value of the handler's own kind (with `.dtype`); `op` is an
    `Op` whose `op.pointwise` spells it, `dtype` the result's."""

    def _op(self, op, args: tuple, dtype):
        raise NotImplementedError

    def __getattr__(self, name):
        op = _SPELLED.get(name) or spelled_op(name)
        if op.pointwise.result == "bool":
            return lambda *a: self._op(op, a, D.bool)
        return lambda *a: self._op(op, a, a[-1].dtype)

    def apply(self, op, *args):
        """A pointwise op with a declared spelling (`op.pointwise`): its result is bool or has the
        dtype of its (last) operand."""
        return self._op(op, args, D.bool if op.pointwise.result == "bool" else args[-1].dtype)

    def to_dtype(self, x, dtype):
        if x.dtype is dtype:
            return x
        return self._op(CAST, (x,), dtype)


# ---- IR nodes --------------------------------------------------------------------------------
class Layout:
    """Shape, dtype, element strides and element offset of a buffer or strided view (each an int or,
    in a graph with symbolic sizes, a sizevars.SizeExpr)."""
    __slots__ = ("shape", "dtype", "strides", "offset")

    def __init__(self, shape, dtype, strides=None, offset=0):
        self.shape = tuple(_size(s) for s in shape)
        self.dtype = dtype
        self.strides = tuple(_size(s) for s in strides) if strides is not None else contiguous_strides(self.shape)
        self.offset = _size(offset)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return self.offset == 0 and all(st == c for s, st, c in zip(self.shape, self.strides,
                                                                   contiguous_strides(self.shape))
                                        if not isinstance(s, int) or s > 1)

    def is_symbolic(self) -> bool:
        return any(is_symbolic(x) for x in self.shape + self.strides + (self.offset,))

    def __repr__(self):
        return f"{self.dtype.name}{list(self.shape)} strides={list(self.strides)}" + \
            (f" offset={self.offset}" if self.offset else "")


class IRNode:
    """Anything a lowering returns for a tensor: knows shape/dtype and how to load an element."""
    shape: tuple
    dtype: object

    def make_loader(self):
        raise NotImplementedError


class _LaidOut(IRNode):
    """An IR node whose shape and dtype are those of its memory layout."""

    @property
    def shape(self):
        return self.layout.shape

    @property
    def dtype(self):
        return self.layout.dtype


class Buffer(_LaidOut):
    """Memory: a graph input, a computed buffer, or an extern kernel's output."""

    def __init__(self, name: str, layout: Layout):
        self.name = name
        self.layout = layout

    def make_loader(self):
        lay = self.layout

        def load(index):
            return ops.load(self, offset_of(index, lay.strides, lay.offset))
        return load

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {self.layout})"


class InputBuffer(Buffer):
    """A graph input (placeholder) or a constant captured from the GraphModule (get_attr)."""

    def __init__(self, name, layout, position: int | None = None, constant=None):
        super().__init__(name, layout)
        self.position = position
        self.constant = constant


class ComputedBuffer(Buffer):
    """A buffer whose elements a Pointwise or Reduction computes (a generated kernel writes it)."""

    def __init__(self, name, layout, data):
        super().__init__(name, layout)
        self.data = data

    def reads(self) -> list:
        return self.data.reads()


class ExternKernel(Buffer):
    """An opaque op called eagerly on realised inputs (BLAS matmul, convolution, sort, fallbacks).

    `args`/`kwargs` hold Buffers/StridedViews (passed as arrays) and plain values. The op may
    return several tensors: then this node has no layout of its own and `outputs` lists
    `MultiOutput` buffers."""

    def __init__(self, name, layout, op, args, kwargs, kind: str = "extern"):
        super().__init__(name, layout)
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.kind = kind
        self.outputs: list = []

    def inputs(self) -> list:
        out = []

        def visit(a):
            if isinstance(a, (Buffer, StridedView)):
                out.append(a.base if isinstance(a, StridedView) else a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
        visit(self.args)
        visit(list(self.kwargs.values()))
        return out


class MultiOutput(Buffer):
    """Output `i` of a multi-output ExternKernel (None when that output is not a tensor)."""

    def __init__(self, name, layout, parent: ExternKernel, i: int):
        super().__init__(name, layout)
        self.parent = parent
        self.i = i


class StridedView(_LaidOut):
    """A view of a buffer expressible by strides (permute, slice, expand, ...): no copy."""

    def __init__(self, base: Buffer, layout: Layout):
        self.base = base
        self.layout = layout

    def make_loader(self):
        lay, base = self.layout, self.base

        def load(index):
            return ops.load(base, offset_of(index, lay.strides, lay.offset))
        return load

    def __repr__(self):
        return f"StridedView({self.base.name}, {self.layout})"


class Pointwise(IRNode):
    """`out[index] = inner_fn(index)` over `ranges` (lazy: inlined into consumers unless realised)."""

    def __init__(self, ranges, dtype, inner_fn):
        self.ranges = tuple(ranges)
        self.dtype = dtype
        self.inner_fn = inner_fn
        self._stats = None
        self.realized = None          # the ComputedBuffer once realised

    @property
    def shape(self):
        return self.ranges

    def make_loader(self):
        if self.realized is not None:
            return self.realized.make_loader()
        return self.inner_fn

    def stats(self):
        if self._stats is None:
            self._stats = analyse(lambda idx: self.inner_fn(idx), self.ranges)
        return self._stats

    def reads(self) -> list:
        return self.stats().loads

    def __repr__(self):
        return f"Pointwise({list(self.ranges)}, {self.dtype.name})"


REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


class Reduction(IRNode):
    """`out[index] = reduce(inner_fn(index, rindex) for rindex in reduction_ranges)`.

    `src_dtype` is the dtype of the reduced values; `dtype` of the result (int64 for argmax)."""

    def __init__(self, ranges, reduction_ranges, reduction_type, dtype, src_dtype, inner_fn):
        assert reduction_type in REDUCTION_TYPES, reduction_type
        self.ranges = tuple(ranges)
        self.reduction_ranges = tuple(reduction_ranges)
        self.reduction_type = reduction_type
        self.dtype = dtype
        self.src_dtype = src_dtype
        self.inner_fn = inner_fn
        self._stats = None

    @property
    def shape(self):
        return self.ranges

    def stats(self):
        if self._stats is None:
            n = len(self.ranges)
            self._stats = analyse(lambda idx: self.inner_fn(idx[:n], idx[n:]), self.ranges + self.reduction_ranges)
        return self._stats

    def reads(self) -> list:
        return self.stats().loads

    def __repr__(self):
        return (f"Reduction({self.reduction_type}, {list(self.ranges)} over {list(self.reduction_ranges)}, "
                f"{self.dtype.name})")


SCATTER_REDUCTIONS = ("sum", "prod", "max", "min")


class Scatter(IRNode):
    """A copy of `init_fn` over `ranges` into a new buffer, then a loop over `scatter_ranges`
    storing `value_fn(i)` at element `target_fn(i)` of it, or, with `reduce` (one of
    SCATTER_REDUCTIONS), combining it with the element there (`sum`: adding).

    `target_fn(i)` returns the flat (contiguous) element offset into the output as an `Index`,
    usually built with `ops.indirect_indexing` (which bounds-checks). `parallel_dims` are the
    scatter dims along which two iterations never write the same element (the dim maps one-to-one
    onto an output dim): only those may run in parallel, so duplicates combine exactly and
    a store's last write wins as in the serial loop. Always realised, never fused."""

    def __init__(self, ranges, dtype, init_fn, scatter_ranges, target_fn, value_fn, reduce: str | None,
                 parallel_dims=()):
        assert reduce is None or reduce in SCATTER_REDUCTIONS, reduce
        self.ranges = tuple(ranges)
        self.dtype = dtype
        self.init_fn = init_fn
        self.scatter_ranges = tuple(scatter_ranges)
        self.target_fn = target_fn
        self.value_fn = value_fn
        self.reduce = reduce
        self.parallel_dims = frozenset(parallel_dims)
        self._reads = None

    @property
    def shape(self):
        return self.ranges

    def reads(self) -> list:
        if self._reads is None:
            self._reads = analyse(self.init_fn, self.ranges).loads + \
                analyse(lambda i: (self.target_fn(i), self.value_fn(i)), self.scatter_ranges, "b").loads
        return self._reads

    def __repr__(self):
        return (f"Scatter({self.reduce or 'store'} over {list(self.scatter_ranges)} "
                f"into {list(self.ranges)}, {self.dtype.name})")


# ---- analysis: which buffers does an element function read, and how much work is it ----------
class _AVal:
    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype


class Stats:
    def __init__(self):
        self.loads: list = []          # (Buffer, Index) in the analysis symbols
        self.ops = 0
        self.heavy = 0                 # transcendental ops


_indirect_names = itertools.count()     # analysis-only names of indirect indices: unique in the process


class AnalysisHandler(Handler):
    def __init__(self):
        self.stats = Stats()
        self.indirect: dict = {}       # id(value) -> (value, name): the value kept alive so its id is not reused

    def _op(self, op, args, dtype):
        self.stats.ops += 1
        if op.pointwise.heavy:
            self.stats.heavy += 1
        return _AVal(dtype)

    def load(self, buf, index):
        self.stats.loads.append((buf, index))
        return _AVal(buf.dtype)

    def constant(self, value, dtype):
        return _AVal(dtype)

    def index_expr(self, index, dtype):
        return _AVal(dtype)

    def indirect_indexing(self, value, size, wrap=True):
        got = self.indirect.get(id(value))
        if got is None:
            got = self.indirect[id(value)] = (value, f"ind{next(_indirect_names)}")
        return Index.of(Indirect(got[1], size))

    def masked(self, mask, body, other):
        return _AVal(body().dtype)


def analysis_symbols(ranges, prefix="a"):
    return [Index.of(Sym(f"{prefix}{i}", s)) if s != 1 else Index() for i, s in enumerate(ranges)]


def analyse(fn, ranges, prefix="a") -> Stats:
    h = AnalysisHandler()
    with set_handler(h):
        fn(analysis_symbols(ranges, prefix))
    return h.stats


class _LoadOnly(AnalysisHandler):
    """Records loads; any other operation marks the element function as more than a load."""

    def __init__(self):
        super().__init__()
        self.pure = True
        self.values = []

    def _op(self, op, args, dtype):
        self.pure = False
        return _AVal(dtype)

    def load(self, buf, index):
        v = _AVal(buf.dtype)
        self.stats.loads.append((buf, index))
        self.values.append(v)
        return v

    def constant(self, value, dtype):
        self.pure = False
        return _AVal(dtype)

    def index_expr(self, index, dtype):
        self.pure = False
        return _AVal(dtype)

    def indirect_indexing(self, value, size, wrap=True):
        self.pure = False
        return super().indirect_indexing(value, size)

    def masked(self, mask, body, other):
        self.pure = False
        return _AVal(body().dtype)


def as_strided_view(x: Pointwise):
    """A StridedView equal to `x` when `x` only reads one buffer at an affine index with
    non-negative coefficients (a permute/reshape/expand of memory that strides can express after
    all), else None. Lets extern kernels read such values in place instead of from a copy."""
    h = _LoadOnly()
    syms = analysis_symbols(x.ranges)
    with set_handler(h):
        out = x.inner_fn(syms)
    if not h.pure or len(h.values) != 1 or out is not h.values[0]:
        return None
    buf, index = h.stats.loads[0]
    if buf.dtype is not x.dtype or not isinstance(buf, Buffer) or buf.layout is None:
        return None
    dims = [next(iter(i.terms.values()))[0] if i.terms else None for i in syms]
    names = {a.name for a in dims if a is not None}
    if not known_nonneg(index.const) or any(not isinstance(a, Sym) or a.name not in names or not known_nonneg(c)
                              for a, c in index.terms.values()):
        return None
    strides = [0 if a is None else index.coeff(a) for a in dims]
    return StridedView(buf, Layout(x.ranges, x.dtype, strides, index.const))
