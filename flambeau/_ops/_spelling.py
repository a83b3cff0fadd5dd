"""Pointwise formulas: how each code generator spells an elementwise op, declared once with the op.

A `PointwiseSpelling` sits on its op (`defop(..., pointwise=...)`, read as `op.pointwise`). The
code generators (`flambeau._inductor.codegen_cpp`, `codegen_numpy`, and the Triton backend) print
an op by formatting its template for their language; they hold no formula of their own. The
loop IR's arithmetic (`ops.add`, `ops.where`, `ops.to_dtype`, ...) is these ops' spellings too.

A template formats the operands' names `{0}`, `{1}`, `{2}` (already loaded and cast to the compute
dtype) and, in C++ and Triton, `{T}`: the result's type (`int8_t`, `tl.int8`). C++ also has `{f}`,
the C math suffix of the operand type ('f' for float), and `{one}`, the literal 1 of that type.
NumPy templates see `np`, `_sp` (scipy.special) and the helpers of `codegen_numpy.namespace()`;
Triton templates see `tl`, `libdevice` and the helpers of `TRITON_HELPERS` below, and compute
bfloat16/float16 in float32 (the backend upcasts loads, as Inductor does).

A template is one string, or a dict by the operands' kind (`kind_of`): 'float'; 'int' (int32,
int64); 'narrow' (int8, int16, uint8: C promotes them to int, so C++ casts the result back), which
falls back to 'int'; 'bool', which falls back to 'int'. A cast (`by_result`) is picked by the
result's kind instead.
"""
from __future__ import annotations

from .. import _dtype as D

_FALLBACK = {"float": ("float",), "int": ("int",), "narrow": ("narrow", "int"), "bool": ("bool", "int")}
_NARROW = frozenset({D.int8, D.int16, D.uint8})
BACKENDS = ("cpp", "numpy", "triton")


def kind_of(dtype) -> str:
    """The template key of a dtype: 'float', 'int', 'narrow' or 'bool'."""
    if dtype is D.bool:
        return "bool"
    if dtype.category == D.FLOATING:
        return "float"
    return "narrow" if dtype in _NARROW else "int"


KIND = {dt: kind_of(dt) for dt in D.ALL if dt.category != D.COMPLEX}      # read per printed op: a dict, not a call


class PointwiseSpelling:
    """A pointwise op's formula for each code generator (C++, NumPy, Triton).

    `heavy`: transcendental work the fuser should not recompute per broadcast copy. `simd`: the C
    math function glibc's libmvec vectorises, declared SIMD in the C++ preamble. `result`: 'same'
    (the dtype of the last operand) or 'bool' (comparisons, predicates). `by_result`: templates
    are picked by the result's kind (casts)."""
    __slots__ = ("cpp", "numpy", "triton", "heavy", "simd", "result", "by_result", "by_kind")

    def __init__(self, cpp, numpy, triton=None, *, heavy: bool = True, simd: str | None = None,
                 result: str = "same", by_result: bool = False):
        if result not in ("same", "bool"):
            raise ValueError(f"PointwiseSpelling: result must be 'same' or 'bool', got {result!r}")
        self.cpp = cpp
        self.numpy = numpy
        self.triton = triton
        self.heavy = heavy
        self.simd = simd
        self.result = result
        self.by_result = by_result
        self.by_kind = {b: {k: self._pick(getattr(self, b), k) for k in _FALLBACK} for b in BACKENDS}

    @staticmethod
    def _pick(t, kind):
        if t is None or isinstance(t, str):
            return t
        return next((t[k] for k in _FALLBACK[kind] if k in t), None)

    def template(self, backend: str, kind: str) -> str:
        """The template of `backend` ('cpp', 'numpy', 'triton') for operands of `kind`."""
        t = self.by_kind[backend][kind]
        if t is None:
            raise NotImplementedError(f"no {backend} spelling for {kind} operands")
        return t

    def __repr__(self):
        return f"PointwiseSpelling(cpp={self.cpp!r}, numpy={self.numpy!r}, triton={self.triton!r})"


def infix(op: str, numpy_fn: str, *, result: str = "same", heavy: bool = False,
          triton: str | None = None) -> PointwiseSpelling:
    """A binary operator written infix in C++ and Triton (`{0} + {1}`): C promotes narrow integers
    to int, so a narrow result is cast back."""
    e = "{0} %s {1}" % op
    cpp = e if result == "bool" else {"float": e, "int": e, "narrow": "static_cast<{T}>(%s)" % e}
    return PointwiseSpelling(cpp, numpy_fn + "({0}, {1})", triton or e, heavy=heavy, result=result)


def call2(cpp_fn: str, numpy_fn: str, triton_fn: str) -> PointwiseSpelling:
    """A binary op that every language spells as a call of a (helper) function."""
    return PointwiseSpelling(cpp_fn + "({0}, {1})", numpy_fn + "({0}, {1})", triton_fn + "({0}, {1})", heavy=False)


# Triton helpers the spellings call: `@triton.jit` functions the Triton backend puts before its
# kernels (its preamble, like the C++ backend's `fl_*` helpers). Integer `//` and `%` in Triton
# truncate toward zero, as in C; shifts by the bit width or more are undefined, hence the guards.
TRITON_HELPERS = '''
@triton.jit
def fl_floordiv_int(a, b):
    q = a // b
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def fl_floordiv_float(a, b):
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = libdevice.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, libdevice.copysign(div * 0.0, a / b), fl)
    return tl.where(b == 0, a / b, fl)


@triton.jit
def fl_remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def fl_remainder_float(a, b):
    r = libdevice.fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def fl_max(a, b):
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def fl_min(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def fl_ipow(a, b):
    r = tl.where(b < 0, tl.where(a == 1, 1, tl.where(a == -1, 1 - 2 * (b & 1), 0)), 1).to(a.dtype)
    base = a
    e = tl.where(b < 0, 0, b)
    for _ in tl.static_range(64):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    return r


@triton.jit
def fl_shl(a, b):
    bits = a.dtype.primitive_bitwidth
    ok = (b >= 0) & (b < bits)
    return tl.where(ok, a << tl.where(ok, b, 0), 0)


@triton.jit
def fl_shr(a, b):
    bits = a.dtype.primitive_bitwidth
    ok = (b >= 0) & (b < bits)
    return tl.where(ok, a >> tl.where(ok, b, 0), tl.where(a < 0, -1, 0))


@triton.jit
def fl_gcd(a, b):
    x = tl.abs(a)
    y = tl.abs(b)
    for _ in tl.static_range(100):
        nz = y != 0
        t = tl.where(nz, x % tl.where(nz, y, 1), 0)
        x = tl.where(nz, y, x)
        y = t
    return x


@triton.jit
def fl_lcm(a, b):
    g = fl_gcd(a, b)
    r = tl.where(g == 0, 0, a // tl.where(g == 0, 1, g) * b)
    return tl.abs(r)
'''
