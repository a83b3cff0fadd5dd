"""Padding modules: constant/zero, reflection, replication and circular padding in 1-3 dims."""
from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
           "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
           "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d"]


def _pad_tuple(padding, n):
    if isinstance(padding, int):
        return (padding,) * (2 * n)
    padding = tuple(padding)
    if len(padding) != 2 * n:
        raise ValueError(f"padding must be an int or a {2 * n}-tuple, got {padding}")
    return padding


class _PadNd(Module):
    _n = 1
    _mode = "reflect"

    def __init__(self, padding):
        super().__init__()
        self.padding = _pad_tuple(padding, self._n)

    def forward(self, input):
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(Module):
    _n = 1

    def __init__(self, padding, value: float):
        super().__init__()
        self.padding = _pad_tuple(padding, self._n)
        self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


def _make(name, base, n, mode=None):
    attrs = {"_n": n, "__module__": __name__}
    if mode is not None:
        attrs["_mode"] = mode
    return type(name, (base,), attrs)


ConstantPad1d = _make("ConstantPad1d", _ConstantPadNd, 1)
ConstantPad2d = _make("ConstantPad2d", _ConstantPadNd, 2)
ConstantPad3d = _make("ConstantPad3d", _ConstantPadNd, 3)
ReflectionPad1d = _make("ReflectionPad1d", _PadNd, 1, "reflect")
ReflectionPad2d = _make("ReflectionPad2d", _PadNd, 2, "reflect")
ReflectionPad3d = _make("ReflectionPad3d", _PadNd, 3, "reflect")
ReplicationPad1d = _make("ReplicationPad1d", _PadNd, 1, "replicate")
ReplicationPad2d = _make("ReplicationPad2d", _PadNd, 2, "replicate")
ReplicationPad3d = _make("ReplicationPad3d", _PadNd, 3, "replicate")
CircularPad1d = _make("CircularPad1d", _PadNd, 1, "circular")
CircularPad2d = _make("CircularPad2d", _PadNd, 2, "circular")
CircularPad3d = _make("CircularPad3d", _PadNd, 3, "circular")


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


ZeroPad1d = _make("ZeroPad1d", _ZeroPadNd, 1)
ZeroPad2d = _make("ZeroPad2d", _ZeroPadNd, 2)
ZeroPad3d = _make("ZeroPad3d", _ZeroPadNd, 3)
