"""Run PyTorch code on flambeau: make `import torch` (and every `torch.*` submodule) resolve to
`flambeau` (and `flambeau.*`). `flambeau.compat.enable()` in a notebook; `python -m flambeau.run`
for a script.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import flambeau


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `torch.x.y` by importing `flambeau.x.y` and handing back that same module object."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" and not fullname.startswith("torch."):
            return None
        target_name = "flambeau" + fullname[len("torch"):]
        try:
            importlib.util.find_spec(target_name)
        except (ImportError, ValueError):
            return None
        if importlib.util.find_spec(target_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module("flambeau" + spec.name[len("torch"):])

    def exec_module(self, module):
        pass


_finder = _Alias()


def enable() -> None:
    """Alias `torch` to `flambeau` in this process (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    sys.modules["torch"] = flambeau
    for name, mod in list(sys.modules.items()):
        if name.startswith("flambeau.") and mod is not None:
            sys.modules.setdefault("torch." + name[len("flambeau."):], mod)


def disable() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        if getattr(sys.modules[name], "__name__", "").startswith("flambeau"):
            del sys.modules[name]
