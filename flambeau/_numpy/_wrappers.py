"""The callables `flambeau.compile` records in graphs for NumPy code: Tensors in, Tensors out.

Dynamo traces a NumPy array as the Tensor holding its values. A call of `np.<fn>`, an ndarray method,
attribute or operator becomes one call_function node whose target is one of these wrappers: it
views its Tensor arguments as `flambeau._numpy.ndarray`s, runs the flambeau._numpy function (made of
flambeau operators, so backends trace through it) and hands the result's Tensors back. `to_numpy`
turns a graph output back into a `numpy.ndarray` for the caller (PyTorch's torch._dynamo.utils
numpy_to_tensor_wrapper / numpy_method_wrapper / numpy_operator_wrapper / to_numpy_helper). Under
`with flambeau.device(d)` the compiled entry passes `to_device(array, d)` for each ndarray input and calls
`write_back` for the inputs the graph mutated.
"""
from __future__ import annotations

import functools
import operator

import numpy as np

from .._tensor import Tensor
from .._ops import functions as F
from ._ndarray import ndarray, binary_operator, UFUNCS, index_key, to_tensor
from . import _funcs, linalg

_NAMESPACES = {"numpy": (_funcs, UFUNCS), "numpy.linalg": (linalg, {})}
UNARY_OPERATORS = {operator.neg: "negative", operator.pos: "positive", operator.abs: "absolute", abs: "absolute",
                    operator.invert: "invert"}


def _arrays(x):
    if isinstance(x, Tensor):
        return ndarray(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_arrays(e) for e in x)
    if isinstance(x, dict):
        return {k: _arrays(v) for k, v in x.items()}
    return x


def _tensors(x):
    if isinstance(x, ndarray):
        return x.tensor
    if isinstance(x, (tuple, list)):
        return type(x)(_tensors(e) for e in x)
    return x


class numpy_function:
    """`np.<name>(...)` over Tensors (the flambeau._numpy function `fn`)."""

    def __init__(self, qualname: str, fn):
        self.qualname = qualname
        self.fn = fn
        self.__name__ = "wrapped_" + qualname.replace(".", "_")

    def __repr__(self) -> str:
        return f"<flambeau._numpy wrapper of {self.qualname}>"

    def __call__(self, *args, **kwargs):
        return _tensors(self.fn(*_arrays(args), **_arrays(kwargs)))


class numpy_method:
    """`ndarray.<name>(...)` with the array given as a Tensor."""

    def __init__(self, name: str):
        self.name = name
        self.__name__ = "wrapped_ndarray_" + name

    def __repr__(self) -> str:
        return f"<flambeau._numpy wrapper of ndarray.{self.name}>"

    def __call__(self, obj: Tensor, *args, **kwargs):
        return _tensors(getattr(ndarray(obj), self.name)(*_arrays(args), **_arrays(kwargs)))


def numpy_attr(obj: Tensor, name: str):
    """`ndarray.<name>` (T, real, imag ...) with the array given as a Tensor."""
    return _tensors(getattr(ndarray(obj), name))


def numpy_binary_operator(fn, a, b):
    """`a <op> b` (in-place operators too) with NumPy's semantics, operands as Tensors or scalars."""
    return _tensors(binary_operator(fn, *_arrays((a, b))))


def numpy_unary_operator(fn, a: Tensor) -> Tensor:
    return UFUNCS[UNARY_OPERATORS[fn]](ndarray(a)).tensor


def numpy_getitem(a: Tensor, key) -> Tensor:
    return a[index_key(_arrays(key))]


def numpy_setitem(a: Tensor, key, value) -> None:
    a[index_key(_arrays(key))] = to_tensor(_arrays(value)).to(a.dtype)


def to_numpy(x):
    """A graph output as the caller's value: Tensors become numpy.ndarrays (tuples/lists kept)."""
    if isinstance(x, Tensor):
        return x.numpy(force=True)
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(e) for e in x)
    return x


def tensor_to_ndarray(x):
    """`wrap_numpy`'s view of an argument: a Tensor as a NumPy array (under compile the same values,
    gradients kept; eagerly `x.numpy(force=True)`), anything else unchanged."""
    return x.numpy(force=True) if isinstance(x, Tensor) else x


def ndarray_to_tensor(x):
    """`wrap_numpy`'s view of a result: a NumPy array as the Tensor holding it, anything else unchanged."""
    return F.from_numpy(x) if isinstance(x, np.ndarray) else x


def wrap_numpy(fn):
    """PyTorch's `torch.compiler.wrap_numpy`: `fn` from NumPy arrays to NumPy arrays as a function from
    Tensors to Tensors. Meant for `flambeau.compile(fullgraph=True)`, where the NumPy code is traced
    as flambeau ops: it then runs on the tensors' device and gradients flow through it."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        args = _tree_map(tensor_to_ndarray, args)
        kwargs = {k: _tree_map(tensor_to_ndarray, v) for k, v in kwargs.items()}
        return _tree_map(ndarray_to_tensor, fn(*args, **kwargs))
    return wrapped


def _tree_map(fn, x):
    if isinstance(x, (tuple, list)):
        return type(x)(_tree_map(fn, e) for e in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def from_numpy(a: np.ndarray) -> Tensor:
    """A numpy.ndarray graph input as the Tensor sharing its memory."""
    return F.from_numpy(a)


def to_device(a: np.ndarray, device) -> Tensor:
    """A numpy.ndarray graph input traced under `with flambeau.device(device)` (not cpu): a copy of it on that
    device, where the graph computes (PyTorch passes `torch.as_tensor(a)`, which the device context moves)."""
    return F.from_numpy(a).to(device)


def write_back(a: np.ndarray, t: Tensor) -> None:
    """The caller's numpy.ndarray `a` given the values of `t`, its copy on another device that the graph
    mutated (an in-place operator, `out=`, an assignment), so the mutation is seen as in NumPy."""
    np.copyto(a, t.numpy(force=True))


_cache: dict = {}


def graph_function(module: str, name: str):
    """The wrapper recorded for `numpy.<module...>.<name>`, or None when flambeau._numpy has no such function."""
    key = (module, name)
    hit = _cache.get(key)
    if hit is None:
        space = _NAMESPACES.get(module)
        if space is None:
            return None
        fn = space[1].get(name) or getattr(space[0], name, None)
        if fn is None or name.startswith("_"):
            return None
        qual = name if module == "numpy" else module[len("numpy."):] + "." + name
        hit = _cache[key] = numpy_function(qual, fn)
    return hit


def method(name: str) -> numpy_method | None:
    """The wrapper recorded for `ndarray.<name>(...)`, or None when flambeau._numpy's ndarray lacks it."""
    if not callable(getattr(ndarray, name, None)) or name.startswith("_"):
        return None
    hit = _cache.get(("ndarray", name))
    if hit is None:
        hit = _cache[("ndarray", name)] = numpy_method(name)
    return hit
