"""From a failure to a repro script: the test each minifier candidate must fail, and what each
repro level writes.

`report_failure(gm, args, exc, ...)` is called by the hooks (after_aot.py, after_dynamo.py) when a
compiled graph raised `exc` or was inaccurate (exc is an AccuracyError):
- level 1: `repro.py` of the whole graph;
- levels 2-4: `minifier_launcher.py` of the whole graph (`python minifier_launcher.py` minifies it
  again), then the minified graph as `repro.py`.
The test of a candidate (`failure_test`) runs it eagerly (it must work), then compiles it the way
the repro script will (script.run_compiled: inductor after aot, the named backend after dynamo)
and says whether it raises an exception of the original type with a similar message, or (for
accuracy) whether its output fails debug_utils.same against eager and float64.

A failure that kills the process (a segfault in generated code) cannot be minified by the process
it kills: level 3's `minifier_launcher.py` is run instead, and the launcher first runs the whole
graph's script in a subprocess. When that dies of a signal, every candidate is judged the same way,
as PyTorch's minifier isolates them: its script runs in a subprocess and fails when it dies of the
same signal (`isolated_failure_test`). Exceptions and accuracy failures stay in-process (faster).
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from typing import Callable

from ... import _logging
from ...autograd import no_grad
from .. import config
from .debug_utils import AccuracyError, LAUNCHER_NAME, SCRIPT_NAME, clone_inputs, same_failure
from .fx_minifier import minify
from .script import check_accuracy, repro_disabled, repro_source, run_compiled, write_repro
from ..._tensor import Tensor
from ...fx.graph_module import GraphModule

log = _logging.get_logger("flambeau._dynamo.repro")
CANDIDATE_TIMEOUT_S = 600          # an isolated candidate running longer counts as not failing


def lift_attributes(gm, args: list) -> tuple:
    """`gm` with its tensor attributes (get_attr nodes) turned into trailing graph inputs, so a
    script can rebuild it from inputs alone; returns (GraphModule, args)."""
    g = copy.deepcopy(gm.graph)
    extra = []
    for n in list(g.nodes):
        if n.op != "get_attr":
            continue
        v = gm
        for part in n.target.split("."):
            v = getattr(v, part)
        if not isinstance(v, Tensor):
            continue
        last = [m for m in g.nodes if m.op == "placeholder"][-1:]
        with g.inserting_after(last[0]) if last else g.inserting_before(next(iter(g.nodes))):
            ph = g.placeholder(n.name)
        ph.meta = dict(n.meta)
        n.replace_all_uses_with(ph)
        g.erase_node(n)
        extra.append(v)
    return GraphModule(gm, g), list(args) + extra


def runs_eagerly(gm, args) -> bool:
    """`gm` runs on copies of `args` without raising (a candidate must fail only when compiled)."""
    try:
        with no_grad():
            gm(*clone_inputs(args))
    except Exception:
        return False
    return True


def failure_test(*, after: str, backend: str | None, accuracy: bool, orig: BaseException | None,
                 ignore_non_fp: bool = False) -> Callable:
    """`fails(gm, args) -> bool` for the minifier (see module docstring)."""

    def fails(gm, args) -> bool:
        if not runs_eagerly(gm, args):
            return False
        try:
            out = run_compiled(gm, clone_inputs(args), after, backend)
        except Exception as e:
            return not accuracy and (orig is None or same_failure(orig, e))
        if not accuracy:
            return False
        with repro_disabled():
            return check_accuracy(gm, args, out, tol=config.repro_tolerance, ignore_non_fp=ignore_non_fp) is not None
    return fails


def run_isolated(gm, args: list, *, after: str, backend: str | None) -> int | None:
    """The exit status of `gm`'s repro script run in a subprocess (negative: the signal it died of;
    None when it ran past CANDIDATE_TIMEOUT_S)."""
    src = repro_source(gm, args, after=after, backend=backend, accuracy=False, command="run")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["flambeau"].__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryDirectory(prefix="flambeau-minifier-") as d:
        path = os.path.join(d, "candidate.py")
        with open(path, "w") as f:
            f.write(src)
        try:
            return subprocess.run([sys.executable, path], env=env, cwd=d, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=CANDIDATE_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            return None


def isolated_failure_test(*, after: str, backend: str | None, signal_number: int) -> Callable:
    """`fails(gm, args)` for a crash: the candidate works eagerly (in-process) and its script, run
    in a subprocess, dies of signal `signal_number`."""

    def fails(gm, args) -> bool:
        return runs_eagerly(gm, args) and run_isolated(gm, args, after=after, backend=backend) == -signal_number
    return fails


def minify_and_dump(gm, args: list, *, after: str, backend: str | None, accuracy: bool,
                    orig: BaseException | None = None) -> str:
    """Minify `gm` against its failure and write the result as `repro.py`; returns the path."""
    gm, args = lift_attributes(gm, args)
    if not accuracy and orig is None:           # a launcher run: find the failure first, isolated
        status = run_isolated(gm, args, after=after, backend=backend)
        if status is not None and status < 0:
            log.warning("flambeau minifier: the graph's script dies of signal %d; each candidate runs in a "
                        "subprocess", -status)
            test = isolated_failure_test(after=after, backend=backend, signal_number=-status)
            small, small_args = minify(gm, args, test)
            return write_repro(small, small_args, after=after, backend=backend, accuracy=False, name=SCRIPT_NAME,
                               note=f"the compiled graph dies of signal {-status}")
        try:
            run_compiled(gm, clone_inputs(args), after, backend)
        except Exception as e:
            orig = e
        else:
            raise RuntimeError("flambeau minifier: the graph compiles and runs without an error; nothing to minify")
    test = failure_test(after=after, backend=backend, accuracy=accuracy, orig=orig, ignore_non_fp=True)
    if accuracy and not test(gm, args):            # only a non-float divergence: minify on that too
        test = failure_test(after=after, backend=backend, accuracy=True, orig=None, ignore_non_fp=False)
    note = f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}" if orig is not None \
        else "accuracy failure"
    small, small_args = minify(gm, args, test)
    return write_repro(small, small_args, after=after, backend=backend, accuracy=accuracy, name=SCRIPT_NAME,
                       note=note[:200])


def write_launcher(gm, args: list, *, after: str, backend: str | None, accuracy: bool) -> str:
    """The whole graph as `minifier_launcher.py` (its default command minifies)."""
    gm, args = lift_attributes(gm, args)
    return write_repro(gm, args, after=after, backend=backend, accuracy=accuracy, command="minify",
                       name=LAUNCHER_NAME, note="the whole graph; run it to minify")


def report_failure(gm, args: list, exc: BaseException, *, after: str, backend: str | None) -> None:
    """Write the repro of level `config.repro_level` for a failure of `gm` (see module docstring);
    the path is added to `exc` (a note and `exc.minifier_path`). A failure of the minifier itself
    is logged and does not replace `exc`."""
    accuracy = isinstance(exc, AccuracyError)
    level = config.repro_level
    try:
        with repro_disabled():
            if level == 1:
                small, small_args = lift_attributes(gm, args)
                path = write_repro(small, small_args, after=after, backend=backend, accuracy=accuracy,
                                   name=SCRIPT_NAME, note=f"{type(exc).__name__}: {exc}"[:200])
            else:
                if level != 3:                     # level 3 wrote the launcher before compiling
                    write_launcher(gm, args, after=after, backend=backend, accuracy=accuracy)
                path = minify_and_dump(gm, args, after=after, backend=backend, accuracy=accuracy,
                                       orig=None if accuracy else exc)
    except Exception as e:                         # noqa: BLE001 - the user's error matters more
        log.warning("flambeau minifier failed (%s: %s); the original error follows", type(e).__name__, e)
        return
    exc.minifier_path = path
    if hasattr(exc, "add_note"):
        exc.add_note(f"flambeau minifier: repro script written to {path} (run it with python)")
