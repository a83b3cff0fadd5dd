"""Index expressions: the integer algebra of loop indices that the loop IR uses to address memory.

An `Index` is an affine combination `c0 + sum(k_i * atom_i)` of *atoms*:
    Sym(name, size)        a loop variable ranging over [0, size)
    FloorDiv(index, c)     floor(index / c), c > 0
    Mod(index, c)          index mod c, c > 0 (result in [0, c))
    Indirect(name, size)   an index read from a tensor (gather/embedding), wrapped into [0, size)
Construction simplifies with value ranges (every atom knows its bounds), so the index remappings
that views compose (reshape = flatten then split) collapse back to plain affine forms:
`(x // 8) * 8 + x % 8 -> x`, `(8*i + j) // 8 -> i` when 0 <= j < 8. The scheduler needs affine
forms to prove that fusing two loops is legal, and the C++ compiler needs them to vectorise.

With symbolic sizes (see sizevars.py) coefficients, constants, atom sizes and divisors may be
`SizeExpr` polynomials over size symbols: `(s1*i + j) // s1 -> i` when 0 <= j < s1 still
simplifies because divisibility and bounds are decided on the polynomials; a fact that can't be
proved for every size leaves the expression unsimplified (correct, maybe not affine).
"""
from __future__ import annotations

import math

from .sizevars import divisible, exact_div, known_lt, known_nonneg, skey, Unsupported, SizeExpr, from_sym
from ..fx._symbolic_shapes import SymInt


class Atom:
    __slots__ = ()

    def bounds(self) -> tuple:
        raise NotImplementedError


class _Named(Atom):
    """A named value in [0, size): a loop variable (Sym) or an index read from memory (Indirect)."""
    __slots__ = ("name", "size")
    _tag = ""

    def __init__(self, name: str, size):
        self.name = name
        self.size = size

    def bounds(self):
        # (a symbolic size may be <= 0 only where the loop runs no iteration: size - 1 bounds it)
        return 0, max(self.size - 1, 0) if isinstance(self.size, int) else self.size - 1

    def key(self):
        return (self._tag, self.name)

    def __repr__(self):
        return self.name


class Sym(_Named):
    __slots__ = ()
    _tag = "s"


class Indirect(_Named):
    __slots__ = ()
    _tag = "i"


class FloorDiv(Atom):
    __slots__ = ("arg", "div")

    def __init__(self, arg: "Index", div):
        self.arg = arg
        self.div = div

    def bounds(self):
        lo, hi = self.arg.bounds()
        nonneg = known_nonneg(lo)           # (then hi >= 0 too, or the argument takes no value)
        return _floor_bound(lo, self.div, True, nonneg), _floor_bound(hi, self.div, False, nonneg)

    def key(self):
        return ("d", self.arg.key(), skey(self.div))

    def __repr__(self):
        return f"({self.arg!r} // {self.div})"


class Mod(Atom):
    __slots__ = ("arg", "div")

    def __init__(self, arg: "Index", div):
        self.arg = arg
        self.div = div

    def bounds(self):
        lo, hi = self.arg.bounds()
        if known_nonneg(lo) and known_lt(hi, self.div):
            return lo, hi
        return 0, self.div - 1

    def key(self):
        return ("m", self.arg.key(), skey(self.div))

    def __repr__(self):
        return f"({self.arg!r} % {self.div})"


class Index:
    """`const + sum(coeff * atom)`; immutable, hashable through `key()`."""
    __slots__ = ("terms", "const", "_key")

    def __init__(self, terms: dict | None = None, const=0):
        self.terms = {k: v for k, v in (terms or {}).items() if v[1] != 0}   # key -> (atom, coeff)
        self.const = _size(const)
        self._key = None

    @classmethod
    def _made(cls, terms: dict, const) -> "Index":
        """An Index of `terms` (no zero coefficient; the dict is not copied: indices are immutable) and a
        `const` already an int or SizeExpr: the arithmetic below builds these."""
        e = object.__new__(cls)
        e.terms, e.const, e._key = terms, const, None
        return e

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def of(x) -> "Index":
        if isinstance(x, Index):
            return x
        if isinstance(x, Atom):
            return Index._made({x.key(): (x, 1)}, 0)
        if type(x) is int:
            return Index._made({}, x)
        return Index(None, x)

    def key(self):
        if self._key is None:
            self._key = (skey(self.const), tuple(sorted((k, skey(c)) for k, (_, c) in self.terms.items())))
        return self._key

    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other) -> "Index":
        o = other if type(other) is Index else Index.of(other)
        terms = dict(self.terms)
        for k, t in o.terms.items():
            old = terms.get(k)
            if old is None:
                terms[k] = t
            else:
                c = old[1] + t[1]
                if c != 0:
                    terms[k] = (t[0], c)
                else:
                    del terms[k]
        return _combine_divmod(Index._made(terms, self.const + o.const))

    __radd__ = __add__

    def __mul__(self, k) -> "Index":
        if isinstance(k, Index):
            if k.is_const():
                k = k.const
            elif self.is_const():
                return k * self.const
            else:
                raise TypeError("index expressions are linear: cannot multiply two variable indices")
        k = k if type(k) is int else _size(k)
        if type(k) is int and k != 0:       # a nonzero int keeps every coefficient nonzero
            return Index._made({key: (a, c * k) for key, (a, c) in self.terms.items()}, self.const * k)
        return Index({key: (a, c * k) for key, (a, c) in self.terms.items()}, self.const * k)

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1

    def __sub__(self, other):
        return self + (-Index.of(other))

    def __floordiv__(self, c) -> "Index":
        c = _size(c)
        if c == 1:
            return self
        if c == 0:                      # only in an empty iteration space: never evaluated
            return Index()
        q_terms, r_terms = {}, {}
        for k, (a, co) in self.terms.items():
            q = exact_div(co, c)
            if q is not None:
                q_terms[k] = (a, q)
            else:
                r_terms[k] = (a, co)
        q0, r0 = _divmod(self.const, c)
        rest = Index(r_terms, r0)
        lo, hi = rest.bounds()
        quot = Index(q_terms, q0)
        if known_nonneg(lo) and known_lt(hi, c):
            return quot
        if rest.is_const() and isinstance(rest.const, int) and isinstance(c, int):
            return quot + rest.const // c
        if len(rest.terms) == 1 and rest.const == 0:
            (a, co), = rest.terms.values()
            if co == 1 and isinstance(a, FloorDiv):
                return quot + Index.of(FloorDiv(a.arg, a.div * c))
        split = _split_by_divisor(rest, c)
        if split is not None:                       # (g*A + s) // c == A // (c/g) when 0 <= s < g
            big, g, _ = split
            return quot + big // (c // g)
        return quot + Index.of(FloorDiv(rest, c))

    def __mod__(self, c) -> "Index":
        c = _size(c)
        if c == 0 or c == 1:
            return Index()
        r_terms = {k: (a, co) for k, (a, co) in self.terms.items() if not divisible(co, c)}
        rest = Index(r_terms, _divmod(self.const, c)[1])
        lo, hi = rest.bounds()
        if known_nonneg(lo) and known_lt(hi, c):
            return rest
        split = _split_by_divisor(rest, c)
        if split is not None:                       # (g*A + s) % c == g*(A % (c/g)) + s when 0 <= s < g
            big, g, small = split
            return (big % (c // g)) * g + small
        return Index.of(Mod(rest, c))

    # -- analysis -----------------------------------------------------------------------------
    def bounds(self) -> tuple:
        lo = hi = self.const
        for a, c in self.terms.values():
            alo, ahi = a.bounds()
            if known_nonneg(c):
                lo += c * alo
                hi += c * ahi
            elif known_nonneg(-c):
                lo += c * ahi
                hi += c * alo
            else:
                raise Unsupported(f"cannot bound an index with coefficient {c}")
        return lo, hi

    def coeff(self, sym: Sym):
        t = self.terms.get(sym.key())
        return t[1] if t else 0

    def atoms(self):
        """Every atom, recursively (the atoms inside FloorDiv/Mod arguments too)."""
        for a, _ in self.terms.values():
            yield a
            if isinstance(a, (FloorDiv, Mod)):
                yield from a.arg.atoms()

    def uses(self, names) -> bool:
        return any(isinstance(a, (Sym, Indirect)) and a.name in names for a in self.atoms())

    def is_affine_in(self, names) -> bool:
        """No FloorDiv/Mod atom depends on the given symbol names."""
        return not any(isinstance(a, (FloorDiv, Mod)) and a.arg.uses(names) for a, _ in self.terms.values())

    def without(self, names) -> "Index":
        """This index with the terms of the given plain symbols removed."""
        return Index({k: v for k, v in self.terms.items()
                      if not (isinstance(v[0], Sym) and v[0].name in names)}, self.const)

    def subs(self, mapping: dict) -> "Index":
        """Substitute symbols/indirect atoms (by name) with indices."""
        out = Index(None, self.const)
        for a, c in self.terms.values():
            if isinstance(a, (Sym, Indirect)):
                v = mapping.get(a.name)
                out = out + (Index.of(a) if v is None else Index.of(v)) * c
            elif isinstance(a, FloorDiv):
                out = out + (a.arg.subs(mapping) // a.div) * c
            else:
                out = out + (a.arg.subs(mapping) % a.div) * c
        return out

    def __repr__(self):
        return render(self, str, "//", "%")


def _split_by_divisor(e: Index, c: int):
    """(A, g, s) with e == g*A + s, g a divisor of c (1 < g < c) and s's range inside [0, g), for
    the largest such g; None when there is none. Views that split a dimension produce these forms:
    (512*i + j) // 32768 with 0 <= j < 512 is i // 64."""
    if not isinstance(c, int) or not isinstance(e.const, int) or \
            any(not isinstance(co, int) for _, co in e.terms.values()):
        return None
    best = None
    for _, co in e.terms.values():
        g = math.gcd(abs(co), c)
        if g <= 1 or g >= c or (best is not None and g <= best[1]):
            continue
        big = {k: (a, v // g) for k, (a, v) in e.terms.items() if v % g == 0}
        small = Index({k: t for k, t in e.terms.items() if k not in big}, e.const % g)
        lo, hi = small.bounds()
        if known_nonneg(lo) and known_lt(hi, g):
            best = (Index(big, e.const // g), g, small)
    return best


def _combine_divmod(e: Index) -> Index:
    """k*c*(x // c) + k*(x % c) -> k*x."""
    mods = [(k, a, c) for k, (a, c) in e.terms.items() if isinstance(a, Mod)]
    if not mods:
        return e
    terms = dict(e.terms)
    changed = False
    for k, a, c in mods:
        dk = _floor_key(a.arg, a.div)
        if dk in terms and terms[dk][1] == c * a.div and k in terms:
            del terms[k]
            del terms[dk]
            changed = True
            for k2, (a2, c2) in a.arg.terms.items():
                old = terms.get(k2, (a2, 0))[1]
                terms[k2] = (a2, old + c2 * c)
            terms = {kk: v for kk, v in terms.items() if v[1] != 0}
            e = Index(terms, e.const + a.arg.const * c)
            terms = dict(e.terms)
    return e if not changed else _combine_divmod(e)


def _floor_key(arg: Index, div: int):
    """The key `arg // div` has once built: `(x // a) // b` is stored as `x // (a*b)`."""
    if len(arg.terms) == 1 and arg.const == 0:
        (a, co), = arg.terms.values()
        if co == 1 and isinstance(a, FloorDiv):
            return FloorDiv(a.arg, a.div * div).key()
    return FloorDiv(arg, div).key()


def render(e: Index, name, div_op: str, mod_op: str) -> str:
    """Print an index; `name(atom)` names Sym/Indirect atoms. Division and modulo print with the
    given operators (the caller guarantees non-negative operands for C's `/` and `%`)."""
    parts = []
    for a, c in sorted(e.terms.values(), key=lambda t: _order(t[0])):
        if isinstance(a, (Sym, Indirect)):
            s = name(a)
        elif isinstance(a, FloorDiv):
            s = f"(({render(a.arg, name, div_op, mod_op)}) {div_op} {a.div})"
        else:
            s = f"(({render(a.arg, name, div_op, mod_op)}) {mod_op} {a.div})"
        parts.append(s if c == 1 else f"{c}*{s}")
    if e.const != 0 or not parts:
        parts.append(str(e.const))
    return " + ".join(parts).replace("+ -", "- ")


def _order(a):
    return (0, a.name) if isinstance(a, (Sym, Indirect)) else (1, repr(a))


def contiguous_strides(shape) -> tuple:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s if not isinstance(s, int) else max(s, 1)
    return tuple(reversed(st))


def dense_strides(shape: tuple, strides: tuple) -> bool:
    """Whether `strides` lay `shape` out densely, without overlap: a permutation of contiguous strides
    (dims of size 1 may have any stride); an empty shape is not."""
    if 0 in shape:
        return False
    dims = sorted((st, s) for s, st in zip(shape, strides) if s != 1)
    acc = 1
    for st, s in dims:
        if st != acc:
            return False
        acc *= s
    return True


def offset_of(index, strides, offset: int = 0) -> Index:
    """`offset + sum(index_i * stride_i)`."""
    terms, const = {}, _size(offset)
    for i, s in zip(index, strides):
        if s == 0:
            continue
        s = s if type(s) is int else _size(s)
        e = i if type(i) is Index else Index.of(i)
        const = const + e.const * s
        for k, (a, c) in e.terms.items():
            old = terms.get(k)
            terms[k] = (a, c * s if old is None else old[1] + c * s)
    return _combine_divmod(Index(terms, const))


def _size(x):
    """int | SizeExpr from an int-like value (a tracer SymInt converts without specialising)."""
    if isinstance(x, SizeExpr):
        return x
    return from_sym(x) if isinstance(x, SymInt) else int(x)


def _divmod(a, c):
    """(q, r) with a == q*c + r: Python's divmod for ints, (a / c, 0) when c divides a, else (0, a)."""
    if isinstance(a, int) and isinstance(c, int):
        return divmod(a, c)
    q = exact_div(a, c)
    return (q, 0) if q is not None else (0, a)


def _floor_bound(x, div, lower: bool, nonneg: bool = False):
    """A bound of x // div (div >= 1) from a bound x: exact for ints, conservative otherwise
    (`nonneg`: every value bounded is >= 0)."""
    if isinstance(x, int) and isinstance(div, int):
        return x // div
    q = exact_div(x, div)
    if q is not None:
        return q
    if nonneg or known_nonneg(x):
        return 0 if lower else x
    if known_nonneg(-x):
        return x if lower else 0
    raise Unsupported(f"cannot bound ({x}) // {div}")
