"""2:4 semi-structured sparsity (flambeau.sparse.semi_structured): the compressed format and its
checks, the products (mm/addmm/matmul/linear) on the cpu dense fallback against the masked dense
products (PyTorch's dense kernels and a float64 reference), the PyTorch 2.1 release-notes example as
`nn.Linear` weight, the 2:4 magnitude mask against torch.ao.pruning's WeightNormSparsifier; on the GPU
(marked `cuda`) the cuSPARSELt path against the dense product and PyTorch's own 2:4 matmul."""
import numpy as np
import pytest
import torch

import flambeau
from flambeau.sparse import (SparseSemiStructuredTensor, SparseSemiStructuredTensorCUSPARSELT,
                             SparseSemiStructuredTensorCUTLASS, semi_structured_mask, to_sparse_semi_structured)
from flambeau.sparse.semi_structured import compress, decompress


def _pruned(m, k, dtype=np.float32, seed=0):
    """A random (m, k) array pruned 2:4 by magnitude, with some groups holding fewer than 2 nonzeros."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    g = np.abs(w).reshape(m, -1, 4)
    keep = np.argsort(-g, axis=-1, kind="stable")[..., :2]
    mask = np.zeros(g.shape, bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    w = (w * mask.reshape(m, k))
    w[0, :4] = [0, 0, 0, 1.5]                       # one nonzero in a group
    w[1, 4:8] = 0                                    # none
    return w.astype(dtype)


@pytest.fixture(autouse=True)
def _cutlass_flag_restored():
    saved = SparseSemiStructuredTensor._FORCE_CUTLASS
    yield
    SparseSemiStructuredTensor._FORCE_CUTLASS = saved


def test_compress_round_trip_and_format():
    w = _pruned(32, 64)
    values, meta = compress(w)
    assert values.shape == (32, 32) and meta.shape == (32, 4) and meta.dtype == np.int16
    np.testing.assert_array_equal(decompress(values, meta, w.shape), w)
    # the kept values are each group's nonzeros in column order
    np.testing.assert_array_equal(values[2], w[2][w[2] != 0])


@pytest.mark.parametrize("dtype", [flambeau.float16, flambeau.bfloat16, flambeau.int8])
def test_to_sparse_semi_structured_to_dense_and_values(dtype):
    w = flambeau.tensor(_pruned(64, 128, np.float32) * 4).to(dtype)
    s = to_sparse_semi_structured(w)
    assert isinstance(s, SparseSemiStructuredTensorCUSPARSELT) and tuple(s.shape) == (64, 128) and s.dtype is dtype
    np.testing.assert_array_equal(s.to_dense().float().numpy(), w.float().numpy())
    assert tuple(s.values().shape) == (64, 64) and s.indices().dtype is flambeau.int16
    assert repr(s) == "SparseSemiStructuredTensorCUSPARSELT(shape=torch.Size([64, 128]))"
    # PyTorch's docstring example: the [0, 0, 1, 1] pattern keeps all ones
    ones = to_sparse_semi_structured(flambeau.Tensor([0, 0, 1, 1]).tile((128, 32)).half())
    assert ones.values().float().numpy().min() == 1.0 and tuple(ones.values().shape) == (128, 64)


def test_force_cutlass_selects_the_cutlass_class_and_its_constraints():
    SparseSemiStructuredTensor._FORCE_CUTLASS = True
    s = to_sparse_semi_structured(flambeau.tensor(_pruned(32, 64)))       # float32: CUTLASS only
    assert isinstance(s, SparseSemiStructuredTensorCUTLASS)
    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    with pytest.raises(RuntimeError, match="is not a supported dtype for"):
        to_sparse_semi_structured(flambeau.tensor(_pruned(32, 64)))


def test_validation_as_pytorch():
    good = flambeau.tensor(_pruned(64, 128)).half()
    with pytest.raises(RuntimeError, match=r"Error original_tensor.dim = 3 is not supported! Only 2d tensors"):
        to_sparse_semi_structured(good.reshape(2, 32, 128))
    with pytest.raises(RuntimeError, match="Error original_tensor is not contiguous!"):
        to_sparse_semi_structured(flambeau.tensor(_pruned(128, 128)).half()[:, ::2].t())
    with pytest.raises(RuntimeError, match=r"is not supported! Both dimensions must be larger or equal than and a "
                                           r"multiple of \(16, 16\)"):
        to_sparse_semi_structured(good[:40])
    with pytest.raises(RuntimeError, match="is not a supported dtype"):
        to_sparse_semi_structured(good.double())
    dense = flambeau.ones(64, 128).half()
    with pytest.raises(RuntimeError, match=r"not 2:4 sparse: row 0, columns 0..3 hold 4 nonzeros"):
        to_sparse_semi_structured(dense)


@pytest.mark.parametrize("dtype", [flambeau.float16, flambeau.bfloat16, flambeau.float32])
def test_products_equal_the_masked_dense_products(dtype):
    SparseSemiStructuredTensor._FORCE_CUTLASS = dtype is flambeau.float32
    w64 = _pruned(64, 128, np.float64, seed=1)
    x64 = np.random.default_rng(2).standard_normal((48, 128))
    b64 = np.random.default_rng(3).standard_normal(64)
    w, x, b = (flambeau.tensor(a).to(dtype) for a in (w64, x64, b64))
    s = to_sparse_semi_structured(w)
    tw, tx, tb = (torch.tensor(a.float().numpy()).to(getattr(torch, dtype.name)) for a in (w, x, b))
    tol = {"float16": 1e-3, "bfloat16": 1.6e-2, "float32": 1e-5}[dtype.name]
    cases = [(x @ s.t(), tx @ tw.t()), (flambeau.mm(s, x.t()), torch.mm(tw, tx.t())),
             (flambeau.addmm(b, x, s.t()), torch.addmm(tb, tx, tw.t())),
             (flambeau.nn.functional.linear(x, s, b), torch.nn.functional.linear(tx, tw, tb)),
             (flambeau.nn.functional.linear(x.reshape(4, 12, 128), s), torch.nn.functional.linear(tx.reshape(4, 12, 128), tw))]
    for got, want in cases:
        assert got.dtype is dtype
        np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=tol, atol=tol * 4)
    ref = x.double().numpy() @ w.double().numpy().T + b.double().numpy()
    np.testing.assert_allclose(flambeau.nn.functional.linear(x, s, b).double().numpy(), ref, rtol=tol * 2, atol=tol * 8)


def test_int8_product_accumulates_in_int32():
    w = (_pruned(32, 64, seed=4) * 3).round().astype(np.int8)
    x = np.random.default_rng(5).integers(-4, 5, (64, 32)).astype(np.int8)
    s = to_sparse_semi_structured(flambeau.tensor(w))
    got = flambeau.mm(s, flambeau.tensor(x))
    assert got.dtype is flambeau.int8
    want = np.clip(w.astype(np.int64) @ x.astype(np.int64), -128, 127)
    np.testing.assert_array_equal(got.numpy(), want)


def test_release_notes_example_as_linear_weight():
    """PyTorch 2.1's example (sizes cut for the cpu; `.cuda()` left out): the sparse output equals the dense."""
    from flambeau.utils.benchmark import Timer
    SparseSemiStructuredTensor._FORCE_CUTLASS = True
    mask = flambeau.Tensor([0, 0, 1, 1]).tile((96, 64)).bool()
    linear = flambeau.nn.Linear(256, 96).half().eval()
    linear.weight = flambeau.nn.Parameter(mask * linear.weight)
    x = flambeau.rand(64, 256).half()
    with flambeau.inference_mode():
        dense_output = linear(x)
        dense_t = Timer(stmt="linear(x)", globals={"linear": linear, "x": x}).blocked_autorange(min_run_time=0.01).median
        linear.weight = flambeau.nn.Parameter(to_sparse_semi_structured(linear.weight))
        assert isinstance(linear.weight, SparseSemiStructuredTensorCUTLASS)
        assert isinstance(linear.weight, flambeau.nn.Parameter) and "weight" in dict(linear.named_parameters())
        sparse_output = linear(x)
        sparse_t = Timer(stmt="linear(x)", globals={"linear": linear, "x": x}).blocked_autorange(min_run_time=0.01).median
        assert flambeau.allclose(sparse_output, dense_output, atol=1e-3)
    assert flambeau.equal(sparse_output, dense_output) and dense_t > 0 and sparse_t > 0


def test_input_gradient_through_a_sparse_weight():
    w = _pruned(32, 64, seed=6)
    xa = np.random.default_rng(7).standard_normal((8, 64)).astype(np.float32)
    SparseSemiStructuredTensor._FORCE_CUTLASS = True
    s = to_sparse_semi_structured(flambeau.tensor(w))
    x = flambeau.tensor(xa, requires_grad=True)
    b = flambeau.zeros(32, requires_grad=True)
    (flambeau.nn.functional.linear(x, s, b) ** 2).sum().backward()
    tx, tb = torch.tensor(xa, requires_grad=True), torch.zeros(32, requires_grad=True)
    (torch.nn.functional.linear(tx, torch.tensor(w), tb) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_unsupported_ops_raise():
    s = to_sparse_semi_structured(flambeau.tensor(_pruned(32, 64)).half())
    with pytest.raises(NotImplementedError, match=r"only supports a specific set of operations, can't perform requested op \(exp\)"):
        s.exp()
    with pytest.raises(ValueError, match="is not supported by the hardware"):
        flambeau.mm(s, s.t())


def test_magnitude_mask_matches_weight_norm_sparsifier():
    from torch.ao.pruning import WeightNormSparsifier
    m = torch.nn.Sequential(torch.nn.Linear(64, 32))
    sp = WeightNormSparsifier(sparsity_level=1.0, sparse_block_shape=(1, 4), zeros_per_block=2)
    sp.prepare(m, [{"tensor_fqn": "0.weight"}])
    sp.step()
    want = m[0].parametrizations.weight[0].mask
    w = flambeau.tensor(m[0].parametrizations.weight.original.detach().numpy())
    mask = semi_structured_mask(w)
    np.testing.assert_array_equal(mask.numpy(), want.numpy())
    to_sparse_semi_structured((w * mask).half())          # a 2:4 mask makes a convertible weight


def test_timer_measures_the_statement():
    from flambeau.utils.benchmark import Timer
    m = Timer(stmt="time.sleep(0.002)", setup="import time").blocked_autorange(min_run_time=0.05)
    assert m.number_per_run >= 1 and len(m.times) >= 2
    assert m.median >= 0.002                    # the statement's own sleep is inside every measured run
    assert Timer(stmt="x + 1", globals={"x": 1}).timeit(100).number_per_run == 100


# ---- cuda: cuSPARSELt ----------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_cusparselt_matmul_equals_dense(dtype):
    from flambeau.sparse import _cusparselt
    assert _cusparselt.available(), _cusparselt.load_error()
    fdt = getattr(flambeau, dtype)
    scale = 3 if dtype == "int8" else 1
    w = flambeau.tensor(_pruned(256, 512, seed=8) * scale).to(fdt).cuda()
    if dtype == "int8":
        x = flambeau.tensor(np.random.default_rng(9).integers(-3, 4, (128, 512)).astype(np.int8)).cuda()
    else:
        x = flambeau.tensor(np.random.default_rng(9).standard_normal((128, 512)).astype(np.float32)).to(fdt).cuda()
    s = to_sparse_semi_structured(w)
    assert s._uses_cusparselt(x.t())
    for got, want in [(flambeau.mm(s, x.t()), s._dense_product(x.t(), None)),
                      (x @ s.t(), s._dense_product(x.t(), None).t()),
                      (flambeau.nn.functional.linear(x, s), s._dense_product(x.t(), None).t())]:
        assert s._cslt is not None
        if dtype == "int8":
            np.testing.assert_array_equal(got.cpu().numpy(), want.cpu().numpy())
        else:
            np.testing.assert_allclose(got.float().cpu().numpy(), want.float().cpu().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.cuda
def test_release_notes_example_runs_as_written_on_cuda():
    from flambeau.utils.benchmark import Timer
    torch_ = flambeau
    SparseSemiStructuredTensor._FORCE_CUTLASS = True
    mask = torch_.Tensor([0, 0, 1, 1]).tile((3072, 2560)).cuda().bool()
    linear = torch_.nn.Linear(10240, 3072).half().cuda().eval()
    linear.weight = torch_.nn.Parameter(mask * linear.weight)
    x = torch_.rand(3072, 10240).half().cuda()
    with torch_.inference_mode():
        dense_output = linear(x)
        dense_t = Timer(stmt="linear(x)", globals={"linear": linear, "x": x}).blocked_autorange().median * 1e3
        linear.weight = torch_.nn.Parameter(to_sparse_semi_structured(linear.weight))
        sparse_output = linear(x)
        sparse_t = Timer(stmt="linear(x)", globals={"linear": linear, "x": x}).blocked_autorange().median * 1e3
        assert torch_.allclose(sparse_output, dense_output, atol=1e-3)
        assert linear.weight._cslt is not None            # the CUTLASS class runs on cuSPARSELt in flambeau
        print(f"Dense: {dense_t:.3f}ms Sparse: {sparse_t:.3f}ms | Speedup: {(dense_t / sparse_t):.3f}x")
