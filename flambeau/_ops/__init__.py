"""All operator declarations. Importing this package registers every op, exports the public
functions and attaches Tensor methods and Python operators (`+`, `@`, `[]`, ...).

Layer 5 (ops, with `random`, `linalg`, `special`, `_api`) of tests/test_layers.py's order: imports
the tensor layer and below; the layers above call the operators through `functions`.
"""
from __future__ import annotations

from . import _registry
from ._registry import OPS, EXPORTS, METHODS, Op, defop, export, TensorSpec  # noqa: F401
# a split module follows the module it was split from (it imports that one's helpers)
from . import creation, pointwise, pointwise_math, reduction, sorting, scans  # noqa: F401
from . import views, views_split, linalg, linalg_decomp, indexing, scatter, masking  # noqa: F401
from . import shape, random_ops, nn_ops, norm_loss, activation, linear, nn_extra, quantized  # noqa: F401
from . import quantized_tensor, quantized_linear, quantized_conv, quantized_pool  # noqa: F401
from .._tensor import Tensor
from .._dtype import scalar_dtype
from .. import _dispatch, _state
_tls = _state.tls


def _fn(name):
    def call(*args, **kwargs):
        return EXPORTS[name](*args, **kwargs)
    return call


_COMMUTATIVE = {"add", "mul", "bitwise_and", "bitwise_or", "bitwise_xor"}


def _rev(name):
    def call(self, other):
        if name in _COMMUTATIVE and not isinstance(other, Tensor):
            return EXPORTS[name](self, other)      # keeps `other` a Python scalar for promotion
        if name == "div" and not isinstance(other, Tensor):
            # PyTorch's `scalar / t` is `t.reciprocal() * scalar` (same rounding; under cuda autocast
            # reciprocal runs in float32, so the result is float32)
            return EXPORTS["mul"](EXPORTS["reciprocal"](self), other)
        return EXPORTS[name](other, self)         # binary kernels take a Python scalar on either side
    return call


def _scalar_dtype(x, t):
    return scalar_dtype(x, _state.default_dtype)


def _meth(name):
    def call(self, *args, **kwargs):
        return METHODS[name](self, *args, **kwargs)
    call.__name__ = name
    return call


def _iop(name):
    def call(self, other):
        return METHODS[name](self, other)
    return call


_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
           "mod": "remainder", "pow": "pow", "matmul": "matmul", "and": "bitwise_and",
           "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
           "rshift": "bitwise_right_shift"}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def _binary_dunder(opname):
    def call(self, other):
        try:
            f = EXPORTS[opname]
        except KeyError:
            return NotImplemented
        if not isinstance(other, (Tensor, int, float, complex, bool)) and not hasattr(other, "dtype"):
            return NotImplemented
        if _registry._fx_hook is None and type(f) is Op:
            if _state.interposed and (_tls.modes or (_tls.autocast and f.autocast_tagged)):
                return _dispatch.dispatch(f, (self, other), {})     # what f(self, other) does, see _method
            return _dispatch.call_functional(f, (self, other), {})
        return f(self, other)
    return call


def install() -> None:
    for name, fn in METHODS.items():
        if name.startswith("__"):
            setattr(Tensor, name, fn)
        else:
            setattr(Tensor, name, _method(fn))
    for dunder, opname in _BINARY.items():
        setattr(Tensor, f"__{dunder}__", _binary_dunder(opname))
        setattr(Tensor, f"__r{dunder}__", _rev(opname))
        if opname + "_" in METHODS:
            setattr(Tensor, f"__i{dunder}__", _iop(opname + "_"))
    for dunder, opname in _COMPARE.items():
        setattr(Tensor, f"__{dunder}__", _binary_dunder(opname))
    Tensor.__hash__ = lambda self: id(self)
    Tensor.__neg__ = lambda self: EXPORTS["neg"](self)
    Tensor.__pos__ = lambda self: self
    Tensor.__abs__ = lambda self: EXPORTS["abs"](self)
    Tensor.__invert__ = lambda self: EXPORTS["bitwise_not"](self)


def _method(fn):
    if isinstance(fn, Op):
        inplace = fn.is_inplace
        autocast_tagged = fn.autocast_tagged

        def m(self, *args, **kwargs):
            # Op.__call__'s route without its cost: calling an Op object goes through the `__call__`
            # slot and repacks the arguments (~1000 instructions on CPython 3.11)
            if _registry._fx_hook is None:
                if kwargs or inplace or (_state.interposed and (_tls.modes or (_tls.autocast and autocast_tagged))):
                    return _dispatch.dispatch(fn, (self, *args), kwargs)
                return _dispatch.call_functional(fn, (self, *args), kwargs)
            return fn(self, *args, **kwargs)
        m.__name__ = fn.__name__
        return m
    return fn
