"""Symbolic sizes: `SymInt` (a sympy expression over size symbols) and `ShapeEnv` (symbols, their
example values, guards).

A fake tensor made with `ShapeEnv.create_symbolic_sizes` has SymInt sizes, so the operators'
meta functions compute symbolic output shapes with ordinary Python arithmetic. When a meta
function branches on a size (`s0 == 1`, `a != b`), the relation is decided by sympy if it can, else
by the example values ("hints"), and the outcome is recorded as a guard: the traced graph is valid
for every size assignment that satisfies all guards (`ShapeEnv.evaluate_guards`). `int(s)` or
`operator.index(s)` specialises: it guards `s == hint` and returns the hint. `expr_to_python` prints
a guard or a derived size as Python over the input shapes.

Like PyTorch: sizes 0 and 1 are specialised (never symbolic), equal example sizes share one
symbol ("duck sizing"), and symbols are positive integers. sympy is imported on first use.
"""
from __future__ import annotations

import numpy

_sympy = None


def _sp():
    global _sympy
    if _sympy is None:
        import sympy  # deferred: sympy is slow to import
        _sympy = sympy
    return _sympy


class ShapeEnv:
    """Owns size symbols, their hints, their sources and the guards recorded while tracing."""

    def __init__(self, duck_shape: bool = True):
        self.var_to_val: dict = {}          # sympy.Symbol -> example int
        self.var_to_sources: dict = {}      # sympy.Symbol -> [(source name, dim)]
        self.guards: list = []              # sympy booleans that must hold
        self._guard_set: set = set()
        self._val_to_var: dict = {}
        self.duck_shape = duck_shape

    def create_symbol(self, hint: int, source=None):
        """A SymInt for a size with example value `hint` (0 and 1 stay plain ints)."""
        if hint in (0, 1):
            return hint
        sym = self._val_to_var.get(hint) if self.duck_shape else None
        if sym is None:
            sym = _sp().Symbol(f"s{len(self.var_to_val)}", integer=True, positive=True)
            self.var_to_val[sym] = hint
            self._val_to_var.setdefault(hint, sym)
        if source is not None:
            self.var_to_sources.setdefault(sym, []).append(source)
        return SymInt(sym, self)

    def create_symbolic_sizes(self, shape, source_name: str = "") -> tuple:
        return tuple(self.create_symbol(int(s), (source_name, i)) for i, s in enumerate(shape))

    def hint(self, expr) -> int:
        return int(expr.xreplace(self.var_to_val))

    def evaluate_expr(self, rel) -> bool:
        """Decide a sympy relation: statically if sympy can, else by the hints plus a guard."""
        sp = _sp()
        if rel is sp.true or rel is True:
            return True
        if rel is sp.false or rel is False:
            return False
        value = bool(rel.xreplace(self.var_to_val))
        guard = rel if value else _negate(rel)
        if guard not in self._guard_set:
            self._guard_set.add(guard)
            self.guards.append(guard)
        return value

    def evaluate_guards(self, values: dict) -> bool:
        """Do the guards hold when the symbols take `values` ({symbol or its name: int})?"""
        sp = _sp()
        subs = {}
        for sym in self.var_to_val:
            if sym in values:
                subs[sym] = values[sym]
            elif sym.name in values:
                subs[sym] = values[sym.name]
        return all(bool(g.xreplace({k: sp.Integer(v) for k, v in subs.items()})) for g in self.guards)

    def bindings_from_shapes(self, shapes: list) -> dict:
        """{symbol: value} read from concrete input shapes, using the symbols' recorded sources
        (source names are input indices as strings, as made by make_fx)."""
        out = {}
        for sym, sources in self.var_to_sources.items():
            name, dim = sources[0]
            out[sym] = int(shapes[int(name)][dim])
        return out

    def format_guards(self) -> str:
        return "\n".join(f" - {g}" for g in self.guards)


def _negate(rel):
    sp = _sp()
    neg = {sp.Eq: sp.Ne, sp.Ne: sp.Eq, sp.Lt: sp.Ge, sp.Ge: sp.Lt, sp.Gt: sp.Le, sp.Le: sp.Gt}
    for k, v in neg.items():
        if type(rel) is k:
            return v(*rel.args)
    return sp.Not(rel)


def _expr(x):
    if isinstance(x, SymInt):
        return x.expr
    return _sp().Integer(int(x))


def _wrap(expr, env):
    if expr.is_Integer:
        return int(expr)
    return SymInt(expr, env)


def _is_intlike(x) -> bool:
    return isinstance(x, (int, SymInt)) and not isinstance(x, bool)


def _arith(fn, reflected=False):
    def impl(self, other):
        if not _is_intlike(other):
            return NotImplemented
        a, b = (_expr(other), self.expr) if reflected else (self.expr, _expr(other))
        return _wrap(fn(a, b), self.env)
    return impl


def _compare(rel_name):
    def impl(self, other):
        if not _is_intlike(other):
            return NotImplemented
        rel = getattr(_sp(), rel_name)(self.expr, _expr(other))
        return self.env.evaluate_expr(rel)
    return impl


def _floordiv(a, b):
    return _sp().floor(a / b)


def _mod(a, b):
    return _sp().Mod(a, b)


class SymInt:
    """A symbolic integer size (see module docstring)."""
    __slots__ = ("expr", "env")

    def __init__(self, expr, env: ShapeEnv):
        self.expr = expr
        self.env = env

    @property
    def node(self):
        return self

    def hint(self) -> int:
        return self.env.hint(self.expr)

    # operators take a SymInt operand like a 0-dim int64 array (type promotion as for a Python int)
    ndim = 0
    shape = ()

    @property
    def dtype(self):
        return numpy.dtype("int64")

    __add__ = _arith(lambda a, b: a + b)
    __radd__ = _arith(lambda a, b: a + b, True)
    __sub__ = _arith(lambda a, b: a - b)
    __rsub__ = _arith(lambda a, b: a - b, True)
    __mul__ = _arith(lambda a, b: a * b)
    __rmul__ = _arith(lambda a, b: a * b, True)
    __floordiv__ = _arith(_floordiv)
    __rfloordiv__ = _arith(_floordiv, True)
    __mod__ = _arith(_mod)
    __rmod__ = _arith(_mod, True)
    __eq__ = _compare("Eq")
    __ne__ = _compare("Ne")
    __lt__ = _compare("Lt")
    __le__ = _compare("Le")
    __gt__ = _compare("Gt")
    __ge__ = _compare("Ge")

    def __pow__(self, other):
        if type(other) is not int or other < 0:       # an int result only for a non-negative int exponent
            return NotImplemented
        return _wrap(self.expr ** other, self.env)

    def __neg__(self):
        return _wrap(-self.expr, self.env)

    def __pos__(self):
        return self

    def __abs__(self):
        return self

    def __bool__(self) -> bool:
        return self.env.evaluate_expr(_sp().Ne(self.expr, 0))

    def __int__(self) -> int:
        h = self.hint()
        self.env.evaluate_expr(_sp().Eq(self.expr, h))
        return h

    __index__ = __int__

    def __float__(self) -> float:
        return float(int(self))

    def __hash__(self):
        raise TypeError("unhashable type: non-nested SymInt")

    def __repr__(self) -> str:
        return str(self.expr)

    __str__ = __repr__

    def __format__(self, spec) -> str:
        return format(str(self), spec)


def is_symbolic(x) -> bool:
    return isinstance(x, SymInt)


def free_symbols(x) -> set:
    return set(x.expr.free_symbols) if isinstance(x, SymInt) else set()


def sym_size(t, dim: int):
    """`t.size(dim)`: the node that reads a symbolic size at run time."""
    return t.shape[dim]


def expr_to_python(e, mapping: dict) -> str:
    """Python source for the sympy expression `e`, each symbol replaced by `mapping[symbol]`: how a
    guard (`s0 >= 2`, `Eq(s1, 2*s0)`) or a size derived from other sizes is printed as code over
    input shapes (dynamo's guards, AOT autograd's size outputs, the inductor's wrapper)."""
    sp = _sp()
    if e is sp.true:
        return "True"
    if e is sp.false:
        return "False"
    if e.is_Symbol:
        if e not in mapping:
            raise NotImplementedError(f"symbol {e} has no source")
        return mapping[e]
    if e.is_Integer:
        return str(int(e))
    if e.is_Rational:
        return f"({int(e.p)} / {int(e.q)})"
    rels = {sp.Eq: "==", sp.Ne: "!=", sp.Lt: "<", sp.Le: "<=", sp.Gt: ">", sp.Ge: ">="}
    for k, op in rels.items():
        if type(e) is k:
            return f"({expr_to_python(e.args[0], mapping)} {op} {expr_to_python(e.args[1], mapping)})"
    if isinstance(e, sp.And):
        return "(" + " and ".join(expr_to_python(a, mapping) for a in e.args) + ")"
    if isinstance(e, sp.Or):
        return "(" + " or ".join(expr_to_python(a, mapping) for a in e.args) + ")"
    if isinstance(e, sp.Not):
        return f"(not {expr_to_python(e.args[0], mapping)})"
    if e.is_Add:
        return "(" + " + ".join(expr_to_python(a, mapping) for a in e.args) + ")"
    if e.is_Mul:
        num, den = sp.fraction(e)
        if den != 1:
            return f"({expr_to_python(num, mapping)} / {expr_to_python(den, mapping)})"
        return "(" + " * ".join(expr_to_python(a, mapping) for a in e.args) + ")"
    if e.is_Pow and e.args[1].is_Integer:
        if e.args[1] < 0:
            return f"(1 / {expr_to_python(e.args[0], mapping)} ** {int(-e.args[1])})"
        return f"({expr_to_python(e.args[0], mapping)} ** {int(e.args[1])})"
    if isinstance(e, sp.floor):
        num, den = sp.fraction(sp.together(e.args[0]))      # floor(s/2 + 1/2): (s + 1) // 2
        if den != 1:
            return f"({expr_to_python(num, mapping)} // {expr_to_python(den, mapping)})"
        return expr_to_python(e.args[0], mapping)
    if isinstance(e, sp.ceiling):
        num, den = sp.fraction(sp.together(e.args[0]))
        return f"(-((-{expr_to_python(num, mapping)}) // {expr_to_python(den, mapping)}))"
    if isinstance(e, sp.Mod):
        return f"({expr_to_python(e.args[0], mapping)} % {expr_to_python(e.args[1], mapping)})"
    if isinstance(e, (sp.Max, sp.Min)):
        fn = "max" if isinstance(e, sp.Max) else "min"
        return f"{fn}({', '.join(expr_to_python(a, mapping) for a in e.args)})"
    raise NotImplementedError(type(e).__name__)
