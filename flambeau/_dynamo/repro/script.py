"""Standalone repro scripts: `write_repro` turns a graph and its inputs into a Python file; what
that file runs (`run_repro`, runner.py) compiles the graph with the functions here.

A script holds the inductor settings of the failing run (`flambeau._inductor.config`, paths and
printing aside), the graph as the `forward` of a `Repro(flambeau.nn.Module)` (the GraphModule's own
generated code), one `(shape, stride, dtype, device, requires_grad)` record per input, and a call

    run_repro(Repro(), INPUTS, after="aot", backend="inductor", accuracy=False)

`python repro.py` (command `run`) rebuilds random inputs of those layouts (seed 0) and
- after="aot": traces `Repro` with fake tensors (`make_fx`) and compiles the graph with the
  inductor entry point `flambeau._inductor.compile_fx`, then calls it;
- after="dynamo": traces `Repro` symbolically and gives the graph to the named backend
  (`flambeau.compiler.lookup_backend`), then calls the result;
and where the failing graph had symbolic sizes (a record's sixth entry), it keeps them: after aot
the trace makes those dims symbolic (aot_autograd.trace_with_dynamic_dims), after dynamo the graph
goes to the backend with example values of symbolic sizes and a ShapeEnv, as the capture front end
gives a dynamic graph;
and with accuracy=True compares the output with eager and a float64 run (debug_utils.same),
raising AccuracyError. So the script exits non-zero exactly while the failure reproduces.
`python repro.py minify` runs the minifier on the script's graph and writes a smaller script.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import textwrap
from typing import Callable, Iterator

from ... import _logging
from ..._public import public_namespace
from ...autograd import no_grad
from .. import config
from .debug_utils import accuracy_failure, fp64_reference, input_spec, minifier_dir, placeholder_dynamic_dims
from ...fx.graph_module import GraphModule
from ...fx import symbolic_trace
from ...fx.experimental.proxy_tensor import make_fx
from ..._functorch.aot_autograd import fakes_with_dynamic_dims, trace_with_dynamic_dims  # loaded by flambeau.export
from ..backends.registry import InvalidBackend, lookup_backend
from .debug_utils import clone_inputs

log = _logging.get_logger("flambeau._dynamo.repro")
_STANDARD_GLOBALS = {"flambeau", "operator", "inf", "nan", "NoneType"}
# inductor settings a script does not replay: where files go, what is printed, the machine's compiler
_SETTINGS_NOT_RECORDED = {"debug", "debug_dir", "cache_dir", "output_code", "cxx", "tune_malloc"}
SEED = 0


def _global_source(name: str, obj) -> str:
    """A line binding `name` to `obj` in a script: a flambeau attribute or an importable object."""
    for attr, v in vars(public_namespace()).items():
        if v is obj and not attr.startswith("_"):
            return f"{name} = flambeau.{attr}"
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if mod and qual and "<" not in qual:
        try:
            found = importlib.import_module(mod)
            for part in qual.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
        if found is obj:
            return f"{name} = __import__({mod!r}, fromlist=['_']).{qual}"
    raise RuntimeError(f"flambeau minifier: the graph uses {obj!r} ({name}), which a repro script cannot name")


def inductor_settings() -> list:
    """Lines setting the code generator's knobs (flambeau._inductor.config) as they are now."""
    from ..._inductor import config as iconfig  # deferred: the inductor loads at first compile
    return [f"flambeau._inductor.config.{k} = {v!r}" for k, v in vars(iconfig).items()
            if not k.startswith("_") and type(v) in (bool, int, float, str) and k not in _SETTINGS_NOT_RECORDED]


def repro_source(gm, args: list, *, after: str, backend: str | None, accuracy: bool, command: str = "run",
                 note: str = "") -> str:
    """The text of a repro script for `gm` called with `args` (see module docstring)."""
    if not isinstance(gm, GraphModule):
        raise TypeError(f"flambeau minifier: expected a GraphModule, got {type(gm).__name__}")
    if any(n.op in ("get_attr", "call_module") for n in gm.graph.nodes):
        raise RuntimeError("flambeau minifier: a repro script needs a graph without get_attr/call_module nodes "
                           "(lift the module's tensors into inputs first)")
    note = " ".join(note.split())            # one comment line, whatever the exception message holds
    pc = gm.graph.python_code(root_module="self")
    extra = [_global_source(k, v) for k, v in pc.globals.items() if k not in _STANDARD_GLOBALS]
    dims = placeholder_dynamic_dims(gm)
    specs = [input_spec(a, keep_grad=after == "dynamo", dynamic=d) for a, d in zip(args, dims)]
    nodes = sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output"))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"# flambeau repro ({nodes} nodes), written by the minifier after {after} on {when}.",
            f"# {note}" if note else None,
            "# Run it with python (no argument: `run`, exits non-zero while the failure reproduces;",
            "# `minify`: shrinks the graph and writes repro.py). Its default command: " + command]
    lines = [h for h in head if h] + ["import operator", "from math import inf, nan", "",
                                      "import flambeau", "import flambeau._inductor.config",
                                      "from flambeau._dynamo.repro import run_repro", "",
                                      "NoneType = type(None)"] + extra
    lines += ["", "# the code generator's settings when the graph failed"] + inductor_settings()
    lines += ["", "", "class Repro(flambeau.nn.Module):", textwrap.indent(pc.src.strip("\n"), "    "), "", "",
              "# one input per line: shape, stride, dtype, device, requires_grad[, dims with symbolic sizes] "
              f"(random values, seed {SEED})", "INPUTS = ["]
    lines += [f"    {s!r}," for s in specs]
    lines += ["]", "", "if __name__ == '__main__':",
              f"    run_repro(Repro(), INPUTS, after={after!r}, backend={backend!r}, accuracy={accuracy!r}, "
              f"command={command!r})", ""]
    return "\n".join(lines)


def write_repro(gm, args: list, *, after: str, backend: str | None, accuracy: bool, command: str = "run",
                name: str = "repro.py", note: str = "") -> str:
    """Write the repro script for `gm` into the minifier directory; returns its path."""
    src = repro_source(gm, args, after=after, backend=backend, accuracy=accuracy, command=command, note=note)
    d = minifier_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(src)
    os.replace(tmp, path)
    log.warning("flambeau minifier: wrote %s", path)
    return path


@contextlib.contextmanager
def repro_disabled() -> Iterator[None]:
    """Inside: no minifier hooks (no recursion into the minifier) and backend errors raise."""
    saved = config.repro_after, config.suppress_errors
    config.repro_after, config.suppress_errors = None, False
    try:
        yield
    finally:
        config.repro_after, config.suppress_errors = saved


# ---- running a script ----------------------------------------------------------------------------
def graph_of(mod, args: list, after: str, dims: list | None = None) -> "GraphModule":
    """The GraphModule a script's `Repro` module stands for; `dims`: per input, the dims whose
    sizes stay symbolic (none: a static graph)."""
    if after == "aot":
        if dims and any(dims):
            gm = trace_with_dynamic_dims(mod, list(args), dims)
        else:
            gm = make_fx(mod, tracing_mode="fake")(*args)
    else:
        gm = symbolic_trace(mod)
    if dims and any(dims):
        for ph, d in zip([n for n in gm.graph.nodes if n.op == "placeholder"], dims):
            ph.meta["dynamic_dims"] = tuple(d)
    return gm


def compile_aot(gm, args: list, dims: list) -> Callable:
    """`gm` (core operators) retraced with fake tensors (symbolic sizes at `dims`) and compiled by
    the inductor entry point."""
    from ..._inductor.compile_fx import compile_fx  # deferred: the inductor loads at first compile
    with no_grad():
        return compile_fx(graph_of(gm, args, "aot", dims), list(args))


def _compile_dynamic(gm, args: list, dims: list, backend: str | None) -> Callable:
    """`gm` given to the backend as the capture front end gives a dynamic graph: a ShapeEnv in
    its meta and placeholders whose example values have symbolic sizes at `dims`."""
    fakes, env = fakes_with_dynamic_dims(list(args), dims)
    for ph, f in zip([n for n in gm.graph.nodes if n.op == "placeholder"], fakes):
        ph.meta["example_value"] = f
    gm.meta["shape_env"] = env
    return resolve_backend(backend)(gm, list(args))


def run_compiled(gm, args: list, after: str, backend: str | None, dims: list | None = None) -> object:
    """Compile `gm` as the minifier's test does and call it on `args` (exceptions propagate);
    `dims` (default: read from `gm`'s placeholders) are the inputs' symbolic dims."""
    if dims is None:
        dims = placeholder_dynamic_dims(gm)
    with repro_disabled():
        if after == "aot":
            compiled = compile_aot(gm, args, dims)
            with no_grad():
                return compiled(*args)
        if any(dims):
            return _compile_dynamic(gm, args, dims, backend)(*args)
        compiled = resolve_backend(backend)(gm, list(args))
        return compiled(*args)


def resolve_backend(backend) -> Callable:
    """The backend callable for a registered name, or for `module.attr` of an importable function."""
    if backend is None:
        raise RuntimeError("flambeau minifier: the repro script names no backend (the graph was compiled with an "
                           "unnamed callable); pass backend= to run_repro")
    try:
        return lookup_backend(backend)
    except InvalidBackend:
        mod, _, attr = backend.rpartition(".")
        if not mod:
            raise
        return getattr(importlib.import_module(mod), attr)


def check_accuracy(gm, args: list, compiled_out, *, tol: float, ignore_non_fp: bool = False) -> str | None:
    """Why `compiled_out` is not `gm`'s eager output on `args` (judged against float64), or None."""
    with no_grad():
        ref = gm(*clone_inputs(args))
    return accuracy_failure(ref, compiled_out, fp64_reference(gm, args), tol=tol, ignore_non_fp=ignore_non_fp)
