"""Tensors and symbolic sizes while tracing.

`TensorVariable` is an FX node plus a fake example value (metadata only; sizes may be SymInts).
Metadata questions (`shape`, `dtype`, `dim()`, `is_contiguous()`) are answered from the example
value — the tensor guards make those answers valid for every call that reuses the graph — and
every other method becomes a `call_method` node. Reading data into Python (`item`, `tolist`,
`bool(t)`, `numpy`) cannot be captured and breaks the graph. `SymNodeVariable` is a symbolic size
(SymInt) with the node that computes it at run time.
"""
from __future__ import annotations

import operator

from ..exc import Unsupported
from .base import VariableTracker, ConstantVariable, const
from ...fx._symbolic_shapes import SymInt
from ..._tensor import Tensor, Size
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
