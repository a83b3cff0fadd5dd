"""The minifier (flambeau._dynamo.repro): FLAMBEAU_REPRO_AFTER=aot|dynamo, FLAMBEAU_REPRO_LEVEL=1..4.

A bug is injected into one inductor lowering (tests/_inductor_bugs.py: `sin` raises, or `mul` is
off by 0.01) inside a graph of about a dozen operators. The minifier must shrink the graph to a
few nodes holding the bad operator and write a repro script that, run as `python repro.py` in a
fresh process with the same bug (a sitecustomize hook), fails the same way, and passes without it.
The accuracy judgement is compared with PyTorch's own `torch._dynamo.utils.same`.
"""
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest

import flambeau
from flambeau._dynamo import config as dconfig
from flambeau._dynamo.repro import AccuracyError, minify, same
from flambeau._inductor import config as iconfig
from tests import _inductor_bugs as bugs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEW_NODES = 3
HOOK = """import os
if os.environ.get("FLAMBEAU_TEST_INDUCTOR_BUG"):
    from tests import _inductor_bugs
    _inductor_bugs.inject(os.environ["FLAMBEAU_TEST_INDUCTOR_BUG"])
"""


def program(x, y, w):
    a = flambeau.cos(x) + y
    b = flambeau.exp(a) * 0.5
    c = flambeau.sin(b * y)
    d = c.tanh() + a
    e = d @ w
    g = flambeau.relu(e).sum(1)
    return g * 2, d.mean()


def inputs():
    flambeau.manual_seed(0)
    return flambeau.randn(4, 8), flambeau.randn(4, 8), flambeau.randn(8, 3)


@pytest.fixture
def repro_env(monkeypatch, tmp_path):
    """Minifier settings for one test: scripts in tmp_path, NumPy code (no C++ compiles), errors raise."""
    flambeau._dynamo.reset()
    monkeypatch.setattr(iconfig, "backend", "numpy")
    monkeypatch.setattr(dconfig, "suppress_errors", False)
    monkeypatch.setattr(dconfig, "minifier_dir", str(tmp_path / "minifier"))

    def setup(after, level, bug=None):
        monkeypatch.setattr(dconfig, "repro_after", after)
        monkeypatch.setattr(dconfig, "repro_level", level)
        if bug is not None:
            op, rule = bugs.BUGS[bug]
            monkeypatch.setattr(op, "lowering", rule)
        return tmp_path / "minifier"
    yield setup
    flambeau._dynamo.reset()


def script_graph(path):
    """The compute nodes' operator names of a repro script's graph, and the script's namespace. The script
    sets every code generator knob as the failing run had it (`backend = 'numpy'` here): they are put back
    after, so no later test of this process compiles with them."""
    saved = {k: v for k, v in vars(iconfig).items() if not k.startswith("__")}
    try:
        ns = runpy.run_path(str(path))
    finally:
        for k, v in saved.items():
            setattr(iconfig, k, v)
    gm = flambeau.fx.symbolic_trace(ns["Repro"]())
    names = [getattr(n.target, "name", None) or str(n.target) for n in gm.graph.nodes
             if n.op not in ("placeholder", "output")]
    return names, ns


def run_script(path, tmp_path, bug, extra_env=None, timeout=120):
    """`python repro.py` in a fresh process, with `bug` injected by a sitecustomize hook (or none)
    and `extra_env` set."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), ROOT]))   # the script sets the NumPy backend
    env.pop("FLAMBEAU_TEST_INDUCTOR_BUG", None)
    env.pop("FLAMBEAU_REPRO_AFTER", None)
    if bug:
        env["FLAMBEAU_TEST_INDUCTOR_BUG"] = bug
    env.update(extra_env or {})
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=timeout)


def test_after_aot_error_minifies_to_the_bad_op(repro_env, tmp_path):
    d = repro_env("aot", 2, bug="error")
    with pytest.raises(RuntimeError, match=bugs.BUG_MESSAGE) as info:
        flambeau.compile(program)(*inputs())
    assert info.value.minifier_path == str(d / "repro.py")
    text = (d / "repro.py").read_text()
    assert "flambeau._inductor.config.backend = 'numpy'" in text and "config.fuse = True" in text
    names, ns = script_graph(d / "repro.py")
    assert "sin" in names and len(names) <= FEW_NODES, names
    assert (d / "minifier_launcher.py").exists()
    failed = run_script(d / "repro.py", tmp_path, "error")
    assert failed.returncode != 0 and f"RuntimeError: {bugs.BUG_MESSAGE}" in failed.stderr, failed.stderr
    passed = run_script(d / "repro.py", tmp_path, None)
    assert passed.returncode == 0, passed.stderr


def test_after_aot_accuracy_minifies_to_the_bad_op(repro_env, tmp_path):
    d = repro_env("aot", 4, bug="accuracy")
    x, y, w = inputs()
    with pytest.raises(AccuracyError, match="Bad accuracy"):
        flambeau.compile(program)(x, y, w)
    names, ns = script_graph(d / "repro.py")
    assert "mul.Tensor" in names and len(names) <= FEW_NODES, names
    assert "accuracy=True" in (d / "repro.py").read_text()
    failed = run_script(d / "repro.py", tmp_path, "accuracy")
    assert failed.returncode != 0 and "AccuracyError: Bad accuracy detected" in failed.stderr, failed.stderr
    passed = run_script(d / "repro.py", tmp_path, None)
    assert passed.returncode == 0, passed.stderr


def test_after_aot_failure_in_the_backward_graph(repro_env, tmp_path):
    """cos fails to lower; the program has no cos, so only the backward graph (sin's derivative)
    meets it: the forward compiles and runs, backward() raises, and the repro holds the cos."""
    d = repro_env("aot", 2, bug="backward")

    def f(x, y):
        a = flambeau.exp(x) + y
        b = flambeau.sin(a * 2) * y
        return (b.tanh() + a).sum()
    x, y, _ = inputs()
    x.requires_grad_()
    out = flambeau.compile(f)(x, y)
    assert abs(float(out) - float(f(x, y))) < 1e-4                # the forward graph is fine
    assert not d.exists()
    with pytest.raises(RuntimeError, match=bugs.COS_BUG_MESSAGE) as info:
        out.backward()
    assert info.value.minifier_path == str(d / "repro.py")
    names, _ = script_graph(d / "repro.py")
    assert "cos" in names and len(names) <= FEW_NODES, names
    launcher, _ = script_graph(d / "minifier_launcher.py")
    assert "cos" in launcher and "exp" not in launcher           # the launcher holds the backward graph
    failed = run_script(d / "repro.py", tmp_path, "backward")
    assert failed.returncode != 0 and f"RuntimeError: {bugs.COS_BUG_MESSAGE}" in failed.stderr, failed.stderr
    assert run_script(d / "repro.py", tmp_path, None).returncode == 0


@pytest.mark.parametrize("after", ["aot", "dynamo"])
def test_dynamic_graph_repro_keeps_symbolic_sizes(repro_env, tmp_path, after):
    """sin fails to lower only on symbolic sizes: a graph compiled with dynamic=True fails, the same
    graph at its example sizes does not. The repro records the symbolic dims and fails the same way."""
    d = repro_env(after, 2, bug="dynamic")
    x, y, w = inputs()
    static = flambeau.compile(program)(x, y, w)                     # static sizes: no failure
    np.testing.assert_allclose(static[1].numpy(), program(x, y, w)[1].numpy(), rtol=1e-5)
    flambeau._dynamo.reset()
    with pytest.raises(RuntimeError, match=bugs.DYNAMIC_BUG_MESSAGE):
        flambeau.compile(program, dynamic=True)(x, y, w)
    names, ns = script_graph(d / "repro.py")
    assert any("sin" in n for n in names) and len(names) <= FEW_NODES, names
    assert any(len(spec) == 6 and spec[5] for spec in ns["INPUTS"]), ns["INPUTS"]
    failed = run_script(d / "repro.py", tmp_path, "dynamic")
    assert failed.returncode != 0 and bugs.DYNAMIC_BUG_MESSAGE in failed.stderr, failed.stderr
    assert run_script(d / "repro.py", tmp_path, None).returncode == 0


CRASHING_PROGRAM = """
import flambeau
import flambeau._inductor.config
flambeau._inductor.config.backend = "numpy"

def small_program(x, y):            # few nodes: every candidate costs a process start
    a = flambeau.cos(x) + y
    return flambeau.sin(a * 2).exp().sum()

flambeau.manual_seed(0)
flambeau.compile(small_program)(flambeau.randn(4, 8), flambeau.randn(4, 8))
"""


def test_crash_is_minified_in_subprocesses(tmp_path):
    """sin's lowering segfaults. The program dies of SIGSEGV at level 3 after writing the launcher;
    `python minifier_launcher.py` runs each candidate in a subprocess (in-process, the first would
    kill it) and writes a repro.py that dies of SIGSEGV with the bug and passes without it."""
    import signal
    d = tmp_path / "minifier"
    (tmp_path / "program.py").write_text(CRASHING_PROGRAM)
    env = {"FLAMBEAU_REPRO_LEVEL": "3", "FLAMBEAU_MINIFIER_DIR": str(d)}
    crashed = run_script(tmp_path / "program.py", tmp_path, "crash", dict(env, FLAMBEAU_REPRO_AFTER="aot"))
    assert crashed.returncode == -signal.SIGSEGV, crashed.stderr
    assert (d / "minifier_launcher.py").exists() and not (d / "repro.py").exists()
    launched = run_script(d / "minifier_launcher.py", tmp_path, "crash", env, timeout=900)
    assert launched.returncode == 0, launched.stderr
    names, _ = script_graph(d / "repro.py")
    assert "sin" in names and len(names) <= FEW_NODES, names
    assert run_script(d / "repro.py", tmp_path, "crash").returncode == -signal.SIGSEGV
    assert run_script(d / "repro.py", tmp_path, None).returncode == 0


def test_after_dynamo_error_with_parameters(repro_env, tmp_path):
    d = repro_env("dynamo", 2, bug="error")
    lin = flambeau.nn.Linear(8, 3)

    def model(x, y):
        return program(x, y, lin.weight.t())
    x, y, _ = inputs()
    with pytest.raises(RuntimeError, match=bugs.BUG_MESSAGE):
        flambeau.compile(model)(x, y)
    names, ns = script_graph(d / "repro.py")
    assert any("sin" in n for n in names) and len(names) <= FEW_NODES, names
    assert "after='dynamo', backend='inductor'" in (d / "repro.py").read_text()
    launcher, _ = script_graph(d / "minifier_launcher.py")
    assert len(launcher) >= 10                       # the whole captured graph, the parameter as an input
    failed = run_script(d / "repro.py", tmp_path, "error")
    assert failed.returncode != 0 and bugs.BUG_MESSAGE in failed.stderr, failed.stderr
    assert run_script(d / "repro.py", tmp_path, None).returncode == 0


def test_after_dynamo_accuracy(repro_env):
    d = repro_env("dynamo", 4, bug="accuracy")
    with pytest.raises(AccuracyError):
        flambeau.compile(program)(*inputs())
    names, _ = script_graph(d / "repro.py")
    assert len(names) <= FEW_NODES and any("mul" in n for n in names), names


def test_level_1_dumps_the_whole_failing_graph(repro_env):
    d = repro_env("aot", 1, bug="error")
    with pytest.raises(RuntimeError, match=bugs.BUG_MESSAGE):
        flambeau.compile(program)(*inputs())
    names, _ = script_graph(d / "repro.py")
    assert len(names) >= 10 and "sin" in names
    assert not (d / "minifier_launcher.py").exists()


def test_level_3_writes_a_launcher_without_a_failure(repro_env, tmp_path):
    d = repro_env("aot", 3)
    x, y, w = inputs()
    got = flambeau.compile(program)(x, y, w)
    want = program(x, y, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert (d / "minifier_launcher.py").exists() and not (d / "repro.py").exists()
    names, _ = script_graph(d / "minifier_launcher.py")
    assert len(names) >= 10


def test_repro_off_leaves_compiled_graphs_alone(repro_env):
    d = repro_env(None, 2, bug="accuracy")
    x, y, w = inputs()
    got = flambeau.compile(program)(x, y, w)[1]        # the bug goes unnoticed: no check, no file
    assert abs(float(got) - float(program(x, y, w)[1])) > bugs.MUL_OFFSET / 10
    assert not d.exists()


def test_bad_setting_is_named(repro_env):
    repro_env("after_everything", 2)
    with pytest.raises(ValueError, match="repro_after"):
        flambeau.compile(program)(*inputs())


# ---- the minifier itself, with a plain Python test ------------------------------------------------
def test_minify_keeps_only_what_the_test_needs():
    def f(x):
        a = x.sin() + 1
        b = a.exp() * 2
        c = b.cos() - a
        return (c.tanh() * 3).sum(), a.abs()
    gm = flambeau.fx.symbolic_trace(f)
    x = flambeau.randn(5)
    calls = []

    def fails(g, args):                      # "fails" while the graph still calls exp on what it gets
        calls.append(1)
        return any(n.op == "call_method" and n.target == "exp" for n in g.graph.nodes)
    small, args = minify(gm, [x], fails)
    compute = [n for n in small.graph.nodes if n.op not in ("placeholder", "output")]
    assert [n.target for n in compute] == ["exp"]
    np.testing.assert_allclose(small(*args)[0].numpy(), (x.sin() + 1).exp().numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="does not fail"):
        minify(gm, [x], lambda g, a: False)


def test_minify_drops_outputs_the_failure_does_not_need():
    def f(x):
        return x.exp(), x.sin(), x.cos()
    gm = flambeau.fx.symbolic_trace(f)

    def fails(g, args):                      # needs exp and two outputs: truncation alone can't do it
        outs = g.graph.output_node().args[0]
        return len(outs) >= 2 and any(n.op == "call_method" and n.target == "exp" for n in g.graph.nodes)
    small, _ = minify(gm, [flambeau.randn(3)], fails)
    assert [n.target for n in small.graph.nodes if n.op == "call_method"] == ["exp"]
    assert len(small.graph.output_node().args[0]) == 2


def test_minifier_keeps_to_the_original_failure(repro_env, monkeypatch):
    d = repro_env("aot", 2)

    sin_lowering = bugs.aten.sin.lowering

    def sin_raises_before_cos(g, x):           # fails only in a graph where cos uses the sin
        if any(u.target is bugs.aten.cos for u in g.node.users):
            raise RuntimeError(bugs.BUG_MESSAGE)
        return sin_lowering(g, x)

    def cos_raises(g, x):                      # another bug: a graph of cos alone fails differently
        raise ValueError("another bug, in cos")
    monkeypatch.setattr(bugs.aten.sin, "lowering", sin_raises_before_cos)
    monkeypatch.setattr(bugs.aten.cos, "lowering", cos_raises)

    def f(x):
        a = flambeau.sin(x * 2)
        return (flambeau.cos(a) + 1).exp()
    with pytest.raises(RuntimeError, match=bugs.BUG_MESSAGE):
        flambeau.compile(f)(flambeau.randn(4))
    names, _ = script_graph(d / "repro.py")
    assert names == ["sin", "cos"], names


# ---- the accuracy judgement, against PyTorch's ---------------------------------------------------
def test_same_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    from torch._dynamo.utils import same as torch_same
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(2000)
    eager = exact.astype(np.float32)
    noisy = (exact * (1 + 3e-7 * rng.standard_normal(2000))).astype(np.float32)
    cases = {"equal": eager, "rounding noise": noisy, "off by 1e-2": eager + np.float32(1e-2),
             "off by 3e-4 on a few": np.where(np.arange(2000) < 5, eager + np.float32(3e-4), eager),
             "one element wrong": np.where(np.arange(2000) == 7, eager + np.float32(1.0), eager)}
    for name, res in cases.items():
        for tol in (1e-4, 1e-3):
            ours = same(flambeau.tensor(eager), flambeau.tensor(res), flambeau.tensor(exact), tol=tol)
            theirs = torch_same(torch.tensor(eager), torch.tensor(res), torch.tensor(exact), tol=tol)
            assert ours == theirs, (name, tol, ours, theirs)
    b = np.array([True, False, True])
    assert same(flambeau.tensor(b), flambeau.tensor(b)) and not same(flambeau.tensor(b), flambeau.tensor(~b))
