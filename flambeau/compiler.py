"""`flambeau.compile` and the backend registry (`flambeau.compiler`).

    compiled = flambeau.compile(fn_or_module, fullgraph=False, dynamic=None, backend="inductor")
    @flambeau.compile                      # or @flambeau.compile(backend="aot_eager", dynamic=True)
    def f(x): ...

A call of a compiled function goes to the front end (`_frontend()`: TorchDynamo-style bytecode
capture in `flambeau._dynamo`): it looks its guards up, or captures FX graphs from the function's
bytecode (breaking the graph where it must) and gives each to the backend. A backend is any callable `backend(gm, example_inputs) -> callable`
(PyTorch's contract: the callable takes the flat graph inputs and returns the graph's outputs), or
the name of a registered one:

    "eager"      run the captured graph as it is (debug)
    "aot_eager"  AOT autograd (functionalize, joint trace, partition) with the graphs run as
                 GraphModules (debug)
    "inductor"   AOT autograd with the core-op decompositions (plus inductor's own, e.g. attention as
                 batched products and a softmax) and the min-cut partitioner, each graph compiled
                 by `flambeau._inductor.compile_fx` (C++/OpenMP kernels)

A compiled `nn.Module` is an `OptimizedModule`: it holds the original as `_orig_mod` (sharing its
parameters), reads and writes attributes through to it, has the original's `state_dict`, and its
`train()`/`eval()` switch the original (the training flags are guarded, so a switch recompiles).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

from . import _dynamo
from ._dynamo import config
from .nn.modules.module import Module

__all__ = ["compile", "list_backends", "register_backend", "lookup_backend", "reset", "OptimizedModule",
           "InvalidBackend", "Unsupported", "is_compiling", "disable", "config"]

Unsupported = _dynamo.exc.Unsupported
_BACKENDS: dict = {}          # name -> (fn(gm, example_inputs, options) -> callable, tags)
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class InvalidBackend(RuntimeError):
    def __init__(self, name):
        super().__init__(f"Invalid backend: {name!r}, see `flambeau.compiler.list_backends()` for available "
                         "backends.")


def _frontend() -> Callable:
    """The capture front end: `optimize(fn, backend, fullgraph=, dynamic=, module=)`."""
    return _dynamo.eval_frame.optimize_for_compiler


# ---- backends ---------------------------------------------------------------------------------------
def register_backend(compiler_fn: Callable | None = None, name: str | None = None, tags=()):
    """Register `compiler_fn(gm, example_inputs)` under `name` (usable as a decorator)."""
    if compiler_fn is None:
        return functools.partial(register_backend, name=name, tags=tags)
    _BACKENDS[name or compiler_fn.__name__] = (lambda gm, ex, options=None: compiler_fn(gm, ex), tuple(tags))
    return compiler_fn


def list_backends(exclude_tags=("debug", "experimental")) -> list:
    """Names of the registered backends, without those tagged with any of `exclude_tags`."""
    ex = set(exclude_tags or ())
    return sorted(n for n, (_, tags) in _BACKENDS.items() if not ex.intersection(tags))


def lookup_backend(backend, options: dict | None = None) -> Callable:
    """A `(gm, example_inputs) -> callable` for a backend name or callable."""
    if callable(backend):
        return backend
    entry = _BACKENDS.get(backend)
    if entry is None:
        raise InvalidBackend(backend)
    fn = entry[0]

    def compiler_fn(gm, example_inputs):
        return fn(gm, example_inputs, options)
    compiler_fn.compiler_name = backend        # how the minifier's repro scripts name it
    return compiler_fn


def _eager(gm, example_inputs, options=None):
    return gm.forward


def _nop(gm, example_inputs):
    return gm.forward


def _aot_eager(gm, example_inputs, options=None):
    from ._functorch.aot_autograd import aot_module_simplified
    return aot_module_simplified(gm, example_inputs, fw_compiler=_nop, bw_compiler=_nop)


@contextlib.contextmanager
def _inductor_options(options: dict | None):
    from ._inductor import config as iconfig
    saved = {}
    try:
        for k, v in (options or {}).items():
            key = k.replace(".", "_")
            if not hasattr(iconfig, key):
                raise RuntimeError(f"Unexpected optimization option {k}, known options are "
                                   f"{sorted(n for n in vars(iconfig) if not n.startswith('_'))}")
            saved[key] = getattr(iconfig, key)
            setattr(iconfig, key, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(iconfig, k, v)


def _inductor(gm, example_inputs, options=None):
    from ._inductor import compile_fx
    from ._inductor.decompositions import decomposition_table
    from ._decomp import core_aten_decompositions
    from ._functorch.aot_autograd import aot_module_simplified
    from ._functorch.partitioners import min_cut_rematerialization_partition

    from ._dynamo.repro.after_aot import wrap_compiler_debug

    def compile_graph(g, ex):
        with _inductor_options(options):
            return compile_fx(g, ex)
    compile_graph = wrap_compiler_debug(compile_graph, "inductor")      # FLAMBEAU_REPRO_AFTER=aot
    return aot_module_simplified(gm, example_inputs, fw_compiler=compile_graph, bw_compiler=compile_graph,
                                 partition_fn=min_cut_rematerialization_partition,
                                 decompositions=decomposition_table(core_aten_decompositions()))


_BACKENDS["eager"] = (_eager, ("debug",))
_BACKENDS["aot_eager"] = (_aot_eager, ("debug",))
_BACKENDS["inductor"] = (_inductor, ())


# ---- compile ------------------------------------------------------------------------------------------
class OptimizedModule(Module):
    """A compiled nn.Module (see module docstring)."""

    def __init__(self, mod: Module, compiled: Callable):
        super().__init__()
        self._modules["_orig_mod"] = mod
        self.__dict__["_compiled"] = compiled
        self.training = mod.training

    def forward(self, *args, **kwargs):
        return self.__dict__["_compiled"](*args, **kwargs)

    def __getattr__(self, name: str):
        mods = self.__dict__.get("_modules")
        if mods is not None and name == "_orig_mod":
            return mods["_orig_mod"]
        if mods is None or "_orig_mod" not in mods:
            return super().__getattr__(name)
        return getattr(mods["_orig_mod"], name)

    def __setattr__(self, name: str, value) -> None:
        mods = self.__dict__.get("_modules")
        if mods is None or "_orig_mod" not in mods or name in self.__dict__ or name == "training":
            super().__setattr__(name, value)
            if name == "training" and mods is not None and "_orig_mod" in mods:
                mods["_orig_mod"].training = value
        else:
            setattr(mods["_orig_mod"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend="inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False):
    """Compile a function or nn.Module (see module docstring); usable as a decorator with or
    without arguments."""
    if model is None:
        def deco(m):
            return compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                           disable=disable)
        return deco
    if not callable(model):
        raise RuntimeError(f"flambeau.compile: expected a function or nn.Module, got {type(model).__name__}")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if mode is not None and mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_MODES)}")
    if disable:
        return model
    be = lookup_backend(backend, options)
    if isinstance(model, Module):
        return OptimizedModule(model, _frontend()(model, be, fullgraph=fullgraph, dynamic=dynamic, module=model))
    cc = _frontend()(model, be, fullgraph=fullgraph, dynamic=dynamic)

    @functools.wraps(model)
    def compiled(*args, **kwargs):
        return cc(*args, **kwargs)
    compiled._torchdynamo_orig_callable = model
    compiled._compiled = cc
    return compiled


disable = _dynamo.disable
is_compiling = _dynamo.is_compiling


def reset() -> None:
    """Forget every compiled graph (the next call of each compiled function recompiles)."""
    _dynamo.reset()
