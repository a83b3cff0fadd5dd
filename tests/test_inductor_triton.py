"""The Triton backend of the code generator (flambeau/_inductor/codegen_triton.py, triton_runtime.py)
without a GPU: `config.backend = "triton"` makes graphs on cpu tensors generate Triton kernels, run
by Triton's interpreter (TRITON_INTERPRET=1, set here before Triton is first imported; on a machine
with cuda these tests skip, the cuda run covers the backend there).

- a slice of the op database's compile tests through the backend vs eager, with no eager fallback
  and kernels launched; the same with dynamic=True (one kernel serves every size);
- bfloat16 loads/stores with float32 compute vs PyTorch; strided, transposed and broadcast inputs;
- the generated code (FLAMBEAU_LOGS=output_code), the on-disk cache, an index out of range;
- every kernel of tests/scripts/triton_sm90_compile.py compiles with `triton.compile` for sm_90
  (the interpreter accepts code the GPU compiler rejects).
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch

import flambeau as fl

if not fl.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("no GPU and TRITON_INTERPRET is not 1: tests/conftest.py sets it before Triton is imported")
triton = pytest.importorskip("triton")

from flambeau._inductor import config, triton_runtime  # noqa: E402
from flambeau._device import CPU  # noqa: E402
from flambeau._dynamo.testing import no_unexpected_fallbacks  # noqa: E402
from tests.conftest import run_sm90_compile_script, spy_compile_fx  # noqa: E402
from tests.opdb import all_opinfos, check_compiled_or_expected_failure  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F = fl.nn.functional

# Op-database entries run through the Triton backend here: pointwise ops of each kind (float, int,
# bool, helpers), reductions (inner, outer, arg, Welford-free two-pass var), fused chains (softmax,
# layer/rms norm, cross entropy), gathers and scatters, views of inputs.
SLICE = ("add", "mul", "div", "where", "sin", "sigmoid", "clamp", "pow", "remainder", "floor_divide", "maximum",
         "lerp", "bitwise_left_shift", "nan_to_num", "gcd", "isfinite", "sum", "mean", "var", "std_mean", "amax",
         "argmax", "argmin", "prod", "logsumexp", "all", "any", "softmax", "log_softmax", "layer_norm", "rms_norm",
         "cross_entropy", "gelu", "embedding", "gather", "index_select", "scatter_add", "index_put", "roll",
         "getitem_adv", "cat", "flip")
DYNAMIC_SLICE = ("add", "sum", "softmax", "layer_norm", "var", "argmax", "roll", "gather")
OPINFOS = {i.name: i for i in all_opinfos()}


# triton_backend: the fixture of tests/conftest.py


def _launches() -> int:
    return triton_runtime.stats["launches"]


@pytest.mark.parametrize("name", SLICE)
def test_opdb_through_triton(triton_backend, name):
    before = _launches()
    check_compiled_or_expected_failure(fl, OPINFOS[name], "inductor", 3)
    assert _launches() > before, f"{name}: no Triton kernel ran"


@pytest.mark.parametrize("name", DYNAMIC_SLICE)
def test_opdb_through_triton_dynamic(triton_backend, name):
    before = _launches()
    check_compiled_or_expected_failure(fl, OPINFOS[name], "inductor", 4, dynamic=True, compile_per_sample=False)
    assert _launches() > before, f"{name}: no Triton kernel ran"


def test_one_kernel_serves_every_size(triton_backend, monkeypatch):
    """dynamic=True: one compile, the sizes are kernel arguments, three sizes (persistent and
    looped rows) agree with PyTorch, nothing runs eagerly."""
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) * x.sum(0)
    made = spy_compile_fx(monkeypatch, [])
    cf = fl.compile(f, dynamic=True)
    with no_unexpected_fallbacks({}):
        for n, m in ((5, 8), (7, 300), (3, 5000)):
            rng = np.random.default_rng(n)
            x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((n, m), (m,), (m,)))
            got = cf(fl.tensor(x), fl.tensor(w), fl.tensor(b)).numpy()
            tx, tw, tb = (torch.tensor(a) for a in (x, w, b))
            want = torch.nn.functional.gelu(torch.nn.functional.layer_norm(tx, (m,), tw, tb)) * tx.sum(0)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
    assert len(made) == 1 and made[0].size_names, "one graph, its sizes symbolic"
    assert "@triton.jit" in made[0].source and "s1" in made[0].source


def test_bfloat16_loads_stores_fp32_compute(triton_backend, monkeypatch):
    def f(x, w):
        h = F.silu(x * w) + 1
        return h, F.softmax(h, -1), h.sum(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 40)).astype(np.float32)
    w = rng.standard_normal(40).astype(np.float32)
    made = spy_compile_fx(monkeypatch, [])
    with no_unexpected_fallbacks({}):
        got = fl.compile(f)(fl.tensor(x).to(fl.bfloat16), fl.tensor(w).to(fl.bfloat16))
    tx, tw = torch.tensor(x).bfloat16(), torch.tensor(w).bfloat16()
    th = torch.nn.functional.silu(tx * tw) + 1
    want = (th, torch.softmax(th, -1), th.sum(0))
    for g, t in zip(got, want):
        assert g.dtype == fl.bfloat16
        np.testing.assert_allclose(g.float().numpy(), t.float().numpy(), rtol=2e-2, atol=2e-2)
    src = made[0].source
    assert ".to(tl.float32)" in src and ".to(tl.bfloat16)" in src


def test_strided_transposed_broadcast_inputs(triton_backend):
    def f(a, b, c):
        return a * b + c, (a.t() - c[:, :1].t()).exp()
    rng = np.random.default_rng(1)
    base = rng.standard_normal((30, 50)).astype(np.float32)
    b = rng.standard_normal(25).astype(np.float32)
    c = rng.standard_normal((13, 1)).astype(np.float32)
    fa = (fl.tensor(base)[::2, 1::2][:13, :25], fl.tensor(b), fl.tensor(c))
    ta = (torch.tensor(base)[::2, 1::2][:13, :25], torch.tensor(b), torch.tensor(c))
    assert not fa[0].is_contiguous()           # a strided view, a broadcast row and column
    with no_unexpected_fallbacks({}):
        got = fl.compile(f)(*fa)
    for g, w in zip(got, f(*ta)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


def test_output_code_dump_shows_triton(triton_backend, capsys, monkeypatch):
    monkeypatch.setattr(config, "output_code", True)
    fl.compile(lambda x: (x + 1).sum(1))(fl.ones(4, 5))
    err = capsys.readouterr().err
    assert "(triton)" in err and "@triton.jit" in err and "tl.sum(" in err


def test_kernel_cache_on_disk_keyed_by_source_device_version(triton_backend, monkeypatch, tmp_path):
    from flambeau import _cpp_builder
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path))
    src = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x):\n    pass\n"
    mod, key = triton_runtime.load_module(src, CPU)
    assert os.path.dirname(mod.__file__).startswith(str(tmp_path)) and open(mod.__file__).read() == src
    assert triton_runtime.load_module(src, CPU)[1] == key
    assert triton_runtime.load_module(src + "\n", CPU)[1] != key
    monkeypatch.setattr(triton, "__version__", "0.0-other")
    assert triton_runtime.load_module(src, CPU)[1] != key


def test_index_out_of_range_raises(triton_backend):
    f = fl.compile(lambda x, i: x[i] * 2)
    x = fl.randn(5, 3)
    np.testing.assert_allclose(f(x, fl.tensor([0, 4, -1])).numpy(), (x[fl.tensor([0, 4, -1])] * 2).numpy())
    with pytest.raises(IndexError):
        f(x, fl.tensor([0, 5]))


def unsynchronised_reads(source: str) -> list:
    """Loads, in a generated kernel, of a buffer the kernel stored earlier with no barrier between:
    on the GPU another lane may have stored that element (the interpreter runs lanes in lockstep
    and cannot show the race, so the tests check the code)."""
    bad, fn, stored = [], None, set()
    for line in source.splitlines():
        if line.startswith("def "):
            fn, stored = line.split("(")[0][4:], set()
        elif "tl.debug_barrier()" in line:
            stored = set()
        for name in stored:
            if f"tl.load({name} +" in line or f"tl.load(tl.broadcast_to({name} +" in line:
                bad.append(f"{fn}: {line.strip()}")
        for pre in ("tl.store(", "tl.atomic_add(", "tl.store(tl.broadcast_to("):
            if pre in line:
                stored.add(line.split(pre, 1)[1].split(" ")[0])
    return bad


def test_no_read_of_memory_stored_by_another_lane(triton_backend, monkeypatch):
    """The kernels of a full-width GPT-2 layer's training step (bf16 autocast), with the GPU's block sizes, never
    load what an earlier statement of the same kernel stored unless a barrier separates them (seen
    on an H200 as gradients 100x off while nodes of one step read each other from memory)."""
    import sys
    sys.path.insert(0, ROOT)
    from bench import gpu_models
    monkeypatch.setattr(config, "triton_interpret_block", config.triton_block)
    made = spy_compile_fx(monkeypatch, [])
    fl.manual_seed(0)
    model = fl.compile(gpu_models.gpt(fl, vocab=512, block=32, layers=1))
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(fl.randint(0, 512, (1, 32)), fl.randint(0, 512, (1, 32)))
    loss.backward()
    assert len(made) == 2
    bad = [b for g in made for b in unsynchronised_reads(g.source)]
    assert not bad, bad


def test_generated_kernels_compile_for_sm90():
    run_sm90_compile_script("triton_sm90_compile.py")


def _gpu_launches(monkeypatch) -> list:
    """Collects, for every graph compiled from now on, {kernel name: Launch} as the code generator
    makes them for cuda (the GPU's block sizes and programs; the interpreter's launches differ)."""
    from flambeau._inductor import codegen_triton
    made, orig = [], codegen_triton.generate

    def spy(kernels, size_names=(), interpret=False):
        made.append((kernels, orig(kernels, size_names, interpret=False)[1]))
        return orig(kernels, size_names, interpret)
    monkeypatch.setattr(codegen_triton, "generate", spy)
    return made


MANY_PROGRAMS = 32       # a kernel reading a large input must spread it over at least this many programs
LARGE = 1 << 18


def _programs(grid) -> int:
    return int(np.prod(grid))


GRID_CASES = {
    "full_sum": lambda x, i, v: x.sum(),
    "full_mean_of_square": lambda x, i, v: (x * x).mean(),
    "full_all": lambda x, i, v: (x > -10).all(),
    "column_sum": lambda x, i, v: x.sum(0),
    "few_long_rows_amax": lambda x, i, v: x.t().reshape(4, -1).amax(1),
    "index_put_accumulate": lambda x, i, v: x.index_put((i,), v, accumulate=True),
    "index_put": lambda x, i, v: x.index_put((i,), v),
    "embedding_backward_like": lambda x, i, v: x.new_zeros((300, 64)).index_add(0, i, v),
}


@pytest.mark.parametrize("case", GRID_CASES)
def test_large_reductions_and_scatters_are_spread_over_programs(triton_backend, monkeypatch, case):
    """Every kernel that reads a tensor of 2^18+ elements runs, on the GPU, over many programs (a
    full reduction in one program took 445 of 498 ms of a compiled GPT-2 step on an H200): full
    and few-output reductions are split into parts (then combined), scatters run one element per
    lane. The grids are computed for the GPU's launch, the values checked in the interpreter."""
    fn = GRID_CASES[case]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((LARGE // 64, 64)).astype(np.float32)
    i = rng.integers(0, 300, LARGE // 64)
    if case == "index_put":
        i = rng.permutation(LARGE // 64)            # distinct targets: a plain store's result is defined
    v = rng.standard_normal((LARGE // 64, 64)).astype(np.float32)
    made = _gpu_launches(monkeypatch)
    with no_unexpected_fallbacks({}):
        got = fl.compile(fn)(fl.tensor(x), fl.tensor(i), fl.tensor(v))
    want = fn(torch.tensor(x), torch.tensor(i), torch.tensor(v))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)
    checked = 0
    for kernels, launches in made:
        for k in kernels:
            if max((b.layout.numel for b in k.loads + k.stores), default=0) < LARGE:
                continue
            chain, la = [], launches[k.name]
            while la is not None:
                chain.append(la.grid({}))
                la = la.then
            assert max(map(_programs, chain)) >= MANY_PROGRAMS, (case, k.name, chain)
            checked += 1
    assert checked, f"{case}: no kernel read the large input"


SPLIT_CASES = {"sum": lambda a: a.sum(), "prod": lambda a: (a * 0.01 + 1).prod(), "amax": lambda a: a.amax(),
               "amin": lambda a: a.amin(), "argmax": lambda a: a.argmax(), "argmin": lambda a: a.argmin(),
               "any": lambda a: (a > 2.5).any(), "all": lambda a: (a > -2.5).all(), "column_sum": lambda a: a.sum(0),
               "few_rows_amax": lambda a: a.reshape(2, -1).amax(1), "mean_var": lambda a: (a.mean(), a.var())}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_reductions_match_torch(triton_backend, monkeypatch, case, dynamic):
    """Split reductions (parts reduced into a workspace, then combined) at small sizes, made to
    split by lowering the thresholds: each reduction type against PyTorch, ties and NaN-free
    arg reductions keeping the first index, with dynamic sizes too (the parts then cover a size
    known at run time; only full reductions split then)."""
    monkeypatch.setattr(config, "triton_split_min", 64)
    monkeypatch.setattr(config, "triton_interpret_block", 64)
    fn = SPLIT_CASES[case]
    cf = fl.compile(fn, dynamic=dynamic)
    made = spy_compile_fx(monkeypatch, [])
    for n in ((300, 7), (500, 3)) if dynamic else ((300, 7),):
        x = np.random.default_rng(n[0]).standard_normal(n).astype(np.float32)
        x[5, 0] = x[40, 1] = x.max() + 1          # a tie for argmax: the first index wins
        x[50, 2] = x.min() - 1
        x[55, 1] = x.min()                        # and for argmin
        with no_unexpected_fallbacks({}):
            got = cf(fl.tensor(x))
        want = fn(torch.tensor(x))
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
    if dynamic and case in ("column_sum", "few_rows_amax"):
        return                        # (with symbolic sizes only full reductions split)
    assert made and all("_final(" in g.source for g in made), "no split reduction was generated"


def _compiled_step_vs_torch(monkeypatch, fn, values, gy) -> list:
    """fn(lib, *tensors) compiled, forward and backward with output gradient `gy`: output and input
    gradients against PyTorch; returns the compiled graphs."""
    made = spy_compile_fx(monkeypatch, [])
    ins = [fl.tensor(v, requires_grad=True) for v in values]
    with no_unexpected_fallbacks({}):
        out = fl.compile(lambda *a: fn(fl, *a))(*ins)
        out.backward(fl.tensor(gy))
    tins = [torch.tensor(v, requires_grad=True) for v in values]
    want = fn(torch, *tins)
    want.backward(torch.tensor(gy))
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for g, t in zip(ins, tins):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
    return made


def test_batchnorm_sums_split_as_one_kernel_pair(triton_backend, monkeypatch):
    """BatchNorm in training over (N, C, H, W): its backward's per-channel sums (sum(dy), sum(dy * x_hat),
    independent reductions over the same N*H*W elements, fused in one kernel) have C outputs, too few
    programs for a GPU: they are split together (one partials kernel for both, a final kernel that also
    runs the pointwise steps after them; ResNet-50: 64 programs looping over 800K elements, 2.2 ms).
    Values and gradients against PyTorch, and a split of two or more reductions in one kernel."""
    monkeypatch.setattr(config, "triton_split_min", 64)
    monkeypatch.setattr(config, "triton_interpret_block", 16)
    monkeypatch.setattr(config, "triton_interpret_split_programs", 16)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal(3).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    gy = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)

    def fn(lib, x, w, b):
        return lib.nn.functional.relu(lib.nn.functional.batch_norm(x, None, None, w, b, training=True))
    made = _compiled_step_vs_torch(monkeypatch, fn, (x, w, b), gy)
    assert made, "nothing compiled"
    assert any("ws1_v" in g.source and "_final(" in g.source for g in made), "no kernel split two reductions"


@pytest.mark.parametrize("form", ["persistent", "looped", "split"])
def test_independent_reductions_share_one_loop(triton_backend, monkeypatch, form):
    """BatchNorm's backward reduces dy and dy * x_hat (and scaled forms) over the same N*H*W elements per
    channel: reductions of one kernel over the same inner elements, none reading another, run in one loop
    (one r index), loading each operand once for all of them (ResNet-50 channels-last on the H100: four
    loops re-reading three activations took 0.67 ms in one kernel). Persistent, looped and split kernels;
    values and gradients against PyTorch."""
    if form == "looped":
        monkeypatch.setattr(config, "triton_persistent_limit", 16)
        monkeypatch.setattr(config, "triton_loop_block", 16)
        monkeypatch.setattr(config, "triton_column_block", (4, 16))
    if form == "split":
        monkeypatch.setattr(config, "triton_split_min", 64)
        monkeypatch.setattr(config, "triton_interpret_block", 16)
        monkeypatch.setattr(config, "triton_interpret_split_programs", 16)
    rng = np.random.default_rng(4)
    x, gy = (rng.standard_normal((3, 4, 6, 5)).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))

    def fn(lib, x, w, b):
        return lib.nn.functional.batch_norm(lib.nn.functional.relu(x), None, None, w, b, training=True)
    made = _compiled_step_vs_torch(monkeypatch, fn, (x, w, b), gy)
    shared = []                       # kernels with two or more accumulators fed under one r index
    for k in (k for g in made for k in g.source.split("@triton.jit")):
        per_r: dict = {}
        for acc, r in re.findall(r"(acc\d+) = .*?r(\d+)mask", k):
            per_r.setdefault(r, set()).add(acc)
        if any(len(accs) >= 2 for accs in per_r.values()):
            shared.append(k)
    assert shared, "independent reductions over the same elements were given separate loops"
    kernels = shared
    if form == "looped":
        assert any("for r0offset" in k for k in kernels), "the looped form was not generated"
    if form == "split":
        assert any("rpart" in k for k in kernels), "the split form was not generated"


def test_misaligned_products_are_padded_where_their_operands_are_made(triton_backend, monkeypatch):
    """GPT-2's lm_head and loss under bfloat16 autocast at a small size (vocabulary 37, off the 8
    bfloat16 elements cuBLASLt's fast kernels need): every product computes on padded operands
    (pad_mm.py: 37 -> 40); the weight's bfloat16 cast is stored once, padded, and saved for the
    backward as a slice of it; the logits gradient is stored padded by the kernel that computes it
    and read by both backward products. Loss and gradients against PyTorch."""
    from flambeau._inductor import pad_mm
    monkeypatch.setattr(pad_mm, "PAD_MIN_MACS", 1)
    rng = np.random.default_rng(5)
    h, w = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((37, 24)).astype(np.float32)
    t = rng.integers(0, 37, 16)

    def fn(lib, h, w, t):
        with lib.autocast(device_type="cpu", dtype=lib.bfloat16):
            return lib.nn.functional.cross_entropy(h.to(lib.bfloat16) @ w.t(), t)
    made = spy_compile_fx(monkeypatch, [])
    fh, fw = (fl.tensor(v, requires_grad=True) for v in (h, w))
    with no_unexpected_fallbacks({}):
        loss = fl.compile(lambda *a: fn(fl, *a))(fh, fw, fl.tensor(t))
        loss.backward()
    th, tw = (torch.tensor(v, requires_grad=True) for v in (h, w))
    want = fn(torch, th, tw, torch.tensor(t))
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-2)
    for g, e in ((fh, th), (fw, tw)):
        np.testing.assert_allclose(g.grad.numpy(), e.grad.numpy(), rtol=2e-2, atol=2e-2)
    shapes = [[tuple(e.layout.shape) for e in g.artifact.externs] for g in made]
    # the weight's gradient is one product in the weight's own (40, 24) layout (matmul's backward
    # writes a transposed operand's gradient in that operand's layout, as PyTorch's)
    assert shapes == [[(16, 40)], [(16, 24), (40, 24)]], shapes
    stored = [[b.layout.numel for k in g.artifact.kernels for b in k.stores] for g in made]
    assert 37 * 24 not in stored[0] and 40 * 24 in stored[0], stored
    assert stored[1].count(16 * 40) == 1, stored


def test_softmax_backward_stores_no_full_size_exp(triton_backend, monkeypatch):
    """A transcendental with several users is recomputed, not stored, by the Triton generator (memory,
    not arithmetic, bounds a GPU kernel): a cross-entropy backward over (N, C) logits writes only its
    (N, C) gradient, no float32 exp(x - max) beside it (GPT-2: 1.65 GB, 2.3 ms of a step)."""
    made = spy_compile_fx(monkeypatch, [])
    x = fl.randn(6, 300, requires_grad=True)
    t = fl.randint(0, 300, (6,))
    fl.compile(lambda a, b: fl.nn.functional.cross_entropy(a, b))(x, t).backward()
    torch_x = torch.from_numpy(x.detach().numpy()).requires_grad_()
    torch.nn.functional.cross_entropy(torch_x, torch.from_numpy(t.numpy())).backward()
    torch.testing.assert_close(torch.from_numpy(x.grad.numpy()), torch_x.grad)
    backward = made[-1]
    full = [b.name for k in backward.artifact.kernels for b in k.stores if b.layout.numel == x.numel()]
    assert len(full) == 1, full


def _colmajor_double(x: fl.Tensor) -> fl.Tensor:
    return (x * 2).t().contiguous().t()          # 2x, laid out column-major (as attention's (B, L, H, E) outputs)


fl.library.custom_op("inductortriton::colmajor_double", _colmajor_double, mutates_args=())
fl.library.register_fake("inductortriton::colmajor_double", lambda x: fl.empty(x.shape[::-1]).t())
fl.library.custom_op("inductortriton::colmajor_double_says_rowmajor", _colmajor_double, mutates_args=())
fl.library.register_fake("inductortriton::colmajor_double_says_rowmajor", lambda x: fl.empty_like(x))


from flambeau._ops.views import preserved_strides  # noqa: E402


def _double_in_input_order(x: fl.Tensor) -> fl.Tensor:
    return x * 2                                  # NumPy keeps the input's order of strides (as empty_like)


fl.library.custom_op("inductortriton::double_in_input_order", _double_in_input_order, mutates_args=())
fl.library.register_fake("inductortriton::double_in_input_order",
                         lambda x: fl.empty_strided(x.shape, preserved_strides(x.shape, x.stride()), device=x.device))


@pytest.mark.parametrize("op, copies", [("colmajor_double", 0), ("colmajor_double_says_rowmajor", 1)])
def test_extern_outputs_are_read_in_the_layout_their_fake_gives(triton_backend, op, copies):
    """An extern's output is taken in the dense layout its fake (meta) function gives: a kernel reads
    a column-major output in place, no copy; an output laid out otherwise than its fake says is copied
    into the layout the graph assumed. Values equal PyTorch's either way."""
    from flambeau._inductor import wrapper
    fn = getattr(fl.ops.inductortriton, op)

    def f(x):
        y = fn(x)
        return y.t() + 1, (y * y).sum(0)        # the transpose of a column-major buffer is a contiguous view
    x = np.random.default_rng(3).standard_normal((6, 9)).astype(np.float32)
    cf = fl.compile(f)
    cf(fl.tensor(x))
    before = wrapper.stats["extern_output_copies"]
    with no_unexpected_fallbacks({}):
        got = cf(fl.tensor(x))
    assert wrapper.stats["extern_output_copies"] - before == copies
    tx = torch.tensor(x) * 2
    for g, w in zip(got, (tx.t() + 1, (tx * tx).sum(0))):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


def test_extern_output_in_an_unexpected_layout_is_conformed():
    """`wrapper.conform`: an array already in the layout passes through; one in another is copied into it."""
    from flambeau._inductor.ir import Layout
    from flambeau._inductor.wrapper import conform
    lay = Layout((4, 3, 5), fl.float32, (5, 20, 1))           # dims 0 and 1 swapped in memory
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5).transpose(1, 0, 2)
    assert conform(lay)(a) is a
    b = np.ascontiguousarray(a)
    c = conform(lay)(b)
    assert c.strides == (20, 80, 4) and np.array_equal(c, b)
    assert conform(Layout((4, 3, 5), fl.float32))(b) is b


@pytest.mark.parametrize("realised", [False, True])
def test_extern_output_layout_follows_its_inputs_as_laid_out_in_the_graph(triton_backend, realised):
    """An extern whose output follows its input's layout (attention's out and gradients, here a custom
    op): fed a transposed view it returns a transposed buffer, read in place; fed a value the trace saw
    transposed (a.t() + 1 keeps its input's strides) but the graph computes into a fresh contiguous
    buffer, it returns a contiguous one, and that is the layout assumed: no copy either way (the
    layout from the trace's fake strides copied the second)."""
    from flambeau._inductor import wrapper
    op = fl.ops.inductortriton.double_in_input_order

    def f(a):
        y = op(a.t() + 1 if realised else a.t())
        return y + 1, y.sum(0)
    x = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
    cf = fl.compile(f)
    cf(fl.tensor(x))
    before = wrapper.stats["extern_output_copies"]
    with no_unexpected_fallbacks({}):
        got = cf(fl.tensor(x))
    assert wrapper.stats["extern_output_copies"] == before
    ty = (torch.tensor(x).t() + (1 if realised else 0)) * 2
    for g, w in zip(got, (ty + 1, ty.sum(0))):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


def test_a_whole_buffer_view_output_is_allocated_in_its_shape(triton_backend, monkeypatch):
    """A batch norm's training statistics, computed as (1, C, 1, 1) buffers and returned as (C,) views (the
    saved mean and inverse std of the forward; the weight and bias gradients of the backward), are allocated
    by the Triton wrapper in the (C,) shape and returned as they are: no view made per call
    (`WrapperCodegen._allocate_in_output_shape`). A view of part of a buffer, or of a buffer returned
    itself too, is still made. Values and shapes are PyTorch's."""
    made = spy_compile_fx(monkeypatch, [])
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((4, 3, 5, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32), \
        rng.standard_normal(3).astype(np.float32)

    def f(T, x, w, b):
        s = (x * 2).sum((0, 2, 3), keepdim=True)
        q = (x * x).sum((0, 2, 3), keepdim=True)
        return s.view(-1) + w, q.view(-1), s[:, :2].reshape(-1), q.flatten() * b
    got = fl.compile(lambda *a: f(fl, *a))(*(fl.tensor(a) for a in (x, w, b)))
    ref = f(torch, *(torch.from_numpy(a) for a in (x, w, b)))
    for g, r in zip(got, ref):
        assert tuple(g.shape) == tuple(r.shape)
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)
    src = made[-1].artifact.wrapper_source
    ret = src[src.index("return ("):]
    assert made[-1].artifact.backend == "triton" and ret.count("_layout_") == 1, src   # s[:, :2]'s view only
    assert re.search(r"= _empty\(\(3,\), ", src), src


def test_output_tensors_get_their_dtype_from_the_wrapper(monkeypatch):
    """The wrapper hands `Tensor._make` the dtype of each output a kernel stores (`_known_dtype`), bool,
    int64, bfloat16 and float32 ones and a view of one; the outputs' dtypes and values are PyTorch's."""
    made = spy_compile_fx(monkeypatch, [])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)

    def f(T, x):
        y = x * 3
        return x > 0, (x * 4).to(T.int64) * 2, (x + 1).to(T.bfloat16), y, y.t()
    got = fl.compile(lambda x: f(fl, x))(fl.tensor(x))
    ref = f(torch, torch.from_numpy(x))
    for g, r in zip(got, ref):
        assert str(g.dtype) == str(r.dtype) and g.shape == r.shape
        np.testing.assert_allclose(g.float().numpy(), r.float().numpy(), rtol=1e-6)
    src = made[-1].artifact.wrapper_source
    assert all(f"_fl_{n}" in src for n in ("bool", "int64", "bfloat16", "float32")), src


def _mlp_step(m, combos_model, x):
    with m.autocast(device_type="cpu", dtype=m.bfloat16):
        y = combos_model(x)
    loss = y.float().square().mean()
    loss.backward()
    return loss


def test_independent_pointwise_kernels_launch_as_one_combo(triton_backend, monkeypatch):
    """Under autocast each weight of a block (three shapes) is cast to bfloat16 by its own flat kernel, and in
    backward each weight gradient back to float32: with `triton_combo_kernels` the forward's casts (reading
    graph inputs only) launch as one ComboKernel, and so do the backward's gradient casts (graph outputs
    only); losses and gradients equal those without combos bit for bit (both runs in this test), and
    PyTorch's to bfloat16 rounding; fewer launches."""
    from flambeau._inductor.triton_schedule import ComboKernel
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 24),
                              torch.nn.Linear(24, 8))
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    want = _mlp_step(torch, ref, torch.tensor(x))
    results = {}
    for combos in (True, False):
        monkeypatch.setattr(config, "triton_combo_kernels", combos)
        fl._dynamo.reset()
        made = spy_compile_fx(monkeypatch, [])
        model = fl.nn.Sequential(fl.nn.Linear(16, 48), fl.nn.GELU(), fl.nn.Linear(48, 24), fl.nn.Linear(24, 8))
        model.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
        before = _launches()
        loss = _mlp_step(fl, fl.compile(model), fl.tensor(x))
        launches = _launches() - before
        np.testing.assert_allclose(float(loss.detach()), float(want.detach()), rtol=5e-2)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-1, atol=5e-3, err_msg=name)
        combo = [k for g in made for k in g.artifact.kernels if isinstance(k, ComboKernel)]
        if combos:
            assert len(combo) == 2 and all(len(k.members) >= 3 for k in combo), [len(k.members) for k in combo]
        else:
            assert not combo
        results[combos] = (float(loss.detach()), [p.grad.numpy().copy() for p in model.parameters()], launches)
    on, off = results[True], results[False]
    assert on[0] == off[0]
    for a, b in zip(on[1], off[1]):
        np.testing.assert_array_equal(a, b)
    assert on[2] < off[2] - 4, (on[2], off[2])
