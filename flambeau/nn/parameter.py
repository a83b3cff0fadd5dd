"""`nn.Parameter`, `nn.Buffer` and the uninitialized (lazy) parameter: Tensor subclasses that mark
tensors for registration when assigned as attributes of a `Module`.

A Parameter shares its data with the tensor it wraps (like PyTorch's `_make_subclass`): it is a
detached alias whose `requires_grad` defaults to True. Operators return plain Tensors."""
from __future__ import annotations

from .._tensor import Tensor, _no_grad
from .._ops.creation import empty


def _empty_default():
    return empty(0)


class Parameter(Tensor):
    """A Tensor that a Module registers as a parameter when assigned as an attribute."""

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        if data is None:
            data = _empty_default()
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter.__new__ expected a Tensor, got {type(data).__name__}")
        if hasattr(type(data), "_wrapper_parameter"):     # a DTensor stays one (PyTorch's custom-tensor rule)
            return type(data)._wrapper_parameter(data, requires_grad)
        p = cls._from(data.detach())
        p._requires_grad = False
        p.requires_grad = requires_grad
        return p

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with _no_grad():
            data = self.detach().clone()
        new = type(self)(data, self.requires_grad)
        if self.grad is not None:
            new._grad = self._grad.__deepcopy__(memo)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):
        return (_rebuild_parameter, (self.detach(), self.requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad)


class Buffer(Tensor):
    """A Tensor that a Module registers as a buffer (persistent unless told otherwise)."""

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True):
        if data is None:
            data = _empty_default()
        b = cls._from(data.detach())
        b._requires_grad = data.requires_grad
        b.persistent = persistent
        return b


class UninitializedParameter(Parameter):
    """A parameter whose shape is not known yet (used by lazy modules); `materialize` gives it one."""

    cls_to_become = Parameter

    def __new__(cls, requires_grad: bool = True, device=None, dtype=None):
        p = Parameter.__new__(cls, empty(0, device=device, dtype=dtype), requires_grad)
        return p

    def materialize(self, shape, device=None, dtype=None) -> None:
        t = empty(shape, device=device or self.device, dtype=dtype or self.dtype)
        self.data = t
        self.__class__ = self.cls_to_become

    def __repr__(self):
        return "<UninitializedParameter>"


def is_lazy(param) -> bool:
    return isinstance(param, UninitializedParameter)
