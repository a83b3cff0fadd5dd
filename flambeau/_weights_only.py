"""What a `weights_only=True` load may rebuild besides tensors and containers: the user's allowlist.

`add_safe_globals([cls, fn, (cls, "module.Name")])` (for the process) and the `safe_globals([...])`
context manager (for a block) extend it, as in PyTorch; `get_safe_globals` / `clear_safe_globals`
read and reset it. Two readers consult it:

- `_pt_format`'s unpickler for PyTorch `.pt` files (`allowed(module, name)`, `buildable(obj)`);
- `unpickle_objects`, for the Python objects a flambeau checkpoint holds next to its tensors
  (`flambeau.save(model, f)` pickles the module; loading it under weights_only needs the module's
  classes allowlisted, exactly as with PyTorch).

`unpickle_objects` resolves a global only when it is in `_BASE` (containers, NumPy's array
rebuild, flambeau's tensor and parameter rebuilds) or in the allowlist, so it can only instantiate
those classes and call those functions.
"""
from __future__ import annotations

import io
import pickle

_REFUSED = ("Weights only load failed. This file can still be loaded, to do so you have two options, do "
            "those steps only if you trust the source of the checkpoint.\n"
            "\t(1) Re-running `flambeau.load` with `weights_only` set to `False` will likely succeed, but it "
            "can result in arbitrary code execution. Do it only if you got the file from a trusted source.\n"
            "\t(2) Alternatively, to load with `weights_only=True` please check the recommended steps in the "
            "following error message.\n"
            "\tWeightsUnpickler error: Unsupported global: GLOBAL {name} was not an allowed global by default. "
            "Please use `torch.serialization.add_safe_globals([{name}])` or the "
            "`torch.serialization.safe_globals([{name}])` context manager to allowlist this global if you "
            "trust this class/function.")

# Globals a flambeau checkpoint's pickled objects use for tensors and containers (protocol 2 names).
_BASE = {
    ("collections", "OrderedDict"), ("builtins", "set"), ("__builtin__", "set"), ("builtins", "frozenset"),
    ("__builtin__", "frozenset"), ("_codecs", "encode"), ("copyreg", "_reconstructor"),
    ("builtins", "object"), ("__builtin__", "object"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("flambeau.serialization", "_rebuild_tensor_from_numpy"), ("flambeau.nn.parameter", "_rebuild_parameter"),
    ("flambeau._device", "device"),
}

_user: list = []          # what add_safe_globals / safe_globals added, in order


def _entry_name(entry) -> str:
    if isinstance(entry, tuple):
        if len(entry) != 2 or not isinstance(entry[1], str):
            raise TypeError("add_safe_globals: a tuple entry is (object, 'module.Name'); got " + repr(entry))
        return entry[1]
    return f"{entry.__module__}.{entry.__qualname__}"


def _entry_object(entry):
    return entry[0] if isinstance(entry, tuple) else entry


def add_safe_globals(safe_globals: list) -> None:
    """Allow these classes/functions (or `(obj, "module.Name")` pairs) in weights_only loads."""
    if not isinstance(safe_globals, list):
        raise TypeError(f"add_safe_globals expects a list, got {type(safe_globals).__name__}")
    for entry in safe_globals:
        _entry_name(entry)
    _user[:0] = [e for e in safe_globals if e not in _user]


def get_safe_globals() -> list:
    """The user allowlist, most recently added first."""
    return list(_user)


def clear_safe_globals() -> None:
    _user.clear()


class safe_globals:
    """Context manager: `with safe_globals([MyModel]): flambeau.load(f)` allows them for the block only."""

    def __init__(self, safe_globals: list) -> None:
        self.safe_globals = safe_globals
        self.saved: list = []

    def __enter__(self) -> None:
        self.saved = list(_user)
        add_safe_globals(self.safe_globals)

    def __exit__(self, *exc) -> None:
        _user[:] = self.saved


def allowed(module: str, name: str):
    """The allowlisted object spelled `module.name`, or None. A PyTorch name (`torch.nn.modules.linear.Linear`,
    in a file torch.save wrote) also finds flambeau's object of the same path, as allowlisted by a program
    that names it `torch....` under `flambeau.run`."""
    names = {f"{module}.{name}"}
    if module == "torch" or module.startswith("torch."):
        names.add(f"flambeau{module[len('torch'):]}.{name}")
    for entry in _user:
        if _entry_name(entry) in names:
            return _entry_object(entry)
    return None


def is_safe_object(obj) -> bool:
    """Whether `obj` itself (a class, a function) is on the allowlist."""
    return any(obj is _entry_object(e) for e in _user)


def buildable(obj) -> bool:
    """Whether weights_only may set the state of `obj` (an instance of an allowlisted class)."""
    return is_safe_object(type(obj))


def refused(module: str, name: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(_REFUSED.format(name=f"{module}.{name}"))


class _ObjectsUnpickler(pickle.Unpickler):
    """Resolves only `_BASE` and the allowlist; anything else is refused with PyTorch's advice."""

    def find_class(self, module: str, name: str):
        if (module, name) in _BASE:
            return super().find_class(module, name)
        obj = allowed(module, name)
        if obj is None:
            raise refused(module, name)
        return obj


def unpickle_objects(blob: bytes):
    """The pickled objects of a flambeau checkpoint, rebuilt under the weights_only rules."""
    return _ObjectsUnpickler(io.BytesIO(blob)).load()


__all__ = ["add_safe_globals", "get_safe_globals", "clear_safe_globals", "safe_globals"]
