import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def keep_log(name: str) -> tuple[list, "logging.Handler"]:
    """Attach a handler to logger `name` that keeps each record's message: returns (messages, handler);
    the caller removes the handler (`logging.getLogger(name).removeHandler(handler)`)."""
    import logging
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    logging.getLogger(name).addHandler(handler)
    return records, handler


def spy_compile_fx(monkeypatch, into: list) -> list:
    """Record every CompiledGraph the inductor backend makes (through flambeau.compile) in `into`, with
    its kernels and extern IR nodes kept for inspection (`artifact.kernels`, `.externs`: config.keep_ir)."""
    import flambeau._inductor as inductor
    monkeypatch.setattr(inductor.config, "keep_ir", True)
    real = inductor.compile_fx

    def spy(gm, example_inputs=None, **kw):
        c = real(gm, example_inputs, **kw)
        into.append(c)
        return c
    monkeypatch.setattr(inductor, "compile_fx", spy)
    return into


def op_names_mode():
    """A flambeau dispatch mode recording, in `.names`, the name of every op that reaches dispatch."""
    from flambeau.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))
    return OpNames()


def _has_cuda():
    try:
        import flambeau
        return flambeau.cuda.is_available()
    except Exception:
        return False


# Triton reads TRITON_INTERPRET once, when it is first imported: set it for the whole run on a machine
# without a GPU, before any test imports Triton (test_inductor_triton.py runs generated kernels in the
# interpreter in this process; whichever test module imported Triton first used to decide).
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # As PyTorch's own test suite does: exact float32 cuDNN convolutions (TF32, the default for
    # users, is ~1e-3 off and the op database compares cuda against cpu at 1e-4).
    from flambeau._backends import cudnn
    cudnn.allow_tf32 = False
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (CuPy); skipped elsewhere")
    config.addinivalue_line("markers", "slow: long-running")


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (CuPy) on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def triton_backend(monkeypatch):
    """The Triton code generator for compiled graphs, its kernels run by Triton's interpreter (TRITON_INTERPRET
    is set above, before Triton is imported); skipped on a cuda machine, where Triton runs kernels for real.
    Yields the launch statistics (`triton_runtime.stats`)."""
    triton = pytest.importorskip("triton")
    import flambeau as fl
    from flambeau._inductor import config, triton_runtime
    if not triton.knobs.runtime.interpret:
        if fl.cuda.is_available():
            pytest.skip("Triton was imported without its interpreter (a cuda machine)")
        raise AssertionError("Triton was imported before TRITON_INTERPRET=1 was set")
    monkeypatch.setattr(config, "backend", "triton")
    fl._dynamo.reset()
    yield triton_runtime.stats
    fl._dynamo.reset()


def python_calls(fn) -> int:
    """Python function calls made while `fn()` runs (`sys.setprofile` "call" events)."""
    n = [0]

    def count(frame, event, arg):
        if event == "call":
            n[0] += 1
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def run_interpreted_script(name: str, timeout: int = 900) -> str:
    """Run tests/scripts/<name> in a fresh Python under Triton's interpreter (TRITON_INTERPRET=1: flambeau's
    Triton kernels on CPU tensors), assert that it exited 0 and return what it printed."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(root, "tests", "scripts", name)], capture_output=True,
                       text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def run_sm90_compile_script(name: str) -> None:
    """Run tests/scripts/<name> in a fresh Python without Triton's interpreter (it compiles generated Triton
    kernels for sm_90 with `triton.compile`, no GPU needed) and assert it ended with OK."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(root, "tests", "scripts", name)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "OK" in r.stdout
