"""`flambeau.utils.hooks`: removable handles for hook dictionaries (nn.Module, Tensor hooks)."""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict


class RemovableHandle:
    """A handle that removes its hook from one or more dicts when `remove()` is called."""
    next_id = 0
    _ids = itertools.count()

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = next(RemovableHandle._ids)
        RemovableHandle.next_id = self.id + 1
        if extra_dict is None:
            extra = ()
        elif isinstance(extra_dict, (list, tuple)):
            extra = extra_dict
        else:
            extra = (extra_dict,)
        self.extra_dict_ref = tuple(weakref.ref(d) for d in extra)

    def remove(self) -> None:
        d = self.hooks_dict_ref()
        if d is not None and self.id in d:
            del d[self.id]
        for ref in self.extra_dict_ref:
            e = ref()
            if e is not None and self.id in e:
                del e[self.id]

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def unserializable_hook(f):
    f.__torch_unserializable__ = True
    return f


def warn_if_has_hooks(tensor) -> None:
    pass


__all__ = ["RemovableHandle", "unserializable_hook", "warn_if_has_hooks", "OrderedDict"]
