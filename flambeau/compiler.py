"""`flambeau.compile` (`flambeau.compiler`): the user's entry to the compiler stack, the top layer.

    compiled = flambeau.compile(fn_or_module, fullgraph=False, dynamic=None, backend="inductor")
    @flambeau.compile                      # or @flambeau.compile(backend="aot_eager", dynamic=True)
    def f(x): ...

A call of a compiled function goes to the front end (`_frontend()`: TorchDynamo-style bytecode
capture in `flambeau._dynamo`): it looks its guards up, or captures FX graphs from the function's
bytecode (breaking the graph where it must) and gives each to the backend. A backend is any callable `backend(gm, example_inputs) -> callable`
(PyTorch's contract: the callable takes the flat graph inputs and returns the graph's outputs), or
the name of a registered one (`flambeau._dynamo.backends`; `register_backend`, `list_backends`
and `lookup_backend` are re-exported here as PyTorch's `torch.compiler` does):

    "eager"      run the captured graph as it is (debug)
    "aot_eager"  AOT autograd (functionalize, joint trace, partition) with the graphs run as
                 GraphModules (debug)
    "inductor"   AOT autograd with the core-op decompositions (plus inductor's own, e.g. attention as
                 batched products and a softmax) and the min-cut partitioner, each graph compiled
                 by `flambeau._inductor.compile_fx` (C++/OpenMP kernels)

A compiled `nn.Module` is an `OptimizedModule` (`flambeau._dynamo.eval_frame`): it holds the
original as `_orig_mod` (sharing its parameters), reads and writes attributes through to it, has the
original's `state_dict`, and its `train()`/`eval()` switch the original (the training flags are
guarded, so a switch recompiles).

This layer also gives `flambeau.library.opcheck` its compile test (test_aot_dispatch_dynamic).
"""
from __future__ import annotations

import functools
from typing import Callable

from . import _dynamo, _logging
from ._dynamo import config
from ._dynamo.backends.registry import InvalidBackend, list_backends, lookup_backend, register_backend
from ._dynamo.eval_frame import OptimizedModule
from .nn.modules.module import Module, register_compiler
from .library import opcheck_tests as _opcheck
from ._numpy._wrappers import wrap_numpy  # noqa: F401

__all__ = ["compile", "list_backends", "register_backend", "lookup_backend", "reset", "OptimizedModule",
           "InvalidBackend", "Unsupported", "is_compiling", "disable", "config", "is_exporting",
           "is_dynamo_compiling", "allow_in_graph", "assume_constant_result", "cudagraph_mark_step_begin",
           "wrap_numpy"]

Unsupported = _dynamo.exc.Unsupported
# each mode as the inductor options it sets (PyTorch's torch._inductor.list_mode_options); the
# inductor says, per graph, where one does not apply (a cpu graph gets no CUDA graph, C++ kernels no
# block-size tuning)
MODE_OPTIONS = {"default": {}, "reduce-overhead": {"triton.cudagraphs": True},
                "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
                "max-autotune-no-cudagraphs": {"max_autotune": True}}
_MODES = tuple(MODE_OPTIONS)
_log = _logging.get_logger("flambeau.compiler")


def _frontend() -> Callable:
    """The capture front end: `optimize(fn, backend, fullgraph=, dynamic=, module=)`."""
    return _dynamo.eval_frame.optimize_for_compiler


# ---- compile ------------------------------------------------------------------------------------------
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
    _check_mode_and_options(backend, mode, options)
    if disable:
        return model
    if mode is not None and backend == "inductor":
        options = dict(MODE_OPTIONS[mode])
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


register_compiler(compile)          # what nn.Module.compile calls (nn sits below the compiler)


def _check_mode_and_options(backend, mode: str | None, options: dict | None) -> None:
    """PyTorch's rules: an unknown mode or option raises RuntimeError; a mode given to a backend other
    than the inductor is said in one log line (options for the registered debug backends raise:
    nothing would act on them)."""
    from ._dynamo.backends.inductor import check_inductor_options  # deferred: the inductor loads at first compile
    if mode is not None and mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_MODES)}")
    if backend == "inductor":
        check_inductor_options(options or {})
        return
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    if options:
        raise RuntimeError(f"backend {name!r} takes no options, got {sorted(options)}")
    if mode not in (None, "default"):
        _log.warning("backend %r ignores mode=%r", name, mode)


disable = _dynamo.disable
is_compiling = _dynamo.is_compiling
is_dynamo_compiling = _dynamo.is_compiling
allow_in_graph = _dynamo.allow_in_graph
assume_constant_result = _dynamo.assume_constant_result


def is_exporting() -> bool:
    """False: flambeau's capture runs for compile only (export tracing does not set it yet)."""
    return False


def cudagraph_mark_step_begin() -> None:
    """Marks a new step for CUDA-graph trees. flambeau's recordings need no mark: a replay kills the
    outputs it overwrites whenever it runs (`flambeau._inductor.cudagraphs`)."""


def reset() -> None:
    """Forget every compiled graph (the next call of each compiled function recompiles)."""
    _dynamo.reset()


# ---- opcheck's compile test ----------------------------------------------------------------------------
def _aot_dispatch_dynamic_check(op, args, kwargs, *, rtol=None, atol=None) -> None:
    """`opcheck`'s test_aot_dispatch_dynamic: `op` compiled whole (AOT autograd, dynamic shapes, one
    graph) gives eager's outputs and gradients."""
    def call(*a, **k):
        return op(*a, **k)
    expected = _opcheck.outputs_and_grads(call, args, kwargs)
    compiled = compile(call, backend="aot_eager", dynamic=True, fullgraph=True)
    got = _opcheck.outputs_and_grads(compiled, args, kwargs)
    _opcheck.assert_close(got[0], expected[0], rtol, atol, f"{op.qualname}: compiled outputs")
    _opcheck.assert_close(got[1], expected[1], rtol, atol, f"{op.qualname}: compiled gradients")


_opcheck.register_opcheck_test("test_aot_dispatch_dynamic", _aot_dispatch_dynamic_check)
