"""cuBLASLt products (flambeau._backends.cublaslt) and the cuBLAS flags (flambeau.backends.cuda.matmul,
set_float32_matmul_precision).

On CPU: the layout logic is checked by emulating the column-major strided-batched call the plan
describes with NumPy (reading each operand's memory through the plan's op/ld/batch stride) against
np.matmul, for transposed, sliced, broadcast, folded and copied operands; the flags against PyTorch's.
On the GPU (marked `cuda`): mm/addmm/bmm/baddbmm/matmul/linear in bfloat16/float16/float32 against
PyTorch on the same GPU and a float64 reference, forward and backward, the TF32 switch, the bias
epilogue, and that a bfloat16 product allocates no up-cast copies."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import flambeau
from flambeau._backends import cublaslt
from flambeau._backends.cublaslt import OP_N, OP_T, Plan, collapse, matrix_operand, plan


# ---- layout logic (CPU) ------------------------------------------------------------------------------
def _estrides(x):
    return tuple(s // x.itemsize for s in x.strides)


def _emulate(a, b):
    """What cuBLAS computes from the plan for numpy views a, b (after gemm's copies), as (batch..., m, n)."""
    p = plan(a.shape, _estrides(a), b.shape, _estrides(b))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if isinstance(p, str):
        if "a" in p:
            a = np.ascontiguousarray(np.broadcast_to(a, batch + a.shape[-2:]))
        if "b" in p:
            b = np.ascontiguousarray(np.broadcast_to(b, batch + b.shape[-2:]))
        p = plan(a.shape, _estrides(a), b.shape, _estrides(b))
    assert isinstance(p, Plan)

    def operand(arr, op):
        kind, rows, cols, ld, bstride = op
        it = arr.itemsize
        stored = np.lib.stride_tricks.as_strided(arr, shape=(p.batch, rows, cols), strides=(bstride * it, it, ld * it))
        return np.swapaxes(stored, -1, -2) if kind == OP_T else stored

    dt = operand(b, p.a) @ operand(a, p.b)            # cuBLAS's D^T = op(A) op(B): n x m per batch
    assert dt.shape == (p.batch, p.n, p.m)
    assert p.out == batch + (a.shape[-2], b.shape[-1])
    return np.swapaxes(dt, -1, -2).reshape(batch + (a.shape[-2], b.shape[-1])), p


def _r(rng, *shape):
    return rng.standard_normal(shape)


def _layouts():
    rng = np.random.default_rng(0)
    w = _r(rng, 7, 12)
    x3 = _r(rng, 2, 5, 12)
    big = _r(rng, 3, 6, 20)
    q = _r(rng, 2, 3, 5, 4)
    k = _r(rng, 2, 3, 6, 4)
    return {
        "mm": (_r(rng, 5, 6), _r(rng, 6, 7)),
        "mm_a_transposed": (_r(rng, 6, 5).T, _r(rng, 6, 7)),
        "mm_b_transposed": (_r(rng, 5, 6), _r(rng, 7, 6).T),
        "mm_both_transposed": (_r(rng, 6, 5).T, _r(rng, 7, 6).T),
        "mm_sliced_rows": (_r(rng, 5, 9)[:, 2:8], _r(rng, 6, 11)[:, :7]),
        "mm_row_vector": (_r(rng, 1, 6), _r(rng, 6, 7)),
        "mm_column_vector_out": (_r(rng, 5, 6), _r(rng, 6, 1)),
        "mm_strided_both_dims": (_r(rng, 10, 12)[::2, ::2], _r(rng, 6, 7)),
        "mm_negative_stride": (_r(rng, 5, 6)[::-1], _r(rng, 6, 7)),
        "linear_fold_3d": (x3, w.T),
        "linear_fold_sliced": (big[:, :, 4:16], w.T),
        "linear_fold_b_unit_batch": (x3, w.T[None, None]),
        "linear_no_fold_permuted": (np.swapaxes(_r(rng, 5, 2, 12), 0, 1), w.T),
        "bmm": (_r(rng, 3, 5, 6), _r(rng, 3, 6, 7)),
        "bmm_transposed": (np.swapaxes(_r(rng, 3, 6, 5), 1, 2), np.swapaxes(_r(rng, 3, 7, 6), 1, 2)),
        "bmm_broadcast_b": (_r(rng, 3, 5, 6), np.broadcast_to(_r(rng, 1, 6, 7), (3, 6, 7))),
        "attention_scores": (q, np.swapaxes(k, -1, -2)),
        "attention_values": (_r(rng, 2, 3, 5, 6), _r(rng, 2, 3, 6, 4)),
        "heads_from_permute": (np.transpose(_r(rng, 2, 5, 3, 4), (0, 2, 1, 3)), np.swapaxes(k, -1, -2)),
        "broadcast_batches": (_r(rng, 2, 1, 5, 6), _r(rng, 1, 3, 6, 7)),
        "2d_times_batched": (_r(rng, 5, 6), _r(rng, 4, 6, 7)),
        "batch_of_one": (_r(rng, 1, 5, 6), _r(rng, 1, 6, 7)),
    }


@pytest.mark.parametrize("name", sorted(_layouts()))
def test_plan_computes_the_product(name):
    a, b = _layouts()[name]
    got, p = _emulate(a, b)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-12, atol=1e-12)
    if name.startswith("linear_fold"):
        assert p.batch == 1 and p.fold                       # one GEMM over all rows, as PyTorch's matmul
    if name in ("mm_a_transposed", "mm_b_transposed", "mm_sliced_rows", "bmm_transposed", "attention_scores",
                "bmm_broadcast_b", "linear_fold_sliced"):
        assert not isinstance(plan(a.shape, _estrides(a), b.shape, _estrides(b)), str)    # read in place


def test_plan_copies_only_what_it_cannot_read():
    rng = np.random.default_rng(1)
    a = _r(rng, 10, 12)[::2, ::2]
    assert plan(a.shape, _estrides(a), (6, 7), (7, 1)) == "a"
    b = _r(rng, 6, 7)[::-1]
    assert plan((5, 6), (6, 1), b.shape, _estrides(b)) == "b"


def test_matrix_operand_reads_transposes_and_refuses_other_strides():
    assert matrix_operand(5, 6, 6, 1) == (OP_N, 6, 5, 6)
    assert matrix_operand(5, 6, 1, 5) == (OP_T, 5, 6, 5)
    assert matrix_operand(5, 6, 8, 1) == (OP_N, 6, 5, 8)          # padded rows: ld 8
    assert matrix_operand(5, 6, 4, 1) is None                      # rows overlap
    assert matrix_operand(5, 6, 2, 2) is None
    assert matrix_operand(1, 6, 0, 1) == (OP_N, 6, 1, 6)           # a row's stride does not matter


def test_collapse_batch_dims():
    assert collapse((2, 3), (12, 4)) == (6, 4)
    assert collapse((2, 3), (0, 0)) == (6, 0)
    assert collapse((2, 1, 3), (12, 99, 4)) == (6, 4)
    assert collapse((2, 3), (4, 8)) is None
    assert collapse((), ()) == (1, 0)


def test_alignment_of_pointers_and_strides():
    assert cublaslt.alignment(0x7f0000000000) == 256
    assert cublaslt.alignment(0x7f0000000010) == 16
    assert cublaslt.alignment(0x7f0000000000, 6) == 2


# ---- flags (CPU) -------------------------------------------------------------------------------------
@pytest.fixture
def _restore_flags():
    saved = (flambeau.get_float32_matmul_precision(), cublaslt.allow_fp16_reduced_precision_reduction,
             cublaslt.allow_bf16_reduced_precision_reduction)
    yield
    flambeau.set_float32_matmul_precision(saved[0])
    cublaslt.allow_fp16_reduced_precision_reduction, cublaslt.allow_bf16_reduced_precision_reduction = saved[1:]


def test_defaults_match_pytorch():
    torch = pytest.importorskip("torch")
    code = ("import flambeau as f, torch as t; m, n = f.backends.cuda.matmul, t.backends.cuda.matmul; "
            "print([f.get_float32_matmul_precision(), m.allow_tf32, m.allow_fp16_reduced_precision_reduction, "
            "m.allow_bf16_reduced_precision_reduction] == [t.get_float32_matmul_precision(), n.allow_tf32, "
            "n.allow_fp16_reduced_precision_reduction, n.allow_bf16_reduced_precision_reduction])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
    assert torch is not None


def test_allow_tf32_is_a_view_of_the_precision(_restore_flags):
    m = flambeau.backends.cuda.matmul
    assert cublaslt.compute_type("float32") == cublaslt.COMPUTE_32F
    m.allow_tf32 = True
    assert flambeau.get_float32_matmul_precision() == "high"
    assert cublaslt.compute_type("float32") == cublaslt.COMPUTE_32F_FAST_TF32
    assert cublaslt.compute_type("bfloat16") == cublaslt.COMPUTE_32F      # fp32 accumulation always
    flambeau.set_float32_matmul_precision("highest")
    assert m.allow_tf32 is False and cublaslt.compute_type("float32") == cublaslt.COMPUTE_32F
    flambeau.set_float32_matmul_precision("medium")
    assert m.allow_tf32 is True
    with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
        flambeau.set_float32_matmul_precision("low")
    assert flambeau.get_float32_matmul_precision() == "medium"


def test_reduced_precision_reduction_flags(_restore_flags):
    m = flambeau.backends.cuda.matmul
    assert cublaslt.reduction_mask("bfloat16") == cublaslt.REDUCTION_SCHEME_MASK
    m.allow_bf16_reduced_precision_reduction = False
    assert cublaslt.reduction_mask("bfloat16") == cublaslt.REDUCTION_SCHEME_COMPUTE_TYPE
    assert cublaslt.reduction_mask("float16") == cublaslt.REDUCTION_SCHEME_MASK
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        m.foo = 1
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        m.foo


def test_cpu_products_do_not_touch_cublaslt():
    before = dict(cublaslt.calls)
    a = flambeau.randn(4, 5, dtype=flambeau.bfloat16)
    flambeau.nn.functional.linear(a, flambeau.randn(3, 5, dtype=flambeau.bfloat16), flambeau.randn(3, dtype=flambeau.bfloat16))
    assert cublaslt.calls == before


# ---- on the GPU --------------------------------------------------------------------------------------
TOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 2e-5}


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA here")
    return torch


def _both(torch, arrays, dtype, requires_grad=False):
    """flambeau and torch cuda tensors of `dtype` holding the same values (rounded once, identically)."""
    fl, tt = [], []
    for x in arrays:
        f = flambeau.tensor(x.astype(np.float32), device="cuda").to(getattr(flambeau, dtype))
        t = torch.tensor(x.astype(np.float32), device="cuda").to(getattr(torch, dtype))
        if requires_grad:
            f.requires_grad_(True)
            t.requires_grad_(True)
        fl.append(f)
        tt.append(t)
    return fl, tt


def _np(t):
    return t.detach().float().cpu().numpy()


def _rel(x, ref):
    return float(np.linalg.norm((np.asarray(x, np.float64) - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-30))


def _views(m, x):
    """Apply the layout `x` names to tensor m (flambeau or torch): 't' transposes a 2-D matrix."""
    return m.t() if x == "t" else m


PRODUCTS = {  # name: (shapes, fn(mod, *tensors)) where mod is flambeau or torch
    "mm": ([(64, 96), (96, 80)], lambda M, a, b: M.mm(a, b)),
    "mm_transposed": ([(96, 64), (80, 96)], lambda M, a, b: M.mm(a.t(), b.t())),
    "mm_sliced": ([(64, 130), (96, 80)], lambda M, a, b: M.mm(a[:, 17:113], b)),
    "addmm_bias": ([(80,), (64, 96), (96, 80)], lambda M, c, a, b: M.addmm(c, a, b)),
    "addmm_beta_alpha": ([(64, 1), (64, 96), (96, 80)], lambda M, c, a, b: M.addmm(c, a, b, beta=0.5, alpha=2.0)),
    "addmm_beta0_ignores_nan": ([(64, 80), (64, 96), (96, 80)],
                                lambda M, c, a, b: M.addmm(c * float("nan"), a, b, beta=0.0, alpha=1.5)),
    "bmm": ([(3, 64, 32), (3, 32, 48)], lambda M, a, b: M.bmm(a, b)),
    "bmm_expanded": ([(3, 64, 32), (1, 32, 48)], lambda M, a, b: M.bmm(a, b.expand(3, 32, 48))),
    "baddbmm": ([(3, 64, 48), (3, 64, 32), (3, 32, 48)],
                lambda M, c, a, b: M.baddbmm(c, a, b, beta=0.25, alpha=-1.0)),
    "matmul_attention": ([(2, 3, 64, 32), (2, 3, 80, 32)], lambda M, q, k: M.matmul(q, k.transpose(-2, -1))),
    "matmul_heads_permuted": ([(2, 64, 3, 32), (2, 3, 32, 80)], lambda M, q, k: M.matmul(q.permute(0, 2, 1, 3), k)),
    "matmul_fold": ([(4, 16, 96), (96, 80)], lambda M, a, b: M.matmul(a, b)),
    "matmul_vector_left": ([(96,), (96, 80)], lambda M, a, b: M.matmul(a, b)),
    "matmul_vector_right": ([(64, 96), (96,)], lambda M, a, b: M.matmul(a, b)),
    "matmul_broadcast": ([(2, 1, 64, 32), (1, 3, 32, 48)], lambda M, a, b: M.matmul(a, b)),
    "linear_bias": ([(4, 16, 96), (80, 96), (80,)], lambda M, x, w, b: M.nn.functional.linear(x, w, b)),
    "linear_nobias": ([(4, 16, 96), (80, 96)], lambda M, x, w: M.nn.functional.linear(x, w)),
    "linear_1d": ([(96,), (80, 96), (80,)], lambda M, x, w, b: M.nn.functional.linear(x, w, b)),
    "linear_noncontiguous_input": ([(16, 4, 96), (80, 96), (80,)],
                                   lambda M, x, w, b: M.nn.functional.linear(x.transpose(0, 1), w, b)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_product_matches_pytorch_and_float64(name, dtype):
    torch = _torch_cuda()
    shapes, fn = PRODUCTS[name]
    rng = np.random.default_rng(abs(hash((name, dtype))) % 2**32)
    xs = [rng.standard_normal(s) for s in shapes]
    (fl, tt) = _both(torch, xs, dtype)
    before = cublaslt.calls["gemm"]
    got = fn(flambeau, *fl)
    assert cublaslt.calls["gemm"] == before + 1, "the product did not go through cuBLASLt"
    ref_t = fn(torch, *tt)
    ref64 = fn(torch, *[torch.tensor(t.detach().double().cpu().numpy()) for t in tt]).numpy()
    assert got.dtype == getattr(flambeau, dtype) and tuple(got.shape) == tuple(ref_t.shape)
    assert _rel(_np(got), ref64) < TOL[dtype]
    assert _rel(_np(got), _np(ref_t).astype(np.float64)) < TOL[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_backward_matches_pytorch(dtype):
    torch = _torch_cuda()
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s) for s in [(4, 16, 96), (80, 96), (80,), (2, 40, 64)]]
    res = []
    for M, ts in zip((flambeau, torch), _both(torch, xs, dtype, requires_grad=True)):
        x, w, b, v = ts
        h = M.nn.functional.linear(x, w, b)                       # (4, 16, 80)
        s = M.matmul(h.reshape(2, 32, 80), h.reshape(2, 32, 80).transpose(-2, -1))
        y = M.bmm(s[:, :, :8].transpose(1, 2).contiguous()[:, :, :32], v[:, :32, :])
        (y.float() * y.float()).sum().backward()
        res.append([_np(t.grad) for t in ts])
    for g, r in zip(*res):
        assert _rel(g, r.astype(np.float64)) < 3 * TOL[dtype]


@pytest.mark.cuda
def test_float32_follows_allow_tf32(_restore_flags):
    torch = _torch_cuda()
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((256, 2048)), rng.standard_normal((2048, 256))
    ref = a @ b
    fa, fb = (flambeau.tensor(x.astype(np.float32), device="cuda") for x in (a, b))
    exact = _rel(_np(fa @ fb), ref)
    flambeau.backends.cuda.matmul.allow_tf32 = True
    tf32 = _rel(_np(fa @ fb), ref)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ta, tb = (torch.tensor(x.astype(np.float32), device="cuda") for x in (a, b))
        torch_tf32 = _rel((ta @ tb).cpu().numpy(), ref)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert exact < 1e-5, exact
    assert tf32 > 5e-5, f"allow_tf32=True did not use TF32 ({tf32})"
    assert 0.5 * torch_tf32 < tf32 < 2 * torch_tf32, (tf32, torch_tf32)


@pytest.mark.cuda
def test_linear_bias_goes_through_the_epilogue():
    x = flambeau.randn(64, 96, device="cuda", dtype=flambeau.bfloat16)
    w = flambeau.randn(80, 96, device="cuda", dtype=flambeau.bfloat16)
    b = flambeau.randn(80, device="cuda", dtype=flambeau.bfloat16)
    before = cublaslt.calls["bias_epilogue"]
    y = flambeau.nn.functional.linear(x, w, b)
    assert cublaslt.calls["bias_epilogue"] == before + 1
    ref = x.double().cpu().numpy() @ w.double().cpu().numpy().T + b.double().cpu().numpy()
    assert _rel(_np(y), ref) < TOL["bfloat16"]


@pytest.mark.cuda
def test_layers_of_one_layout_alternate_their_biases():
    """Four same-shape linears (one cuBLASLt descriptor, its bias pointer re-pointed through a slot kept with
    it at every call) each add their own bias, twice round, as float64 references."""
    x = flambeau.randn(64, 96, device="cuda", dtype=flambeau.bfloat16)
    w = flambeau.randn(80, 96, device="cuda", dtype=flambeau.bfloat16)
    biases = [flambeau.randn(80, device="cuda", dtype=flambeau.bfloat16) for _ in range(4)]
    ref = x.double().cpu().numpy() @ w.double().cpu().numpy().T
    before = cublaslt.calls["bias_epilogue"]
    outs = [flambeau.nn.functional.linear(x, w, b) for _ in range(2) for b in biases]
    assert cublaslt.calls["bias_epilogue"] == before + 8
    for y, b in zip(outs, biases * 2):
        assert _rel(_np(y), ref + b.double().cpu().numpy()) < TOL["bfloat16"]


@pytest.mark.cuda
def test_bfloat16_product_makes_no_upcast_copies():
    n = 2048
    a = flambeau.randn(n, n, device="cuda", dtype=flambeau.bfloat16)
    b = flambeau.randn(n, n, device="cuda", dtype=flambeau.bfloat16)
    (a @ b).sum()                                                   # warm: the workspace is allocated once
    flambeau.cuda.synchronize()
    base = flambeau.cuda.memory_allocated()
    flambeau.cuda.reset_peak_memory_stats()
    c = a @ b
    flambeau.cuda.synchronize()
    grew = flambeau.cuda.max_memory_allocated() - base
    out_bytes = n * n * 2
    assert grew <= out_bytes + (1 << 20), f"{grew} bytes for a {out_bytes}-byte result (up-cast copies?)"
    assert c.dtype == flambeau.bfloat16


@pytest.mark.cuda
def test_shape_and_dtype_errors_unchanged_on_cuda():
    a = flambeau.randn(4, 5, device="cuda", dtype=flambeau.bfloat16)
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(4x5 and 4x5\)"):
        a.mm(a)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        a.mm(a.t().float())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cublaslt.available(), cublaslt.load_error()


PADDED = {  # products whose leading dimensions are off 16 bytes (GPT-2's vocabulary of 50257 is odd)
    "odd_n_output": ([(64, 96), (81, 96)], lambda M, x, w: x @ w.t()),
    "odd_ld_left": ([(64, 81), (81, 96)], lambda M, g, w: g @ w),
    "odd_ld_left_transposed": ([(64, 81), (64, 96)], lambda M, g, x: g.t() @ x),
    "odd_ld_sliced": ([(64, 99), (97, 96)], lambda M, a, b: a[:, 1:98] @ b),
    "fold_odd_n_bias": ([(4, 16, 96), (81, 96), (81,)], lambda M, x, w, b: M.nn.functional.linear(x, w, b)),
    "addmm_bias_odd_k": ([(96,), (64, 81), (81, 96)], lambda M, c, a, b: M.addmm(c, a, b)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(PADDED))
def test_misaligned_leading_dimensions_are_padded(name, monkeypatch):
    """Large 2-D (or folded) products (here every one: PAD_MIN_MACS lowered) with a size or leading
    dimension off 16 bytes run on zero-padded copies (cuBLASLt has only align1 kernels otherwise):
    same values as float64, a contiguous result."""
    torch = _torch_cuda()
    monkeypatch.setattr(cublaslt, "PAD_MIN_MACS", 0)
    shapes, fn = PADDED[name]
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(s) for s in shapes]
    fl, tt = _both(torch, xs, "bfloat16")
    before = cublaslt.calls["padded"]
    got = fn(flambeau, *fl)
    assert cublaslt.calls["padded"] == before + 1
    assert got.is_contiguous()
    ref64 = fn(torch, *[torch.tensor(t.detach().double().cpu().numpy()) for t in tt]).numpy()
    assert _rel(_np(got), ref64) < TOL["bfloat16"]
