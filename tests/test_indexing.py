"""Indexing and views beyond the op database: memory sharing of basic indexing, writes through
views and `__setitem__` with autograd (CopySlices), version counters, and PyTorch's index errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau


def both(fn, *arrays, grad=True):
    """Run fn(module, *tensors) in both frameworks; return (ours, theirs, our leaves, their leaves)."""
    out = []
    for mod in (flambeau, torch):
        ts = [mod.tensor(a).requires_grad_(grad and a.dtype.kind == "f") for a in arrays]
        out.append((fn(mod, *ts), ts))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def close(a, b):
    np.testing.assert_allclose(np.asarray(a.detach()), b.detach().numpy(), rtol=1e-6, atol=1e-7)


def check_grads(fn, *arrays):
    ours, ref, lo, lt = both(fn, *arrays)
    close(ours, ref)
    g = np.random.default_rng(0).standard_normal(tuple(ref.shape))
    ours.backward(flambeau.tensor(g))
    ref.backward(torch.tensor(g))
    for a, b in zip(lo, lt):
        if b.grad is None:
            assert a.grad is None or float(a.grad.abs().sum()) == 0
        else:
            close(a.grad, b.grad)


A = np.random.default_rng(1).standard_normal((4, 5))
W = np.random.default_rng(2).standard_normal(5)


def test_basic_index_is_a_view_sharing_memory():
    x = flambeau.zeros(4, 5)
    for key in [1, (slice(1, 3),), (Ellipsis, 2), (None, 1), (slice(None, None, 2), -1)]:
        v = x[key]
        assert v._base is x
    v = x[1, 1:4:2]
    v.fill_(7)
    assert x[1, 1].item() == 7 and x[1, 3].item() == 7 and x[1, 2].item() == 0
    assert x._version == v._version


def test_advanced_index_copies():
    x = flambeau.zeros(4, 5)
    y = x[[0, 2]]
    y.fill_(1)
    assert float(x.sum()) == 0 and y._base is None


def test_setitem_through_clone_grad():
    def f(m, x, w):
        y = x.clone()
        y[0] = w * 2
        return y * y
    check_grads(f, A, W)


@pytest.mark.parametrize("key", [(slice(1, 3), slice(None, None, 2)), (Ellipsis, 1), (1, [0, 3]),
                                 ([0, 2],), (slice(None), [True, False, True, False, True])])
def test_setitem_grad(key):
    def f(m, x, v):
        y = x * 1
        y[key] = v.sum() * 3
        return y.sin()
    check_grads(f, A, W)


def test_inplace_on_view_updates_base_grad():
    def f(m, x, w):
        y = x.clone()
        r = y[1:3]
        r.mul_(w)
        d = y.diagonal()
        d.add_(1)
        return y * 2
    check_grads(f, A, W)


def test_view_taken_after_write_sees_new_value():
    def f(m, x, w):
        y = x.clone()
        y[2] = w
        y[:, 1] += w[:4]
        return y[2] * y
    check_grads(f, A, W)


def test_narrow_inplace():
    def f(m, x, w):
        y = x.clone()
        b = y.narrow(0, 1, 3)
        b.mul_(w.sum())
        return y.exp()
    check_grads(f, A, W)


def test_index_put_accumulate_grad():
    def f(m, x, w):
        y = x.clone()
        return y.index_put((m.tensor([0, 0, 3]),), w.expand(3, 5), accumulate=True)
    check_grads(f, A, W)


def test_as_strided_grad():
    def f(m, x, w):
        return x.as_strided((3, 3), (5, 1), 1) * 2
    check_grads(f, A, W)


def test_unfold_grad():
    def f(m, x, w):
        return x.unfold(1, 3, 1).exp()
    check_grads(f, A, W)


def test_leaf_setitem_errors():
    x = flambeau.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        x[0] = 1.0


@pytest.mark.parametrize("key,exc,msg", [
    (5, IndexError, "index 5 is out of bounds for dimension 0 with size 4"),
    ((0, 0, 0), IndexError, "too many indices"),
    (([5],), IndexError, "index 5 is out of bounds for dimension 0 with size 4"),
    ((slice(None, None, -1),), ValueError, "step must be greater than zero"),
])
def test_index_errors(key, exc, msg):
    x = flambeau.zeros(4, 5)
    with pytest.raises(exc, match=msg):
        x[key]
    with pytest.raises(exc):
        torch.zeros(4, 5)[key]


def test_float_index_error():
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool tensors"):
        flambeau.zeros(3)[flambeau.tensor([1.0])]


def test_setitem_scalar_and_broadcast():
    for mod in (flambeau, torch):
        x = mod.zeros(3, 4)
        x[1] = 2
        x[:, 0] = mod.tensor([1.0, 2.0, 3.0])
        x[x > 2.5] = -1
        x[[0, 2], 1:3] = mod.ones(1, 2)
        if mod is flambeau:
            ours = np.asarray(x)
        else:
            np.testing.assert_array_equal(ours, x.numpy())


def test_copy_cast_and_broadcast():
    x = flambeau.zeros(2, 3, dtype=flambeau.int64)
    x.copy_(flambeau.tensor([1.7, 2.2, -3.9]))
    assert x.tolist() == [[1, 2, -3], [1, 2, -3]]
    with pytest.raises(RuntimeError):
        flambeau.zeros(3).copy_(flambeau.zeros(2))


def test_nonzero_as_tuple_and_where():
    m = np.array([[True, False], [True, True]])
    a = flambeau.tensor(m)
    b = torch.tensor(m)
    for x, y in zip(flambeau.where(a), torch.where(b)):
        np.testing.assert_array_equal(np.asarray(x), y.numpy())
    for x, y in zip(a.nonzero(as_tuple=True), b.nonzero(as_tuple=True)):
        np.testing.assert_array_equal(np.asarray(x), y.numpy())


def test_resize_():
    x = flambeau.arange(6.) if hasattr(flambeau, "arange") else flambeau.tensor([0., 1, 2, 3, 4, 5])
    x.resize_(2, 2)
    assert x.tolist() == [[0, 1], [2, 3]]


@pytest.mark.parametrize("op", ["zero_()", "fill_(2.0)", "fill_(v)", "add_(1)"])
def test_inplace_on_expanded_matches_torch(op):
    """PyTorch's zero_/fill_(Scalar) write an expanded (self-overlapping) tensor; fill_(Tensor) and
    add_ raise. Fuzzer seeds 248, 324."""
    outcomes = []
    for m in (torch, flambeau):
        x, v = m.zeros(3, 1).expand(3, 3), m.tensor(2.0)
        try:
            eval("x." + op, {"x": x, "v": v})
            outcomes.append(("ok", x.tolist()))
        except RuntimeError as e:
            outcomes.append(("raise", str(e)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("dtype", ["bool", "int32", "uint8"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2.5])
def test_masked_fill_nonfinite_into_integer_matches_torch(dtype, value):
    """bool takes any float (nan -> True); integer dtypes raise on nan/inf (fuzzer seed 119)."""
    outcomes = []
    for m in (torch, flambeau):
        x = m.tensor([0, 1, 0]).to(getattr(m, dtype))
        try:
            outcomes.append(("ok", x.masked_fill(x == 0, value).tolist()))
        except RuntimeError as e:
            outcomes.append(("raise", type(e).__name__, str(e).split(" type ")[0]))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("index", [lambda m: m.tensor([]), lambda m: m.zeros(0, 2), lambda m: m.zeros(1, 1)])
def test_gather_scatter_empty_float_index_matches_torch(index):
    """An empty index is checked neither for dtype nor rank; a non-empty float one raises (seeds 229, 486)."""
    outcomes = []
    for m in (torch, flambeau):
        s = m.zeros(2, 3)
        try:
            outcomes.append(("ok", list(m.gather(s, 1, index(m)).shape), s.scatter(1, index(m), 1.0).tolist()))
        except RuntimeError as e:
            outcomes.append(("raise", str(e).split(" dtype")[0]))   # flambeau takes int64 only
    assert outcomes[0] == outcomes[1]
