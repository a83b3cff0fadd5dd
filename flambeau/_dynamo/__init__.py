"""flambeau._dynamo: graph capture from Python bytecode (PyTorch's TorchDynamo).

`optimize(backend)(fn)` (what `flambeau.compile` uses) returns a wrapper that, per call, checks the
guards of the entries cached for `fn.__code__` and runs the matching compiled entry, or
symbolically evaluates the bytecode of `fn` with the actual arguments to capture an FX graph
(symbolic_convert.py), guards every assumption (guards.py), gives the graph to the backend and
generates the entry (output_graph.py, codegen.py). What cannot be captured breaks the graph and
continues in generated resume functions (resume.py); frames that cannot be handled run eagerly.
Files: bytecode.py (the only CPython-version-specific module), variables/ (the symbolic values),
eval_frame.py (wrappers, the code cache, OptimizedModule), compiled_state.py (what the variable
kinds ask of compiled code), convert_frame.py, explain.py, config.py,
_logging.py, utils.py (`counters`), backends/ (the backend registry and the built-in backends).

Layer 12 of tests/test_layers.py's order: imports the inductor and below (the inductor at the first
compile); only `flambeau.compiler` imports it.
"""
from __future__ import annotations

from . import config, exc, utils  # noqa: F401
from .eval_frame import (optimize, disable, reset, compile_fn, is_compiling,  # noqa: F401
                         optimize_for_compiler)
from .explain import explain, ExplainOutput  # noqa: F401
from ._logging import set_logs  # noqa: F401
from .exc import Unsupported  # noqa: F401


def mark_dynamic(t, index, **kwargs) -> None:
    """Compile `t`'s dimension(s) `index` with a symbolic size from the first compile on."""
    idx = [index] if isinstance(index, int) else list(index)
    cur = set(getattr(t, "_dynamo_dynamic_indices", ()))
    t.__dict__["_dynamo_dynamic_indices"] = cur | set(idx)


maybe_mark_dynamic = mark_dynamic


def mark_static(t, index=None) -> None:
    """Undo mark_dynamic for `index` (all dims when None)."""
    cur = set(getattr(t, "_dynamo_dynamic_indices", ()))
    if index is None:
        cur = set()
    else:
        cur -= {index} if isinstance(index, int) else set(index)
    t.__dict__["_dynamo_dynamic_indices"] = cur


def graph_break() -> None:
    """A call that always breaks the graph (does nothing when run)."""


def run(fn=None):
    """Run `fn` with previously compiled entries only (here: the function itself, eagerly)."""
    return fn


graph_break._flambeau_dynamo_disable = True


def mark_static_address(t, guard: bool = True) -> None:
    """Mark `t` as living at a fixed address across calls (PyTorch's CUDA-graph input hint); the
    mark is recorded on the tensor (`_dynamo_static_input_type`). flambeau has no CUDA graphs, so
    nothing reads it yet."""
    t.__dict__["_dynamo_static_input_type"] = "guarded" if guard else "unguarded"


def allow_in_graph(fn):
    """Let compiled code call `fn`. flambeau's capture traces into it as into any function (the
    graph holds its operations rather than one opaque call); results are the same."""
    fn._flambeau_allow_in_graph = True
    return fn


def assume_constant_result(fn):
    """Declare `fn`'s result constant for tracing. Eager calls run it every time; flambeau's capture
    traces into it (it does not yet fold the result into a constant)."""
    fn._flambeau_assume_constant_result = True
    return fn
