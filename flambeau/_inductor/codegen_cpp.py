"""C++ code generation: one `extern "C"` function per scheduled kernel.

`CppHandler` interprets the `ops` namespace by emitting typed C++ statements (one temporary per
op, common subexpressions shared within a loop body); `KernelPrinter` prints a kernel's loop nest
around them: an OpenMP-parallel outer loop when the work is large, reduction steps with local
accumulators (`#pragma omp simd reduction`), pointwise steps with a vectorisable contiguous inner
loop (`#pragma omp simd`). Every pointwise op, arithmetic, comparisons and casts included, prints
its own declared C++ spelling (`op.pointwise`, see `flambeau._ops._spelling`); the `fl_*` helpers
below are what those spellings call. Transcendentals call libm; where glibc's libmvec is available
the functions the ops name as `simd` are declared so and the compiler vectorises them
(`cpp_builder` detects this once).

bfloat16/float16 (`LOWP`): a buffer holds the 16-bit patterns (`STORAGE`), a load widens to float
(`load_expr`), ops compute in float, a store (`store_expr`) and an explicit cast round to nearest
even, as PyTorch's CPU Inductor does.

Symbolic sizes: every kernel of a graph with size symbols takes them all as trailing `int64_t s0,
int64_t s1, ...` arguments; loop bounds and index arithmetic print the `SizeExpr` polynomials over
them, and a parallel decision that depends on them becomes an OpenMP `if(parallel: ...)` clause
evaluated at run time. One compiled library then serves every size.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D
from .._decomp._table import aten
from .._backends import cpp_headers
from .._backends.cpu_kernels import array_data_offset
from .._ops import OPS
from .._ops._spelling import KIND
from . import config
from .index import FloorDiv, Index, Indirect, Sym, contiguous_strides, offset_of
from .ir import CAST, Handler, set_handler, ops
from .sizevars import SizeExpr, Unsupported, known_lt, known_nonneg
from .scheduler import expand_groups, strip

# bfloat16/float16 values are computed in float: a buffer of them holds the 16-bit patterns
# (`STORAGE`), a load widens (`fl_*_to_f32`), a store and an explicit cast round to nearest even
# (`fl_f32_to_*`, PyTorch's rounding).
LOWP = (D.bfloat16, D.float16)
CTYPES = {D.float32: "float", D.float64: "double", D.int64: "int64_t", D.int32: "int32_t",
          D.int16: "int16_t", D.int8: "int8_t", D.uint8: "uint8_t", D.bool: "bool",
          D.bfloat16: "float", D.float16: "float"}          # the C type a value of the dtype is computed in
STORAGE = {**CTYPES, **{dt: "uint16_t" for dt in LOWP}}    # the element type of a buffer
WIDEN = {D.bfloat16: "fl_bf16_to_f32", D.float16: "fl_f16_to_f32"}
NARROW = {D.bfloat16: "fl_f32_to_bf16", D.float16: "fl_f32_to_f16"}
ROUND = {D.bfloat16: "fl_round_bf16", D.float16: "fl_round_f16"}
NEXTAFTER = {D.bfloat16: "fl_nextafter_bf16", D.float16: "fl_nextafter_f16"}
DTYPES = frozenset(CTYPES)     # the dtypes this code generator takes

# The C math functions libmvec vectorises, as the ops declare them (`PointwiseSpelling.simd`), by arity.
SIMD1 = tuple(op.pointwise.simd for op in OPS.values() if op.pointwise is not None and op.pointwise.simd
              and len(op.tensor_args) == 1)
SIMD2 = tuple(op.pointwise.simd for op in OPS.values() if op.pointwise is not None and op.pointwise.simd
              and len(op.tensor_args) == 2)

HELPERS = r"""
// Errors found inside a kernel (an index out of range, an integer division by zero) are recorded
// here instead of touching memory out of bounds; the wrapper reads and clears the code after
// each call and raises PyTorch's exception (see wrapper.py).
static int fl_error_code = 0;
static inline void fl_set_error(int c) { __atomic_store_n(&fl_error_code, c, __ATOMIC_RELAXED); }
extern "C" int fl_take_error() { return __atomic_exchange_n(&fl_error_code, 0, __ATOMIC_RELAXED); }
static inline int64_t fl_index(int64_t v, int64_t size) {
  int64_t t = v < 0 ? v + size : v;
  if (t < 0 || t >= size) { fl_set_error(1); return 0; }
  return t;
}
// scatter/scatter_add: negative indices are out of range too (PyTorch raises a RuntimeError)
static inline int64_t fl_index_nowrap(int64_t v, int64_t size) {
  if (v < 0 || v >= size) { fl_set_error(3); return 0; }
  return v;
}
template <typename T> static inline T fl_max(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return (a != a || a > b) ? a : b; } else { return a > b ? a : b; }
}
template <typename T> static inline T fl_min(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return (a != a || a < b) ? a : b; } else { return a < b ? a : b; }
}
template <typename T> static inline T fl_truncdiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::trunc(a / b); }
  else { if (b == 0) { fl_set_error(2); return 0; } if (std::is_signed<T>::value && b == T(-1)) return T(-a); return a / b; }
}
template <typename T> static inline T fl_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    T fl;
    if (div != 0) { fl = std::floor(div); if (div - fl > T(0.5)) fl += T(1); }
    else { fl = std::copysign(T(0), a / b); }
    return fl;
  } else {
    if (b == 0) { fl_set_error(2); return 0; }
    if (std::is_signed<T>::value && b == T(-1)) return T(-a);
    T q = a / b, r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <typename T> static inline T fl_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T r = std::fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  } else {
    if (b == 0) { fl_set_error(2); return 0; }
    if (std::is_signed<T>::value && b == T(-1)) return 0;
    T r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}
template <typename T> static inline T fl_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::fmod(a, b); }
  else { if (b == 0 || (std::is_signed<T>::value && b == T(-1))) return 0; return a % b; }
}
template <typename T> static inline T fl_ipow(T a, T b) {
  if (b < 0) { if (a == 1) return 1; if (a == -1) return (b % 2) ? -1 : 1; return 0; }
  T r = 1;
  while (b) { if (b & 1) r = T(r * a); b >>= 1; a = T(a * a); }
  return r;
}
template <typename T> static inline T fl_shl(T a, T b) {
  if (b < 0 || b >= T(sizeof(T) * 8)) return 0;
  return T(typename std::make_unsigned<T>::type(a) << b);
}
template <typename T> static inline T fl_shr(T a, T b) {
  if (b < 0 || b >= T(sizeof(T) * 8)) return std::is_signed<T>::value && a < 0 ? T(-1) : T(0);
  return T(a >> b);
}
template <typename T> static inline T fl_lcm(T a, T b) {
  T g = std::gcd(a, b);
  T r = g == 0 ? 0 : T(a / g * b);
  return r < 0 ? T(-r) : r;
}
// exp for float, inline so that it vectorises without a call: glibc's vector expf takes a slow
// scalar path for every vector holding a lane outside the normal range (the -inf scores of masked
// attention), and a call spills the loop's vector registers. Cephes' range reduction and
// polynomial, about 1.5 ulp; results below the smallest normal float flush to zero.
static inline float fl_pow2i(int32_t n) { int32_t b = (n + 127) << 23; float f; std::memcpy(&f, &b, 4); return f; }
static inline float fl_exp(float x) {
  float xc = x < -87.33654f ? -87.33654f : (x > 88.72284f ? 88.72284f : x);
  float n = std::nearbyint(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  float y = p * (r * r) + r + 1.0f;
  int32_t ni = static_cast<int32_t>(n), n1 = ni >> 1;
  y = y * fl_pow2i(n1) * fl_pow2i(ni - n1);
  y = x < -87.33654f ? 0.0f : y;
  y = x > 88.72284f ? static_cast<float>(INFINITY) : y;
  return x != x ? x : y;
}
static inline double fl_exp(double x) { return exp(x); }
""" + cpp_headers.header("lowp.h") + r"""
static inline float fl_round_bf16(float f) { return fl_bf16_to_f32(fl_f32_to_bf16(f)); }
static inline float fl_round_f16(float f) { return fl_f16_to_f32(fl_f32_to_f16(f)); }
// nextafter in the storage dtype: both operands rounded to it, the bit pattern stepped one unit toward
// `b` (from zero to the smallest subnormal of b's sign), NaN in -> NaN out, a == b -> b (eager's rule).
// `up`/`down`: a's pattern plus/minus one (larger/smaller magnitude), `tiny`: the smallest subnormal.
static inline float fl_nextafter_lowp(float a, float b, float up, float down, float tiny) {
  float s = (b > a) == (a > 0) ? up : down;
  return a != a || b != b ? a + b : (a == b ? b : (a == 0 ? (b > 0 ? tiny : -tiny) : s));
}
static inline float fl_nextafter_bf16(float x, float y) {
  float a = fl_round_bf16(x), b = fl_round_bf16(y);
  uint16_t h = fl_f32_to_bf16(a);
  return fl_nextafter_lowp(a, b, fl_bf16_to_f32(uint16_t(h + 1)), fl_bf16_to_f32(uint16_t(h - 1)),
                           fl_bf16_to_f32(1));
}
static inline float fl_nextafter_f16(float x, float y) {
  float a = fl_round_f16(x), b = fl_round_f16(y);
  uint16_t h = fl_f32_to_f16(a);
  return fl_nextafter_lowp(a, b, fl_f16_to_f32(uint16_t(h + 1)), fl_f16_to_f32(uint16_t(h - 1)),
                           fl_f16_to_f32(1));
}
static inline int64_t fl_floordiv_i(int64_t a, int64_t b) { int64_t q = a / b, r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t fl_mod_i(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
#pragma omp declare reduction(flmax : float, double, int64_t, int32_t, int16_t, int8_t, uint8_t : omp_out = fl_max(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(flmin : float, double, int64_t, int32_t, int16_t, int8_t, uint8_t : omp_out = fl_min(omp_out, omp_in)) initializer(omp_priv = omp_orig)
"""


def preamble(simd_math: bool) -> str:
    lines = ["#include <algorithm>", "#include <cmath>", "#include <cstdint>", "#include <cstring>", "#include <limits>",
             "#include <numeric>",
             "#include <type_traits>"]
    if simd_math:
        for f in SIMD1:
            for name, t in ((f, "double"), (f + "f", "float")):
                lines.append(f'extern "C" {t} {name}({t}) noexcept __attribute__((simd("notinbranch")));')
        for f in SIMD2:
            for name, t in ((f, "double"), (f + "f", "float")):
                lines.append(f'extern "C" {t} {name}({t}, {t}) noexcept __attribute__((simd("notinbranch")));')
    return "\n".join(lines) + "\n" + HELPERS


def render_c(e: Index) -> str:
    parts = []
    for a, c in e.terms.values():
        if isinstance(a, (Sym, Indirect)):
            s = a.name
        else:
            lo = _lower_bound(a.arg)
            inner = render_c(a.arg)
            if isinstance(a, FloorDiv):
                s = f"({inner}) / {a.div}" if lo >= 0 else f"fl_floordiv_i({inner}, {a.div})"
            else:
                s = f"({inner}) % {a.div}" if lo >= 0 else f"fl_mod_i({inner}, {a.div})"
            s = f"({s})"
        parts.append(s if c == 1 else f"{c}*{s}")
    if e.const != 0 or not parts:
        parts.append(str(e.const))
    return " + ".join(parts)


def _lower_bound(e: Index):
    """0 when e is provably >= 0 (C's `/` and `%` are then floor division and modulo), else -1."""
    try:
        return 0 if known_nonneg(e.bounds()[0]) else -1
    except Unsupported:
        return -1


def at_least(x, threshold):
    """x >= threshold: a bool when decided for every size, else a C condition (for `if(...)`)."""
    if isinstance(x, int):
        return x >= threshold
    if known_nonneg(x - threshold):
        return True
    if known_lt(x, threshold):
        return False
    return f"{x} >= {threshold}"


def both(a, b):
    """Conjunction of decisions that are bools or C conditions."""
    if a is False or b is False:
        return False
    if a is True:
        return b
    if b is True:
        return a
    return f"({a}) && ({b})"


def if_clause(cond) -> str:
    return "" if cond is True else f" if(parallel: {cond})"


def literal(v, dtype) -> str:
    if dtype is D.bool:
        return "true" if v else "false"
    if dtype.category == D.FLOATING:
        v = float(v)
        if math.isnan(v):
            return "NAN" if dtype is D.float64 else "static_cast<float>(NAN)"
        if math.isinf(v):
            s = "INFINITY" if v > 0 else "-INFINITY"
            return s if dtype is D.float64 else f"static_cast<float>({s})"
        if CTYPES[dtype] == "float":           # (bfloat16/float16 compute in float, as PyTorch's opmath)
            return f"{float(np.float32(v))!r}f"
        return repr(v)
    iv = int(v) if not isinstance(v, float) or math.isfinite(v) else 0
    iv = int(np.array(iv & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(dtype.np)[()])
    if dtype is D.int64:
        return f"INT64_C({iv})" if iv != -2 ** 63 else "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{CTYPES[dtype]}>({iv})"


class CVar:
    """A C value. `level`: how many of the loops of the step being printed it depends on, outermost
    first (0: the same in every iteration of them; `KernelPrinter.hoists`)."""
    __slots__ = ("name", "dtype", "level")

    def __init__(self, name, dtype, level=0):
        self.name = name
        self.dtype = dtype
        self.level = level

    def __str__(self):
        return self.name


def c_expr(op, args, dtype) -> str:
    """The C++ expression of pointwise `op` over C variables `args` with result `dtype`: the op's
    declared spelling (`op.pointwise.cpp`), formatted."""
    t = args[0].dtype
    sp = op.pointwise
    if op is CAST and dtype in LOWP:           # a cast to half precision rounds, then computes on in float
        return f"{ROUND[dtype]}({args[0].name})"
    if t in LOWP and op is aten.nextafter:     # steps in the storage dtype, not in float
        return f"{NEXTAFTER[t]}({args[0].name}, {args[1].name})"
    tmpl = sp.by_kind["cpp"][KIND[dtype if sp.by_result else t]]
    if tmpl is None:
        raise NotImplementedError(f"{op.name} has no C++ spelling for {t.name} operands")
    return tmpl.format(*(x.name for x in args), f="f" if CTYPES[t] == "float" else "",
                       one=literal(1, t) if t in CTYPES else "1", T=CTYPES[dtype])


def load_expr(dtype, element: str) -> str:
    """The computed value of a buffer element (bfloat16/float16 widened to float)."""
    return f"{WIDEN[dtype]}({element})" if dtype in LOWP else element


def store_expr(dtype, value: str) -> str:
    """What a value stores into a buffer of `dtype` (bfloat16/float16 rounded)."""
    return f"{NARROW[dtype]}({value})" if dtype in LOWP else value


class CppHandler(Handler):
    def __init__(self, printer: "KernelPrinter"):
        self.p = printer

    def _emit(self, expr: str, dtype, level: int) -> CVar:
        """A temporary holding `expr`, which depends on the step's loops up to `level`: computed in the
        innermost loop only when it varies there, else before the first loop it varies in
        (`KernelPrinter.hoist`); one the same for all of them is shared by the kernel's later steps."""
        p = self.p
        hit = p.cse.get(expr) or p.invariant.get(expr)
        if hit is not None:
            return hit
        v = CVar(f"tmp{p.n_tmp}", dtype, level)
        p.n_tmp += 1
        line = f"{CTYPES[dtype]} {v.name} = {expr};"
        if level == 0 and p.at_outer:
            p.line(line)
        elif not p.hoist(line, level):
            v.level = p.innermost()
            p.line(line)
            p.cse[expr] = v
            return v
        (p.invariant if level == 0 else p.cse)[expr] = v
        return v

    def _op(self, op, args, dtype):
        return self._emit(c_expr(op, args, dtype), dtype, max((a.level for a in args), default=0))

    def load(self, buf, index):
        p = self.p
        loc = p.locals.get(buf.name)
        if loc is not None:
            return loc
        level = p.innermost() if buf.name in p.stored else p.level(index)    # (a buffer this kernel writes: in place)
        if p.masked_depth and p.level(index) > 0 and _divides(index):
            p.scalar_loop = True
        return self._emit(load_expr(buf.dtype, f"{buf.name}[{render_c(index)}]"), buf.dtype, level)

    def constant(self, value, dtype):
        if isinstance(value, SizeExpr):
            return self._emit(f"static_cast<{CTYPES[dtype]}>({value})", dtype, 0)
        return CVar(literal(value, dtype), dtype)

    def index_expr(self, index, dtype):
        return self._emit(f"static_cast<{CTYPES[dtype]}>({render_c(index)})", dtype, self.p.level(index))

    def indirect_indexing(self, value, size, wrap=True):
        v = value.name
        var = self._emit(f"{'fl_index' if wrap else 'fl_index_nowrap'}({v}, {size})", D.int64, value.level)
        self.p.level_of[var.name] = var.level
        return Index.of(Indirect(var.name, size))

    def masked(self, mask, body, other):
        p = self.p
        saved_lines, saved_cse, saved_hoists, saved_outer = p.lines, p.cse, p.hoists, p.at_outer
        p.lines, p.cse, p.at_outer = [], dict(saved_cse), False   # (nothing leaves a condition's body)
        p.hoists = None
        p.depth += 1
        p.masked_depth += 1
        try:
            v = body()
        finally:
            inner = p.lines
            p.lines, p.cse, p.hoists, p.at_outer = saved_lines, saved_cse, saved_hoists, saved_outer
            p.depth -= 1
            p.masked_depth -= 1
        out = CVar(f"tmp{p.n_tmp}", v.dtype, p.innermost())
        p.n_tmp += 1
        other = literal(other, v.dtype)
        p.line(f"{CTYPES[v.dtype]} {out.name} = {other};")
        p.line(f"if ({mask.name}) {{")
        p.lines.extend(inner)
        p.line(f"    {out.name} = {v.name};")
        p.line("}")
        return out


def node_index(n, syms_iter, ranges) -> list:
    return [next(syms_iter) if s != 1 else Index() for s in ranges]


_SIMPLE_RED = {"sum": "+", "prod": "*", "any": "||", "all": "&&", "max": "flmax", "min": "flmin"}


class KernelPrinter:
    """Print one scheduler.Kernel as an extern "C" function."""

    def __init__(self, kernel, size_names=()):
        self.k = kernel
        self.size_names = list(size_names)
        self.lines: list = []
        self.cse: dict = {}
        self.locals: dict = {}
        self.n_tmp = 0
        self.depth = 1
        self.stored = {b.name for b in kernel.stores}
        self.invariant: dict = {}     # expression -> CVar computed before some step's innermost loops
        self.hoists = None            # [line position, depth] before each loop of the step being printed
        self.level_of: dict = {}      # loop variable (or index read in a loop) -> its level (1 + its loop's)
        self.at_outer = False         # printing a step without loops of its own: every value is invariant
        self.masked_depth = 0         # inside how many conditional (masked) bodies
        self.scalar_loop = False      # the step's innermost loop is better left to scalar code (`_pointwise`)

    def line(self, s: str):
        self.lines.append("    " * self.depth + s)

    def hoist(self, s: str, level: int) -> bool:
        """Put a line computing a value of `level` before the step's loop number `level` (inside the loops
        it depends on); False where it belongs in the innermost loop or nothing may move."""
        if self.hoists is None or level >= len(self.hoists):
            return False
        at, depth = self.hoists[level]
        self.lines.insert(at, "    " * depth + s)
        for h in self.hoists[level:]:
            h[0] += 1
        return True

    def innermost(self) -> int:
        return len(self.hoists) if self.hoists else 0

    def level(self, index: Index) -> int:
        """The level of `index`: the deepest of the step's loops whose variable it reads."""
        return max((self.level_of.get(n, 0) for n in _names(index)), default=0)

    def _hoist_before(self, var: str):
        """The next loop (of variable `var`) opens here: values not depending on it go before it."""
        self.hoists.append([len(self.lines), self.depth])
        self.level_of[var] = len(self.hoists)

    def _open(self, s):
        self.line(s + " {")
        self.depth += 1

    def _close(self):
        self.depth -= 1
        self.line("}")

    def generate(self) -> str:
        k = self.k
        params = [f"const {STORAGE[b.dtype]}* __restrict__ {b.name}" for b in k.loads] + \
                 [f"{STORAGE[b.dtype]}* __restrict__ {b.name}" for b in k.stores] + \
                 [f"int64_t {s}" for s in self.size_names]
        if k.column or k.scatter is not None:
            with set_handler(CppHandler(self)):
                self._column() if k.column else self._scatter()
            return f'extern "C" {_NOINLINE} void {k.name}({", ".join(params)}) {{\n' + "\n".join(self.lines) + "\n}\n"
        groups = k.outer_groups
        msyms = [Index.of(Sym(f"x{i}", math.prod(g))) for i, g in enumerate(groups)]
        outer = expand_groups(groups, msyms)
        work = at_least(k.work(), config.parallel_threshold)
        par = both(work, at_least(math.prod(k.outer), 2))
        if groups:
            if par is not False:
                self.line("#pragma omp parallel for" + (f" collapse({len(groups)})" if len(groups) > 1 else "")
                          + if_clause(par))
            for i, g in enumerate(groups):
                self._open(f"for (int64_t x{i} = 0; x{i} < {math.prod(g)}; x{i}++)")
        inner_par = both(not outer, work)
        with set_handler(CppHandler(self)):
            for step in k.steps:
                self.cse = {}
                step_par = both(inner_par, at_least(math.prod(step.inner), config.parallel_threshold))
                if step.kind == "reduction":
                    self._reduction(step, outer, step_par)
                else:
                    self._pointwise(step, outer, step_par)
        for _ in groups:
            self._close()
        return f'extern "C" {_NOINLINE} void {k.name}({", ".join(params)}) {{\n' + "\n".join(self.lines) + "\n}\n"

    def _loops(self, prefix, groups, parallel, simd_clause="", simd=True, hoist=False):
        """Open one loop per merged group; return per-dim index expressions. With `hoist`, values that
        don't depend on these loops' variables are computed once before them (`CppHandler._emit`): an
        embedding's row index, a layer norm's mean, so that the innermost loop stays vectorisable
        (GCC turns a load at an index computed inside an `omp simd` loop into a gather)."""
        sizes = [math.prod(g) for g in groups]
        syms = [Index.of(Sym(f"{prefix}{j}", s)) for j, s in enumerate(sizes)]
        if hoist:
            self.hoists = [] if sizes and not any(s == 0 for s in sizes) else None  # (an empty loop computes nothing)
            self.level_of = {}
        for j, s in enumerate(sizes):
            last = j == len(sizes) - 1
            if self.hoists is not None:
                self._hoist_before(f"{prefix}{j}")
            if parallel is not False and j == 0:
                self.line("#pragma omp parallel for" + (" simd" if last else "") + simd_clause + if_clause(parallel))
            elif last and simd:
                self.line("#pragma omp simd" + simd_clause)
            self._open(f"for (int64_t {prefix}{j} = 0; {prefix}{j} < {s}; {prefix}{j}++)")
        return expand_groups(groups, syms)

    def _pointwise(self, step, outer, parallel):
        syms = self._loops("y", step.inner_groups, both(parallel, bool(step.inner)), hoist=True)
        self.at_outer = not step.inner_groups
        for n in step.nodes:
            it = iter(outer + syms)
            idx = node_index(n, it, n.ranges)
            v = n.buf.data.inner_fn(idx)
            v = self._as_dtype(v, n.buf.dtype)
            if n.name in self.k.locals or self.at_outer:    # (a value per outer index: later steps read it as is)
                self.locals[n.name] = v
            if n.name not in self.k.locals:
                off = offset_of(idx, contiguous_strides(n.ranges))
                self.line(f"{n.name}[{render_c(off)}] = {store_expr(n.buf.dtype, v.name)};")
        for _ in step.inner_groups:
            self._close()
        if self.scalar_loop and self.hoists:
            # A conditional load at an index divided or reduced modulo (a cat of transposed pieces): GCC's
            # masked AVX-512 gathers take 1.7x the scalar loop's time (the small GPT's qkv gradient cat:
            # 72 us vs 43 us), so the innermost loop is not marked simd.
            at = self.hoists[-1][0]
            if self.lines[at].strip() == "#pragma omp simd":
                del self.lines[at]
            else:                                   # ("#pragma omp parallel for simd")
                self.lines[at] = self.lines[at].replace(" simd", "")
        self.hoists, self.at_outer, self.scalar_loop = None, False, False

    def _as_dtype(self, v, dtype):
        return ops.to_dtype(v, dtype)

    def _reduction(self, step, outer, parallel):
        n = step.nodes[0]
        red = n.buf.data
        rt, src, dt = red.reduction_type, red.src_dtype, red.dtype
        acc = f"acc_{n.name}"
        if rt in ("argmax", "argmin"):
            self.line(f"{CTYPES[src]} {acc} = 0;")
            self.line(f"int64_t {acc}_i = -1;")
            clause = ""
        else:
            at, init = _acc_type_init(rt, src)
            self.line(f"{at} {acc} = {init};")
            clause = f" reduction({_SIMPLE_RED[rt]}:{acc})"
        rsyms = self._loops("r", step.inner_groups, both(parallel, bool(step.inner) and bool(clause)), clause,
                            hoist=True)
        idx = node_index(n, iter(outer), n.ranges)
        ridx = node_index(n, iter(rsyms), n.reduction_ranges)
        x = self._as_dtype(red.inner_fn(idx, ridx), src).name
        if rt in ("argmax", "argmin"):
            rflat = render_c(offset_of(ridx, contiguous_strides(n.reduction_ranges)))
            cmp = ">" if rt == "argmax" else "<"
            nan = f" || ({x} != {x} && {acc} == {acc})" if src.category == D.FLOATING else ""
            self.line(f"if ({acc}_i < 0 || {x} {cmp} {acc}{nan}) {{ {acc} = {x}; {acc}_i = {rflat}; }}")
        else:
            self.line(_combine(rt, acc, x))
        for _ in step.inner_groups:
            self._close()
        self.hoists = None
        res = f"{acc}_i < 0 ? 0 : {acc}_i" if rt in ("argmax", "argmin") else acc
        self.line(f"{CTYPES[dt]} {n.name}_v = static_cast<{CTYPES[dt]}>({res});")
        val = CVar(f"{n.name}_v", dt)
        self.locals[n.name] = val
        if n.name not in self.k.locals:
            off = offset_of(idx, contiguous_strides(n.ranges))
            self.line(f"{n.name}[{render_c(off)}] = {store_expr(dt, val.name)};")

    def _column(self):
        """A lone reduction read contiguously along its last output dim: a block of COLUMN_BLOCK
        outputs is reduced together, the inner loop running (vectorised) across the block."""
        k = self.k
        step = k.steps[0]
        n = step.nodes[0]
        red = n.buf.data
        *lead, last = k.outer_groups
        L = math.prod(last)
        B = min(COLUMN_BLOCK, L) if isinstance(L, int) else COLUMN_BLOCK
        lead_syms = [Index.of(Sym(f"x{i}", math.prod(g))) for i, g in enumerate(lead)]
        par = both(at_least(k.work(), config.parallel_threshold), at_least(math.prod(k.outer), B + 1))
        if par is not False:
            self.line("#pragma omp parallel for" + (f" collapse({len(lead) + 1})" if lead else "") + if_clause(par))
        for i, g in enumerate(lead):
            self._open(f"for (int64_t x{i} = 0; x{i} < {math.prod(g)}; x{i}++)")
        self._open(f"for (int64_t xb = 0; xb < {L}; xb += {B})")
        self.line(f"const int64_t nb = std::min<int64_t>({B}, {L} - xb);")
        at, init = _acc_type_init(red.reduction_type, red.src_dtype)
        self.line(f"{at} acc[{B}];")
        self.line(f"for (int64_t xi = 0; xi < {B}; xi++) acc[xi] = {init};")
        rsyms = self._loops("r", step.inner_groups, False, simd=False, hoist=True)
        if self.hoists is not None:
            self._hoist_before("xi")
        self.line("#pragma omp simd")
        self._open("for (int64_t xi = 0; xi < nb; xi++)")
        outer = expand_groups(k.outer_groups, lead_syms + [Index.of(Sym("xb", L)) + Index.of(Sym("xi", B))])
        idx = node_index(n, iter(outer), n.ranges)
        ridx = node_index(n, iter(rsyms), n.reduction_ranges)
        x = self._as_dtype(red.inner_fn(idx, ridx), red.src_dtype).name
        self.line(_combine(red.reduction_type, "acc[xi]", x))
        self._close()
        for _ in step.inner_groups:
            self._close()
        self.cse, self.hoists = {}, None
        self.line("#pragma omp simd")
        self._open("for (int64_t xi = 0; xi < nb; xi++)")
        off = offset_of(idx, contiguous_strides(n.ranges))
        self.line(f"{n.name}[{render_c(off)}] = {store_expr(red.dtype, f'static_cast<{CTYPES[red.dtype]}>(acc[xi])')};")
        self._close()
        self._close()
        for _ in lead:
            self._close()

    def _scatter(self):
        """A Scatter: copy the destination into the output, then one loop over the scattered
        elements storing (or adding) each at its target. Only a leading run of dims that can't
        collide (`parallel_dims`) runs in parallel; the rest is serial, so duplicate targets add up
        exactly once each and a plain store's last write wins."""
        n = self.k.scatter
        sc = n.buf.data
        out = n.name
        syms = self._loops("y", [(s,) for s in strip(sc.ranges)],
                           at_least(math.prod(sc.ranges), config.parallel_threshold))
        idx = node_index(n, iter(syms), sc.ranges)
        v = self._as_dtype(sc.init_fn(idx), sc.dtype)
        self.line(f"{out}[{render_c(offset_of(idx, contiguous_strides(sc.ranges)))}] = {store_expr(sc.dtype, v.name)};")
        for _ in strip(sc.ranges):
            self._close()
        self.cse = {}
        dims = [d for d, s in enumerate(sc.scatter_ranges) if s != 1]
        n_par = next((j for j, d in enumerate(dims) if d not in sc.parallel_dims), len(dims))
        par = both(at_least(math.prod(sc.scatter_ranges), config.parallel_threshold), n_par > 0)
        syms = []
        for j, d in enumerate(dims):
            size = sc.scatter_ranges[d]
            if j == 0 and par is not False:
                self.line("#pragma omp parallel for" + (f" collapse({n_par})" if n_par > 1 else "") + if_clause(par))
            self._open(f"for (int64_t z{j} = 0; z{j} < {size}; z{j}++)")
            syms.append(Index.of(Sym(f"z{j}", size)))
        idx = node_index(n, iter(syms), sc.scatter_ranges)
        target = f"{out}[{render_c(sc.target_fn(idx))}]"
        v = self._as_dtype(sc.value_fn(idx), sc.dtype).name
        if sc.reduce is None:
            self.line(f"{target} = {store_expr(sc.dtype, v)};")
        elif sc.dtype in LOWP:                     # widen, combine in float, round back
            old = load_expr(sc.dtype, target)
            new = f"{old} {'+' if sc.reduce == 'sum' else '*'} {v}" if sc.reduce in ("sum", "prod") else \
                f"fl_{sc.reduce}({old}, {v})"
            self.line(f"{target} = {store_expr(sc.dtype, new)};")
        elif sc.dtype is D.bool:
            self.line(f"{target} = {target} {'||' if sc.reduce in ('sum', 'max') else '&&'} {v};")
        elif sc.reduce in ("sum", "prod"):
            self.line(f"{target} {'+' if sc.reduce == 'sum' else '*'}= {v};")
        else:
            self.line(f"{target} = fl_{sc.reduce}({target}, {v});")
        for _ in dims:
            self._close()


COLUMN_BLOCK = 64


def _divides(e: Index) -> bool:
    """Whether index `e` has a floor division or a remainder in it."""
    return any(not isinstance(a, (Sym, Indirect)) for a, _ in e.terms.values())


def _names(e: Index) -> set:
    """The names of the loop variables and read indices that index `e` depends on."""
    out = set()
    for a, _ in e.terms.values():
        if isinstance(a, (Sym, Indirect)):
            out.add(a.name)
        else:
            out |= _names(a.arg)
    return out


def _acc_type_init(rt, src):
    at = CTYPES[src]
    if rt in ("sum", "prod") and src.category == D.FLOATING and (src is D.float64 or config.accumulate_float_in_double):
        at = "double"
    lim = f"std::numeric_limits<{at}>"
    init = {"sum": "0", "prod": "1", "any": "false", "all": "true",
            "max": f"-{lim}::infinity()" if src.category == D.FLOATING else f"{lim}::lowest()",
            "min": f"{lim}::infinity()" if src.category == D.FLOATING else f"{lim}::max()"}[rt]
    return at, init


def _combine(rt, acc, x) -> str:
    return {"sum": f"{acc} += {x};", "prod": f"{acc} *= {x};", "any": f"{acc} = {acc} || {x};",
            "all": f"{acc} = {acc} && {x};", "max": f"{acc} = fl_max({acc}, {x});",
            "min": f"{acc} = fl_min({acc}, {x});"}[rt]


# The wrapper passes arrays to `<kernel>_obj` entry points as Python objects when this is known:
# NumPy's `.ctypes.data` builds an object per read (~1.4 us; a 6-array kernel call cost ~9 us
# with it, ~0.9 us without).
DATA_OFFSET = array_data_offset()
_NOINLINE = "__attribute__((noinline))"    # the kernels compile as they do without the entries


def object_entry(k, size_names) -> str:
    """`<kernel>_obj`: the kernel taking its arrays as NumPy array objects (ctypes.py_object),
    reading each one's data pointer at DATA_OFFSET."""
    params = [f"const char* {b.name}" for b in k.loads + k.stores] + [f"int64_t {s}" for s in size_names]
    args = [f"*(const {STORAGE[b.dtype]}* const*)({b.name} + {DATA_OFFSET})" for b in k.loads] + \
           [f"*({STORAGE[b.dtype]}* const*)({b.name} + {DATA_OFFSET})" for b in k.stores] + list(size_names)
    return f'extern "C" void {k.name}_obj({", ".join(params)}) {{ {k.name}({", ".join(args)}); }}\n'


def generate(kernels, simd_math: bool, size_names=()) -> str:
    """The C++ source of all kernels of one graph (each taking the size symbols `size_names`), and
    each one's `_obj` entry point when DATA_OFFSET is known."""
    parts = [preamble(simd_math)]
    for k in kernels:
        parts.append(KernelPrinter(k, size_names).generate())
        if DATA_OFFSET is not None:
            parts.append(object_entry(k, size_names))
    return "\n".join(parts)
