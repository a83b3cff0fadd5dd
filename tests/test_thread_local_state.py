"""Per-thread autograd and dispatch state, checked against PyTorch in the same process.

PyTorch keeps grad mode, inference mode, autocast (on/off, dtype, cache), the dispatch mode stack,
saved-tensor hooks and the default device per thread (a new thread starts with its defaults,
whatever the thread that started it has); anomaly mode and the default dtype are process-wide.
Each scenario enters a state in the main thread, then reads every state function and a few op
results from a fresh thread (and from the main thread), in PyTorch and in flambeau: they must agree.
Compiled functions may be called from several threads at once; compiling is serialized.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau import _state
from flambeau._dynamo.testing import CompileCounter
from flambeau._subclasses.fake_tensor import FakeTensorMode
from tests.conftest import spy_compile_fx

WAIT_S = 60        # how long a thread waits for the other side of a handshake before the test fails


def in_thread(fn):
    """`fn()` run in a new thread; its result (or its exception, raised here)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:      # noqa: BLE001 (re-raised in the calling thread)
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _name(x) -> str:
    """A dtype or device as a library-independent string ('float32', 'cpu')."""
    return str(x).rsplit(".", 1)[-1]


class Recorder:
    """The saved-tensor packs and dispatched ops a scenario's hooks and mode see, per library."""

    def __init__(self, lib):
        self.lib = lib
        self.packed: list = []
        self.ops: list = []
        rec = self
        base = (torch.utils._python_dispatch.TorchDispatchMode if lib is torch
                else fl.utils._python_dispatch.TorchDispatchMode)

        class RecordOps(base):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                rec.ops.append(func)
                return func(*args, **(kwargs or {}))
        self.mode_class = RecordOps

    def pack(self, t):
        self.packed.append(1)
        return t


def _setting(set_fn, get_fn, value):
    @contextlib.contextmanager
    def ctx():
        prev = get_fn()
        set_fn(value)
        try:
            yield
        finally:
            set_fn(prev)
    return ctx()


SCENARIOS = {
    "no_grad": lambda lib, rec: lib.no_grad(),
    "set_grad_enabled(False)": lambda lib, rec: lib.set_grad_enabled(False),
    "inference_mode": lambda lib, rec: lib.inference_mode(),
    "autocast cpu float16": lambda lib, rec: lib.autocast("cpu", dtype=lib.float16),
    "set_autocast_dtype": lambda lib, rec: _setting(lambda d: lib.set_autocast_dtype("cpu", d),
                                                    lambda: lib.get_autocast_dtype("cpu"), lib.float16),
    "autocast cache off": lambda lib, rec: _setting(lib.set_autocast_cache_enabled,
                                                    lib.is_autocast_cache_enabled, False),
    "detect_anomaly": lambda lib, rec: lib.autograd.set_detect_anomaly(True),
    "default device meta": lambda lib, rec: _setting(lib.set_default_device, lib.get_default_device, "meta"),
    "default dtype float64": lambda lib, rec: _setting(lib.set_default_dtype, lib.get_default_dtype, lib.float64),
    "dispatch mode": lambda lib, rec: rec.mode_class(),
    "saved_tensors_hooks": lambda lib, rec: lib.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t),
}


def observe(rec: Recorder) -> dict:
    """What the calling thread sees: every state function, and what a few ops do."""
    lib = rec.lib
    packed, ops = len(rec.packed), len(rec.ops)
    x = lib.ones(3, dtype=lib.float32, requires_grad=True)
    y = x * x
    z = lib.ones(2, 2) @ lib.ones(2, 2)
    return {
        "is_grad_enabled": lib.is_grad_enabled(),
        "is_inference_mode_enabled": lib.is_inference_mode_enabled(),
        "is_anomaly_enabled": lib.is_anomaly_enabled(),
        "is_autocast_enabled(cpu)": lib.is_autocast_enabled("cpu"),
        "get_autocast_dtype(cpu)": _name(lib.get_autocast_dtype("cpu")),
        "is_autocast_cache_enabled": lib.is_autocast_cache_enabled(),
        "get_default_device": _name(lib.get_default_device()),
        "get_default_dtype": _name(lib.get_default_dtype()),
        "dispatch modes": len(lib.utils._python_dispatch._get_current_dispatch_mode_stack()),
        "x * x records a grad_fn": y.grad_fn is not None,
        "ones() dtype, device": (_name(lib.ones(1).dtype), _name(lib.ones(1).device)),
        "mm dtype": _name(z.dtype),
        "the mode saw ops": len(rec.ops) > ops,
        "the hook packed": len(rec.packed) > packed,
    }


def _views(lib, scenario: str) -> tuple[dict, dict]:
    """(the main thread's view, a new thread's view) while the main thread is in `scenario`."""
    rec = Recorder(lib)
    with SCENARIOS[scenario](lib, rec):
        main = observe(rec)
        other = in_thread(lambda: observe(rec))
    return main, other


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_new_thread_sees_the_state_pytorch_gives_it(scenario):
    torch_main, torch_thread = _views(torch, scenario)
    fl_main, fl_thread = _views(fl, scenario)
    assert fl_thread == torch_thread
    assert fl_main == torch_main
    assert torch_main != torch_thread or scenario in ("detect_anomaly", "default dtype float64")
    assert _state.interposed == 0              # every thread left its modes and autocast regions


def test_each_thread_keeps_its_own_state_while_both_run():
    """A thread in no_grad + autocast + a dispatch mode, paused in the middle, and the main thread
    working meanwhile: neither sees the other's state, before or after."""
    rec = Recorder(fl)
    entered, main_done = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with fl.no_grad(), fl.autocast("cpu", dtype=fl.float16), rec.mode_class():
            entered.set()
            assert main_done.wait(WAIT_S)
            seen["worker"] = observe(rec)
    t = threading.Thread(target=worker)
    t.start()
    assert entered.wait(WAIT_S)
    seen["main"] = observe(rec)
    main_done.set()
    t.join()
    assert seen["main"]["is_grad_enabled"] and seen["main"]["x * x records a grad_fn"]
    assert seen["main"]["mm dtype"] == "float32" and not seen["main"]["is_autocast_enabled(cpu)"]
    assert seen["main"]["dispatch modes"] == 0 and not seen["main"]["the mode saw ops"]
    assert not seen["worker"]["is_grad_enabled"] and not seen["worker"]["x * x records a grad_fn"]
    assert seen["worker"]["mm dtype"] == "float16" and seen["worker"]["dispatch modes"] == 1
    assert seen["worker"]["the mode saw ops"]
    assert _state.interposed == 0


def _backward_while_the_other_thread_works(lib) -> dict:
    """Main thread in no_grad starts a thread that runs forward + backward; inside its backward (a
    tensor hook, which pauses) the main thread leaves no_grad and records a graph of its own."""
    rng = np.random.default_rng(0)
    w1, w2, xv = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (2, 4), (5, 3)))
    in_backward, main_done = threading.Event(), threading.Event()
    out = {}

    def step():
        W1 = lib.tensor(w1, requires_grad=True)
        W2 = lib.tensor(w2, requires_grad=True)
        h = lib.relu(lib.tensor(xv) @ W1.T)

        def hook(g):
            out["grad mode in the thread's backward"] = lib.is_grad_enabled()
            in_backward.set()
            assert main_done.wait(WAIT_S)
            return g
        h.register_hook(hook)
        loss = (h @ W2.T).square().mean()
        loss.backward()
        return loss.item(), W1.grad.numpy().copy(), W2.grad.numpy().copy()

    with lib.no_grad():
        t = threading.Thread(target=lambda: out.setdefault("step", step()))
        t.start()
        assert in_backward.wait(WAIT_S)
        out["main in no_grad"] = lib.is_grad_enabled()
    v = lib.ones(2, requires_grad=True)
    out["main records during the thread's backward"] = (v * 3).grad_fn is not None
    main_done.set()
    t.join()
    return out


def test_backward_in_a_thread_while_the_main_thread_is_in_no_grad():
    ref = _backward_while_the_other_thread_works(torch)
    got = _backward_while_the_other_thread_works(fl)
    for k in ("grad mode in the thread's backward", "main in no_grad", "main records during the thread's backward"):
        assert got[k] == ref[k], k
    assert ref["main records during the thread's backward"] and not ref["grad mode in the thread's backward"]
    for a, b in zip(got["step"], ref["step"]):
        np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5)


def _callbacks_of_two_backwards_at_once(lib) -> tuple:
    """Thread A and the main thread each inside a backward pass at once, each queuing a final
    callback from a tensor hook; A's pass ends while the main thread's still runs: each callback
    runs at the end of its own pass, in its own thread."""
    events: list = []
    a_queued, main_queued, a_done = threading.Event(), threading.Event(), threading.Event()
    engine = lib.autograd.Variable._execution_engine
    seen = {}

    def pass_with_hook(hook):
        x = lib.ones(2, requires_grad=True)
        h = x * 2
        h.register_hook(hook)
        h.sum().backward()

    def callback(name):
        return lambda: events.append((name, threading.current_thread().name))

    def hook_a(g):
        engine.queue_callback(callback("A"))
        a_queued.set()
        assert main_queued.wait(WAIT_S)

    def hook_main(g):
        engine.queue_callback(callback("main"))
        main_queued.set()
        assert a_done.wait(WAIT_S)

    def thread_a():
        pass_with_hook(hook_a)
        seen["A after its backward"] = list(events)
        a_done.set()
    t = threading.Thread(target=thread_a, name="A")
    t.start()
    assert a_queued.wait(WAIT_S)
    pass_with_hook(hook_main)
    t.join()
    return seen["A after its backward"], sorted(events)


def test_final_callbacks_belong_to_the_backward_pass_of_their_thread():
    main = threading.current_thread().name
    expected = ([("A", "A")], [("A", "A"), ("main", main)])
    assert _callbacks_of_two_backwards_at_once(torch) == expected
    assert _callbacks_of_two_backwards_at_once(fl) == expected


def test_backward_passes_of_two_threads_accumulate_into_shared_leaves_without_losing_any():
    """Two threads run backward into one leaf at once, on arrays large enough that NumPy releases
    the GIL inside each `+=`: `.grad` must be the sum of every pass's gradient, as in PyTorch, whose
    AccumulateGrad holds a mutex (unguarded, two passes read the same old gradient and one sum is
    lost: 22-28 of 30 in 5 runs here)."""
    n, passes = 2_000_000, 10
    w = fl.zeros(n, requires_grad=True)
    c = fl.ones(n)
    start = threading.Barrier(2)

    def worker(scale):
        start.wait(WAIT_S)
        for _ in range(passes):
            ((w * c).sum() * scale).backward()
    threads = [threading.Thread(target=worker, args=(s,)) for s in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g = w.grad.numpy()
    assert g.min() == g.max() == 3 * passes


def _mlp(seed: int = 0):
    fl.manual_seed(seed)
    return fl.nn.Sequential(fl.nn.Linear(8, 16), fl.nn.ReLU(), fl.nn.Linear(16, 4))


def test_two_threads_run_one_compiled_mlp_at_once(monkeypatch):
    graphs = spy_compile_fx(monkeypatch, [])
    m = _mlp()
    cm = fl.compile(m)
    params = list(m.parameters())
    xs = [fl.randn(5, 8) for _ in range(2)]

    def eager(x):
        y = m(x)
        return y.detach().numpy().copy(), [g.numpy().copy() for g in fl.autograd.grad(y.square().sum(), params)]
    ref = [eager(x) for x in xs]
    start = threading.Barrier(2)
    results: dict = {}

    def worker(i):
        start.wait(WAIT_S)
        for k in range(4):
            y = cm(xs[i])
            grads = fl.autograd.grad(y.square().sum(), params)
            results[i, k] = (y.device.type, y.detach().numpy().copy(), [g.numpy().copy() for g in grads])
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    for (i, _), (device, y, grads) in results.items():
        assert device == "cpu"
        np.testing.assert_allclose(y, ref[i][0], rtol=1.3e-6, atol=1e-5)
        for g, r in zip(grads, ref[i][1]):
            np.testing.assert_allclose(g, r, rtol=1.3e-6, atol=1e-5)
    assert len(graphs) == 2           # compiled once: the forward and (at its first use) the backward


def test_threads_calling_a_fresh_compiled_function_at_once_compile_it_once(monkeypatch):
    graphs = spy_compile_fx(monkeypatch, [])

    def f(x, w):
        return fl.tanh(x @ w) * 2 + 1
    cf = fl.compile(f)
    x, w = fl.randn(6, 5), fl.randn(5, 3)
    ref = f(x, w).numpy()
    start = threading.Barrier(3)
    outs = []

    def worker():
        start.wait(WAIT_S)
        outs.append(cf(x, w).numpy())
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outs) == 3
    for o in outs:
        np.testing.assert_allclose(o, ref, rtol=1.3e-6, atol=1e-5)
    assert len(graphs) == 1


def test_a_thread_compiling_leaves_the_others_eager_and_compiled_calls_alone():
    """Thread A is inside a backend, under a fake-tensor mode, while the main thread runs eager ops
    and a function compiled before: real tensors with their autograd graph, the compiled code run
    from its cache, and `is_compiling()` False in the main thread (as in PyTorch's eager code)."""
    inside, release = threading.Event(), threading.Event()
    compiling_seen = {}

    def blocking_backend(gm, example_inputs):
        compiling_seen["A"] = fl.compiler.is_compiling()
        with FakeTensorMode():
            inside.set()
            assert release.wait(WAIT_S)
        return gm.forward

    counter = CompileCounter()
    graph_calls = []

    def counting_backend(gm, example_inputs):
        counter(gm, example_inputs)

        def run(*args):
            graph_calls.append(1)
            return gm.forward(*args)
        return run

    def g(x):
        return x.sin() + 1
    cg = fl.compile(g, backend=counting_backend)
    x = fl.randn(4)
    cg(x)
    assert counter.frame_count == 1 and len(graph_calls) == 1

    def h(x):
        return x.cos() * 3
    t = threading.Thread(target=lambda: fl.compile(h, backend=blocking_backend)(fl.randn(3)))
    t.start()
    try:
        assert inside.wait(WAIT_S)
        w = fl.ones(3, requires_grad=True)
        y = w * 2 + 1
        compiled_y = cg(x)
        main_compiling = fl.compiler.is_compiling()
    finally:
        release.set()
        t.join()
    assert type(y) is fl.Tensor and y.device.type == "cpu" and y.grad_fn is not None
    np.testing.assert_array_equal(y.detach().numpy(), np.full(3, 3.0, np.float32))
    np.testing.assert_allclose(compiled_y.numpy(), np.sin(x.numpy()) + 1, rtol=1.3e-6, atol=1e-6)
    assert len(graph_calls) == 2 and counter.frame_count == 1     # its compiled code, no recompile
    assert compiling_seen["A"] and not main_compiling


def test_func_transforms_in_a_thread_while_another_is_inside_vmap():
    """Each thread's vmap levels are its own: while thread A waits inside a vmap, the main thread's
    `grad` and `vmap(grad)` see no outer level (they match torch.func)."""
    xv = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    inside, release = threading.Event(), threading.Event()

    def waiting(v):
        inside.set()
        assert release.wait(WAIT_S)
        return v * 2

    def f(lib):
        return lambda v: (v.exp() * v).sum()

    t = threading.Thread(target=lambda: fl.func.vmap(waiting)(fl.tensor(xv)))
    t.start()
    try:
        assert inside.wait(WAIT_S)
        got_grad = fl.func.grad(f(fl))(fl.tensor(xv[0])).numpy()
        got_per_row = fl.func.vmap(fl.func.grad(f(fl)))(fl.tensor(xv)).numpy()
    finally:
        release.set()
        t.join()
    np.testing.assert_allclose(got_grad, torch.func.grad(f(torch))(torch.tensor(xv[0])).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_per_row, torch.func.vmap(torch.func.grad(f(torch)))(torch.tensor(xv)).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_vmaps_of_two_threads_ending_out_of_order_put_the_kernel_runner_back():
    """Two outermost vmap calls overlap (one per thread) and the first to start ends first: while
    either runs, kernels run through the caching allocator's runner; after both, through the default."""
    from flambeau import _dispatch
    from flambeau._backends import cpu_allocator
    if cpu_allocator.kernel_runner() is None:
        pytest.skip("no caching allocator or kernel context here")
    default = _dispatch._run_quiet
    a_inside, main_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def in_a(v):
        a_inside.set()
        assert main_inside.wait(WAIT_S)
        return v * 2

    def in_main(v):
        main_inside.set()
        assert a_done.wait(WAIT_S)
        seen["runner while main's vmap runs alone"] = _dispatch._run_quiet
        return v + 1

    def thread_a():
        fl.func.vmap(in_a)(fl.ones(2, 3))
        a_done.set()
    t = threading.Thread(target=thread_a)
    t.start()
    assert a_inside.wait(WAIT_S)
    out = fl.func.vmap(in_main)(fl.ones(2, 3))
    t.join()
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2.0, np.float32))
    assert seen["runner while main's vmap runs alone"] is cpu_allocator.kernel_runner()
    assert _dispatch._run_quiet is default


def test_per_thread_state_changes_only_through_state_functions():
    """The mode stack and autocast map change only through `_state`'s functions, which keep the
    hot paths' `interposed` count; the module attributes they replaced are gone."""
    import pathlib
    import re
    pkg = pathlib.Path(fl.__file__).parent
    direct = re.compile(r"\btls\.(modes|autocast)\s*=[^=]")
    removed = re.compile(r"\b_state\.(grad_enabled|inference_mode|fwd_grad_enabled|modes|autocast|default_device)\b")
    bad = [f"{p.relative_to(pkg)}:{i}" for p in pkg.rglob("*.py") if p.name != "_state.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if direct.search(line) or removed.search(line)]
    assert not bad
