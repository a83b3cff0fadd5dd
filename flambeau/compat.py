"""Run PyTorch code on flambeau: make `import torch` (and every `torch.*` submodule) resolve to
`flambeau` (and `flambeau.*`). `flambeau.compat.enable()` in a notebook; `python -m flambeau.run`
for a script.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
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


# A folder holding a `torch` package that enables the alias: on sys.path, the processes multiprocessing starts
# by `spawn` (which re-run the script's imports before its target) alias `torch` too.
ALIAS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_alias")


def enable() -> None:
    """Alias `torch` to `flambeau` in this process and in the processes multiprocessing spawns from it
    (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    if ALIAS_PATH not in sys.path:
        sys.path.insert(0, ALIAS_PATH)
    sys.modules["torch"] = flambeau
    for name, mod in list(sys.modules.items()):
        if name.startswith("flambeau.") and mod is not None:
            sys.modules.setdefault("torch." + name[len("flambeau."):], mod)


def disable() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    while ALIAS_PATH in sys.path:
        sys.path.remove(ALIAS_PATH)
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        if getattr(sys.modules[name], "__name__", "").startswith("flambeau"):
            del sys.modules[name]
