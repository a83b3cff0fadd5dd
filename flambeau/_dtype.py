"""dtypes: the scalar types of tensors, their NumPy storage types, and PyTorch's promotion rules.

A `dtype` knows its category (bool < integer < floating < complex), its size, and the NumPy dtype
that stores it (bfloat16 comes from ml_dtypes). `promote_types` and `result_type` follow PyTorch
exactly, including the rule that dimensioned tensors outrank 0-dim tensors, which outrank Python
scalars, within a category.
"""
from __future__ import annotations

import enum

import numpy as np
import ml_dtypes


class Category(enum.IntEnum):
    """A dtype's kind, in the order PyTorch's promotion climbs: bool < integer < floating < complex."""
    BOOL = 0
    INTEGER = 1
    FLOATING = 2
    COMPLEX = 3


# Module-level names for the members: `dt.category < D.FLOATING` reads as fast as comparing with an
# int literal, while `Category.FLOATING` goes through the enum metaclass (~60 ns) on hot meta paths.
BOOL, INTEGER, FLOATING, COMPLEX = Category


class dtype:
    __slots__ = ("name", "np", "itemsize", "category", "is_signed", "_alias")

    def __init__(self, name: str, np_dtype, category: Category, is_signed: bool):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.category = category
        self.is_signed = is_signed

    @property
    def is_floating_point(self) -> bool:
        return self.category == FLOATING

    @property
    def is_complex(self) -> bool:
        return self.category == COMPLEX

    def to_real(self) -> "dtype":
        return {complex64: float32, complex128: float64}.get(self, self)

    def to_complex(self) -> "dtype":
        return {float64: complex128, complex128: complex128}.get(self, complex64)

    def __repr__(self) -> str:
        return "torch." + self.name

    def __reduce__(self):
        return (_by_name, (self.name,))


def _by_name(name: str) -> dtype:
    return BY_NAME[name]


bool = dtype("bool", np.bool_, BOOL, False)
uint8 = dtype("uint8", np.uint8, INTEGER, False)
int8 = dtype("int8", np.int8, INTEGER, True)
int16 = dtype("int16", np.int16, INTEGER, True)
int32 = dtype("int32", np.int32, INTEGER, True)
int64 = dtype("int64", np.int64, INTEGER, True)
float16 = dtype("float16", np.float16, FLOATING, True)
bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16, FLOATING, True)
float32 = dtype("float32", np.float32, FLOATING, True)
float64 = dtype("float64", np.float64, FLOATING, True)
complex64 = dtype("complex64", np.complex64, COMPLEX, True)
complex128 = dtype("complex128", np.complex128, COMPLEX, True)
uint16 = dtype("uint16", np.uint16, INTEGER, False)
uint32 = dtype("uint32", np.uint32, INTEGER, False)
uint64 = dtype("uint64", np.uint64, INTEGER, False)
float8_e4m3fn = dtype("float8_e4m3fn", ml_dtypes.float8_e4m3fn, FLOATING, True)
float8_e5m2 = dtype("float8_e5m2", ml_dtypes.float8_e5m2, FLOATING, True)

ALL = [bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, complex64,
       complex128, uint16, uint32, uint64, float8_e4m3fn, float8_e5m2]
BY_NAME = {d.name: d for d in ALL}
ALIASES = {"half": float16, "float": float32, "double": float64, "short": int16, "int": int32,
           "long": int64, "cfloat": complex64, "cdouble": complex128, "chalf": None}
FROM_NP = {d.np: d for d in ALL}
# quantized dtypes: the integer storage of a quantized tensor (its scale and zero point live on the
# tensor, `flambeau._quantized`); outside ALL, so no promotion or NumPy-dtype lookup ever yields one
quint8 = dtype("quint8", np.uint8, INTEGER, False)
qint8 = dtype("qint8", np.int8, INTEGER, True)
qint32 = dtype("qint32", np.int32, INTEGER, True)
QUANTIZED = (quint8, qint8, qint32)
BY_NAME.update((d.name, d) for d in QUANTIZED)
LOW_PRECISION = (float16, bfloat16, float8_e4m3fn, float8_e5m2)


class qscheme:
    """`torch.qscheme`: how a quantized tensor maps integers to reals (one scale, or one per channel)."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return "torch." + self.name

    def __reduce__(self):
        return (_qscheme_by_name, (self.name,))


def _qscheme_by_name(name: str) -> qscheme:
    return QSCHEMES[name]


per_tensor_affine = qscheme("per_tensor_affine")
per_channel_affine = qscheme("per_channel_affine")
per_tensor_symmetric = qscheme("per_tensor_symmetric")
per_channel_symmetric = qscheme("per_channel_symmetric")
per_channel_affine_float_qparams = qscheme("per_channel_affine_float_qparams")
QSCHEMES = {q.name: q for q in (per_tensor_affine, per_channel_affine, per_tensor_symmetric,
                                per_channel_symmetric, per_channel_affine_float_qparams)}


def from_numpy_dtype(npd) -> dtype:
    try:
        return FROM_NP[npd]
    except KeyError:
        raise TypeError(f"can't convert np.ndarray of type {npd}. The only supported types are: "
                        "float64, float32, float16, complex64, complex128, int64, int32, int16, "
                        "int8, uint8, and bool.") from None


# ---- promotion ---------------------------------------------------------------------------
_INT_ORDER = [uint8, int8, int16, int32, int64]
_promote_cache: dict = {}


def promote_types(a: dtype, b: dtype) -> dtype:
    """PyTorch's promote_types lattice."""
    if a is b:
        return a
    key = (a, b)
    r = _promote_cache.get(key)
    if r is not None:
        return r
    wide = (uint16, uint32, uint64)
    if (a in wide or b in wide) and not (a.category == FLOATING or b.category == FLOATING):
        names = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
                 "int64": "Long", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
        raise RuntimeError("Promotion for uint16, uint32, uint64 types is not supported, attempted to promote "
                           f"{names.get(a.name, 'UInt' + a.name[4:])} and {names.get(b.name, 'UInt' + b.name[4:])}")
    if a.category == BOOL:
        r = b
    elif b.category == BOOL:
        r = a
    elif a.category == COMPLEX or b.category == COMPLEX:
        hi = 0
        for d in (a, b):
            if d in (complex128, float64):
                hi = 1
        r = complex128 if hi else complex64
    elif a.category == FLOATING and b.category == FLOATING:
        if {a, b} == {float16, bfloat16}:
            r = float32
        elif a.name.startswith("float8") or b.name.startswith("float8"):
            if a.name.startswith("float8") and b.name.startswith("float8"):
                raise RuntimeError(f"Promotion for Float8 Types is not supported, attempted to promote {a.name.capitalize()} and {b.name.capitalize()}")
            r = b if a.name.startswith("float8") else a
        else:
            r = a if a.itemsize >= b.itemsize else b
    elif a.category == FLOATING:
        r = a
    elif b.category == FLOATING:
        r = b
    else:
        r = FROM_NP[np.promote_types(a.np, b.np)]
    _promote_cache[key] = r
    return r


def _combine(higher: dtype | None, lower: dtype | None) -> dtype | None:
    # PyTorch's combine_categories: a higher-priority class wins unless the lower one is of a
    # higher category, in which case the lower class's category is adopted.
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.category == COMPLEX:
        return higher
    if higher.category == FLOATING:
        if lower.category == COMPLEX:
            return higher.to_complex() if higher is not float16 else complex64
        return higher
    if higher.category == BOOL or lower.category >= FLOATING:
        return promote_types(higher, lower)
    return higher


def scalar_dtype(x, default_float: dtype) -> dtype:
    t = type(x)
    if t is float:
        return default_float
    if t is int:
        return int64
    if t is builtins_bool:
        return bool
    if t is complex:
        return complex128 if default_float is float64 else complex64
    if isinstance(x, np.generic):
        return FROM_NP.get(x.dtype, default_float)
    raise TypeError(f"unsupported scalar type {t.__name__}")


import builtins as _b  # noqa: E402
builtins_bool = _b.bool


def result_type_of(dims, zeros, scalars) -> dtype:
    """Combine the dtypes of dimensioned tensors, 0-dim tensors and Python scalars."""
    d = z = s = None
    for x in dims:
        d = x if d is None else promote_types(d, x)
    for x in zeros:
        z = x if z is None else promote_types(z, x)
    for x in scalars:
        s = x if s is None else promote_types(s, x)
    return _combine(d, _combine(z, s))
