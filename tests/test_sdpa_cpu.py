"""The fused CPU scaled_dot_product_attention kernel (`_sdpa_flash_cpu`, flambeau/_backends/cpu_attention.cpp):
forward and backward against the math path computed in float64 and against PyTorch (causal with
L = S, L < S and L > S, bool masks with a fully masked row, broadcast additive masks, odd lengths,
head dims 32/64/80, a value head dim other than the query's, grouped-query attention, 3-d and
broadcast batch inputs), in float32 and bfloat16; chosen by default on cpu, dropout keeping the
other paths; an extern call inside compiled graphs; its workspace O(L + S).

Every test checks that the kernel ran (its op's kernel counts calls).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau
import flambeau.nn.functional as F
from flambeau import _cpp_builder
from flambeau._backends import cpu_attention
from flambeau._dynamo.testing import no_unexpected_fallbacks
from flambeau._ops import attention as A
from flambeau._ops import attention_cpu as AC
from tests.conftest import spy_compile_fx



def _has_compiler() -> bool:
    try:
        _cpp_builder.detect_flags()
        return True
    except _cpp_builder.NoCompilerError:
        return False


# Skipped only without a compiler: where one exists, a kernel that fails to build fails these tests
# (every test checks that the kernel ran) instead of quietly skipping them.
pytestmark = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler")


def test_the_kernels_build_where_a_compiler_exists():
    assert cpu_attention.available()


@pytest.fixture
def calls(monkeypatch):
    """How many times the fused kernel's forward and backward ran."""
    n = {"forward": 0, "backward": 0}
    for op, key in ((AC._sdpa_flash_cpu, "forward"), (AC._sdpa_flash_cpu_backward, "backward")):
        orig = op.kernel

        def counting(*a, _orig=orig, _key=key, **k):
            n[_key] += 1
            return _orig(*a, **k)
        monkeypatch.setattr(op, "kernel", counting)
    return n


CASES = {
    "plain": dict(),
    "causal_square": dict(is_causal=True, L=67, S=67),
    "causal_short_q": dict(is_causal=True, L=37, S=101),
    "causal_long_q": dict(is_causal=True, L=150, S=70),
    "bool_mask": dict(mask="bool"),
    "float_mask_bcast": dict(mask="float"),
    "scale": dict(scale=0.37),
    "head_dim_32": dict(E=32, Ev=32, L=130, S=129),
    "head_dim_64": dict(E=64, Ev=64),
    "head_dim_80": dict(E=80, Ev=80, is_causal=True, L=90, S=90),
    "value_dim_differs": dict(E=24, Ev=40),
    "gqa": dict(enable_gqa=True, E=32),
    "three_d": dict(three_d=True),
    "batch_broadcast": dict(kv_batch=1),
}


def _inputs(case, dtype=np.float32, seed=0):
    cfg = dict(CASES[case])
    rng = np.random.default_rng(seed)
    B, H = 2, 4
    L, S, E, Ev = cfg.pop("L", 45), cfg.pop("S", 77), cfg.pop("E", 16), cfg.pop("Ev", None)
    Ev = Ev or E
    hk = 2 if cfg.get("enable_gqa") else H
    kb = cfg.pop("kv_batch", B)
    three = cfg.pop("three_d", False)
    q = rng.standard_normal((B, H, L, E))
    k = rng.standard_normal((kb, hk, S, E))
    v = rng.standard_normal((kb, hk, S, Ev))
    if three:
        q, k, v = q[0], k[0], v[0]
    mask = cfg.pop("mask", None)
    if mask == "bool":
        m = rng.random((B, 1, L, S)) > 0.3
        m[0, 0, 3] = False          # a fully masked row: zeros out, zero gradients
        cfg["attn_mask"] = m
    elif mask == "float":
        cfg["attn_mask"] = rng.standard_normal((L, S)).astype(dtype)
    g = rng.standard_normal(q.shape[:-1] + (Ev,))
    return [x.astype(dtype) for x in (q, k, v, g)], cfg


def _run(lib, q, k, v, g, cfg, dtype):
    """(out, dq, dk, dv) of `lib` (flambeau or torch) on these arrays."""
    if lib is torch:
        to = lambda a: torch.tensor(a) if a.dtype != np.float32 or dtype is None else torch.tensor(a).to(dtype)  # noqa: E731
    else:
        to = lambda a: flambeau.tensor(a) if dtype is None else flambeau.tensor(a).to(dtype)  # noqa: E731
    ts = [to(a).requires_grad_(True) for a in (q, k, v)]
    kw = {key: (to(val) if isinstance(val, np.ndarray) and val.dtype != bool else
                (flambeau.tensor(val) if lib is flambeau else torch.tensor(val)) if isinstance(val, np.ndarray) else val)
          for key, val in cfg.items()}
    out = lib.nn.functional.scaled_dot_product_attention(*ts, **kw)
    grads = lib.autograd.grad(out, ts, to(g))
    return [np.asarray(x.detach().float().numpy(), dtype=np.float64) for x in (out, *grads)]


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_vs_float64_math_and_pytorch(case, calls):
    (q, k, v, g), cfg = _inputs(case)
    got = _run(flambeau, q, k, v, g, cfg, None)
    assert calls == {"forward": 1, "backward": 1}
    c64 = {key: (val.astype(np.float64) if isinstance(val, np.ndarray) and val.dtype != bool else val)
           for key, val in cfg.items()}
    with A.sdpa_kernel(A.SDPBackend.MATH):       # flambeau's math path in float64: the reference
        exact = _run(flambeau, *(a.astype(np.float64) for a in (q, k, v, g)), c64, None)
    theirs = _run(torch, q, k, v, g, cfg, None)
    for name, a, e, t in zip(("out", "dq", "dk", "dv"), got, exact, theirs):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_allclose(a, t, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", ["plain", "causal_square", "bool_mask", "head_dim_64", "gqa"])
def test_bfloat16_vs_pytorch(case, calls):
    (q, k, v, g), cfg = _inputs(case)
    got = _run(flambeau, q, k, v, g, cfg, flambeau.bfloat16)
    assert calls == {"forward": 1, "backward": 1}
    theirs = _run(torch, q, k, v, g, cfg, torch.bfloat16)
    with A.sdpa_kernel(A.SDPBackend.MATH):
        rounded = [a.astype(np.float32) for a in (q, k, v, g)]
        exact = _run(torch, *(torch.tensor(a).bfloat16().double().numpy() for a in rounded), cfg, None)
    for name, a, t, e in zip(("out", "dq", "dk", "dv"), got, theirs, exact):
        # PyTorch's bfloat16 tolerance against PyTorch; no less accurate than PyTorch against float64
        np.testing.assert_allclose(a, t, rtol=1.6e-2, atol=1.6e-2, err_msg=name)
        assert np.sqrt(np.mean((a - e) ** 2)) <= 1.5 * np.sqrt(np.mean((t - e) ** 2)) + 1e-3, name


def test_dropout_and_float64_keep_the_other_paths(calls):
    x = flambeau.randn(1, 2, 8, 4)
    F.scaled_dot_product_attention(x, x, x, dropout_p=0.3)
    F.scaled_dot_product_attention(x.double(), x.double(), x.double())
    with A.sdpa_kernel(A.SDPBackend.MATH):
        F.scaled_dot_product_attention(x, x, x)
    assert calls["forward"] == 0
    F.scaled_dot_product_attention(x, x, x)
    assert calls["forward"] == 1


def test_mask_requiring_grad_keeps_the_other_paths(calls):
    x = flambeau.randn(1, 2, 8, 4)
    m = flambeau.randn(8, 8, requires_grad=True)
    F.scaled_dot_product_attention(x, x, x, attn_mask=m).sum().backward()
    assert calls["forward"] == 0 and m.grad is not None


def test_compiled_graph_calls_the_kernel_as_an_extern(calls, monkeypatch):
    made = spy_compile_fx(monkeypatch, [])
    (q, k, v, g), cfg = _inputs("causal_square")
    fq, fk, fv = (flambeau.tensor(a, requires_grad=True) for a in (q, k, v))
    fn = flambeau.compile(lambda a, b, c: F.scaled_dot_product_attention(a * 1.5, b, c, **cfg).relu())
    with no_unexpected_fallbacks():
        out = fn(fq, fk, fv)
        grads = flambeau.autograd.grad(out, (fq, fk, fv), flambeau.tensor(g))
    assert calls == {"forward": 1, "backward": 1}
    assert any("_sdpa_flash_cpu" in c.artifact.wrapper_source for c in made)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = torch.nn.functional.scaled_dot_product_attention(tq * 1.5, tk, tv, **cfg).relu()
    tgrads = torch.autograd.grad(to, (tq, tk, tv), torch.tensor(g))
    np.testing.assert_allclose(out.detach().numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    for a, b in zip(grads, tgrads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_workspace_is_linear_in_length():
    """The kernels' whole memory beyond inputs and outputs is the workspace: O(L + S), not L x S."""
    _, _, ws = cpu_attention._load()
    sizes = lambda T: np.array([1, 8, 8, T, T, 64, 64], np.int64)     # noqa: E731
    for backward in (0, 1):
        small, big = (ws(sizes(T).ctypes.data, backward, 2) for T in (2048, 8192))
        assert big <= 4.2 * small, (backward, small, big)
        assert big * 4 < 8192 * 8192 * 4 // 4, "a quarter of one head's score matrix"


def test_softmax_exponentials_are_accurate_to_float_rounding():
    """Two keys with scores 0 and x per query row (x from -87 to 20, and -inf through an additive mask):
    the kernel's logsumexp log(e^0 + e^x) and output (v0 + e^x v1) / (1 + e^x) against float64, to a
    few float32 ulps (its inline vector exp must be as accurate as expf)."""
    x = np.concatenate([np.linspace(-87.0, 20.0, 2003), [-np.inf, -0.34657, 0.34657, 0.5 * np.log(2)]])
    q = np.ones((1, 1, x.size, 1), np.float32)
    k = np.array([0.0, 1.0], np.float32).reshape(1, 1, 2, 1)
    v = np.array([[0.25, -1.0], [1.5, 2.0]], np.float32).reshape(1, 1, 2, 2)
    mask = np.zeros((1, 1, x.size, 2), np.float32)
    mask[0, 0, :, 1] = x.astype(np.float32)        # scores q.k + mask: 0 and x
    out, lse = cpu_attention.forward(q, k, v, mask=mask, is_causal=False, scale=0.0)
    x64 = x.astype(np.float32).astype(np.float64)
    m = np.maximum(x64, 0.0)
    e0, e1 = np.exp(-m), np.exp(x64 - m)
    want_lse = m + np.log(e0 + e1)
    want_out = (e0[:, None] * v[0, 0, 0].astype(np.float64) + e1[:, None] * v[0, 0, 1]) / (e0 + e1)[:, None]
    np.testing.assert_allclose(lse[0, 0], want_lse, rtol=4e-7, atol=1e-7)
    np.testing.assert_allclose(out[0, 0], want_out, rtol=1e-6, atol=1e-7)


def test_layouts_are_made_once_per_signature_and_read_each_calls_arrays(monkeypatch):
    """Unmasked 4-d calls remember their layout by shapes and strides: calls with new arrays of a known
    layout read those arrays, a transposed operand of the same shape gets its own layout; forward and
    backward match PyTorch's flash kernel each time."""
    monkeypatch.setattr(cpu_attention, "_LAYOUTS", {})
    rng = np.random.default_rng(3)
    aten = torch.ops.aten
    for seed in range(3):
        q, k, v, g = (rng.standard_normal((2, 3, 20, 8)).astype(np.float32) for _ in range(4))
        if seed == 2:                               # k as the transpose of a (.., E, S) array: other strides
            k = np.ascontiguousarray(k.swapaxes(-1, -2)).swapaxes(-1, -2)
        out, lse = cpu_attention.forward(q, k, v, is_causal=True)
        grads = cpu_attention.backward(g, q, k, v, out, lse, is_causal=True)
        tq, tk, tv = (torch.tensor(np.ascontiguousarray(a)) for a in (q, k, v))   # its kernel assumes unit column strides
        to, tl = aten._scaled_dot_product_flash_attention_for_cpu(tq, tk, tv, 0.0, True)[:2]
        tgrads = aten._scaled_dot_product_flash_attention_for_cpu_backward(torch.tensor(g), tq, tk, tv, to, tl, 0.0, True)
        np.testing.assert_allclose(out, to.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, tl.numpy(), rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, tgrads):
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-5)
    assert len(cpu_attention._LAYOUTS) == 2


VMAP_CASES = ["plain", "causal_short_q", "bool_mask", "float_mask_bcast", "gqa", "three_d", "batch_broadcast"]


def _per_example(fn, in_dims, args, n):
    """`fn` run on each example of the batch and stacked: the loop that vmap must equal."""
    outs = [fn(*(a if d is None else a.select(d, i) for a, d in zip(args, in_dims))) for i in range(n)]
    if isinstance(outs[0], tuple):
        return tuple(flambeau.stack([o[j] for o in outs]) for j in range(len(outs[0])))
    return flambeau.stack(outs)


@pytest.mark.parametrize("case", VMAP_CASES)
def test_vmap_folds_the_batch_into_one_kernel_call(case, calls):
    """vmap of the kernel op and of its backward (some operands unbatched, one batched at dim 1) equals the
    loop over the batch, in one kernel call each: the batching rules, not vmap's loop fallback."""
    n = 3
    arrays = [_inputs(case, seed=s)[0] for s in range(n)]
    cfg = _inputs(case)[1]
    mask = cfg.get("attn_mask")
    mask = None if mask is None else flambeau.tensor(mask)
    causal, gqa = cfg.get("is_causal", False), cfg.get("enable_gqa", False)
    q = flambeau.tensor(np.stack([a[0] for a in arrays]))                # batched at 0
    k = flambeau.tensor(arrays[0][1])                                    # unbatched
    v = flambeau.tensor(np.stack([a[2] for a in arrays], axis=1))        # batched at 1
    fwd = lambda q, k, v: AC._sdpa_flash_cpu(q, k, v, mask, causal, None, gqa)  # noqa: E731
    dims = (0, None, 1)
    got = flambeau.func.vmap(fwd, in_dims=dims)(q, k, v)
    assert calls["forward"] == 1
    want = _per_example(fwd, dims, (q, k, v), n)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    g = flambeau.tensor(np.stack([a[3] for a in arrays]))
    bwd = lambda g, q, k, v, o, lse: AC._sdpa_flash_cpu_backward(g, q, k, v, o, lse, mask, causal, None, gqa)  # noqa: E731
    dims = (0, 0, None, 1, 0, 0)
    args = (g, q, k, v, got[0], got[1])
    grads = flambeau.func.vmap(bwd, in_dims=dims)(*args)
    assert calls["backward"] == 1
    for a, b in zip(grads, _per_example(bwd, dims, args, n)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_per_sample_gradients_through_vmap_of_grad_match_pytorch(calls):
    """vmap(grad(...)) over sdpa with the weights unbatched: per-example gradients as torch.func gives."""
    (q, k, v, _), _ = _inputs("plain")
    xs = np.random.default_rng(1).standard_normal((3,) + q.shape[1:]).astype(np.float32)

    def loss(lib, w, x):
        return (lib.nn.functional.scaled_dot_product_attention(x * w, x, x, is_causal=True) ** 2).sum()

    w = q[0, 0, 0]
    got = flambeau.func.vmap(flambeau.func.grad(lambda w, x: loss(flambeau, w, x)), in_dims=(None, 0))(
        flambeau.tensor(w), flambeau.tensor(xs))
    assert calls == {"forward": 1, "backward": 1}
    want = torch.func.vmap(torch.func.grad(lambda w, x: loss(torch, w, x)), in_dims=(None, 0))(
        torch.tensor(w), torch.tensor(xs))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
