"""Triton matrix-product templates with fused epilogues (`flambeau._inductor.mm_template`, mode="max-autotune").

Without a GPU: graphs on cpu tensors with the Triton backend (`triton_backend`, Triton's interpreter) compiled
under mode="max-autotune", whose products become templates (the interpreter runs the first configuration,
here small blocks so that a product spans many programs and the grouped ordering, the row/column clamps and
the masked K tail all run) against float64 PyTorch; the extern choice (the eager product, then the epilogue
kernel alone); the choice between configurations and the extern with a fake timer (the fastest wins, a second
"process" reads the disk cache, a capture never times). GPU checks: tests/test_mm_template_cuda.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._inductor import mm_template
from flambeau._inductor.mm_template import Config
from tests.conftest import run_sm90_compile_script, spy_compile_fx

F = fl.nn.functional
TF = torch.nn.functional
SMALL = (Config(16, 32, 16, 2, 4, 1), Config(32, 16, 32, 4, 4, 1))
TOL = {fl.float32: (1e-5, 1e-5), fl.bfloat16: (1.6e-2, 1e-2), fl.float16: (2e-3, 2e-3)}


@pytest.fixture
def small_blocks(triton_backend, monkeypatch):
    monkeypatch.setattr(mm_template, "CONFIGS", SMALL)
    return triton_backend


def _mk(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _compiled_vs_torch(fn, tfn, shapes, dtype=fl.float32, mode="max-autotune"):
    """(flambeau's compiled result as float64, PyTorch's float64 result, template stats deltas)."""
    xs = [_mk(s, i) for i, s in enumerate(shapes)]
    fx = [fl.tensor(x).to(dtype) for x in xs]
    lowp = {fl.bfloat16: torch.bfloat16, fl.float16: torch.float16}
    tx = [torch.tensor(x).to(lowp.get(dtype, torch.float32)).double() for x in xs]
    before = dict(mm_template.stats)
    out = fl.compile(fn, mode=mode)(*fx)
    got = out.to(fl.float64).numpy()
    return got, tfn(*tx).numpy(), {k: mm_template.stats[k] - before[k] for k in before}, out.dtype


def _close(got, ref, dtype):
    rtol, atol = TOL[dtype]
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * scale)


# (name, flambeau fn, torch fn, shapes): products with and without epilogues, transposed operands,
# sizes that are no multiple of the blocks (M 37, N 29/45, K 45/20 against 16/32 blocks)
CASES = [
    ("mm", lambda a, b: a @ b, lambda a, b: a @ b, [(37, 45), (45, 29)]),
    ("mm_transposed", lambda a, b: a.t() @ b.t(), lambda a, b: a.t() @ b.t(), [(45, 37), (29, 45)]),
    ("linear_bias", lambda x, w, b: F.linear(x, w, b), lambda x, w, b: TF.linear(x, w, b),
     [(37, 45), (29, 45), (29,)]),
    ("bias_relu", lambda x, w, b: fl.relu(F.linear(x, w, b)), lambda x, w, b: torch.relu(TF.linear(x, w, b)),
     [(37, 45), (29, 45), (29,)]),
    ("bias_gelu_residual", lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r,
     lambda x, w, b, r: TF.gelu(TF.linear(x, w, b)) + r, [(37, 45), (29, 45), (29,), (37, 29)]),
    ("two_products_one_epilogue", lambda x, w, y, v: fl.relu(x @ w + y @ v),
     lambda x, w, y, v: torch.relu(x @ w + y @ v), [(37, 30), (30, 45), (37, 20), (20, 45)]),
    ("silu_3d", lambda x, w: F.silu(x @ w), lambda x, w: TF.silu(x @ w), [(2, 19, 20), (20, 33)]),
    ("bmm_tanh_gelu", lambda a, b: F.gelu(fl.bmm(a, b), approximate="tanh"),
     lambda a, b: TF.gelu(torch.bmm(a, b), approximate="tanh"), [(3, 37, 20), (3, 20, 33)]),
]


@pytest.mark.parametrize("dtype", [fl.float32, fl.bfloat16, fl.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("name,fn,tfn,shapes", CASES, ids=[c[0] for c in CASES])
def test_template_matches_float64(small_blocks, name, fn, tfn, shapes, dtype):
    got, ref, d, _ = _compiled_vs_torch(fn, tfn, shapes, dtype)
    _close(got, ref, dtype)
    assert d["template_calls"] == (2 if name == "two_products_one_epilogue" else 1) and d["extern_calls"] == 0
    assert d["fused_epilogues"] == (0 if name in ("mm", "mm_transposed") else 1)


def test_epilogue_casts_to_the_output_dtype(small_blocks):
    got, ref, d, dt = _compiled_vs_torch(lambda x, w: F.silu(x @ w).to(fl.bfloat16),
                                         lambda x, w: TF.silu(x @ w).to(torch.bfloat16).double(),
                                         [(37, 45), (45, 29)])
    assert dt is fl.bfloat16 and d["fused_epilogues"] == 1 and d["template_calls"] == 1
    _close(got, ref, fl.bfloat16)


def test_outside_max_autotune_nothing_changes(small_blocks):
    got, ref, d, _ = _compiled_vs_torch(lambda x, w, b: fl.relu(F.linear(x, w, b)),
                                        lambda x, w, b: torch.relu(TF.linear(x, w, b)),
                                        [(37, 45), (29, 45), (29,)], mode=None)
    _close(got, ref, fl.float32)
    assert d == {k: 0 for k in d}


def _choices_of(compiled) -> list:
    return [v for v in compiled.artifact.call.__globals__.values() if isinstance(v, mm_template.TemplateChoice)]


def test_the_extern_choice_runs_the_product_then_the_epilogue_alone(small_blocks, monkeypatch):
    """The extern choice (what cuBLASLt + the epilogue kernel do on cuda): the eager product, then the
    epilogue printed as its own kernel, gives the template's result; so does a product without epilogue
    (an output of the graph)."""
    made = spy_compile_fx(monkeypatch, [])
    xs = [fl.tensor(_mk(s, i)) for i, s in enumerate([(37, 45), (29, 45), (29,), (37, 29)])]

    def f(x, w, b, r):
        return F.gelu(F.linear(x, w, b)) + r, x @ w.t()
    cf = fl.compile(f, mode="max-autotune")
    first = [o.numpy() for o in cf(*xs)]
    (graph,) = made
    choices = _choices_of(graph)
    assert sorted(c.epilogue is None for c in choices) == [False, True]
    assert all(c.choice == 0 for c in choices)         # the interpreter: the first configuration
    for c in choices:
        c.choice = len(c.templates)
    before = dict(mm_template.stats)
    again = [o.numpy() for o in cf(*xs)]
    assert mm_template.stats["extern_calls"] - before["extern_calls"] == 2
    assert mm_template.stats["template_calls"] == before["template_calls"]
    tx = [torch.tensor(x.numpy()).double() for x in xs]
    refs = [(TF.gelu(TF.linear(*tx[:3])) + tx[3]).numpy(), (tx[0] @ tx[1].t()).numpy()]
    for a, b, r in zip(first, again, refs):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b, r, rtol=1e-5, atol=1e-5)


def test_compiled_mlp_training_under_max_autotune(small_blocks):
    """A model's forward and backward under mode="max-autotune": every product a template (the forward's
    with their bias/GELU/residual epilogues), the loss and gradients PyTorch's."""
    fl.manual_seed(0)
    m = fl.nn.Sequential(fl.nn.Linear(24, 40), fl.nn.GELU(), fl.nn.Linear(40, 24))
    tm = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 24))
    with torch.no_grad():
        for p, q in zip(m.parameters(), tm.parameters()):
            q.copy_(torch.tensor(p.detach().numpy()))
    x = _mk((33, 24), 7)

    def step(model, x):
        y = model(x) + x
        return (y * y).mean()
    before = dict(mm_template.stats)
    loss = fl.compile(step, mode="max-autotune")(m, fl.tensor(x))
    loss.backward()
    tloss = step(tm, torch.tensor(x))
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    for p, q in zip(m.parameters(), tm.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert mm_template.stats["fused_epilogues"] - before["fused_epilogues"] >= 2
    assert mm_template.stats["template_calls"] - before["template_calls"] >= 5     # 2 forward, 3 backward


# ---- the choice ------------------------------------------------------------------------------------
def _write(path, text):
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_the_fastest_choice_is_kept_and_read_back_from_disk(tmp_path):
    times = [3.0, 1.5, 2.0]                      # configs 0, 1 and the extern (last)
    ran = []

    def timer(fn):
        fn()
        return times[ran[-1]]
    path = mm_template.cache_path(str(tmp_path), "key", "kernel0", "sm90")
    assert mm_template.select(3, ran.append, timer, path, False, _write) == 1
    assert sorted(set(ran)) == [0, 1, 2]

    def never(fn):
        raise AssertionError("timed although the choice is on disk")
    assert mm_template.select(3, ran.append, never, path, False, _write) == 1     # a second process
    other = mm_template.cache_path(str(tmp_path), "key", "kernel1", "sm90")
    times[:] = [3.0, 2.5, 1.0]
    assert mm_template.select(3, ran.append, timer, other, False, _write) == 2    # the extern wins


def test_a_capture_never_times(tmp_path):
    def never(fn):
        raise AssertionError("timed while capturing")
    path = mm_template.cache_path(str(tmp_path), "key", "kernel0", "sm90")
    assert mm_template.select(3, lambda i: None, never, path, True, _write) is None
    assert not (tmp_path / "autotune").exists()
    _write(path, '{"choice": 0}')
    assert mm_template.select(3, lambda i: None, never, path, True, _write) == 0


def test_template_choice_takes_the_extern_while_nothing_is_known():
    """`choose` returning None (capturing, nothing cached): that call runs the extern and nothing is kept;
    a later call chooses and keeps its choice."""
    calls = []
    templates = [lambda *a: calls.append("t0"), lambda *a: calls.append("t1")]
    answers = [None, 1]
    tc = mm_template.TemplateChoice.__new__(mm_template.TemplateChoice)
    tc.store_product, tc.templates, tc.epilogue, tc.n_loads = False, templates, None, 2
    tc.product = lambda arrays, out: calls.append(("extern", arrays, out))
    tc.choose, tc.choice = (lambda self, args: answers.pop(0)), None
    tc("A", "B", "C")
    assert calls == [("extern", ("A", "B"), "C")] and tc.choice is None
    tc("A", "B", "C")
    tc("A", "B", "C")
    assert calls[1:] == ["t1", "t1"] and tc.choice == 1 and answers == []


def test_a_configuration_that_fails_is_skipped(tmp_path):
    def timer(fn):
        i = fn()
        if i == 0:
            raise RuntimeError("out of shared memory")
        return {1: 4.0, 2: 3.0}[i]
    path = mm_template.cache_path(str(tmp_path), "key", "kernel0", "sm90")
    assert mm_template.select(3, lambda i: i, timer, path, False, _write) == 2

    def extern_fails(fn):
        if fn() == 2:
            raise RuntimeError("the extern fails")
        return 1.0
    with pytest.raises(RuntimeError, match="the extern fails"):
        mm_template.select(3, lambda i: i, extern_fails, str(tmp_path / "other.json"), False, _write)


def test_a_call_whose_store_is_a_load_is_not_repeated():
    a, b, c = np.zeros(4), np.zeros(4), np.zeros(4)
    assert mm_template.aliases_inputs((a, b, a), 2) and not mm_template.aliases_inputs((a, b, c), 2)


def test_a_dynamic_graph_keeps_its_externs(small_blocks):
    """A graph with symbolic sizes: its kernels take the sizes, a template none; a product of two parameters
    (static sizes) in it stays the extern."""
    class M(fl.nn.Module):
        def __init__(self):
            super().__init__()
            self.u = fl.nn.Parameter(fl.tensor(_mk((12, 16), 1)))
            self.v = fl.nn.Parameter(fl.tensor(_mk((16, 7), 2)))

        def forward(self, x):
            return x @ fl.relu(self.u @ self.v)
    m = M()
    before = dict(mm_template.stats)
    cf = fl.compile(m, mode="max-autotune", dynamic=True)
    ref = np.maximum(m.u.detach().numpy() @ m.v.detach().numpy(), 0)
    with fl.no_grad():
        for n in (5, 9):
            x = _mk((n, 12), n)
            np.testing.assert_allclose(cf(fl.tensor(x)).numpy(), x @ ref, rtol=1e-5, atol=1e-5)
    assert mm_template.stats["template_calls"] == before["template_calls"]


def test_templates_compile_for_sm90():
    """Every configuration of the templates (and each epilogue alone) compiles with `triton.compile` for
    sm_90 (tests/scripts/mm_template_sm90_compile.py, without the interpreter, in a subprocess)."""
    run_sm90_compile_script("mm_template_sm90_compile.py")


def test_an_operand_is_never_written_in_place(small_blocks):
    """x.copy_(relu(x @ w)) under max-autotune-no-cudagraphs (inputs written in place allowed): the template's
    tiles read whole rows of x, so its store must not land in x while other tiles still read it."""
    x0, w = _mk((64, 64), 1), _mk((64, 64), 2)
    x = fl.tensor(x0.copy())

    def f(x, w):
        x.copy_(fl.relu(x @ w))
        return x.sum()
    before = dict(mm_template.stats)
    fl.compile(f, mode="max-autotune-no-cudagraphs")(x, fl.tensor(w))
    np.testing.assert_allclose(x.numpy(), np.maximum(x0 @ w, 0), rtol=1e-5, atol=1e-4)
    assert mm_template.stats["fused_epilogues"] - before["fused_epilogues"] == 1


class _Arr:
    """A device array as the choice reads it: its pointer."""

    def __init__(self, ptr):
        self.data = type("Mem", (), {"ptr": ptr})()


class _FakeGpu:
    """What `mm_template.launcher` uses of triton_runtime and CuPy on cuda: a Launcher per configuration
    recording its calls, CUDA events whose elapsed time is that of the candidate run last, a capture flag."""

    def __init__(self, tmp_path, times):
        self.times, self.ran, self.capturing, self.dir = times, [], False, str(tmp_path)
        gpu = self

        class Launcher:
            def __init__(self, module, la, device):
                self.launch, self.error_flag, self.kernel_key = la, False, "key"

            def __call__(self, *args):
                gpu.ran.append(self.launch)

            def build(self):
                gpu.ran.append("build " + self.launch)

        class Event:
            def record(self, stream=None):
                pass

            def synchronize(self):
                pass

        class Stream:
            def is_capturing(self):
                return gpu.capturing

        class Cuda:
            def get_current_stream(self):
                return Stream()

            def get_elapsed_time(self, a, b):
                return gpu.times[gpu.ran[-1]] * mm_template.TIMED_LAUNCHES
        Cuda.Event = Event
        self.Launcher, self.cupy = Launcher, type("Cupy", (), {"cuda": Cuda()})()

    def _cupy(self):
        return self.cupy

    def cache_dir(self):
        return self.dir

    def device_key(self, device):
        return "sm90"

    def _write_atomic(self, path, text):
        _write(path, text)


class _Cuda:
    type = "cuda"


def test_the_choice_on_a_fake_gpu(tmp_path, monkeypatch):
    """`launcher`'s cuda path: a call while capturing runs the extern and keeps nothing; the next call builds every
    configuration, then times each and the extern and keeps the fastest (the other Launchers dropped); a fresh
    launcher (another process) reads it from disk; a call whose output is one of its inputs takes the extern
    without timing."""
    tk = type("TK", (), {"name": "kernel0", "loads": ["a", "b"], "epilogue": None, "store_product": True})()
    gpu = _FakeGpu(tmp_path, {"c0": 3.0, "c1": 1.0, "c2": 2.0, "extern": 1.5})
    monkeypatch.setattr(mm_template, "extern_product",
                        lambda tk, device: lambda arrays, out: gpu.ran.append("extern"))
    launches = {"kernel0": ["c0", "c1", "c2"]}
    args = (_Arr(0), _Arr(256), _Arr(512))
    choice = mm_template.launcher(gpu, None, tk, launches, _Cuda())
    gpu.capturing = True
    choice(*args)
    assert gpu.ran == ["extern"] and choice.choice is None and not (tmp_path / "autotune").exists()
    gpu.capturing, gpu.ran = False, []
    choice(*args)
    assert choice.choice == 1 and gpu.ran[-1] == "c1"
    assert gpu.ran[:3] == ["build c0", "build c1", "build c2"]       # every configuration built before timing
    assert sorted(set(gpu.ran[3:])) == ["c0", "c1", "c2", "extern"]
    assert choice.templates[1] is not None and choice.templates[0] is None is choice.templates[2]  # losers dropped
    gpu.ran = []
    fresh = mm_template.launcher(gpu, None, tk, launches, _Cuda())
    fresh(*args)
    assert gpu.ran == ["c1"] and fresh.choice == 1
    gpu.ran = []
    tk1 = type("TK", (), {"name": "kernel1", "loads": ["a", "b"], "epilogue": None, "store_product": True})()
    other = mm_template.launcher(gpu, None, tk1, {"kernel1": ["c0"]}, _Cuda())
    other(_Arr(0), _Arr(256), _Arr(0))
    assert gpu.ran == ["extern"]


def test_the_epilogue_indexes_the_tile_by_its_rows_and_columns(small_blocks, monkeypatch):
    """The epilogue of a bias add reads the bias at the tile's columns `rn` and stores at rows * N + columns,
    no division of a flat index (the GPU compiler then vectorises the columns); values as PyTorch's."""
    made = spy_compile_fx(monkeypatch, [])
    got, ref, d, _ = _compiled_vs_torch(lambda x, w, b: fl.relu(F.linear(x, w, b)),
                                        lambda x, w, b: torch.relu(TF.linear(x, w, b)), [(37, 45), (29, 45), (29,)])
    _close(got, ref, fl.float32)
    (src,) = [f for f in made[0].source.split("@triton.jit") if "BLOCK_M: tl.constexpr" in f]   # the template
    assert d["fused_epilogues"] == 1 and "x1 = rn[None, :]" in src and "xindex //" not in src and "xindex %" not in src


def test_a_product_that_is_also_an_output_is_stored_by_its_template(small_blocks, monkeypatch):
    """y = x @ w returned and read by relu(y + b): one template stores y and runs the epilogue (the extern
    choice writes y and runs the epilogue on it); both outputs PyTorch's."""
    made = spy_compile_fx(monkeypatch, [])
    xs = [fl.tensor(_mk(s, i)) for i, s in enumerate([(37, 45), (45, 29), (29,)])]
    tx = [torch.tensor(x.numpy()).double() for x in xs]
    refs = [(tx[0] @ tx[1]).numpy(), torch.relu(tx[0] @ tx[1] + tx[2]).numpy()]

    def f(x, w, b):
        y = x @ w
        return y, fl.relu(y + b)
    before = dict(mm_template.stats)
    cf = fl.compile(f, mode="max-autotune")
    for o, r in zip(cf(*xs), refs):
        np.testing.assert_allclose(o.numpy(), r, rtol=1e-5, atol=1e-5)
    assert {k: mm_template.stats[k] - before[k] for k in ("template_calls", "fused_epilogues")} == \
        {"template_calls": 1, "fused_epilogues": 1}
    (choice,) = _choices_of(made[0])
    assert choice.store_product
    choice.choice = len(choice.templates)
    for o, r in zip(cf(*xs), refs):
        np.testing.assert_allclose(o.numpy(), r, rtol=1e-5, atol=1e-5)


def test_contiguity_hints_only_where_wraps_fall_on_vector_boundaries(small_blocks, monkeypatch):
    """`rm % M` is hinted contiguous (vectorised loads along M) only for M a multiple of 16: with M = 37 a
    vector of a column-major operand could straddle the wrap and read past it."""
    made = spy_compile_fx(monkeypatch, [])
    for m in (37, 64):
        a, b = _mk((45, m), m), _mk((45, 32), 1)
        out = fl.compile(lambda a, b: a.t() @ b, mode="max-autotune", dynamic=False)(fl.tensor(a), fl.tensor(b))
        np.testing.assert_allclose(out.numpy(), a.T @ b, rtol=1e-5, atol=1e-4)
    src37, src64 = (g.source for g in made)
    assert "ram = rm % 37\n" in src37 and "tl.multiple_of(rm % 64, BLOCK_M)" in src64


def test_a_template_choice_takes_arrays_never_raw_addresses():
    """The wrapper passes arena temporaries as raw addresses only to launchers that say `direct()`; a
    template's choice (the extern product views its operands) must refuse them (broken: no `direct`, or an
    `entry` without the `raw` parameter -> the cuda wrapper fails to build)."""
    from flambeau._inductor.mm_template import TemplateChoice
    choice = TemplateChoice.__new__(TemplateChoice)
    assert choice.direct() is False
    assert choice.entry(()) is choice
    with pytest.raises(ValueError):
        choice.entry((0,))


def test_a_template_choice_keeps_none_of_the_lowering(small_blocks, monkeypatch):
    """Once compiled, nothing keeps the TemplateKernel alive (its epilogue's nodes hold the graph's lowering:
    loaders and IR, which outlived the compile under max-autotune and weighed on every full collection)."""
    import gc
    import weakref
    kept = []
    real = mm_template.launcher

    def spy(rt, module, tk, launches, device):
        kept.extend((weakref.ref(tk), weakref.ref(tk.product)))
        return real(rt, module, tk, launches, device)
    monkeypatch.setattr(mm_template, "launcher", spy)
    fl._dynamo.reset()
    x, w, b = _mk((40, 24), 0), _mk((24, 16), 1), _mk((16,), 2)
    out = fl.compile(lambda x, w, b: fl.relu(x @ w + b), mode="max-autotune")(*map(fl.tensor, (x, w, b)))
    ref = TF.relu(torch.tensor(x).double() @ torch.tensor(w).double() + torch.tensor(b).double())
    torch.testing.assert_close(torch.from_numpy(out.numpy()).double(), ref, rtol=1e-5, atol=1e-5)
    gc.collect()
    assert kept and all(k() is None for k in kept)
