"""Helpers of `nn.Module`: hook handles, the load_state_dict result, typename, repr indentation and
the argument parser of `Module.to`."""
from __future__ import annotations

import itertools
import weakref
from collections import namedtuple

from ..._tensor import Tensor
from ... import _dtype as D
from ..._device import device as Device


# Bumped by every module hook registration and removal, so that compiled code can guard "no hook
# was added or removed since capture" with one comparison instead of four dict checks per module
# (hooks put into the dicts by hand, bypassing register_*_hook, are not seen).
hooks_version = [0]


class RemovableHandle:
    """Handle returned by `register_*_hook`; `remove()` unregisters the hook."""
    _ids = itertools.count()

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = next(RemovableHandle._ids)
        self.extra_dict_refs = tuple(weakref.ref(d) for d in (extra_dict or ()))
        hooks_version[0] += 1

    def remove(self) -> None:
        hooks_version[0] += 1
        d = self.hooks_dict_ref()
        if d is not None:
            d.pop(self.id, None)
        for ref in self.extra_dict_refs:
            e = ref()
            if e is not None:
                e.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.remove()


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _typename(obj) -> str:
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", "") or ""
    if hasattr(obj, "__qualname__"):
        qualname = obj.__qualname__
    elif hasattr(obj, "__name__"):
        qualname = obj.__name__
    else:
        module = obj.__class__.__module__ or ""
        qualname = obj.__class__.__qualname__
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def _addindent(s: str, n: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(" " * n + line for line in lines)


def _parse_to(*args, **kwargs):
    """Parse `Module.to`'s overloads: (device, dtype, non_blocking), (dtype), (tensor), (memory_format=)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    memory_format = kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() received an invalid combination of arguments - got unexpected {list(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, D.dtype):
            dtype = a
        elif isinstance(a, bool):
            non_blocking = a
        elif isinstance(a, (str, int, Device)):
            device = a
        elif a is not None:
            raise TypeError(f"to() received an invalid combination of arguments - got ({_typename(a)})")
    if device is not None:
        device = Device(f"cuda:{device}" if isinstance(device, int) else device)
    return device, dtype, non_blocking, memory_format
