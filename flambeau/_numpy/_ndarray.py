"""flambeau._numpy's `ndarray`: a flambeau Tensor seen through NumPy's API (PyTorch's torch._numpy.ndarray).

An `ndarray` holds one Tensor (`.tensor`) and answers NumPy's attributes (`shape`, `dtype` as a NumPy
dtype, `size`, `T`, `strides` in bytes ...), operators and methods with NumPy's semantics; the work is
done by flambeau operators, so the same code runs eagerly, traced into a graph by dynamo, or on another
device. This module also holds the conversions every function uses:

- `to_tensor(x)`: an ndarray, Tensor, NumPy array, Python scalar or (nested) sequence as a Tensor, with
  NumPy's default dtypes (Python floats are float64, ints int64); new tensors are made on the default device
  (`with flambeau.device(...)`), as PyTorch's `torch.as_tensor`;
- `np_dtype(x)` / `fl_dtype(d)`: NumPy dtype of an operand (a Python scalar stays its Python type: a
  weak scalar in NumPy 2's promotion), and the flambeau dtype of a NumPy dtype;
- `ufunc(name)`: a NumPy ufunc over flambeau ops. The loop's dtypes are NumPy's own answer
  (`np.<ufunc>.resolve_dtypes`), so type promotion is NumPy's (int32 + float32 is float64, a Python
  float keeps a float32 array float32, sqrt of int8 is float16), with `out=` and `dtype=`.
"""
from __future__ import annotations

import builtins
import operator

import numpy as np

from .. import _state
from .._tensor import Tensor
from .._dtype import from_numpy_dtype, dtype as _fl_dtype
from .._ops import functions as F

_PY_SCALARS = (builtins.bool, builtins.int, builtins.float, builtins.complex)


class ndarray:
    """A NumPy array backed by a flambeau Tensor (see the module docstring)."""
    __slots__ = ("tensor",)
    __array_priority__ = 100     # `np_array + ndarray` gives our reflected operator, not NumPy's

    def __init__(self, t: Tensor):
        if not isinstance(t, Tensor):
            raise TypeError(f"flambeau._numpy.ndarray wraps a Tensor, got {type(t).__name__}")
        self.tensor = t

    # ---- attributes -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.tensor.shape)

    @property
    def ndim(self) -> int:
        return self.tensor.dim()

    @property
    def size(self) -> int:
        return self.tensor.numel()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.tensor.dtype.np)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def strides(self) -> tuple:
        return tuple(s * self.itemsize for s in self.tensor.stride())

    @property
    def T(self) -> "ndarray":
        return ndarray(self.tensor.permute(*reversed(range(self.ndim))))

    @property
    def real(self) -> "ndarray":
        return ndarray(F.real(self.tensor)) if self.tensor.is_complex() else self

    @property
    def imag(self) -> "ndarray":
        if self.tensor.is_complex():
            return ndarray(F.imag(self.tensor))
        return ndarray(F.zeros_like(self.tensor))

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (ndarray(t) for t in self.tensor.unbind(0))

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return builtins.bool(self.tensor.item())

    def __int__(self) -> int:
        return builtins.int(self.tensor.item())

    def __float__(self) -> float:
        return builtins.float(self.tensor.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return builtins.int(self.tensor.item())

    def item(self, *args):
        if args:
            return self[args if len(args) > 1 else args[0]].item()
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.tensor.reshape(()).item()

    def tolist(self):
        return self.tensor.tolist()

    def __array__(self, dtype=None, copy=None):
        a = self.tensor.detach().cpu().numpy()
        return a.astype(dtype) if dtype is not None else a

    def __repr__(self) -> str:
        return repr(self.__array__()).replace("array(", "flambeau._numpy.ndarray(", 1)

    # ---- indexing -----------------------------------------------------------------------------------
    def __getitem__(self, key):
        return ndarray(self.tensor[index_key(key)])

    def __setitem__(self, key, value):
        self.tensor[index_key(key)] = to_tensor(value).to(self.tensor.dtype)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True) -> "ndarray":
        target = fl_dtype(dtype)
        if target == self.tensor.dtype and not copy:
            return self
        return ndarray(self.tensor.to(target, copy=True))

    def copy(self, order="C") -> "ndarray":
        return ndarray(self.tensor.clone())

    def fill(self, value) -> None:
        self.tensor.fill_(value)


def index_key(key):
    """A NumPy index with ndarrays/lists of indices turned into tensors (basic parts kept)."""
    if isinstance(key, tuple):
        return tuple(index_key(k) for k in key)
    if isinstance(key, (ndarray, np.ndarray)):
        return to_tensor(key)
    if isinstance(key, list):
        return to_tensor(key)
    return key


# ---- dtypes and conversions --------------------------------------------------------------------------
def fl_dtype(d) -> _fl_dtype:
    """The flambeau dtype of a NumPy dtype spec (np.float32, "int64", float, a flambeau dtype)."""
    if isinstance(d, _fl_dtype):
        return d
    return from_numpy_dtype(np.dtype(d))


def np_dtype(x):
    """The NumPy dtype an operand brings to type promotion; a Python scalar is its (weak) type."""
    if isinstance(x, ndarray):
        return x.dtype
    if isinstance(x, Tensor):
        return np.dtype(x.dtype.np)
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    if type(x) in _PY_SCALARS:
        return type(x)
    return np.asarray(x).dtype


def to_tensor(x, dtype=None) -> Tensor:
    """`x` as a Tensor (see the module docstring); `dtype`: a NumPy dtype spec to cast to."""
    if isinstance(x, ndarray):
        t = x.tensor
    elif isinstance(x, Tensor):
        t = x
    elif isinstance(x, np.ndarray):          # on the default device, as torch.as_tensor
        t = F.from_numpy(np.ascontiguousarray(x))
        if _state.tls.default_device is not None:
            t = t.to(_state.tls.default_device)
    elif isinstance(x, (list, tuple)) and any(_holds_array(e) for e in x):
        parts = [to_tensor(e) for e in x]
        common = np.result_type(*[np_dtype(p) for p in parts])
        t = F.stack([p.to(fl_dtype(common)) for p in parts])
    else:
        arr = np.asarray(x)
        t = F.full(arr.shape, arr.item(), dtype=fl_dtype(arr.dtype)) if arr.ndim == 0 else \
            F.tensor(arr.tolist(), dtype=fl_dtype(arr.dtype))
    if dtype is not None and t.dtype != fl_dtype(dtype):
        t = t.to(fl_dtype(dtype))
    return t


def _holds_array(x) -> bool:
    if isinstance(x, (ndarray, Tensor, np.ndarray)):
        return True
    return isinstance(x, (list, tuple)) and any(_holds_array(e) for e in x)


def wrap(x):
    """Tensors (also inside tuples/lists) as ndarrays."""
    if isinstance(x, Tensor):
        return ndarray(x)
    if isinstance(x, (tuple, list)):
        return type(x)(wrap(e) for e in x)
    return x


def write_out(result: Tensor, out) -> ndarray:
    """NumPy's `out=`: the result cast into `out` (same_kind casting), which is returned."""
    if isinstance(out, tuple):
        (out,) = out
    if not isinstance(out, ndarray):
        raise TypeError(f"out= must be a flambeau._numpy.ndarray, got {type(out).__name__}")
    src = np.dtype(result.dtype.np)
    if not np.can_cast(src, out.dtype, casting="same_kind"):
        raise TypeError(f"Cannot cast ufunc output from dtype('{src}') to dtype('{out.dtype}') with casting "
                        "rule 'same_kind'")
    out.tensor.copy_(F.broadcast_to(result, out.tensor.shape).to(out.tensor.dtype))
    return out


# ---- ufuncs ---------------------------------------------------------------------------------------------
def _operand(x, loop_dtype) -> Tensor:
    t = to_tensor(x)
    target = fl_dtype(loop_dtype)
    return t if t.dtype == target else t.to(target)


class ufunc:
    """A NumPy ufunc computed by a flambeau function: NumPy's loop dtypes, `out=`, `dtype=`."""

    def __init__(self, name: str, fn, nin: int):
        self.__name__ = name
        self.np = getattr(np, name)
        self.fn = fn
        self.nin = nin
        self.nout = 1

    def __repr__(self) -> str:
        return f"<flambeau._numpy ufunc '{self.__name__}'>"

    def loop_dtypes(self, args, dtype=None, casting="same_kind") -> tuple:
        dts = tuple(np_dtype(a) for a in args) + (None,)
        if dtype is None:
            return self.np.resolve_dtypes(dts, casting=casting)
        return self.np.resolve_dtypes(dts, signature=(None,) * self.nin + (np.dtype(dtype),), casting=casting)

    def __call__(self, *args, out=None, dtype=None, where=True, casting="same_kind", order="K", subok=True):
        if len(args) != self.nin:
            raise TypeError(f"{self.__name__}() takes {self.nin} positional argument(s) but {len(args)} were given")
        if where is not True:
            raise NotImplementedError(f"np.{self.__name__}(where=...) is not supported by flambeau._numpy")
        loop = self.loop_dtypes(args, dtype, casting)
        result = self.fn(*[_operand(a, loop[i]) for i, a in enumerate(args)])
        want = fl_dtype(loop[self.nin])
        if result.dtype != want:
            result = result.to(want)
        if out is not None:
            return write_out(result, out)
        return ndarray(result)


def _bitwise_not(t: Tensor) -> Tensor:
    return F.logical_not(t) if t.dtype.np == np.bool_ else F.bitwise_not(t)


def _conjugate(t: Tensor) -> Tensor:
    return F.conj_physical(t) if t.is_complex() else t.clone()


def _absolute(t: Tensor) -> Tensor:
    return F.abs(t) if t.dtype.np != np.bool_ else t.clone()


# NumPy ufunc name -> the flambeau function computing it on operands already in the loop dtype
UNARY_UFUNCS = {
    "negative": F.neg, "positive": F.positive, "absolute": _absolute, "fabs": F.abs, "sign": F.sign,
    "sqrt": F.sqrt, "square": F.square, "reciprocal": F.reciprocal, "exp": F.exp, "exp2": F.exp2,
    "expm1": F.expm1, "log": F.log, "log2": F.log2, "log10": F.log10, "log1p": F.log1p,
    "sin": F.sin, "cos": F.cos, "tan": F.tan, "arcsin": F.asin, "arccos": F.acos, "arctan": F.atan,
    "sinh": F.sinh, "cosh": F.cosh, "tanh": F.tanh, "arcsinh": F.asinh, "arccosh": F.acosh,
    "arctanh": F.atanh, "floor": F.floor, "ceil": F.ceil, "trunc": F.trunc, "rint": F.round,
    "isnan": F.isnan, "isinf": F.isinf, "isfinite": F.isfinite, "signbit": F.signbit,
    "logical_not": F.logical_not, "invert": _bitwise_not, "bitwise_not": _bitwise_not,
    "deg2rad": F.deg2rad, "rad2deg": F.rad2deg, "degrees": F.rad2deg, "radians": F.deg2rad,
    "conjugate": _conjugate, "conj": _conjugate,
}
BINARY_UFUNCS = {
    "add": F.add, "subtract": F.sub, "multiply": F.mul, "divide": F.div, "true_divide": F.div,
    "floor_divide": F.floor_divide, "remainder": F.remainder, "mod": F.remainder, "fmod": F.fmod,
    "power": F.pow, "float_power": F.pow, "maximum": F.maximum, "minimum": F.minimum, "fmax": F.fmax,
    "fmin": F.fmin, "arctan2": F.atan2, "hypot": F.hypot, "logaddexp": F.logaddexp,
    "logaddexp2": F.logaddexp2, "copysign": F.copysign, "heaviside": F.heaviside, "nextafter": F.nextafter,
    "equal": F.eq, "not_equal": F.ne, "less": F.lt, "less_equal": F.le, "greater": F.gt,
    "greater_equal": F.ge, "logical_and": F.logical_and, "logical_or": F.logical_or,
    "logical_xor": F.logical_xor, "bitwise_and": F.bitwise_and, "bitwise_or": F.bitwise_or,
    "bitwise_xor": F.bitwise_xor, "left_shift": F.bitwise_left_shift, "right_shift": F.bitwise_right_shift,
    "gcd": F.gcd, "lcm": F.lcm,
}
UFUNCS = {name: ufunc(name, fn, 1) for name, fn in UNARY_UFUNCS.items()}
UFUNCS.update({name: ufunc(name, fn, 2) for name, fn in BINARY_UFUNCS.items()})


# ---- operators --------------------------------------------------------------------------------------
_OPERATOR_UFUNCS = {
    operator.add: "add", operator.sub: "subtract", operator.mul: "multiply", operator.truediv: "true_divide",
    operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "power",
    operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
    operator.lshift: "left_shift", operator.rshift: "right_shift", operator.eq: "equal",
    operator.ne: "not_equal", operator.lt: "less", operator.le: "less_equal", operator.gt: "greater",
    operator.ge: "greater_equal",
}
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
            operator.ipow: operator.pow, operator.iand: operator.and_, operator.ior: operator.or_,
            operator.ixor: operator.xor, operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
            operator.imatmul: operator.matmul}


def binary_operator(fn, a, b):
    """`a <op> b` with NumPy's semantics (in-place operators write into `a`)."""
    if fn in _INPLACE:
        return write_out(to_tensor(binary_operator(_INPLACE[fn], a, b)), a)
    if fn is operator.matmul:
        return matmul(a, b)
    return UFUNCS[_OPERATOR_UFUNCS[fn]](a, b)


def matmul(a, b, out=None) -> ndarray:
    ta, tb = to_tensor(a), to_tensor(b)
    if ta.dim() == 0 or tb.dim() == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    common = fl_dtype(np.result_type(np_dtype(ta), np_dtype(tb)))
    r = F.matmul(ta.to(common), tb.to(common))
    return write_out(r, out) if out is not None else ndarray(r)


def _install_operators() -> None:
    def make(fn):
        def op(self, other):
            return binary_operator(fn, self, other)
        op.__name__ = f"__{fn.__name__.strip('_')}__"
        return op

    def make_reflected(fn):
        def rop(self, other):
            return binary_operator(fn, other, self)
        rop.__name__ = f"__r{fn.__name__.strip('_')}__"
        return rop

    for fn in list(_OPERATOR_UFUNCS) + [operator.matmul]:
        name = fn.__name__.strip("_")
        setattr(ndarray, f"__{name}__", make(fn))
        if fn not in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
            setattr(ndarray, f"__r{name}__", make_reflected(fn))
    for fn in _INPLACE:
        setattr(ndarray, f"__{fn.__name__.strip('_')}__", make(fn))
    def make_unary(dunder, name):
        def unary(self):
            return UFUNCS[name](self)
        unary.__name__ = dunder
        return unary

    for dunder, name in _UNARY_OPERATORS.items():
        setattr(ndarray, dunder, make_unary(dunder, name))
    ndarray.__hash__ = None


_UNARY_OPERATORS = {"__neg__": "negative", "__pos__": "positive", "__abs__": "absolute", "__invert__": "invert"}


_install_operators()
