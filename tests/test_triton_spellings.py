"""The Triton spelling of every pointwise op (`op.pointwise.triton`), run without Triton.

Triton is not installed here, so each spelling is evaluated in a small stand-in for `tl` and
`libdevice` written on NumPy, with Triton's semantics where they differ from NumPy's (integer `//`
and `%` truncate toward zero as in C, int / int is float32, a Python float meeting an integer
block is float32, libdevice takes only float32/float64), together with the spellings' helpers
(`flambeau._ops._spelling.TRITON_HELPERS`, executed as written, `@triton.jit` a no-op). The
evaluation follows what the Triton backend's printer will do: operands cast to the compute dtype
(the result's; for a comparison the operands'; float32 for bfloat16/float16), the formula, a cast
to the result dtype. Each result is compared with the op's eager kernel on the same inputs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sp

import flambeau as fl
from flambeau import _dtype as D
from flambeau._ops import OPS
from flambeau._ops._spelling import TRITON_HELPERS, kind_of
from flambeau._decomp._table import aten
from flambeau._inductor.lowering import _ROUNDING

# ---- a NumPy stand-in for triton.language -------------------------------------------------------
LOWP = (D.bfloat16, D.float16)


class FakeDtype:
    def __init__(self, np_dtype, name):
        self.np = np.dtype(np_dtype)
        self.name = name
        self.primitive_bitwidth = 1 if self.np == np.bool_ else self.np.itemsize * 8

    def is_floating(self) -> bool:
        return self.np.kind == "f"


class Block:
    """A Triton block: a NumPy array with Triton's operator semantics."""
    __array_ufunc__ = None            # NumPy scalars on the left defer to Block's reflected operators

    def __init__(self, a):
        self.a = np.asarray(a)

    @property
    def dtype(self) -> FakeDtype:
        return FakeDtype(self.a.dtype, "")

    def to(self, dt: FakeDtype) -> "Block":
        with np.errstate(all="ignore"):
            return Block(self.a.astype(dt.np))

    def __bool__(self):
        raise TypeError("a Triton block has no truth value (use tl.where)")

    def _other(self, x):
        if isinstance(x, Block):
            return x.a
        if isinstance(x, bool):
            return np.asarray(x)
        if isinstance(x, float) and self.a.dtype.kind != "f":
            return np.float32(x)                         # int block with a float literal: float32
        if isinstance(x, int) and self.a.dtype.kind in "iu":
            info = np.iinfo(self.a.dtype)
            if not info.min <= x <= info.max:
                return np.int64(x)                       # a literal outside the block's range widens it
        return np.asarray(x, dtype=self.a.dtype)         # a literal takes the block's dtype

    def _bin(self, fn, other, reflected=False):
        a, b = self.a, self._other(other)
        if isinstance(other, float) and a.dtype.kind != "f":
            a = a.astype(np.float32)
        with np.errstate(all="ignore"):
            return Block(fn(b, a) if reflected else fn(a, b))

    __add__ = lambda s, o: s._bin(np.add, o)                     # noqa: E731
    __radd__ = lambda s, o: s._bin(np.add, o, True)              # noqa: E731
    __sub__ = lambda s, o: s._bin(np.subtract, o)                # noqa: E731
    __rsub__ = lambda s, o: s._bin(np.subtract, o, True)         # noqa: E731
    __mul__ = lambda s, o: s._bin(np.multiply, o)                # noqa: E731
    __rmul__ = lambda s, o: s._bin(np.multiply, o, True)         # noqa: E731
    __truediv__ = lambda s, o: s._bin(_truediv, o)               # noqa: E731
    __rtruediv__ = lambda s, o: s._bin(_truediv, o, True)        # noqa: E731
    __floordiv__ = lambda s, o: s._bin(_c_div, o)                # noqa: E731
    __mod__ = lambda s, o: s._bin(_c_mod, o)                     # noqa: E731
    __and__ = lambda s, o: s._bin(np.bitwise_and, o)             # noqa: E731
    __rand__ = lambda s, o: s._bin(np.bitwise_and, o, True)      # noqa: E731
    __or__ = lambda s, o: s._bin(np.bitwise_or, o)               # noqa: E731
    __xor__ = lambda s, o: s._bin(np.bitwise_xor, o)             # noqa: E731
    __lshift__ = lambda s, o: s._bin(np.left_shift, o)           # noqa: E731
    __rshift__ = lambda s, o: s._bin(np.right_shift, o)          # noqa: E731
    __eq__ = lambda s, o: s._bin(np.equal, o)                    # noqa: E731
    __ne__ = lambda s, o: s._bin(np.not_equal, o)                # noqa: E731
    __lt__ = lambda s, o: s._bin(np.less, o)                     # noqa: E731
    __le__ = lambda s, o: s._bin(np.less_equal, o)               # noqa: E731
    __gt__ = lambda s, o: s._bin(np.greater, o)                  # noqa: E731
    __ge__ = lambda s, o: s._bin(np.greater_equal, o)            # noqa: E731
    __hash__ = None

    def __neg__(self):
        with np.errstate(all="ignore"):
            return Block(np.negative(self.a))

    def __invert__(self):
        return Block(np.invert(self.a))


def _truediv(a, b):
    if a.dtype.kind != "f" and b.dtype.kind != "f":
        a, b = a.astype(np.float32), b.astype(np.float32)
    return np.true_divide(a, b)


def _c_div(a, b):
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        raise TypeError("`//` on floats: spell floor division with libdevice")
    q = np.floor_divide(a, b)
    return np.where((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)), q + 1, q).astype(q.dtype)


def _c_mod(a, b):
    return np.fmod(a, b)


def _unwrap(x):
    return x.a if isinstance(x, Block) else x


class FakeTl:
    """`triton.language`: dtypes, where, the math it has, static_range."""

    def __init__(self):
        for name, dt in _TL_NAMES.items():
            setattr(self, name, FakeDtype(dt, name))

    @staticmethod
    def where(c, a, b):
        a_, b_ = _unwrap(a), _unwrap(b)
        if isinstance(a, Block) and not isinstance(b, Block):
            b_ = np.asarray(b_, dtype=a_.dtype)
        elif isinstance(b, Block) and not isinstance(a, Block):
            a_ = np.asarray(a_, dtype=b_.dtype)
        return Block(np.where(_unwrap(c), a_, b_))

    @staticmethod
    def abs(x):
        with np.errstate(all="ignore"):
            return Block(np.abs(x.a))

    exp = staticmethod(lambda x: _float_fn(np.exp)(x))
    log = staticmethod(lambda x: _float_fn(np.log)(x))
    sin = staticmethod(lambda x: _float_fn(np.sin)(x))
    cos = staticmethod(lambda x: _float_fn(np.cos)(x))
    static_range = staticmethod(range)


def _float_fn(fn):
    """A libdevice function: float32/float64 operands only, result in their dtype."""
    def call(*xs):
        arrs = [_unwrap(x) for x in xs]
        for a in arrs:
            if np.asarray(a).dtype not in (np.float32, np.float64):
                raise TypeError(f"libdevice.{fn.__name__} takes float32/float64, got {np.asarray(a).dtype}")
        with np.errstate(all="ignore"):
            r = np.asarray(fn(*arrs))
        return Block(r.astype(arrs[0].dtype) if r.dtype.kind == "f" else r)
    call.__name__ = getattr(fn, "__name__", "fn")
    return call


class FakeLibdevice:
    pass


for _name, _fn in {"sqrt": np.sqrt, "log1p": np.log1p, "expm1": np.expm1, "tan": np.tan, "asin": np.arcsin,
                   "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
                   "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erf": sp.erf, "erfc": sp.erfc,
                   "lgamma": sp.gammaln, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "nearbyint": np.rint,
                   "atan2": np.arctan2, "hypot": np.hypot, "nextafter": np.nextafter, "pow": np.power, "fmod": np.fmod,
                   "copysign": np.copysign, "signbit": lambda a: np.signbit(a).astype(np.int32)}.items():
    setattr(FakeLibdevice, _name, staticmethod(_float_fn(_fn)))

_TL_NAMES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "int16": np.int16,
             "int8": np.int8, "uint8": np.uint8, "int1": np.bool_}
_TL_OF = {D.float32: "float32", D.float64: "float64", D.int64: "int64", D.int32: "int32", D.int16: "int16",
          D.int8: "int8", D.uint8: "uint8", D.bool: "int1"}


class _Triton:
    jit = staticmethod(lambda fn: fn)


def triton_namespace() -> dict:
    ns = {"tl": FakeTl(), "libdevice": FakeLibdevice(), "triton": _Triton()}
    exec(compile(TRITON_HELPERS, "<triton-helpers>", "exec"), ns)
    return ns


NS = triton_namespace()


def _upcast(dt):
    return D.float32 if dt in LOWP else dt


def evaluate(op, arrays, result_dtype, compute_dtype, operand_dtype=None):
    """What the Triton printer's kernel computes: operands loaded in `operand_dtype` (default: the
    compute dtype; the condition of `where` stays bool), the op's Triton formula in
    `compute_dtype` (float32 for bfloat16/float16), then a cast to `result_dtype`."""
    sp_ = op.pointwise
    cd, od = _upcast(compute_dtype), _upcast(operand_dtype or compute_dtype)
    expr_dtype = D.bool if sp_.result == "bool" else cd
    blocks = [Block(a if (op is aten.where and i == 0) else a.astype(od.np)) for i, a in enumerate(arrays)]
    kind = kind_of(expr_dtype if sp_.by_result else D.FROM_NP[blocks[0].a.dtype])
    tmpl = sp_.template("triton", kind)
    names = [f"x{i}" for i in range(len(blocks))]
    ns = dict(NS, **dict(zip(names, blocks)))
    out = eval(tmpl.format(*names, T=f"tl.{_TL_OF[expr_dtype]}"), ns)
    a = np.asarray(_unwrap(out))
    with np.errstate(all="ignore"):
        return np.not_equal(a, 0) if result_dtype is D.bool else a.astype(result_dtype.np)


# ---- sample inputs ------------------------------------------------------------------------------
DTYPES = (D.float32, D.float64, D.bfloat16, D.float16, D.int64, D.int32, D.int16, D.int8, D.uint8, D.bool)
_FLOATS = np.array([-7.5, -3.25, -2.0, -1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 10.0,
                    np.inf, -np.inf, np.nan], dtype=np.float64)


def samples(dtype, arity: int, rng):
    """`arity` arrays of `dtype`: specials and random values; a second operand is never an
    integer zero (an integer division by zero raises in eager mode). Integers stay small: what
    overflows (lcm of large values) is implementation-defined in PyTorch too."""
    n = 64
    if dtype.category == D.FLOATING:
        a = np.concatenate([_FLOATS, rng.standard_normal(n - len(_FLOATS)) * 4])
        cols = [a, np.roll(a, 5), np.roll(a, 11)]
    elif dtype is D.bool:
        cols = [rng.random(n) < 0.5 for _ in range(3)]
    else:
        info = np.iinfo(dtype.np)
        lo, hi = max(info.min, -12), min(info.max, 12)
        a = np.concatenate([[0, 1, -1 if info.min < 0 else 2], rng.integers(lo, hi + 1, n - 3)])
        b = rng.integers(lo, hi + 1, n)
        b = np.where(b == 0, 3, b)
        cols = [a, b, rng.integers(lo, hi + 1, n)]
    return [np.asarray(c).astype(dtype.np) for c in cols[:arity]]


def _tensor(a):
    return fl.from_numpy(np.ascontiguousarray(a))


def _eager(op, arrays):
    return op(*[_tensor(a) for a in arrays])


# Ops whose bfloat16/float16 result is not their float32 result rounded: computed in float32 (as
# the Triton backend computes half precision) they would be wrong. nextafter steps to the next
# representable value of the storage dtype: the Triton backend must not upcast it (issue 13).
STORAGE_DTYPE_OPS = {aten.nextafter: "steps in the storage dtype"}

SPELLED = sorted((op for op in OPS.values() if op.pointwise is not None and op is not aten._to_copy),
                 key=lambda op: op.name)


def _check(op, dtype, rng):
    arity = len(op.tensor_args)
    arrays = samples(dtype, arity, rng)
    if op is aten.where:
        arrays = [samples(D.bool, 1, rng)[0]] + samples(dtype, 2, rng)
    try:
        want = _eager(op, arrays)
    except (RuntimeError, NotImplementedError, TypeError):
        return False                                           # the op does not take this dtype
    rdt = want.dtype
    if op in _ROUNDING and dtype.category != D.FLOATING:
        return False                                           # lowered as the identity there
    if op in STORAGE_DTYPE_OPS and dtype in LOWP:
        return False
    if op.pointwise.result == "bool":
        cd = dtype if op is not aten.signbit or dtype.category == D.FLOATING else D.float32   # as the lowering
    else:
        cd = rdt
    got = evaluate(op, arrays, rdt, cd)
    w = want.numpy()
    if rdt.category == D.FLOATING:
        tol = 1.6e-2 if rdt in LOWP else (2e-6 if rdt is D.float32 else 1e-12)
        np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=f"{op.name} on {dtype.name}: {op.pointwise.triton!r}")
    else:
        np.testing.assert_array_equal(got, w, err_msg=f"{op.name} on {dtype.name}: {op.pointwise.triton!r}")
    return True


@pytest.mark.parametrize("op", SPELLED, ids=lambda op: op.name)
def test_triton_spelling_matches_eager(op):
    rng = np.random.default_rng(0)
    ran = [dt for dt in DTYPES if _check(op, dt, rng)]
    assert ran, f"{op.name}: no dtype ran"
    if D.float32 in ran and op not in STORAGE_DTYPE_OPS:
        assert set(LOWP) <= set(ran), f"{op.name}: bfloat16/float16 not checked"


@pytest.mark.parametrize("src", DTYPES, ids=lambda d: d.name)
def test_triton_cast_spelling(src):
    """`ops.to_dtype` (`aten._to_copy`'s spelling) between every pair of dtypes, on values every
    target holds (a float outside an integer's range converts differently per machine)."""
    vals = np.array([-3.75, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5, 7.0, 100.0, 127.0], dtype=np.float64)
    if src is D.bool:
        a = np.array([True, False, True, True])
    else:
        a = vals.astype(src.np) if src.category == D.FLOATING else np.abs(vals).astype(src.np)
    for dst in DTYPES:
        want = _tensor(a).to(dst).numpy()
        got = evaluate(aten._to_copy, [a], dst, dst, src)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=f"{src.name} -> {dst.name}")


def test_fake_triton_semantics():
    """The stand-in has Triton's integer division (toward zero) and rejects libdevice on integers."""
    a, b = Block(np.array([-7, 7, -7], np.int32)), Block(np.array([2, -2, -2], np.int32))
    assert list((a // b).a) == [-3, -3, 3] and list((a % b).a) == [-1, 1, -1]
    assert (a / b).a.dtype == np.float32
    with pytest.raises(TypeError):
        FakeLibdevice.floor(a)
    assert math.isnan(float(NS["fl_max"](Block(np.float32(np.nan)), Block(np.float32(1.0))).a))
