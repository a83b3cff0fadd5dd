"""Dynamic dimensions of `export`: `Dim`, derived dims, the `dynamic_shapes` spec, constraint checks.

`Dim("batch", min=2, max=64)` names a dimension whose size may vary; using one `Dim` for several
inputs says their sizes are equal; `2 * batch + 1` is a *derived* dim (a linear function of a root
Dim). `Dim.AUTO` lets export decide (dynamic unless the program specialises it, no error),
`Dim.STATIC` (or None) keeps the example size, `Dim.DYNAMIC` is like an unnamed `Dim`.

`parse_dynamic_shapes` matches the spec (a dict keyed by the forward's parameter names, or a
tuple/list in their order; per tensor a dict `{dim: Dim}` or a tuple/list with one entry per dim)
to the flattened inputs. While tracing each root Dim is one size symbol of the ShapeEnv; afterwards
`check_constraints` reads the guards the program recorded and raises `torch._dynamo.exc.UserError`
("Constraints violated (batch)! ...") when a guard specialises a Dim to a constant, equates two
Dims, or excludes part of a Dim's declared range, with PyTorch's suggested fixes. Guards that only
exclude sizes 0 and 1 are accepted (PyTorch's size-oblivious reasoning).
"""
from __future__ import annotations

import inspect
import math

from .._dynamo.exc import UserError, UserErrorType
from ..fx._symbolic_shapes import SymInt, _sp, expr_to_python
from ..utils import _pytree as pytree

__all__ = ["Dim", "DerivedDim", "DimHint", "ShapesCollection", "ValueRanges"]

SIZE_OBLIVIOUS_MIN = 2       # guards that only exclude sizes below this are accepted (0/1 specialisation)
INT_OO = math.inf
_UNCHECKED = ("AUTO", "DERIVED")   # dims whose guards export accepts: AUTO ones, dynamo's symbols of derived dims
GUARD_SAMPLES = 64          # sizes tried for a guard sympy cannot solve (a divisibility guard): lo .. lo + 64


class DimHint:
    """`Dim.AUTO`, `Dim.STATIC`, `Dim.DYNAMIC`."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return f"DimHint({self.kind})"


class Dim:
    """A named dynamic dimension with an inclusive range (see module docstring)."""
    AUTO = DimHint("AUTO")
    STATIC = DimHint("STATIC")
    DYNAMIC = DimHint("DYNAMIC")

    def __init__(self, name: str, *, min: int | None = None, max: int | None = None):  # noqa: A002
        lo = 0 if min is None else int(min)
        hi = INT_OO if max is None else int(max)
        if hi < lo:
            raise UserError(UserErrorType.INVALID_INPUT,
                            f"Cannot create Dim with inconsistent min={min}, max={max}")
        self.__name__ = name
        self.min, self.max = lo, hi

    def _derive(self, a: int, b: int) -> "DerivedDim":
        return DerivedDim(self, a, b)

    def __mul__(self, other):
        if type(other) is not int:
            return NotImplemented
        return self._derive(other, 0)

    __rmul__ = __mul__

    def __add__(self, other):
        if type(other) is not int:
            return NotImplemented
        return self._derive(1, other)

    __radd__ = __add__

    def __sub__(self, other):
        if type(other) is not int:
            return NotImplemented
        return self._derive(1, -other)

    def __repr__(self) -> str:
        return f"Dim({self.__name__!r}, min={self.min}, max={'int_oo' if self.max == INT_OO else self.max})"


class DerivedDim:
    """`a * root + b` for a root `Dim` (see module docstring)."""

    def __init__(self, root: Dim, a: int, b: int):
        self.root, self.a, self.b = root, a, b
        self.__name__ = self._text(root.__name__)

    def _text(self, name: str) -> str:
        s = name if self.a == 1 else f"{self.a}*{name}"
        return s if self.b == 0 else f"{s} + {self.b}" if self.b > 0 else f"{s} - {-self.b}"

    def __mul__(self, other):
        if type(other) is not int:
            return NotImplemented
        return DerivedDim(self.root, self.a * other, self.b * other)

    __rmul__ = __mul__

    def __add__(self, other):
        if type(other) is not int:
            return NotImplemented
        return DerivedDim(self.root, self.a, self.b + other)

    __radd__ = __add__

    def __sub__(self, other):
        if type(other) is not int:
            return NotImplemented
        return DerivedDim(self.root, self.a, self.b - other)

    def __repr__(self) -> str:
        return self.__name__


class ShapesCollection:
    """`dynamic_shapes` built per tensor: `sc[x] = {0: batch}`; `sc.dynamic_shapes(m, args)` gives the spec."""

    def __init__(self):
        self._shapes: dict = {}

    def __setitem__(self, t, shape) -> None:
        self._shapes[id(t)] = shape

    def __getitem__(self, t):
        return self._shapes.setdefault(id(t), {})

    def dynamic_shapes(self, m, args: tuple, kwargs: dict | None = None):
        return pytree.tree_map(lambda x: self._shapes.get(id(x)), (tuple(args), dict(kwargs or {})))


class ValueRanges:
    """An inclusive integer range `VR[lower, upper]` (upper may be int_oo)."""

    def __init__(self, lower: int, upper):
        self.lower, self.upper = lower, upper

    def __eq__(self, other) -> bool:
        return isinstance(other, ValueRanges) and (self.lower, self.upper) == (other.lower, other.upper)

    def __repr__(self) -> str:
        return f"VR[{self.lower}, {'int_oo' if self.upper == INT_OO else self.upper}]"


# ---- matching the spec to the inputs ---------------------------------------------------------------
def _arg_names(forward, n_args: int, kwargs: dict) -> list:
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return [f"args_{i}" for i in range(n_args)] + list(kwargs)
    names = []
    for i in range(n_args):
        p = params[i] if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                                 params[i].POSITIONAL_OR_KEYWORD) else None
        names.append(p.name if p is not None else f"args_{i}")
    return names + list(kwargs)


def input_names(forward, args: tuple, kwargs: dict) -> list:
    """The forward's parameter names for `args` then the keys of `kwargs` (PyTorch's placeholder names)."""
    return _arg_names(forward, len(args), kwargs)


def _per_dim(spec, ndim: int, where: str) -> dict:
    """{dim: Dim | DerivedDim | DimHint} from one tensor's spec."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        out = {}
        for d, v in spec.items():
            if not isinstance(d, int) or not -ndim <= d < ndim:
                raise UserError(UserErrorType.INVALID_INPUT, f"Dimension {d} of {where} in dynamic_shapes is out of "
                                f"range for a tensor with {ndim} dimensions")
            if v is not None:
                out[d % ndim] = v
        return out
    if isinstance(spec, (tuple, list)):
        if len(spec) != ndim:
            raise UserError(UserErrorType.INVALID_INPUT, f"Expected dynamic shape spec {spec} at {where} to have "
                            f"the same length as the actual tensor shape ({ndim})")
        return {d: v for d, v in enumerate(spec) if v is not None}
    raise UserError(UserErrorType.INVALID_INPUT, f"Unexpected dynamic_shape {spec!r} of {where}: expected a dict "
                    "{dim: Dim} or a tuple/list with one entry per dimension")


def parse_dynamic_shapes(dynamic_shapes, names: list, args: tuple, kwargs: dict, is_tensor) -> list:
    """Per flat input leaf (in `pytree` order of `(args, kwargs)`), `{dim: Dim|DerivedDim|DimHint}`."""
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    if dynamic_shapes is None:
        return [{} for _ in leaves]
    values = list(args) + list(kwargs.values())
    if isinstance(dynamic_shapes, dict):
        unknown = set(dynamic_shapes) - set(names)
        if unknown:
            raise UserError(UserErrorType.INVALID_INPUT, f"dynamic_shapes has keys {sorted(unknown)} that are not "
                            f"inputs of the program (its inputs are {names})")
        per_arg = [dynamic_shapes.get(n) for n in names]
    elif isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) != len(values):
            raise UserError(UserErrorType.INVALID_INPUT, f"dynamic_shapes has {len(dynamic_shapes)} entries but the "
                            f"program has {len(values)} inputs ({names})")
        per_arg = list(dynamic_shapes)
    else:
        raise UserError(UserErrorType.INVALID_INPUT, "dynamic_shapes must be a dict, tuple or list, got "
                        f"{type(dynamic_shapes).__name__}")
    out = []
    for name, value, spec in zip(names, values, per_arg):
        sub = pytree.tree_leaves(value)
        if spec is None:
            out += [{} for _ in sub]
        elif pytree.tree_is_leaf(value):
            out.append(_per_dim(spec, value.dim(), name) if is_tensor(value) else {})
        else:
            specs = pytree.tree_structure(value).flatten_up_to(spec)
            out += [_per_dim(s, v.dim(), name) if is_tensor(v) else {} for v, s in zip(sub, specs)]
    return out


# ---- size symbols ------------------------------------------------------------------------------------
class DimInfo:
    """One root dimension: its symbol, name, range, how it was asked for, and where it first occurs."""

    def __init__(self, sym, name: str, lo: int, hi, kind: str, source: str):
        self.sym, self.name, self.lo, self.hi, self.kind, self.source = sym, name, lo, hi, kind, source


def dim_info(spec, source: str, sym) -> DimInfo:
    """The DimInfo of a size symbol made elsewhere (dynamo's) for a dim with `spec`. A derived dim is its own
    symbol there; its guards (divisibility by its coefficient) are implied by the root's and not checked."""
    if isinstance(spec, DimHint):
        return DimInfo(sym, source, 0, INT_OO, spec.kind, source)
    if isinstance(spec, DerivedDim):
        root = spec.root
        hi = INT_OO if root.max == INT_OO else spec.a * root.max + spec.b
        return DimInfo(sym, spec.__name__, spec.a * root.min + spec.b, hi, "DERIVED", source)
    return DimInfo(sym, spec.__name__, spec.min, spec.max, "Dim", source)


class SymbolTable:
    """Creates one size symbol per root Dim (or per AUTO/DYNAMIC dim) in a ShapeEnv; remembers each."""

    def __init__(self, shape_env):
        self.env = shape_env
        self.by_root: dict = {}          # id(Dim) -> DimInfo (Dims are matched by name, like PyTorch)
        self.by_name: dict = {}
        self.infos: dict = {}            # sympy symbol -> DimInfo

    def _symbol(self, hint: int, source):
        sym = _sp().Symbol(f"s{len(self.env.var_to_val)}", integer=True, positive=True)
        self.env.var_to_val[sym] = hint
        self.env.var_to_sources.setdefault(sym, []).append(source)
        return sym

    def size(self, spec, size: int, source_text: str, source) -> object:
        """The (symbolic) size of a dim with `spec` whose example size is `size`."""
        if isinstance(spec, DimHint):
            if spec.kind == "STATIC":
                return size
            sym = self._symbol(size, source)
            self.infos[sym] = DimInfo(sym, f"{source_text}", 0, INT_OO, spec.kind, source_text)
            return SymInt(sym, self.env)
        if isinstance(spec, Dim):
            root, a, b = spec, 1, 0
        elif isinstance(spec, DerivedDim):
            root, a, b = spec.root, spec.a, spec.b
        else:
            raise UserError(UserErrorType.INVALID_INPUT, f"Unexpected dimension spec {spec!r} at {source_text}: "
                            "expected a Dim, a derived Dim, Dim.AUTO/STATIC/DYNAMIC or None")
        info = self.by_name.get(root.__name__)
        if info is None:
            if (size - b) % a:
                raise UserError(UserErrorType.CONSTRAINT_VIOLATION, f"Expected {source_text} = {size} of input "
                                f"Tensor to be of the form {spec.__name__}, where {root.__name__} is an integer")
            hint = (size - b) // a
            sym = self._symbol(hint, source)
            info = DimInfo(sym, root.__name__, root.min, root.max, "Dim", source_text)
            self.by_name[root.__name__] = info
            self.infos[sym] = info
        expected = a * self.env.var_to_val[info.sym] + b
        if expected != size:
            raise UserError(UserErrorType.CONSTRAINT_VIOLATION, f"Expected input at {source_text} to be equal to "
                            f"{expected} ({spec.__name__}, with {root.__name__} = {info.source}), but got {size}")
        expr = a * info.sym + b
        return SymInt(expr, self.env)

    def range_constraints(self) -> dict:
        return {s: ValueRanges(i.lo, i.hi) for s, i in self.infos.items()}

    def dim_names(self) -> dict:
        """{symbol name: the user's Dim name} of the symbols made for Dims (not for AUTO/DYNAMIC dims)."""
        return {s.name: i.name for s, i in self.infos.items() if i.kind == "Dim"}


# ---- checking the guards against the Dims ------------------------------------------------------------
def _range_text(info: DimInfo) -> str:
    parts = []
    if info.lo > 0:
        parts.append(f"{info.lo} <=")
    parts.append(info.name)
    if info.hi != INT_OO:
        parts.append(f"<= {info.hi}")
    return " ".join(parts)


def _source_map(table: SymbolTable) -> dict:
    return {s: i.source for s, i in table.infos.items()}


def _holds_on_range(guard, sym, lo: int, hi) -> tuple:
    """(whether `guard` holds for every integer in [lo, hi], the sub-range where it holds or None)."""
    sp = _sp()
    var = sp.Symbol("v", real=True)
    g = guard.xreplace({sym: var})
    try:
        sol = sp.solve_univariate_inequality(g, var, relational=False) if not isinstance(g, (sp.Eq, sp.Ne)) \
            else (sp.FiniteSet(*sp.solve(g.lhs - g.rhs, var)) if isinstance(g, sp.Eq)
                  else sp.Complement(sp.S.Reals, sp.FiniteSet(*sp.solve(g.lhs - g.rhs, var))))
    except (NotImplementedError, TypeError, ValueError):      # e.g. a divisibility guard: try the sizes
        top = lo + GUARD_SAMPLES if hi == INT_OO else min(hi, lo + GUARD_SAMPLES)
        holds = all(bool(guard.xreplace({sym: v})) for v in range(max(lo, SIZE_OBLIVIOUS_MIN), top + 1))
        return holds, None
    span = sp.Interval(max(lo, SIZE_OBLIVIOUS_MIN), sp.oo if hi == INT_OO else hi)
    if span.is_subset(sol):
        return True, None
    kept = sol.intersect(sp.Interval(lo, sp.oo if hi == INT_OO else hi))
    if kept.is_empty or not isinstance(kept, sp.Interval):
        return False, None
    new_lo = kept.inf if not kept.left_open else kept.inf + 1
    new_hi = kept.sup if not kept.right_open else kept.sup - 1
    new_lo = int(sp.ceiling(new_lo))
    new_hi = INT_OO if new_hi == sp.oo else int(sp.floor(new_hi))
    return False, (new_lo, new_hi)


def _constant_of(guard, sym):
    """The integer `guard` (an equation in `sym` alone) pins `sym` to, or None (a divisibility guard)."""
    sp = _sp()
    try:
        vals = sp.solve(guard.lhs - guard.rhs, sym)
    except (NotImplementedError, TypeError, ValueError):
        return None
    return int(vals[0]) if len(vals) == 1 and vals[0].is_Integer else None


def check_constraints(shape_env, table: SymbolTable) -> None:
    """Raise UserError naming every Dim that the recorded guards specialise, equate or restrict."""
    sp = _sp()
    sources = _source_map(table)
    problems, fixes, names = [], [], []

    def name(s) -> str:
        return table.infos[s].name

    constant = {}                       # symbol -> the constant a guard specialises it to
    for g in shape_env.guards:
        syms = [s for s in g.free_symbols if s in table.infos]
        if isinstance(g, sp.Eq) and len(syms) == 1 and syms[0] not in constant:
            val = _constant_of(g, syms[0])
            if val is not None:
                constant[syms[0]] = val
    for g in shape_env.guards:
        syms = sorted((s for s in g.free_symbols if s in table.infos), key=lambda s: s.name)
        if not syms:
            continue
        text = expr_to_python(g, sources)
        if any(s in constant for s in syms) and not (len(syms) == 1 and _constant_of(g, syms[0]) is not None):
            continue                    # implied by the specialisation, which is reported
        if isinstance(g, sp.Eq) and len(syms) == 1 and syms[0] in constant:
            info = table.infos[syms[0]]
            if info.kind in _UNCHECKED:
                continue
            val = constant[syms[0]]
            names.append(info.name)
            problems.append(f"You marked {info.name} as dynamic but your code specialized it to be a constant "
                            f"({val}). If you're using Dim.DYNAMIC, replace it with either Dim.STATIC or Dim.AUTO.")
            fixes.append(f"{info.name} = {val}")
        elif isinstance(g, sp.Eq) and len(syms) == 2:
            a, b = syms
            if any(table.infos[s].kind in _UNCHECKED for s in syms):
                continue
            names += [name(b), name(a)]
            problems.append(f"The values of {name(b)} = {sources[b]} and {name(a)} = {sources[a]} must always be "
                            "equal.")
            sol = sp.solve(g.lhs - g.rhs, b)
            rhs = str(sol[0].xreplace({a: sp.Symbol(name(a))})) if len(sol) == 1 else name(a)
            fixes.append(f"{name(b)} = {rhs}")
        elif len(syms) == 1:
            info = table.infos[syms[0]]
            ok, new = _holds_on_range(g, syms[0], info.lo, info.hi)
            if ok or info.kind in _UNCHECKED:
                continue
            names.append(info.name)
            problems.append(f"Not all values of {info.name} = {info.source} in the specified range "
                            f"{_range_text(info)} satisfy the generated guard {text}")
            if new is not None:
                hi = "" if new[1] == INT_OO else f", max={new[1]}"
                fixes.append(f"{info.name} = Dim({info.name!r}, min={new[0]}{hi})")
        else:
            if all(table.infos[s].kind in _UNCHECKED for s in syms):
                continue
            names += [name(s) for s in syms]
            problems.append(f"Not all values of {', '.join(name(s) for s in syms)} satisfy the generated guard {text}")
    if problems:
        uniq = list(dict.fromkeys(names))
        msg = f"Constraints violated ({', '.join(uniq)})! For more information, run with FLAMBEAU_LOGS=\"+dynamic\".\n"
        msg += "".join(f"  - {p}\n" for p in problems)
        if fixes:
            msg += "Suggested fixes:\n" + "".join(f"  {f}\n" for f in dict.fromkeys(fixes))
        raise UserError(UserErrorType.CONSTRAINT_VIOLATION, msg)
