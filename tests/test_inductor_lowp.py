"""bfloat16 and float16 in compiled CPU graphs (the C++ backend): buffers hold the 16-bit patterns,
kernels load them widened to float, compute in float and round to nearest even on store, as
PyTorch's CPU Inductor does.

Every test checks that the graph was compiled into generated kernels: no eager fallback recorded,
no fallback kernel in the graph, and the generated source converts the type (`fl_bf16_to_f32`...).
Values are compared with PyTorch: conversions bit for bit (every float16/bfloat16 pattern, and
float32 patterns around every rounding case), computations with PyTorch's bfloat16/float16
tolerances (`torch.testing.assert_close`) against PyTorch's eager result in that dtype.
"""
import numpy as np
import pytest
import torch

from bench.small_gpt import small_gpt
import flambeau as fl
from flambeau import _cpp_builder as cpp_builder
from flambeau._dynamo.testing import no_unexpected_fallbacks
from flambeau._inductor import config
from tests.conftest import spy_compile_fx

LOWP = {"bfloat16": (fl.bfloat16, torch.bfloat16), "float16": (fl.float16, torch.float16)}
WIDEN = {"bfloat16": "fl_bf16_to_f32", "float16": "fl_f16_to_f32"}
NARROW = {"bfloat16": "fl_f32_to_bf16", "float16": "fl_f32_to_f16"}


@pytest.fixture(autouse=True)
def _cpp(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(cpp_builder, "cache_dir", str(tmp_path_factory.getbasetemp() / "inductor_cache"))
    monkeypatch.setattr(config, "backend", "cpp")
    fl.compiler.reset()
    yield
    fl.compiler.reset()


@pytest.fixture
def made(monkeypatch):
    return spy_compile_fx(monkeypatch, [])


def assert_generated(made, *needles):
    """Every graph compiled to C++ kernels, none ran an op eagerly; the source holds `needles`."""
    assert made, "nothing was compiled"
    for c in made:
        assert c.artifact is not None, c.eager_reason
        assert c.artifact.backend == "cpp"
        assert not c.fallback_ops, c.fallback_ops
    src = "\n".join(c.source for c in made)
    for n in needles:
        assert n in src, n


def fl_of(t: torch.Tensor) -> fl.Tensor:
    """The flambeau tensor of a torch tensor (bfloat16/float16 through their bits)."""
    if t.dtype == torch.bfloat16:
        return fl.tensor(t.view(torch.int16).numpy()).view(fl.bfloat16)
    return fl.tensor(t.numpy())


def torch_of(x: fl.Tensor) -> torch.Tensor:
    if x.dtype == fl.bfloat16:
        return torch.from_numpy(np.array(x.view(fl.int16).numpy())).view(torch.bfloat16)
    return torch.from_numpy(np.array(x.numpy()))


def same_bits(got: torch.Tensor, want: torch.Tensor):
    """Equal bit patterns; any NaN matches any NaN (PyTorch's NaN patterns are not compared)."""
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    g, w = got[~nan], want[~nan]
    bits = torch.int16 if g.element_size() == 2 else torch.int32
    bad = (g.view(bits) != w.view(bits)).nonzero()
    assert not len(bad), [(g[i].item(), w[i].item()) for i in bad[:5, 0]]


def _float_patterns() -> torch.Tensor:
    """float32 values around every rounding case of both 16-bit formats: each 16-bit pattern's value
    and its neighbours half an ulp away (the ties) and one float ulp either side of those, the
    float16 overflow and subnormal edges, and random patterns."""
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    lo = torch.cat([h.view(torch.bfloat16).float(), h.view(torch.float16).float()])
    lo = lo[torch.isfinite(lo)]
    base = lo.view(torch.int32)
    ties = torch.cat([base + (1 << 15), base + (1 << 12)])          # halfway to the next bf16 / f16 (normal)
    sub = torch.linspace(-2.0 ** -14, 2.0 ** -14, 20001)             # float16 subnormals and their ties
    edges = torch.tensor([65504.0, 65519.996, 65520.0, 65520.004, 65536.0, 1e30, float("inf"), -float("inf"),
                          float("nan"), 2.0 ** -25, 2.0 ** -24, 3 * 2.0 ** -26, 1e-45, 0.0, -0.0])
    rnd = torch.from_numpy(np.random.default_rng(0).integers(-2 ** 31, 2 ** 31, 200000, dtype=np.int64)
                           .astype(np.int32)).view(torch.float32)
    near = torch.cat([ties - 1, ties, ties + 1]).view(torch.float32)
    return torch.cat([lo, near, sub, edges, rnd])


@pytest.mark.parametrize("name", list(LOWP))
def test_widening_every_pattern_bit_exact(name, made):
    fdt, tdt = LOWP[name]
    t = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(tdt)
    got = fl.compile(lambda x: x.float() * 1)(fl_of(t))
    same_bits(torch_of(got), t.float())
    assert_generated(made, WIDEN[name])


@pytest.mark.parametrize("name", list(LOWP))
def test_narrowing_rounds_to_nearest_even_as_pytorch(name, made):
    fdt, tdt = LOWP[name]
    x = _float_patterns()
    got = fl.compile(lambda a: (a * 1).to(fdt))(fl.tensor(x.numpy()))
    assert got.dtype == fdt
    same_bits(torch_of(got).float(), x.to(tdt).float())
    assert_generated(made, NARROW[name])


def _data(shape, seed, scale=1.0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


GRAPHS = {
    "pointwise": (lambda x, w: (torch_like(x).sigmoid(x) * w + 1).tanh() - x * 0.5, [(33, 70), (70,)]),
    "softmax": (lambda x, w: (x * w).softmax(-1), [(17, 130), (130,)]),
    "log_softmax_dim0": (lambda x, w: (x + w).log_softmax(0), [(40, 9), (9,)]),
    "layer_norm_gelu": (lambda x, w: NNF(x).gelu(NNF(x).layer_norm(x, (x.shape[-1],), w)), [(12, 96), (96,)]),
    "reductions": (lambda x, w: (x.sum(-1), x.mean(0), x.amax(1), (x * w).abs().sum(), x.argmax(-1)),
                   [(25, 48), (48,)]),
    "transposed_broadcast": (lambda x, w: x.t() * w[:, None] + x.t().exp(), [(31, 20), (20,)]),
    "where_mask": (lambda x, w: torch_like(x).where(x > w, x * 2, -w), [(8, 64), (64,)]),
}


def torch_like(x):
    """The library of `x` (flambeau or torch), so one function serves both."""
    return fl if isinstance(x, fl.Tensor) else torch


def NNF(x):
    return fl.nn.functional if isinstance(x, fl.Tensor) else torch.nn.functional


@pytest.mark.parametrize("name", list(LOWP))
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_compiled_lowp_graph_vs_pytorch_eager(graph, name, made):
    fdt, tdt = LOWP[name]
    fn, shapes = GRAPHS[graph]
    ts = [_data(s, i).to(tdt) for i, s in enumerate(shapes)]
    with no_unexpected_fallbacks():
        got = fl.compile(fn)(*[fl_of(t) for t in ts])
    want, exact = fn(*ts), fn(*[t.double() for t in ts])
    tup = lambda v: v if isinstance(v, tuple) else (v,)      # noqa: E731
    for g, w, e in zip(tup(got), tup(want), tup(exact)):
        g = torch_of(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        if not w.is_floating_point():
            assert torch.equal(g, w)
            continue
        close_as_pytorch_inductor(g, w, e)
    assert_generated(made, WIDEN[name], NARROW[name])


def close_as_pytorch_inductor(got, eager, exact):
    """PyTorch's bfloat16/float16 check of a compiled result: close to eager with the dtype's rtol and
    an atol of 1e-2 (test_torchinductor's for half precision: the compiled graph rounds once, eager
    after every op, so values that cancel differ absolutely), and at least about as accurate as eager
    against float64 (torch._dynamo.utils.same with fp64_ref: RMSE within 3x eager's)."""
    torch.testing.assert_close(got, eager, rtol=1e-3 if got.dtype == torch.float16 else 1.6e-2, atol=1e-2)
    rmse = lambda a: (a.double() - exact).square().mean().sqrt().item()      # noqa: E731
    assert rmse(got) <= 3 * rmse(eager) + 1e-4, (rmse(got), rmse(eager))


def test_float_reductions_of_lowp_accumulate_wide(made):
    """A sum of 4096 bfloat16 ones is 4096 (an accumulator in bfloat16 stalls at 256)."""
    got = fl.compile(lambda x: x.sum(), dynamic=False)(fl.ones(4096, dtype=fl.bfloat16))
    assert float(got) == 4096.0
    assert_generated(made, WIDEN["bfloat16"])


def test_scatter_add_into_bfloat16(made):
    idx = torch.tensor([0, 2, 2, 5, 0, 7])
    src = _data((6,), 3).bfloat16()
    dst = _data((8,), 4).bfloat16()
    got = fl.compile(lambda d, i, s: d.scatter_add(0, i, s))(fl_of(dst), fl.tensor(idx.numpy()), fl_of(src))
    torch.testing.assert_close(torch_of(got), dst.scatter_add(0, idx, src))
    assert_generated(made, NARROW["bfloat16"])


def char_gpt(lib, vocab=65, d=64, heads=4, layers=2, block=32):
    """A character-level GPT with the head tied to the token embedding (bench/small_gpt.py)."""
    return small_gpt(lib, vocab=vocab, d=d, heads=heads, layers=layers, block=block, tied_head=True)


def test_autocast_bfloat16_char_gpt_training_step_compiled_vs_eager(made):
    """One training step (forward, loss, backward) of a char GPT under CPU autocast(bfloat16),
    compiled: every op in generated kernels or planned externs (no fallback), the bfloat16 values
    loaded and stored as such, attention in the fused kernel; loss as eager's, and the gradients no
    farther from the float32 step's than eager autocast's are (3x, torch._dynamo.utils.same's rule)."""
    import copy
    F = fl.nn.functional
    fl.manual_seed(0)
    base = char_gpt(fl)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 65, size=(8, 33))
    x, y = fl.tensor(data[:, :-1].copy()), fl.tensor(data[:, 1:].copy())

    def step(model, compiled, autocast):
        def loss_fn(a, b):
            with fl.autocast(device_type="cpu", dtype=fl.bfloat16, enabled=autocast):
                logits = model(a)
            return F.cross_entropy(logits.float().reshape(-1, 65), b.reshape(-1))
        fn = fl.compile(loss_fn) if compiled else loss_fn
        loss = fn(x, y)
        loss.backward()
        return float(loss), np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])

    ref_loss, ref = step(copy.deepcopy(base), False, False)
    eager_loss, eager = step(copy.deepcopy(base), False, True)
    with no_unexpected_fallbacks():
        comp_loss, comp = step(copy.deepcopy(base), True, True)
    assert abs(comp_loss - eager_loss) <= 1e-2 * abs(ref_loss)
    rmse = lambda g: float(np.sqrt(np.mean((g - ref) ** 2)))     # noqa: E731
    assert rmse(comp) <= 3 * rmse(eager) + 1e-6, (rmse(comp), rmse(eager))
    assert_generated(made, WIDEN["bfloat16"], NARROW["bfloat16"])
    assert any("_sdpa_flash_cpu" in c.artifact.wrapper_source for c in made)


@pytest.mark.parametrize("name", list(LOWP))
def test_nextafter_steps_in_the_storage_dtype(name, made):
    """nextafter of bfloat16/float16 compiles into the kernel (no eager fallback) and steps one unit of
    the storage dtype, bit for bit as PyTorch: toward larger and smaller values, both signs, from and
    to zero, equal operands, infinities and NaN, the operand computed in float first."""
    fdt, tdt = LOWP[name]
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, -0.0, 3.5, 65504.0, float("inf"), float("nan"), 2.0, 1e-3,
                      -7.25]).to(tdt)
    b = torch.tensor([2.0, 0.0, 0.0, -2.0, 1.0, -1.0, 0.0, 3.5, float("inf"), 0.0, 1.0, float("nan"), -1.0,
                      -7.0]).to(tdt)
    got = fl.compile(lambda x, y: fl.nextafter(x * 1, y))(fl_of(a), fl_of(b))
    assert got.dtype == fdt
    same_bits(torch_of(got).float(), torch.nextafter(a, b).float())
    assert_generated(made, "fl_nextafter_" + ("bf16" if name == "bfloat16" else "f16"))
