"""The package's layers point one way: a module imports only from its own layer or below.

`LAYERS` is the declared order (bottom first; README's layout section points here). Every import
in `flambeau/`, at module level and inside functions alike, is read with `ast` and checked against
it. `KNOWN_UPWARD` lists the upward imports that the tree still has, each with the reason it is
not moved yet; the list may only shrink: an import against the order that is not on it fails, and
an entry that no longer occurs fails too (delete it).

Imports belong at module level. One inside a function says why on its own line, as a trailing
`# deferred: <reason>`: an optional or slow dependency (CuPy, SciPy, SymPy), a part loaded at first
use (the inductor), or the import cycle it still breaks, named. `MAX_DEFERRED` caps their number;
it may only shrink.

Below the top layer, the public namespace is read only at call time, through
`flambeau._public.public_namespace()`, by the modules `PUBLIC_NAMESPACE_USERS` lists. The import
graph of module-level imports (what runs at import time) is measured: `MAX_IMPORT_CYCLE` caps its
largest strongly connected component; it may only shrink.
"""
from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "flambeau"

# Bottom first. A module belongs to the layer of its longest listed prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("flambeau._state", "flambeau._dtype", "flambeau._logging", "flambeau._png",
                    "flambeau._cpp_builder", "flambeau._counters", "flambeau._atomic", "flambeau._strict_zip",
                    "flambeau._tags", "flambeau._fp_errors", "flambeau._public", "flambeau._compile_lock", "flambeau._code_cache",
                    "flambeau._pending_grads",
                    "flambeau.torch_version",
                    "flambeau.version", "flambeau.futures")),
    ("device", ("flambeau._device",)),
    ("backends", ("flambeau._backends",)),
    ("tensor", ("flambeau._tensor", "flambeau._tensor_str", "flambeau._dispatch", "flambeau.storage")),
    ("ops", ("flambeau._ops", "flambeau.random", "flambeau.linalg", "flambeau.special",
             "flambeau._api", "flambeau._tensor_types")),
    ("autograd", ("flambeau.autograd",)),
    ("library", ("flambeau.nn", "flambeau.optim", "flambeau.utils", "flambeau.amp", "flambeau.cuda",
                 "flambeau.cpu", "flambeau.backends", "flambeau.accelerator",
                 "flambeau.distributions", "flambeau.distributed", "flambeau.jit", "flambeau.serialization",
                 "flambeau._pt_format", "flambeau._weights_only", "flambeau.testing",
                 "flambeau._numpy", "flambeau.sparse",
                 "flambeau.profiler", "flambeau.autograd.profiler")),   # a dispatch mode times the ops
    ("tracing", ("flambeau._subclasses", "flambeau.fx", "flambeau.library",
                 "flambeau.utils.tensorboard",     # add_graph traces with fx
                 "flambeau.distributed.pipelining")),   # pipeline() cuts an fx trace into stages
    ("decompositions", ("flambeau._decomp",)),
    ("functorch", ("flambeau._functorch", "flambeau._higher_order_ops")),
    ("inductor", ("flambeau._inductor",)),
    ("dynamo", ("flambeau._dynamo",)),
    ("compiler", ("flambeau.compiler",        # functional collectives: custom operators for compiled code
                  "flambeau.distributed._functional_collectives", "flambeau.distributed.nn")),
    ("quantization", ("flambeau.ao",)),     # observers, dynamic modules, the PT2E flow (traces with make_fx)
    ("export", ("flambeau.export", "flambeau.onnx")),
    ("entry", ("flambeau", "flambeau.compat", "flambeau.run", "flambeau.demo",
               "flambeau.distributed.run", "flambeau.distributed._worker")),   # the launcher runs flambeau.run
]

# (importer, imported) -> why it is still there. May only shrink.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# The modules below the top that read the public namespace `flambeau` at call time
# (`flambeau._public.public_namespace`), each with its reason. May only shrink.
PUBLIC_NAMESPACE_USERS: dict[str, str] = {
    "flambeau.fx.graph": "generated graph code runs with the public namespace as its global `flambeau`",
    "flambeau._dynamo.variables.torch": "user bytecode names flambeau.<fn>: the functions a graph may record",
    "flambeau._dynamo.repro.script": "a repro script binds the graph's globals as flambeau.<name>",
}

# How many function-level imports may carry `# deferred:`. May only shrink (82: the inductor's Triton
# runtime, `compile_fx._triton_runtime`, imports Triton, optional and ~1 s to import; 83: the CPU
# collective engine, `distributed_c10d._mpi`, imports mpi4py, optional, and importing it starts MPI,
# which must happen only in init_process_group, never at `import flambeau`; 82: the repro script's two
# AOT autograd imports moved up, flambeau.export loads it at import; onnx, optional, added; 83: the cuda
# collective engine, `_nccl_backend.nccl_library`, imports CuPy's NCCL module, optional, only where NCCL runs;
# 79: the Triton launcher's seven CuPy imports are one `triton_launch._cupy()`; 77: main had 80 (the
# eager max-pooling Triton module, `nn_pool._triton_max_pool`, is imported at first use), and the cuDNN
# wrapper's three calls now allocate through `cudnn._empty`; 75: `triton.compile` moved with its two
# Triton imports into `_backends/compile_worker.py`, whose Triton modules come from one `_triton()`).
MAX_DEFERRED = 73

# The largest strongly connected component of the module-level import graph (imports executed at
# import time: function bodies and `if TYPE_CHECKING:` blocks left out). May only shrink. The one
# cycle left is dynamo's variable kinds (the package and its 9 modules): the kinds build one another
# (a constant's method is a builtin, a container's item or an attribute any kind), so each reads the
# kinds defined after it through the package at call time (see _dynamo/variables/__init__.py).
MAX_IMPORT_CYCLE = 10

_DEFERRED = re.compile(r"#.*\bdeferred: *\S")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(importer: str, is_package: bool, node: ast.AST) -> list[str]:
    """The flambeau modules an import statement names (a name imported from a package that is a
    submodule counts as that submodule)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".")
            if not is_package:
                base.pop()
            base = base[:len(base) - node.level + 1]
            if node.module:
                base.append(node.module)
            base = ".".join(base)
        else:
            base = node.module
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        parts = name.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        if parts:
            out.append(".".join(parts))
    return out


def imports_in(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(imported flambeau module, line) for every import statement of `source`: at module level,
    inside functions and classes, under `if TYPE_CHECKING`, anywhere."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend((t, node.lineno) for t in _target(module, is_package, node) if t != module)
    return out


def imports() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a flambeau module in the package."""
    return [(name, target, line) for name, path in MODULES.items()
            for target, line in imports_in(name, path.read_text(), path.name == "__init__.py")]


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise KeyError(module)
    return rank


def upward_imports() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for importer, imported, line in imports():
        if layer_of(imported) > layer_of(importer):
            out.setdefault((importer, imported), []).append(line)
    return out


def test_every_module_has_a_layer():
    missing = []
    for m in MODULES:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"modules in no layer of tests/test_layers.py LAYERS: {missing}"


def test_no_import_against_the_layer_order():
    bad = {k: v for k, v in upward_imports().items() if k not in KNOWN_UPWARD}
    lines = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]}) at line(s) {v}"
             for (a, b), v in sorted(bad.items())]
    assert not bad, "imports against the layer order:\n" + "\n".join(lines)


def test_known_upward_list_is_current():
    stale = sorted(set(KNOWN_UPWARD) - set(upward_imports()))
    assert not stale, f"these KNOWN_UPWARD entries no longer occur; delete them: {stale}"


def test_public_namespace_users_are_listed():
    users = {name for name, path in MODULES.items()
             if name != "flambeau._public" and "public_namespace" in path.read_text()}
    unlisted = sorted(users - set(PUBLIC_NAMESPACE_USERS))
    stale = sorted(set(PUBLIC_NAMESPACE_USERS) - users)
    assert not unlisted, (f"these modules read the public namespace at call time: import what they use from its "
                          f"own layer, or list them in PUBLIC_NAMESPACE_USERS with the reason: {unlisted}")
    assert not stale, f"these PUBLIC_NAMESPACE_USERS entries no longer use it; delete them: {stale}"


def test_the_checker_reads_imports_inside_functions():
    """An upward import hidden in a function (relative or absolute) is seen and judged upward."""
    src = ("def f():\n    from ..compiler import compile\n"
           "class C:\n    def g(self):\n        import flambeau._inductor.graph\n")
    found = imports_in("flambeau._ops.pointwise", src)
    assert found == [("flambeau.compiler", 2), ("flambeau._inductor.graph", 5)]
    assert all(layer_of(t) > layer_of("flambeau._ops.pointwise") for t, _ in found)


def function_level_imports_in(source: str) -> list[tuple[int, str]]:
    """(line, source text) of every import statement inside a function (or a class inside one)."""
    lines = source.splitlines()
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child.lineno, "\n".join(lines[child.lineno - 1:child.end_lineno])))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(ast.parse(source), False)
    return out


def deferred_imports() -> list[tuple[str, int, str]]:
    """(module, line, text) of every function-level import in the package."""
    return [(name, line, text) for name, path in MODULES.items()
            for line, text in function_level_imports_in(path.read_text())]


def test_function_level_imports_say_why():
    bare = [f"{m}:{line}: {text.strip()}" for m, line, text in deferred_imports() if not _DEFERRED.search(text)]
    assert not bare, ("imports inside functions without a '# deferred: <reason>' comment (move them to module "
                      "level, or say which heavy dependency or named cycle keeps them there):\n" + "\n".join(bare))


def test_deferred_imports_do_not_grow():
    n = len(deferred_imports())
    assert n <= MAX_DEFERRED, f"{n} function-level imports (cap {MAX_DEFERRED}): move the new ones to module level"
    assert n == MAX_DEFERRED, f"only {n} function-level imports are left: lower MAX_DEFERRED to {n}"


def test_the_checker_finds_function_level_imports():
    """Nested functions and methods are seen; module-level and class-level imports are not reported;
    a reason must follow `deferred:`."""
    src = ("import os\n"
           "class C:\n    import re\n    def m(self):\n        import json\n"
           "def f():\n    def g():\n        from . import x  # deferred: cycle a <-> b\n"
           "    import sys  # deferred:\n")
    found = function_level_imports_in(src)
    assert [line for line, _ in found] == [5, 8, 9]
    assert [bool(_DEFERRED.search(text)) for _, text in found] == [False, True, False]


def module_level_imports_in(module: str, source: str, is_package: bool = False) -> set[str]:
    """The flambeau modules `source` imports when it is imported: every import statement outside
    function bodies and outside `if TYPE_CHECKING:` blocks (class bodies, `try`, `if` included)."""
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.update(t for t in _target(module, is_package, child) if t != module)
            visit(child)
    visit(ast.parse(source))
    return out


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of `graph` (node -> successors)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    components.append(sorted(component))
    return components


def import_cycles() -> list[list[str]]:
    """The import cycles of the package (components of more than one module), largest first."""
    graph = {name: module_level_imports_in(name, path.read_text(), path.name == "__init__.py")
             for name, path in MODULES.items()}
    return sorted((c for c in strongly_connected_components(graph) if len(c) > 1), key=len, reverse=True)


def test_the_module_level_import_cycle_does_not_grow():
    cycles = import_cycles()
    largest = len(cycles[0]) if cycles else 0
    assert largest <= MAX_IMPORT_CYCLE, (f"the largest module-level import cycle has {largest} modules (cap "
                                         f"{MAX_IMPORT_CYCLE}): {cycles[0]}")
    assert largest == MAX_IMPORT_CYCLE, f"the largest import cycle is down to {largest}: lower MAX_IMPORT_CYCLE"


def test_the_cycle_checker_finds_cycles():
    """Module-level imports only (a function's or TYPE_CHECKING's do not count); a cycle through
    three modules is one component, a module importing itself back through a fourth joins it."""
    src = ("from . import b\nimport flambeau.c\nfrom typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from . import d\nelse:\n    pass\n"
           "def f():\n    from . import e\nclass K:\n    from . import g\n")
    known = {"flambeau.x", "flambeau.b", "flambeau.c", "flambeau.d", "flambeau.e", "flambeau.g"}
    saved = dict(MODULES)
    MODULES.update({m: PACKAGE for m in known})
    try:
        assert module_level_imports_in("flambeau.x", src) == {"flambeau.b", "flambeau.c", "flambeau.g"}
    finally:
        MODULES.clear()
        MODULES.update(saved)
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d", "a"}}
    comps = sorted(strongly_connected_components(graph), key=len, reverse=True)
    assert comps[0] == ["a", "b", "c"] and all(len(c) == 1 for c in comps[1:])
    graph["d"] = {"f"}
    assert max(strongly_connected_components(graph), key=len) == ["a", "b", "c", "d", "f"]
