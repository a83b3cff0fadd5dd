"""Symbolic sizes in the loop IR: `SizeExpr`, a polynomial with integer coefficients over size
symbols (s0, s1, ... as named by the tracer's ShapeEnv).

Design (graphs traced with `dynamic=True`, `mark_dynamic` or automatic dynamic shapes): a size, a
stride, a loop extent, an Index coefficient/constant or a divisor is `int | SizeExpr`. Arithmetic
normalises, so a value without symbols is a plain `int` and static graphs never see this type.
The generated kernels take the symbols as `int64_t` arguments; `str(e)` prints an expression that
is valid C++ and Python over variables named like the symbols.

A size that is not a polynomial because of a floor division (`floor(s1/2)`, from `view(n, 2, -1)`;
a modulo `Mod(s, c)` is `s - c*floor(s/c)`) gets a *derived* symbol (`d` and a hash of the
expression) that the wrapper computes from the base ones; it is only known to be >= 0.

A symbol that a guard pins to one value (`Eq(s1, 6)`: a dynamic dim matched with a weight's by a
matrix product) is that constant, as in PyTorch.

Decisions follow the tracer's rules: a size symbol stands for an integer >= 2 (sizes 0 and 1 are
specialised; the wrapper checks this at run time and runs the graph eagerly otherwise).
- `==`/`!=` compare the polynomials (equal forms are equal for every size; the tracer has already
  guarded the relations that the graph's shapes depend on).
- `<`, `<=`, `>`, `>=`, `bool()` decide when the answer holds for every value of the symbols
  (>= 2; derived ones >= 0) and raise `Unsupported` otherwise, so a lowering that needs the answer
  falls back instead of guessing.
- `known_nonneg`/`known_lt` answer "provably" (False when unknown): simplifications use them and
  simply don't simplify when a fact can't be proved.
- `int()` raises `Unsupported` (code that needs a concrete value can't serve every size).
"""
from __future__ import annotations

import hashlib
import math
import weakref
from ..fx._symbolic_shapes import SymInt


class Unsupported(Exception):
    """Raised by a lowering that cannot handle its input: the node becomes a fallback kernel."""


MIN_SIZE = 2          # the least value a size symbol takes (a derived one: 0)


def _make(terms: dict):
    """int | SizeExpr from {monomial: coeff}; a monomial is a sorted tuple of symbol names."""
    terms = {m: c for m, c in terms.items() if c != 0}
    if not terms:
        return 0
    if len(terms) == 1 and () in terms:
        return terms[()]
    e = SizeExpr.__new__(SizeExpr)
    e.terms = tuple(sorted(terms.items(), key=lambda t: (not t[0], t[0])))   # constant last
    return e


def _terms(x) -> dict:
    if isinstance(x, SizeExpr):
        return dict(x.terms)
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"not a size: {x!r}")
    return {(): x} if x else {}


class SizeExpr:
    """A polynomial over size symbols (see module docstring); immutable and hashable."""
    __slots__ = ("terms",)

    @staticmethod
    def symbol(name: str):
        return _make({(name,): 1})

    def __add__(self, o):
        if not isinstance(o, (int, SizeExpr)):
            return NotImplemented
        t = dict(self.terms)
        for m, c in _terms(o).items():
            t[m] = t.get(m, 0) + c
        return _make(t)

    __radd__ = __add__

    def __neg__(self):
        return _make({m: -c for m, c in self.terms})

    def __sub__(self, o):
        if not isinstance(o, (int, SizeExpr)):
            return NotImplemented
        return self + (-o)

    def __rsub__(self, o):
        return (-self) + o

    def __mul__(self, o):
        if not isinstance(o, (int, SizeExpr)):
            return NotImplemented
        t: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(o).items():
                m = tuple(sorted(m1 + m2))
                t[m] = t.get(m, 0) + c1 * c2
        return _make(t)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        if not isinstance(o, (int, SizeExpr)):
            return NotImplemented
        q = exact_div(self, o)
        return q if q is not None else _floor_div(self, o)

    def __rfloordiv__(self, o):
        q = exact_div(o, self)
        return q if q is not None else _floor_div(o, self)

    def __mod__(self, o):
        if not isinstance(o, (int, SizeExpr)):
            return NotImplemented
        return self - o * (self // o)

    def __rmod__(self, o):
        if not isinstance(o, int):
            return NotImplemented
        return o - self * (o // self)

    def __pow__(self, k):
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            return NotImplemented
        return math.prod([self] * k) if k else 1

    def to_sympy(self):
        import sympy  # deferred: sympy is slow to import
        out = sympy.Integer(0)
        for m, c in self.terms:
            term = sympy.Integer(c)
            for name in m:
                term = term * (_derived_defs.get(name) or sympy.Symbol(name, integer=True, positive=True))
            out = out + term
        return out

    def __eq__(self, o):
        return isinstance(o, SizeExpr) and o.terms == self.terms

    def __ne__(self, o):
        return not self.__eq__(o)

    def __hash__(self):
        return hash(self.terms)

    def __lt__(self, o):
        return _decide(_sub(o, self) - 1)

    def __le__(self, o):
        return _decide(_sub(o, self))

    def __gt__(self, o):
        return _decide(_sub(self, o) - 1)

    def __ge__(self, o):
        return _decide(_sub(self, o))

    def __bool__(self):
        if known_nonneg(self - 1) or known_nonneg(-self - 1):
            return True
        raise Unsupported(f"cannot decide whether the symbolic size {self} is zero")

    def __int__(self):
        raise Unsupported(f"a concrete value of the symbolic size {self} is needed")

    __index__ = __int__

    def free_symbols(self) -> set:
        return {s for m, _ in self.terms for s in m}

    def __str__(self):
        parts = []
        for m, c in self.terms:
            mono = "*".join(m)
            if not m:
                s = str(abs(c))
            elif abs(c) == 1:
                s = mono
            else:
                s = f"{abs(c)}*{mono}"
            parts.append(("- " if c < 0 else "+ ") + s)
        out = " ".join(parts)
        out = out[2:] if out.startswith("+ ") else "-" + out[2:]
        lone = len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1
        return out if lone else f"({out})"          # safe as an operand of any C/Python operator

    __repr__ = __str__

    def evaluate(self, env: dict) -> int:
        return sum(c * math.prod(env[s] for s in m) for m, c in self.terms)


def _floor_div(a, b):
    """a // b that is not exact: a derived symbol for floor(a / b) (b must be positive)."""
    import sympy  # deferred: sympy is slow to import
    if not known_nonneg(b - 1):
        raise Unsupported(f"floor division of {a} by {b}")
    sa = a.to_sympy() if isinstance(a, SizeExpr) else sympy.Integer(a)
    sb = b.to_sympy() if isinstance(b, SizeExpr) else sympy.Integer(b)
    return _note(_from_sympy(sympy.floor(sa / sb), {}))


def _sub(a, b):
    return a - b


def _decide(e) -> bool:
    """e >= 0 for every symbol value >= MIN_SIZE (True), for none (False), else Unsupported."""
    if known_nonneg(e):
        return True
    if known_nonneg(-e - 1):
        return False
    raise Unsupported(f"cannot decide {e} >= 0 for every size")


def known_nonneg(e) -> bool:
    """Provably e >= 0 when every symbol is >= its least value: after substituting s = least + t
    (t >= 0) every coefficient is >= 0 (sufficient, not necessary). A derived symbol d = floor(a/b)
    that e holds as k*b*d is bounded first (a - b + 1 <= b*d <= a), so `n - Mod(3, n)` (roll's slice
    start: n - 3 + n*floor(3/n)) is known to be >= 1."""
    if isinstance(e, int):
        return e >= 0
    for d in e.free_symbols():
        bound = _floor_lower_bound(e, d)
        if bound is not None and known_nonneg(bound):
            return True
    shifted: dict = {(): 0}
    for m, c in e.terms:
        poly = {(): c}
        for s in m:                              # multiply by (t_s + least value of s)
            low = 0 if s in _derived_defs else MIN_SIZE
            nxt: dict = {}
            for pm, pc in poly.items():
                k = tuple(sorted(pm + (s,)))
                nxt[k] = nxt.get(k, 0) + pc
                nxt[pm] = nxt.get(pm, 0) + pc * low
            poly = nxt
        for pm, pc in poly.items():
            shifted[pm] = shifted.get(pm, 0) + pc
    return all(c >= 0 for c in shifted.values())


def _floor_lower_bound(e, d):
    """A lower bound of `e` without the derived symbol `d` = floor(a/b), when e = p + k*b*d with an
    integer k and d only in that term; else None."""
    f = _derived_defs.get(d)
    if f is None:
        return None
    num, den = f.args[0].as_numer_denom()
    a, b = _from_sympy(num, {}), _from_sympy(den, {})
    if not known_nonneg(b - 1):
        return None
    rest, with_d = {}, {}
    for m, c in e.terms:
        if d not in m:
            rest[m] = c
        elif m.count(d) == 1:
            r = list(m)
            r.remove(d)
            with_d[tuple(r)] = c
        else:
            return None
    k = exact_div(_make(with_d), b)
    if not isinstance(k, int):
        return None
    return _make(rest) + (k * (a - b + 1) if k > 0 else k * a)


def known_lt(a, b) -> bool:
    return known_nonneg(_sub(b, a) - 1)


def exact_div(a, b):
    """a / b when b divides a as polynomials (b an int or a single term), else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    if isinstance(b, int):
        if b == 0 or any(c % b for _, c in a.terms):
            return None
        return _make({m: c // b for m, c in a.terms})
    if len(b.terms) != 1:
        return 1 if a == b else None
    (bm, bc), = b.terms
    out = {}
    for m, c in _terms(a).items():
        rest = list(m)
        for s in bm:
            if s not in rest:
                return None
            rest.remove(s)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return _make(out)


def divisible(a, b) -> bool:
    return exact_div(a, b) is not None


def is_symbolic(x) -> bool:
    return isinstance(x, SizeExpr)


def skey(x):
    """A sort/hash key for int | SizeExpr (the two never compare with `<`)."""
    return (0, x) if isinstance(x, int) else (1, x.terms)


def evaluate(x, env: dict) -> int:
    return x.evaluate(env) if isinstance(x, SizeExpr) else x


def from_sym(x):
    """int | SizeExpr for an int or a tracer SymInt (a sympy polynomial with integer coefficients);
    Unsupported for anything else (floor division, modulo, rational coefficients of symbols)."""
    if isinstance(x, bool):
        raise Unsupported("a bool where a size is expected")
    if isinstance(x, (int, SizeExpr)):
        return x
    if not isinstance(x, SymInt):
        raise Unsupported(f"not a size: {type(x).__name__}")
    return _note(_from_sympy(x.expr, replacements(x.env)))


_seen: list = []            # stack of sets collecting the derived symbols met while lowering a graph


class collect_derived:
    """`with collect_derived() as names:` gathers the derived symbols of every size converted or
    computed inside the block (the kernels of a graph take them as arguments)."""

    def __enter__(self) -> set:
        _seen.append(set())
        return _seen[-1]

    def __exit__(self, *exc):
        _seen.pop()


def _note(e):
    if _seen and isinstance(e, SizeExpr):
        _seen[-1].update(n for n in e.free_symbols() if n in _derived_defs)
    return e


_cache: dict = {}
_repl_cache = weakref.WeakKeyDictionary()     # ShapeEnv -> (number of guards seen, replacements)


def replacements(env) -> dict:
    """{symbol: value} for the symbols a guard pins to one value (`Eq(s1, 6)`: a dynamic dim that a
    matrix product matched with a static one); like PyTorch, those sizes are static after all."""
    hit = _repl_cache.get(env)
    if hit is None or hit[0] != len(env.guards):
        import sympy  # deferred: sympy is slow to import
        repl = {}
        for g in env.guards:
            if isinstance(g, sympy.Eq):
                pinned = _pinned_symbol(sympy, g.args[0] - g.args[1])
                if pinned is not None:
                    repl[pinned[0]] = pinned[1]
        hit = _repl_cache[env] = (len(env.guards), repl)
    return hit[1]


def _pinned_symbol(sympy, e):
    """(symbol, value) when `e == 0` pins its one symbol to an integer, linearly (`s1 - 1 - 1`: a
    broadcast that guarded `Eq(s1 - 1, 1)`, so s1 is 2), else None."""
    if len(e.free_symbols) != 1:
        return None
    sym, = e.free_symbols
    poly = sympy.Poly(e, sym) if e.is_polynomial(sym) else None
    if poly is None or poly.degree() != 1:
        return None
    c, d = poly.all_coeffs()
    value = -d / c
    return (sym, value) if value.is_Integer else None


def _from_sympy(expr, repl: dict):
    key = (expr, tuple(sorted((str(k), int(v)) for k, v in repl.items() if k in expr.free_symbols)))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    import sympy  # deferred: sympy is slow to import
    if repl:
        expr = expr.xreplace(repl)
    if expr.is_Integer:
        return int(expr)
    if expr.atoms(sympy.Mod):
        expr = expr.replace(lambda e: isinstance(e, sympy.Mod),
                            lambda e: e.args[0] - e.args[1] * sympy.floor(e.args[0] / e.args[1]))
    floors = expr.atoms(sympy.floor)
    if floors:                                   # floor(s1/2) (a view's inferred -1): a derived symbol
        expr = expr.xreplace({f: sympy.Symbol(_derived_name(f), integer=True, positive=True) for f in floors})
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    try:
        poly = sympy.Poly(sympy.expand(expr), *syms)
    except sympy.PolynomialError as e:
        raise Unsupported(f"symbolic size {expr} is not a polynomial") from e
    terms = {}
    for exps, c in poly.terms():
        if not c.is_Integer:
            raise Unsupported(f"symbolic size {expr} has a non-integer coefficient")
        mono = tuple(sorted(s.name for s, k in zip(syms, exps) for _ in range(k)))
        terms[mono] = int(c)
    out = _make(terms)
    _cache[key] = out
    return out


_derived: dict = {}         # floor(...) sympy expression -> name
_derived_defs: dict = {}    # name -> floor(...) sympy expression


def _derived_name(f) -> str:
    """A name fixed by the expression (the kernel source, hence the disk cache key, doesn't depend
    on what else the process compiled)."""
    name = _derived.get(f)
    if name is None:
        name = _derived[f] = "d" + hashlib.sha1(str(f).encode()).hexdigest()[:8]
        _derived_defs[name] = f
    return name


def derived_definition(name: str):
    """The sympy expression (a floor division of base symbols) a derived size symbol stands for,
    or None for a base symbol. The wrapper computes derived symbols from the base ones."""
    return _derived_defs.get(name)


def size_tuple(shape) -> tuple:
    return tuple(from_sym(s) for s in shape)
