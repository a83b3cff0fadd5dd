"""NumPy code generation: the same kernels as Python functions over whole arrays.

Used when no C++ compiler works (announced once with a warning) or when
`config.backend == "numpy"`. Each buffer of a kernel is computed over its full iteration space at
once: loop indices become broadcast `arange`s, loads become gathers from the buffer's raw memory
at the computed element offsets, reductions reduce a trailing flattened axis, a scatter copies its
destination and then stores at the computed target offsets in element order (`ufunc.at` where
they combine, so duplicates add up). Indices read from tensors are bounds-checked and raise
like the C++ path. Slower than C++,
but it exercises exactly the same IR, scheduling and wrapper. With symbolic sizes each kernel
takes the size symbols as trailing parameters, and shapes print as expressions of them.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D
from .._ops._spelling import KIND
from .index import Index, Indirect, Sym, render
from .ir import Handler, ops, set_handler
from .sizevars import SizeExpr
from .wrapper import kernel_error

# the ufunc combining a Scatter's values into its target elements, by (reduction, bool dtype)
_SCATTER_UFUNC = {("sum", False): "np.add", ("prod", False): "np.multiply", ("max", False): "np.maximum",
                  ("min", False): "np.minimum", ("sum", True): "np.logical_or", ("prod", True): "np.logical_and",
                  ("max", True): "np.logical_or", ("min", True): "np.logical_and"}


def _np_dtype(dt) -> str:
    return f"np.{dt.np.name}" if dt is not D.bool else "np.bool_"


class NVal:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name = name
        self.dtype = dtype


class NumpyHandler(Handler):
    def __init__(self, printer):
        self.p = printer
        self.masks: list = []

    def _emit(self, expr, dtype):
        p = self.p
        hit = p.cse.get(expr)
        if hit is not None:
            return hit
        v = NVal(f"t{p.n_tmp}", dtype)
        p.n_tmp += 1
        p.lines.append(f"    {v.name} = {expr}")
        p.cse[expr] = v
        return v

    def _op(self, op, args, dtype):
        """Pointwise `op`'s declared NumPy spelling (`op.pointwise.numpy`), cast to `dtype`."""
        sp = op.pointwise
        expr = sp.by_kind["numpy"][KIND[dtype if sp.by_result else args[0].dtype]]
        if expr is None:
            raise NotImplementedError(f"{op.name} has no NumPy spelling for {args[0].dtype.name} operands")
        return self._emit(f"_cast({expr.format(*(x.name for x in args))}, {_np_dtype(dtype)})", dtype)

    def load(self, buf, index):
        if buf.layout.numel == 0:       # only reachable under a mask that is never true
            return self.constant(0, buf.dtype)
        off = render(index, self.p.sym_name, "//", "%")
        if self.masks:
            off = f"np.where({self.masks[-1].name}, {off}, 0)"
        return self._emit(f"{self.p.raw(buf)}[{off}]", buf.dtype)

    def constant(self, value, dtype):
        if isinstance(value, SizeExpr):
            return self._emit(f"{_np_dtype(dtype)}({value})", dtype)
        if dtype is D.bool:
            return NVal("np.True_" if value else "np.False_", dtype)
        if dtype.category == D.FLOATING:
            v = float(value)
            lit = repr(v) if math.isfinite(v) else f"float('{v}')"
            return NVal(f"{_np_dtype(dtype)}({lit})", dtype)
        iv = int(np.array(int(value) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(dtype.np)[()])
        return NVal(f"{_np_dtype(dtype)}({iv})", dtype)

    def index_expr(self, index, dtype):
        return self._emit(f"_cast({render(index, self.p.sym_name, '//', '%')}, {_np_dtype(dtype)})", dtype)

    def indirect_indexing(self, value, size, wrap=True):
        mask = self.masks[-1].name if self.masks else "None"
        v = self._emit(f"_index({value.name}, {size}, {wrap}, {mask})", D.int64)
        return Index.of(Indirect(v.name, size))

    def masked(self, mask, body, other):
        if self.masks:                  # nested masked regions: loads need every enclosing mask
            self.masks.append(self._emit(f"np.logical_and({self.masks[-1].name}, {mask.name})", D.bool))
        else:
            self.masks.append(mask)
        try:
            v = body()
        finally:
            self.masks.pop()
        o = self.constant(other, v.dtype)
        return self._emit(f"np.where({mask.name}, {v.name}, {o.name})", v.dtype)


class NumpyKernelPrinter:
    def __init__(self, kernel, size_names=()):
        self.k = kernel
        self.size_names = list(size_names)
        self.lines: list = []
        self.cse: dict = {}
        self.n_tmp = 0
        self._raw: dict = {}

    def sym_name(self, a):
        return a.name

    def raw(self, buf) -> str:
        name = self._raw.get(buf.name)
        if name is None:
            name = self._raw[buf.name] = f"{buf.name}_raw"
            self.lines.append(f"    {name} = _raw({buf.name})")
        return name

    def _syms(self, sizes, prefix):
        """Index list over `sizes` (broadcast aranges), one axis per dim."""
        nd = len(sizes)
        idx = []
        for i, s in enumerate(sizes):
            if s == 1:
                idx.append(Index())
                continue
            name = f"{prefix}{i}"
            shape = [1] * nd
            shape[i] = s
            self.lines.append(f"    {name} = np.arange({s}, dtype=np.int64).reshape({tuple(shape)})")
            idx.append(Index.of(Sym(name, s)))
        return idx

    def generate(self) -> str:
        k = self.k
        params = [b.name for b in k.loads] + [b.name for b in k.stores] + self.size_names
        self.lines.append(f"def {k.name}({', '.join(params)}):")
        stored = {b.name for b in k.stores}
        with set_handler(NumpyHandler(self)):
            for n in k.nodes:
                self.cse = {}
                if n.name not in stored:
                    self.lines.append(f"    {n.name} = np.empty({n.ranges}, {_np_dtype(n.buf.dtype)})")
                    self._raw.pop(n.name, None)
                if n.scatter:
                    self._scatter(n)
                elif n.is_reduction:
                    self._reduction(n)
                else:
                    idx = self._syms(n.ranges, f"{n.name}_i")
                    v = ops.to_dtype(n.buf.data.inner_fn(idx), n.buf.dtype)
                    self.lines.append(f"    {n.name}.reshape(-1)[:] = np.broadcast_to({v.name}, {n.ranges}).reshape(-1)")
        if len(self.lines) == 1:
            self.lines.append("    pass")
        return "\n".join(self.lines) + "\n"

    def _scatter(self, n):
        sc = n.buf.data
        idx = self._syms(sc.ranges, f"{n.name}_i")
        v = ops.to_dtype(sc.init_fn(idx), sc.dtype)
        self.lines.append(f"    {n.name}.reshape(-1)[:] = np.broadcast_to({v.name}, {sc.ranges}).reshape(-1)")
        self.cse = {}
        idx = self._syms(sc.scatter_ranges, f"{n.name}_j")
        t = f"_cast({render(sc.target_fn(idx), self.sym_name, '//', '%')}, np.int64)"
        v = ops.to_dtype(sc.value_fn(idx), sc.dtype)
        shape = tuple(sc.scatter_ranges)
        where = f"np.broadcast_to({t}, {shape}).reshape(-1)"
        vals = f"np.broadcast_to({v.name}, {shape}).reshape(-1)"
        if sc.reduce is None:
            self.lines.append(f"    {n.name}.reshape(-1)[{where}] = {vals}")
        else:
            fn = _SCATTER_UFUNC[sc.reduce, sc.dtype is D.bool]
            self.lines.append(f"    {fn}.at({n.name}.reshape(-1), {where}, {vals})")

    def _reduction(self, n):
        red = n.buf.data
        P, R = tuple(n.ranges), tuple(n.reduction_ranges)
        syms = self._syms(P + R, f"{n.name}_i")
        v = ops.to_dtype(red.inner_fn(syms[:len(P)], syms[len(P):]), red.src_dtype)
        full = f"np.broadcast_to({v.name}, {P + R}).reshape({P + (math.prod(R),)})"
        rt = red.reduction_type
        acc = ""
        if rt in ("sum", "prod") and red.src_dtype is D.float32:
            acc = ", dtype=np.float64"
        fn = {"sum": "np.sum", "prod": "np.prod", "max": "np.max", "min": "np.min", "argmax": "np.argmax",
              "argmin": "np.argmin", "any": "np.any", "all": "np.all"}[rt]
        self.lines.append(f"    {n.name}.reshape(-1)[:] = _cast({fn}({full}, axis=-1{acc}), "
                          f"{_np_dtype(red.dtype)}).reshape(-1)")


def _raw(a):
    if a.flags.c_contiguous:
        return a.reshape(-1)
    span = 1 + sum((s - 1) * st for s, st in zip(a.shape, a.strides) if s > 0) // a.itemsize
    return np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,))


def _cast(x, dt):
    if dt is np.bool_:
        return np.not_equal(x, 0)
    return np.asarray(x).astype(dt, copy=False)


def _ipow(a, b):
    a, b = np.asarray(a), np.asarray(b)
    safe = np.where(b < 0, 0, b)
    r = np.power(a, safe)
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 1, -1, 1), 0)).astype(r.dtype)
    return np.where(b < 0, neg, r)


def _shl(a, b):
    bits = np.asarray(a).dtype.itemsize * 8
    ok = (b >= 0) & (b < bits)
    return np.where(ok, np.left_shift(a, np.where(ok, b, 0)), 0)


def _shr(a, b):
    bits = np.asarray(a).dtype.itemsize * 8
    ok = (b >= 0) & (b < bits)
    return np.where(ok, np.right_shift(a, np.where(ok, b, 0)), np.where(a < 0, -1, 0))


def _index(v, size, wrap, mask):
    """Indices read from a tensor, checked against `size` where `mask` (None: everywhere) holds;
    negative ones count from the end when `wrap` (advanced indexing), else are out of range
    (scatter). Raises what the C++ path's error codes raise (wrapper.kernel_error)."""
    v = np.asarray(v)
    lo = -size if wrap else 0
    bad = (v < lo) | (v >= size)
    if mask is not None:
        bad = bad & mask
    if bad.any():
        kernel_error(1 if wrap else 3)
    return np.where(v < 0, v + size, v) if wrap else v


def _no_int_zero(a, b):
    """Integer division by zero raises, as in eager PyTorch (the C++ path flags it in the kernel)."""
    if a.dtype.kind in "iub" and b.dtype.kind in "iub" and (b == 0).any():
        raise RuntimeError("ZeroDivisionError")


def _remainder(a, b):
    a, b = np.asarray(a), np.asarray(b)
    _no_int_zero(a, b)
    return np.remainder(a, b)


def _fmod(a, b):
    a, b = np.asarray(a), np.asarray(b)
    _no_int_zero(a, b)
    return np.fmod(a, b)


def _truncdiv(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        return np.trunc(a / b)
    _no_int_zero(a, b)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    return np.where(b == 0, 0, np.where((a < 0) != (safe < 0), -q, q))


def _floordiv(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        return np.floor_divide(a, b)
    _no_int_zero(a, b)
    return np.floor_divide(a, b)


def namespace() -> dict:
    import scipy.special as sp  # deferred: scipy.special is slow to import
    return {"np": np, "_sp": sp, "_raw": _raw, "_cast": _cast, "_ipow": _ipow, "_shl": _shl, "_shr": _shr,
            "_truncdiv": _truncdiv, "_index": _index, "_floordiv": _floordiv, "_remainder": _remainder, "_fmod": _fmod}


def generate(kernels, size_names=()) -> str:
    return "\n\n".join(NumpyKernelPrinter(k, size_names).generate() for k in kernels)


def load(source: str) -> dict:
    ns = namespace()
    exec(compile(source, "<flambeau-inductor-numpy>", "exec"), ns)
    return ns

