"""Matrix-product templates on the GPU (mode="max-autotune", flambeau/_inductor/mm_template.py; marked `cuda`:
the GPU machine runs these, CI skips them): every block configuration and the extern choice of products with
fused epilogues against float64 NumPy, the choice timed once and read back from the disk cache by a fresh
compile, and a compiled model under mode="max-autotune" (CUDA graphs) matching eager."""
from __future__ import annotations

import numpy as np
import pytest

import flambeau as fl
from flambeau._inductor import mm_template
from tests.conftest import spy_compile_fx

pytestmark = pytest.mark.cuda
F = fl.nn.functional


def _gelu64(v):
    from math import erf
    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def _inputs(shapes, dtype):
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    dev = [fl.tensor(h).to(dtype).to("cuda") for h in host]
    return dev, [d.cpu().to(fl.float64).numpy() for d in dev]


# (name, fn, float64 reference, shapes): sizes off the blocks (M 1000, N 760/600, K 200/100)
CASES = [
    ("bias_gelu_residual", lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r,
     lambda x, w, b, r: _gelu64(x @ w.T + b) + r, [(1000, 200), (760, 200), (760,), (1000, 760)]),
    ("transposed_relu", lambda a, b: fl.relu(a.t() @ b), lambda a, b: np.maximum(a.T @ b, 0), [(200, 1000), (200, 600)]),
    ("plain", lambda a, b: a @ b, lambda a, b: a @ b, [(1000, 200), (200, 600)]),
    ("bmm_silu", lambda a, b: F.silu(fl.bmm(a, b)), lambda a, b: (a @ b) / (1 + np.exp(-(a @ b))),
     [(3, 300, 100), (3, 100, 260)]),
]
TOL = {fl.float32: 1e-4, fl.bfloat16: 2e-2}


def _check(got, ref, dtype):
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got.cpu().to(fl.float64).numpy(), ref, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", [fl.float32, fl.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name,fn,ref,shapes", CASES, ids=[c[0] for c in CASES])
def test_every_choice_matches_float64_on_cuda(monkeypatch, name, fn, ref, shapes, dtype):
    # every candidate is run below, after the choice: keep the losers the choice would release
    # (tests/test_mm_template.py checks that they are released)
    monkeypatch.setattr(mm_template.TemplateChoice, "release_losers", lambda self: None)
    fl.compiler.reset()
    made = spy_compile_fx(monkeypatch, [])
    dev, host = _inputs(shapes, dtype)
    expect = ref(*host)
    before = dict(mm_template.stats)
    cf = fl.compile(fn, mode="max-autotune-no-cudagraphs")
    _check(cf(*dev), expect, dtype)
    assert mm_template.stats["tuned"] + mm_template.stats["from_disk"] > before["tuned"] + before["from_disk"]
    (choice,) = [v for v in made[-1].artifact.call.__globals__.values() if isinstance(v, mm_template.TemplateChoice)]
    assert (choice.epilogue is None) == (name == "plain")
    for i in range(len(choice.templates) + 1):      # each configuration, then the extern (cuBLASLt + epilogue)
        choice.choice = i
        _check(cf(*dev), expect, dtype)


def test_the_choice_is_read_back_by_a_fresh_compile():
    dev, host = _inputs([(1024, 768), (768, 768), (768,)], fl.bfloat16)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh")       # noqa: E731
    fl.compiler.reset()
    fl.compile(fn, mode="max-autotune-no-cudagraphs")(*dev)
    fl.compiler.reset()
    before = dict(mm_template.stats)
    fl.compile(fn, mode="max-autotune-no-cudagraphs")(*dev)
    assert mm_template.stats["tuned"] == before["tuned"] and mm_template.stats["from_disk"] == before["from_disk"] + 1


def test_max_autotune_with_cuda_graphs_matches_eager():
    """mode="max-autotune": the first call (not captured) chooses, the captured replays run the choice."""
    fl.compiler.reset()
    fl.manual_seed(0)
    m = fl.nn.Sequential(fl.nn.Linear(256, 1024), fl.nn.GELU(), fl.nn.Linear(1024, 256)).to("cuda").to(fl.bfloat16)
    x = fl.randn(512, 256, device="cuda").to(fl.bfloat16)
    before = dict(mm_template.stats)
    cm = fl.compile(m, mode="max-autotune")
    with fl.no_grad():
        want = m(x).float().cpu().numpy()
        for _ in range(3):
            np.testing.assert_allclose(cm(x).float().cpu().numpy(), want, rtol=2e-2, atol=2e-2)
    assert mm_template.stats["fused_epilogues"] - before["fused_epilogues"] >= 2
