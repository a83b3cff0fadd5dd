"""Tensors, NumPy arrays and symbolic sizes while tracing.

`TensorVariable` is an FX node plus a fake example value (metadata only; sizes may be SymInts).
Metadata questions (`shape`, `dtype`, `dim()`, `is_contiguous()`) are answered from the example
value — the tensor guards make those answers valid for every call that reuses the graph — and
every other method becomes a `call_method` node. Reading data into Python (`item`, `tolist`,
`bool(t)`) cannot be captured and breaks the graph. `SymNodeVariable` is a symbolic size
(SymInt) with the node that computes it at run time.

With `config.trace_numpy` (PyTorch 2.1's compile of NumPy code), a `numpy.ndarray` is traced as the
Tensor holding its values: `NumpyNdarrayVariable` wraps that TensorVariable, and `NumpyVariable` is a
NumPy function. Their calls, methods, attributes and operators become call_function nodes of
`flambeau._numpy._wrappers` (NumPy's semantics over flambeau ops); an array that leaves the graph is
turned back into a `numpy.ndarray`; `t.numpy()` and `flambeau.from_numpy(a)` move between the two
without leaving the graph. What flambeau._numpy lacks, and `np.random`, break the graph with the reason.
Under `with flambeau.device(d)` the arrays read from the frame are copies on d (builder._numpy_array).
"""
from __future__ import annotations

import operator

import numpy as np

from .. import config
from ..exc import Unsupported
from .base import VariableTracker, ValueVariable, ConstantVariable, const
from ...fx._symbolic_shapes import SymInt
from ..._tensor import Tensor, Size
from ..._numpy import _wrappers as np_wrappers
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)

_CONST_ATTRS = {"dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_meta", "is_sparse",
                "is_quantized", "layout", "is_mkldnn", "is_nested", "itemsize", "is_complex_dtype"}
_GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
_BREAK_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
                  "backward", "register_hook", "data_ptr", "untyped_storage", "storage", "__array__",
                  "__iter__", "__format__", "__repr__", "__str__", "__reduce_ex__", "share_memory_",
                  "retain_grad", "register_post_accumulate_grad_hook", "requires_grad_", "set_",
                  "__setstate__", "pin_memory", "record_stream"}


class TensorVariable(VariableTracker):
    def __init__(self, node, example, source=None, cls=None):
        self.node = node
        self.example = example
        self.source = source
        self.cls = cls                    # the real class of a tensor read from the frame (e.g. Parameter)
        node.meta["example_value"] = example

    def python_type(self):
        return self.cls or Tensor

    def __repr__(self):
        return f"TensorVariable({self.node.name})"

    # ---- attributes -----------------------------------------------------------------------------
    def size_vt(self, tx, dim=None):
        ex = self.example
        sizes = ex.shape
        if dim is not None:
            d = dim if dim >= 0 else dim + len(sizes)
            if not 0 <= d < len(sizes):
                raise Unsupported(f"IndexError: dimension {dim} out of range")
            return self._size_item(tx, d, sizes[d])
        return kinds.containers.TupleVariable([self._size_item(tx, d, s) for d, s in enumerate(sizes)], cls=Size)

    def _size_item(self, tx, d, s):
        if isinstance(s, int):
            return const(s)
        node = tx.output.graph.call_method("size", (self.node, d))
        return SymNodeVariable(node, s)

    def var_getattr(self, tx, name):
        ex = self.example
        if name == "shape":
            return self.size_vt(tx)
        if name in _CONST_ATTRS:
            return const(getattr(ex, name))
        if name == "is_leaf":
            return const(ex.grad_fn is None)
        if name in _GRAPH_ATTRS:
            return tx.output.call_in_graph(tx, "call_function", getattr, [self, const(name)], {})
        if name == "data":
            return tx.output.call_in_graph(tx, "call_method", "detach", [self], {})
        if callable(getattr(Tensor, name, None)):
            return kinds.builtin.GetAttrVariable(self, name)
        if not hasattr(type(ex), name) and name not in getattr(ex, "__dict__", {}):
            # what eager raises: `hasattr(x, "jax")` (transformers' is_jax_jitting) answers False
            raise kinds.builtin.ObservedAttributeError(f"AttributeError: 'Tensor' object has no attribute {name!r}")
        raise Unsupported(f"Tensor attribute {name!r} (reading .{name} is not captured)")

    def call_method(self, tx, name, args, kwargs):
        ex = self.example
        cargs = None
        if all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values()):
            cargs = [a.as_python_constant() for a in args]
        if name == "size" and cargs is not None and not kwargs:
            return self.size_vt(tx, *cargs)
        if name in ("dim", "ndimension") and not args:
            return const(ex.dim())
        if name in ("numel", "nelement") and not args:
            n = const(1)
            for s in self.size_vt(tx).items:
                n = SymNodeVariable.binop(tx, operator.mul, n, s)
            return n
        if name == "__len__" and not args:
            if ex.dim() == 0:
                raise Unsupported("TypeError: len() of a 0-d tensor")
            return self.size_vt(tx, 0)
        if name in ("stride", "is_contiguous", "element_size", "is_floating_point", "is_complex", "get_device",
                    "storage_offset", "is_signed") and cargs is not None:
            kw = {k: v.as_python_constant() for k, v in kwargs.items()}
            v = getattr(ex, name)(*cargs, **kw)
            return _wrap_meta_result(tx, v)
        if name == "type" and not args and not kwargs:
            return const(ex.type())
        if name == "__getattribute__":
            return self.var_getattr(tx, args[0].as_python_constant())
        if name == "numpy" and config.trace_numpy and not args:
            return NumpyNdarrayVariable(tx.output.call_in_graph(tx, "call_method", "detach", [self], {}))
        if name in _BREAK_METHODS:
            raise Unsupported(f"Tensor.{name}() needs the tensor's data in Python")
        if name == "__contains__":
            raise Unsupported("`in` on a tensor is data-dependent")
        if name == "__setitem__" and len(args) == 2 and not kwargs:
            tx.store_subscr(self, args[0], args[1])     # as `x[k] = v` (a call_method node was dead code)
            return const(None)
        return tx.output.call_in_graph(tx, "call_method", name, [self] + list(args), kwargs)

    def has_unpack_var_sequence(self, tx):
        return self.example.dim() > 0 and isinstance(self.example.shape[0], int)

    def unpack_var_sequence(self, tx):
        if not self.has_unpack_var_sequence(tx):
            raise Unsupported("iterating over a 0-d tensor or one with a symbolic first size")
        return [tx.output.call_in_graph(tx, "call_function", operator.getitem, [self, const(i)], {})
                for i in range(self.example.shape[0])]

    def truthy(self, tx):
        raise Unsupported("data-dependent branch: the condition is a tensor (bool(tensor) needs its value)")

    def reconstruct(self, cg):
        return cg.tensor(self)


def _wrap_meta_result(tx, v):
    if isinstance(v, SymInt):
        raise Unsupported("symbolic stride/offset used in Python")
    if isinstance(v, (tuple, list)):
        if any(isinstance(x, SymInt) for x in v):
            raise Unsupported("symbolic strides used in Python")
        return kinds.containers.TupleVariable([const(x) for x in v])
    return const(v)


class SymNodeVariable(VariableTracker):
    """A symbolic int (a size that varies between calls) and the node computing it."""

    def __init__(self, node, sym):
        self.node = node
        self.sym = sym
        node.meta["example_value"] = sym

    def python_type(self):
        return int

    def __repr__(self):
        return f"SymNodeVariable({self.sym})"

    def truthy(self, tx):
        return bool(self.sym)

    def as_int(self) -> int:
        return int(self.sym)

    @staticmethod
    def binop(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        """fn(a, b) where a, b are ints or SymNodes: folded when concrete, else a graph node."""
        av = a.sym if isinstance(a, SymNodeVariable) else a.as_python_constant()
        bv = b.sym if isinstance(b, SymNodeVariable) else b.as_python_constant()
        if fn in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
            return const(bool(fn(av, bv)))      # decided on the hints; the shape env records the guard
        if fn is operator.truediv:
            raise Unsupported("true division of a symbolic size")
        r = fn(av, bv)
        if not isinstance(r, SymInt):
            return const(r)
        an = a.node if isinstance(a, SymNodeVariable) else av
        bn = b.node if isinstance(b, SymNodeVariable) else bv
        return SymNodeVariable(tx.output.graph.call_function(fn, (an, bn)), r)

    def call_method(self, tx, name, args, kwargs):
        if name in ("__int__", "__index__"):
            return const(self.as_int())
        raise Unsupported(f"method {name} of a symbolic size")

    def reconstruct(self, cg):
        return cg.tensor(self)


def is_sizelike(vt) -> bool:
    return isinstance(vt, SymNodeVariable) or (isinstance(vt, ConstantVariable) and type(vt.value) is int)


# ---- NumPy ----------------------------------------------------------------------------------------------
_NDARRAY_CONST_ATTRS = {"ndim", "dtype", "itemsize", "strides"}
_NDARRAY_GRAPH_ATTRS = {"T", "real", "imag"}
_NDARRAY_BREAK_METHODS = {"item", "tolist", "tobytes", "tofile", "__array__", "__bool__", "__int__", "__float__",
                          "__index__", "__repr__", "__str__", "__format__", "view", "resize", "setflags"}


class NumpyNdarrayVariable(VariableTracker):
    """A numpy.ndarray while tracing: `tensor` is the TensorVariable holding its values (see module
    docstring); `source` is set for an array read from the frame."""

    def __init__(self, tensor: TensorVariable, source=None):
        self.tensor = tensor
        self.source = source

    def python_type(self):
        return np.ndarray

    def __repr__(self):
        return f"NumpyNdarrayVariable({self.tensor.node.name})"

    def var_getattr(self, tx, name):
        ex = self.tensor.example
        if name == "shape":
            return kinds.containers.TupleVariable(self.tensor.size_vt(tx).items)
        if name == "size":
            return self.tensor.call_method(tx, "numel", [], {})
        if name in _NDARRAY_CONST_ATTRS or name == "nbytes":
            if any(not isinstance(s, int) for s in ex.shape):
                raise Unsupported(f"ndarray.{name} of an array with symbolic sizes")
            return kinds.builder.wrap_constant_like(getattr(np_wrappers.ndarray(ex), name))
        if name in _NDARRAY_GRAPH_ATTRS:
            return numpy_call(tx, np_wrappers.numpy_attr, [self, const(name)], {})
        if np_wrappers.method(name) is not None or name in _NDARRAY_BREAK_METHODS:
            return kinds.builtin.GetAttrVariable(self, name)
        raise Unsupported(f"ndarray.{name} is not supported by flambeau._numpy")

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and not args:
            return self.tensor.call_method(tx, "__len__", [], {})
        if name == "__getattribute__":
            return self.var_getattr(tx, args[0].as_python_constant())
        if name in _NDARRAY_BREAK_METHODS:
            raise Unsupported(f"ndarray.{name}() needs the array's data in Python")
        wrapper = np_wrappers.method(name)
        if wrapper is None:
            raise Unsupported(f"ndarray.{name}() is not supported by flambeau._numpy")
        return numpy_call(tx, wrapper, [self] + list(args), kwargs)

    def has_unpack_var_sequence(self, tx):
        return self.tensor.has_unpack_var_sequence(tx)

    def unpack_var_sequence(self, tx):
        if not self.has_unpack_var_sequence(tx):
            raise Unsupported("iterating over a 0-d array or one with a symbolic first size")
        return [numpy_call(tx, np_wrappers.numpy_getitem, [self, const(i)], {})
                for i in range(self.tensor.example.shape[0])]

    def truthy(self, tx):
        raise Unsupported("data-dependent branch: the condition is a NumPy array (bool() needs its value)")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return f"{cg.const(np_wrappers.to_numpy)}({cg.tensor(self.tensor)})"


class NumpyVariable(VariableTracker):
    """A NumPy function (`np.sum`, a ufunc, `np.linalg.norm`) named `module.name`: a call becomes a node
    of its flambeau._numpy counterpart."""

    def __init__(self, value, module: str, name: str, source=None):
        self.value = value
        self.module = module
        self.name = name
        self.source = source

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def __repr__(self):
        return f"NumpyVariable({self.module}.{self.name})"

    def call_function(self, tx, args, kwargs):
        if self.module.startswith("numpy.random"):
            raise Unsupported(f"np.random.{self.name}(): NumPy's random number generators are not traced "
                              "(the call runs in NumPy, keeping NumPy's random stream)")
        target = np_wrappers.graph_function(self.module, self.name)
        if target is None:
            raise Unsupported(f"{self.module}.{self.name}() is not supported by flambeau._numpy")
        return numpy_call(tx, target, args, kwargs)

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.const(self.value)


def numpy_function_name(v):
    """(module, name) of a NumPy function or ufunc (None for anything else, NumPy's classes included)."""
    if not config.trace_numpy or isinstance(v, type) or not callable(v):
        return None
    if isinstance(v, np.ufunc):
        return "numpy", v.__name__
    owner = getattr(v, "__self__", None)
    mod = getattr(v, "__module__", None) or getattr(type(owner), "__module__", None) or ""
    if mod.split(".")[0] != "numpy" or not hasattr(v, "__name__"):
        return None
    parts = mod.split(".")
    if len(parts) > 1 and not parts[1].startswith("_"):        # numpy.linalg, numpy.fft, numpy.random
        return ".".join(parts[:2]), v.__name__
    return "numpy", v.__name__


def as_tensor_vt(vt):
    """NumPy array trackers (also inside tuples/lists) as the TensorVariables holding their values."""
    if isinstance(vt, NumpyNdarrayVariable):
        return vt.tensor
    if isinstance(vt, (kinds.containers.TupleVariable, kinds.containers.ListVariable)):
        items = [as_tensor_vt(x) for x in vt.items]
        if all(a is b for a, b in zip(items, vt.items)):
            return vt
        return vt.new(items) if isinstance(vt, kinds.containers.TupleVariable) else \
            kinds.containers.ListVariable(items)
    return vt


def as_ndarray_vt(vt):
    """TensorVariables (also inside tuples/lists) as NumPy array trackers."""
    if isinstance(vt, TensorVariable):
        return NumpyNdarrayVariable(vt)
    if isinstance(vt, kinds.containers.TupleVariable):
        return vt.new([as_ndarray_vt(x) for x in vt.items])
    if isinstance(vt, kinds.containers.ListVariable):
        return kinds.containers.ListVariable([as_ndarray_vt(x) for x in vt.items])
    return vt


def numpy_call(tx, target, args: list, kwargs: dict) -> VariableTracker:
    """Record `target` (a flambeau._numpy wrapper) on the arrays' tensors; tensors it returns are arrays."""
    out = tx.output.call_in_graph(tx, "call_function", target, [as_tensor_vt(a) for a in args],
                                  {k: as_tensor_vt(v) for k, v in kwargs.items()})
    return as_ndarray_vt(out)


_methods_by_id: dict | None = None


def tensor_method_name(fn) -> str | None:
    """The name under which `fn` is a method of flambeau's Tensor class (`Tensor.add`), else None."""
    global _methods_by_id
    if _methods_by_id is None:
        _methods_by_id = {id(v): (k, v) for k, v in vars(Tensor).items() if callable(v) and not isinstance(v, type)}
    hit = _methods_by_id.get(id(fn))
    return hit[0] if hit is not None and hit[1] is fn else None


class TensorMethodVariable(ValueVariable):
    """A method read from the Tensor class (`flambeau.Tensor.add`): called with a tensor first, it is
    that tensor's method call (`Tensor.add(a, b)` is `a.add(b)`), as PyTorch's `torch.Tensor.add`."""

    def __repr__(self):
        return f"TensorMethodVariable({self.name})"

    @property
    def name(self) -> str:
        return tensor_method_name(self.value)

    def call_function(self, tx, args, kwargs):
        if not args or not isinstance(args[0], TensorVariable):
            raise Unsupported(f"Tensor.{self.name} called without a tensor first")
        return args[0].call_method(tx, self.name, list(args[1:]), kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value)
