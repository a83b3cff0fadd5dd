"""add/sub/mul/div on cuda through one cached raw kernel (flambeau/_backends/cuda_binary.py),
compared bit for bit with PyTorch on cuda; the general path keeps the other operand kinds; cuda
device objects are one per index (the dispatcher's same-device test is an identity test)."""
import operator

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._device import canonical

DTYPES = ["float32", "float64", "float16", "bfloat16"]
OPS = ["add", "sub", "mul", "div"]
SPECIAL = [0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), float("nan"), 1e-30, 6.5e4, 3e38, 1.0009765625]


def _pair(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * 100
    b = rng.standard_normal(shape) * 3
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    k = min(len(SPECIAL), flat_a.size)
    flat_a[:k] = SPECIAL[:k]
    flat_b[:k] = SPECIAL[::-1][:k]
    ta = torch.tensor(a, dtype=getattr(torch, dtype), device="cuda")
    tb = torch.tensor(b, dtype=getattr(torch, dtype), device="cuda")
    fa = fl.tensor(ta.float().cpu().numpy(), device="cuda").to(getattr(fl, dtype))
    fb = fl.tensor(tb.float().cpu().numpy(), device="cuda").to(getattr(fl, dtype))
    if dtype == "float64":
        fa = fl.tensor(ta.cpu().numpy(), device="cuda")
        fb = fl.tensor(tb.cpu().numpy(), device="cuda")
    return ta, tb, fa, fb


def _same(f, t):
    assert str(f.dtype) == str(t.dtype), (f.dtype, t.dtype)
    assert tuple(f.shape) == tuple(t.shape)
    ref = t.cpu().double().numpy()
    # to the host first: CuPy compiles its float32 -> float64 cast with -ftz=true, flushing subnormals
    got = f.cpu().double().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(got[ok], ref[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(8, 8), (3, 1000, 7), (1,)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_same_shape_tensors_as_pytorch(op, dtype, shape):
    ta, tb, fa, fb = _pair(dtype, shape)
    _same(getattr(fl, op)(fa, fb), getattr(torch, op)(ta, tb))


@pytest.mark.cuda
@pytest.mark.parametrize("scalar", [0.5, 3, -2.25, 1e-3, float("inf")])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_tensor_and_python_number_as_pytorch(op, dtype, scalar):
    ta, _, fa, _ = _pair(dtype, (5, 33))
    _same(getattr(fl, op)(fa, scalar), getattr(torch, op)(ta, scalar))


@pytest.mark.cuda
def test_the_raw_kernel_is_the_one_that_ran():
    from flambeau._backends import cuda_binary
    _, _, fa, fb = _pair("float64", (4, 4))
    cuda_binary._functions.clear()
    fa / fb
    fa - 2.0
    names = {(k[0], k[1].name, k[2]) for k in cuda_binary._functions}
    assert names == {("div", "float64", "tt"), ("sub", "float64", "ts")}


@pytest.mark.cuda
def test_more_elements_than_one_grid_as_pytorch(monkeypatch):
    from flambeau._backends import cuda_binary
    monkeypatch.setattr(cuda_binary, "MAX_BLOCKS", 3)
    n = 3 * cuda_binary.THREADS * 4 + 5
    ta, tb, fa, fb = _pair("float32", (n,), seed=3)
    _same(fa + fb, ta + tb)
    _same(fa / 7.0, ta / 7.0)


@pytest.mark.cuda
def test_larger_arrays_take_the_general_path_as_pytorch():
    from flambeau._backends import cuda_binary
    ta, tb, fa, fb = _pair("bfloat16", (cuda_binary.MAX_ELEMENTS + 1,), seed=4)
    cuda_binary._functions.clear()
    _same(fa * fb, ta * tb)
    assert not cuda_binary._functions


@pytest.mark.cuda
def test_larger_float32_arrays_take_the_raw_kernel_as_pytorch():
    from flambeau._backends import cuda_binary
    ta, tb, fa, fb = _pair("float32", (2, cuda_binary.MAX_ELEMENTS + 3), seed=5)
    cuda_binary._functions.clear()
    _same(fa + fb, ta + tb)
    _same(fa * 0.5, ta * 0.5)
    assert {(k[0], k[1].name, k[2]) for k in cuda_binary._functions} == {("add", "float32", "tt"),
                                                                          ("mul", "float32", "ts")}


@pytest.mark.cuda
def test_float32_subnormals_are_kept_as_pytorch():
    ta = torch.tensor([1e-38, 3e-39, -2e-39, 1e-45], device="cuda")
    fa = fl.tensor(ta.cpu().numpy(), device="cuda")
    for f, t in [(fa * 0.5, ta * 0.5), (fa + fa, ta + ta), (fa - fa * 2.0, ta - ta * 2.0), (fa / 3.0, ta / 3.0),
                 (fa / fl.full_like(fa, 4.0), ta / torch.full_like(ta, 4.0))]:
        _same(f, t)


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS)
def test_other_operands_take_the_general_path_as_pytorch(op):
    ta, tb, fa, fb = _pair("float32", (6, 6))
    infix = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}[op]
    cases = [
        (lambda m, a, b: getattr(m, op)(a.t(), b)),                     # not contiguous
        (lambda m, a, b: getattr(m, op)(a, b[:1])),                     # broadcast
        (lambda m, a, b: getattr(m, op)(a, b.double())),                # mixed dtypes
        # number on the left (b scaled: 2.5 / 3e38 is a subnormal that CuPy's -ftz=true reciprocal flushes)
        (lambda m, a, b: infix(2.5, b * 1e-3)),
        (lambda m, a, b: getattr(m, op)(a, b[0, 0])),                   # 0-dim tensor
        (lambda m, a, b: getattr(m, op)(a, b.bfloat16())),              # float32 with bfloat16
    ]
    for case in cases:
        _same(case(fl, fa, fb), case(torch, ta, tb))
    rng = np.random.default_rng(1)
    ia, ib = rng.integers(-50, 50, (5, 5)), rng.integers(1, 50, (5, 5))
    _same(getattr(fl, op)(fl.tensor(ia, device="cuda"), fl.tensor(ib, device="cuda")),
          getattr(torch, op)(torch.tensor(ia, device="cuda"), torch.tensor(ib, device="cuda")))


@pytest.mark.cuda
def test_the_sum_of_a_training_step_grad_is_unchanged_under_autograd():
    ta, tb, fa, fb = _pair("float32", (7, 9))
    ta.requires_grad_(True)
    fa.requires_grad_(True)
    ((ta * tb + 1.5) / (tb * tb + 1.0) - ta).sum().backward()
    ((fa * fb + 1.5) / (fb * fb + 1.0) - fa).sum().backward()
    np.testing.assert_allclose(fa.grad.cpu().numpy(), ta.grad.cpu().numpy(), rtol=1e-6, atol=1e-6)


def test_cuda_devices_are_one_object_per_index():
    a = canonical("cuda")
    assert a is canonical("cuda:0") is canonical(fl.device("cuda", 0)) is canonical(fl.device("cuda:0"))
    assert canonical("cuda:1") is canonical(fl.device("cuda", 1))
    assert canonical("cuda:1") is not a and canonical("cuda:1") == fl.device("cuda:1")


_INT64_EDGES = [0, 1, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 62, -(2 ** 40) - 3, 12345678901]


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_int64_with_int64_or_a_python_int_wraps_as_pytorch(op):
    """int64 add/sub/mul take the raw kernel (BatchNorm's num_batches_tracked += 1) and wrap around
    at the int64 range as PyTorch's do; an int64 division or a float number keeps the general path."""
    from flambeau._backends import cuda_binary
    rng = np.random.default_rng(5)
    ia = np.concatenate([np.array(_INT64_EDGES, dtype=np.int64), rng.integers(-2 ** 62, 2 ** 62, 40)])
    ib = np.concatenate([np.array(_INT64_EDGES[::-1], dtype=np.int64), rng.integers(-2 ** 62, 2 ** 62, 40)])
    fa, fb = fl.tensor(ia, device="cuda"), fl.tensor(ib, device="cuda")
    ta, tb = torch.tensor(ia, device="cuda"), torch.tensor(ib, device="cuda")
    cuda_binary._functions.clear()
    for f, t in [(getattr(fl, op)(fa, fb), getattr(torch, op)(ta, tb)),
                 (getattr(fl, op)(fa, 2 ** 62 + 7), getattr(torch, op)(ta, 2 ** 62 + 7)),
                 (getattr(fl, op)(fa, -3), getattr(torch, op)(ta, -3))]:
        assert str(f.dtype) == str(t.dtype) == "torch.int64"
        np.testing.assert_array_equal(f.cpu().numpy(), t.cpu().numpy())
    assert {(k[0], k[2]) for k in cuda_binary._functions} == {(op, "tt"), (op, "ts")}
    cuda_binary._functions.clear()
    _same(getattr(fl, op)(fa, 0.5), getattr(torch, op)(ta, 0.5))        # a float number: float32 result
    _same(fl.div(fa, fb), torch.div(ta, tb))
    assert not cuda_binary._functions
    n = fl.tensor(3, device="cuda")
    n.add_(1)
    assert int(n.item()) == 4 and str(n.dtype) == "torch.int64"
