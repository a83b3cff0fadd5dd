"""The backend registry: backend names -> `backend(gm, example_inputs, options) -> callable`.

A built-in backend is registered by its own module under `flambeau._dynamo.backends`, which the
registry imports on the first lookup or listing (`_BUILTIN`): PyTorch's lazy registry, so that
`import flambeau` does not load the compiler stages behind them.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

# name -> (fn(gm, example_inputs, options) -> callable, tags)
_BACKENDS: dict[str, tuple[Callable, tuple]] = {}
# built-in backend name -> the module of flambeau._dynamo.backends that registers it
_BUILTIN = {"eager": "debugging", "aot_eager": "debugging", "inductor": "inductor"}


class InvalidBackend(RuntimeError):
    def __init__(self, name):
        super().__init__(f"Invalid backend: {name!r}, see `flambeau.compiler.list_backends()` for available "
                         "backends.")


def register_backend(compiler_fn: Callable | None = None, name: str | None = None, tags=()):
    """Register `compiler_fn(gm, example_inputs)` under `name` (usable as a decorator)."""
    if compiler_fn is None:
        return functools.partial(register_backend, name=name, tags=tags)
    _BACKENDS[name or compiler_fn.__name__] = (lambda gm, ex, options=None: compiler_fn(gm, ex), tuple(tags))
    return compiler_fn


def register_builtin(name: str, fn: Callable, tags=()) -> None:
    """Register a built-in backend that takes the `options` of `flambeau.compile` as a third argument."""
    _BACKENDS[name] = (fn, tuple(tags))


def _load_builtin(name: str) -> None:
    if name not in _BACKENDS and name in _BUILTIN:
        importlib.import_module(f"{__package__}.{_BUILTIN[name]}")


def list_backends(exclude_tags=("debug", "experimental")) -> list:
    """Names of the registered backends, without those tagged with any of `exclude_tags`."""
    for name in _BUILTIN:
        _load_builtin(name)
    ex = set(exclude_tags or ())
    return sorted(n for n, (_, tags) in _BACKENDS.items() if not ex.intersection(tags))


def lookup_backend(backend, options: dict | None = None) -> Callable:
    """A `(gm, example_inputs) -> callable` for a backend name or callable."""
    if callable(backend):
        return backend
    _load_builtin(backend)
    entry = _BACKENDS.get(backend)
    if entry is None:
        raise InvalidBackend(backend)
    fn = entry[0]

    def compiler_fn(gm, example_inputs):
        return fn(gm, example_inputs, options)
    compiler_fn.compiler_name = backend        # how the minifier's repro scripts and backend errors name it
    return compiler_fn
