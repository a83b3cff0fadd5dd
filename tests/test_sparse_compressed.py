"""CSC, BSR and BSC tensors (`flambeau/sparse/_compressed.py`) against torch 2.13: every conversion between
dense, COO, CSR, CSC, BSR and BSC gives PyTorch's components (or its refusal), the constructors rebuild
PyTorch's matrices, products with a dense matrix and their gradients (PyTorch has none for these
layouts) against float64 math, value-only ops keep the layout, and save/load round trips."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import flambeau

LAYOUTS = ("dense", "coo", "csr", "csc", "bsr", "bsc")
BLOCK = (2, 2)


def _matrix(seed=0, shape=(6, 8), density=0.3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * (rng.random(shape) < density)
    x[2:4, 2:4] = 0          # an empty block
    return x.astype(np.float32)


def _to(m, t, layout, block=BLOCK):
    if layout == "dense":
        return t.to_dense() if t.layout is not m.strided else t
    if layout == "coo":
        return t.to_sparse()
    if layout in ("bsr", "bsc"):
        return getattr(t, f"to_sparse_{layout}")(block)
    return getattr(t, f"to_sparse_{layout}")()


def _components(t) -> list:
    """What a layout stores, as lists: PyTorch's component accessors."""
    name = str(t.layout).split(".")[-1]
    if name == "strided":
        return [name, t.tolist()]
    if name == "sparse_coo":
        return [name, t._indices().tolist(), t._values().tolist(), t.is_coalesced()]
    if name in ("sparse_csr", "sparse_bsr"):
        return [name, t.crow_indices().tolist(), t.col_indices().tolist(), t.values().tolist()]
    return [name, t.ccol_indices().tolist(), t.row_indices().tolist(), t.values().tolist()]


def _both(fn):
    """fn(torch) and fn(flambeau): their results, or the exception types and messages."""
    out = []
    for m in (torch, flambeau):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append(fn(m))
        except (RuntimeError, NotImplementedError) as e:
            out.append((type(e).__name__, str(e).split("\n")[0]))
    return out


@pytest.mark.parametrize("src", LAYOUTS)
@pytest.mark.parametrize("dst", LAYOUTS)
def test_conversions_give_pytorchs_components(src, dst):
    x = _matrix()
    want, got = _both(lambda m: _components(_to(m, _to(m, m.tensor(x), src), dst)))
    if isinstance(want, tuple):       # PyTorch refuses (BSR/BSC -> CSR/CSC)
        assert isinstance(got, tuple) and got[0] == want[0], (want, got)
        return
    assert got == want


@pytest.mark.parametrize("dst", ["bsr", "bsc"])
def test_blocked_conversions_refuse_a_changed_or_indivisible_blocksize(dst):
    x = _matrix()
    for fn in (lambda m: _to(m, m.tensor(x).to_sparse_bsr((2, 2)), dst, (2, 1)),
               lambda m: _to(m, m.tensor(x), dst, (4, 3)),
               lambda m: m.tensor(x).to_sparse(layout=getattr(m, f"sparse_{dst}"))):
        want, got = _both(fn)
        assert isinstance(want, tuple) and isinstance(got, tuple) and want[0] == got[0], (want, got)
    want, got = _both(lambda m: _to(m, m.tensor(x).to_sparse_bsr((2, 2)), dst, (2, 1)))
    assert got == want


@pytest.mark.parametrize("layout", ["csc", "bsr", "bsc"])
def test_constructors_rebuild_pytorchs_matrix(layout):
    t = _to(torch, torch.tensor(_matrix(1)), layout)
    comp = t.crow_indices() if layout == "bsr" else t.ccol_indices()
    plain = t.col_indices() if layout == "bsr" else t.row_indices()
    parts = [flambeau.tensor(a.numpy()) for a in (comp, plain, t.values())]
    made = getattr(flambeau, f"sparse_{layout}_tensor")(*parts, tuple(t.shape))
    general = flambeau.sparse_compressed_tensor(*parts, tuple(t.shape), layout=getattr(flambeau, f"sparse_{layout}"))
    for s in (made, general):
        assert str(s.layout) == str(t.layout) and s._nnz() == t._nnz()
        np.testing.assert_array_equal(s.to_dense().numpy(), t.to_dense().numpy())
    assert repr(made).splitlines()[0].split("=")[0] == repr(t).splitlines()[0].split("=")[0]
    with pytest.raises(RuntimeError, match="compressed indices"):
        getattr(flambeau, f"sparse_{layout}_tensor")(parts[0][:-1], *parts[1:], tuple(t.shape))


def test_component_accessors_refuse_the_other_orientation():
    x = flambeau.tensor(_matrix())
    for fn, t in ((lambda s: s.crow_indices(), x.to_sparse_csc()), (lambda s: s.ccol_indices(), x.to_sparse_csr()),
                  (lambda s: s.row_indices(), x.to_sparse_bsr(BLOCK))):
        name = str(t.layout).split(".")[-1]
        want = _both(lambda m: fn(_to(m, m.tensor(_matrix()), name[len("sparse_"):])))[0]
        with pytest.raises(RuntimeError) as e:
            fn(t)
        assert str(e.value) == want[1]


@pytest.mark.parametrize("layout", ["csc", "bsr", "bsc"])
def test_products_with_a_dense_matrix_and_their_gradients(layout):
    """S @ D, torch.sparse.mm and S.to_dense() of each layout against float64 math; the gradient of S's
    values is (G @ D^T) read at each stored element (every element of a stored block), D's is S^T G."""
    x = _matrix(2).astype(np.float64)
    rng = np.random.default_rng(3)
    d = rng.standard_normal((8, 5))
    g = rng.standard_normal((6, 5))
    s = _to(flambeau, flambeau.tensor(x), layout).detach().requires_grad_()
    for product in (lambda a, b: a @ b, flambeau.sparse.mm, lambda a, b: a.to_dense() @ b):
        s.grad = None
        dd = flambeau.tensor(d, requires_grad=True)
        y = product(s, dd)
        np.testing.assert_allclose(y.detach().numpy(), x @ d, rtol=1e-12, atol=1e-12)
        y.backward(flambeau.tensor(g))
        np.testing.assert_allclose(dd.grad.numpy(), x.T @ g, rtol=1e-12, atol=1e-12)
        full = g @ d.T
        gv = s.grad.values().detach().numpy() if s.grad.layout is s.layout else None
        if gv is None:          # a dense gradient (torch.mm's rule): compare where S stores entries
            np.testing.assert_allclose(s.grad.numpy()[x != 0], full[x != 0], rtol=1e-12)
            continue
        t = _to(torch, torch.tensor(x), layout)
        if layout == "csc":
            want = full[t.row_indices().numpy(), np.repeat(np.arange(8), np.diff(t.ccol_indices().numpy()))]
        else:
            comp, plain = ((t.crow_indices(), t.col_indices()) if layout == "bsr" else
                           (t.ccol_indices(), t.row_indices()))
            major = np.repeat(np.arange(len(comp) - 1), np.diff(comp.numpy()))
            rows, cols = (major, plain.numpy()) if layout == "bsr" else (plain.numpy(), major)
            want = np.stack([full[r * 2:r * 2 + 2, c * 2:c * 2 + 2] for r, c in zip(rows, cols)])
        np.testing.assert_allclose(gv, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["csc", "bsr", "bsc"])
def test_value_only_ops_keep_the_layout_as_pytorchs(layout):
    x = _matrix(4)
    for fn in (lambda t: -t, lambda t: t * 2.5, lambda t: t.clone(), lambda t: t.to(t.dtype)):
        want, got = _both(lambda m: _components(fn(_to(m, m.tensor(x), layout))))
        assert got == want


@pytest.mark.parametrize("layout", ["csc", "bsr", "bsc"])
def test_save_and_load_round_trip(layout, tmp_path):
    s = _to(flambeau, flambeau.tensor(_matrix(5)), layout)
    flambeau.save({"w": s}, tmp_path / "s.pt")
    back = flambeau.load(tmp_path / "s.pt")["w"]
    assert _components(back) == _components(s)


def _hybrid(seed=1):
    """(6, 8, 2) with whole entries zero and one entry zero in one of its two dense elements."""
    x = np.repeat(_matrix(seed)[:, :, None], 2, axis=2) * np.array([1.0, -0.5], np.float32)
    x[0, 0] = [0.0, 3.0]
    return x.astype(np.float32)


HYBRID = {
    "csr": lambda m, t: t.to_sparse_csr(dense_dim=1),
    "csc": lambda m, t: t.to_sparse_csc(dense_dim=1),
    "bsr": lambda m, t: t.to_sparse_bsr((2, 4), dense_dim=1),
    "bsc": lambda m, t: t.to_sparse_bsc((3, 2), dense_dim=1),
    "layout_kwarg": lambda m, t: t.to_sparse(layout=m.sparse_csr, dense_dim=1),
    "coo_to_csr": lambda m, t: t.to_sparse(2).to_sparse_csr(),
    "csr_to_csc": lambda m, t: t.to_sparse_csr(dense_dim=1).to_sparse_csc(),
}


@pytest.mark.parametrize("case", list(HYBRID))
def test_hybrid_compressed_tensors_match_pytorch(case):
    """Two sparse dimensions then a dense one (`dense_dim=1`): an entry is stored where any of its dense
    elements is non-zero; PyTorch's components, values (nnz[, bh, bw], 2), dense_dim and to_dense."""
    x = _hybrid()
    want, got = HYBRID[case](torch, torch.tensor(x)), HYBRID[case](flambeau, flambeau.tensor(x))
    assert str(got.layout) == str(want.layout) and got.dense_dim() == want.dense_dim() == 1
    assert _components(got)[:-1] == _components(want)[:-1]
    np.testing.assert_array_equal(got.values().detach().numpy(), want.values().numpy())
    np.testing.assert_array_equal(got.to_dense().numpy(), x)


def test_hybrid_csr_constructor_and_gradients():
    """`sparse_csr_tensor` with (nnz, 2) values builds PyTorch's hybrid matrix; the gradient of to_dense
    through a hybrid CSR reaches the dense input at the stored entries only, all their dense elements
    (float64 math; PyTorch's CSR has no backward here)."""
    args = ([0, 1, 1, 3], [2, 0, 1], [[1.0, 2.0], [3.0, 0.0], [0.0, -1.0]])
    want = torch.sparse_csr_tensor(*(torch.tensor(a) for a in args), size=(3, 3, 2))
    got = flambeau.sparse_csr_tensor(*(flambeau.tensor(a) for a in args), size=(3, 3, 2))
    np.testing.assert_array_equal(got.to_dense().numpy(), want.to_dense().numpy())
    x = _hybrid()
    w = np.random.default_rng(2).standard_normal(x.shape)
    t = flambeau.tensor(x.astype(np.float64), requires_grad=True)
    (t.to_sparse_csr(dense_dim=1).to_dense() * flambeau.tensor(w)).sum().backward()
    stored = (x != 0).any(axis=2, keepdims=True)
    np.testing.assert_allclose(t.grad.numpy(), w * stored, rtol=0, atol=1e-12)


def _batched(seed=3, shape=(2, 2, 3, 4, 2), per_batch=4):
    """Batches of matrices with the same number of stored entries (PyTorch's rule), hybrid when 5-D."""
    rng = np.random.default_rng(seed)
    x = np.zeros(shape, np.float32)
    for b in np.ndindex(*shape[:-3 if len(shape) == 5 else -2]):
        for q in rng.choice(shape[-3] * shape[-2] if len(shape) == 5 else shape[-2] * shape[-1], per_batch,
                            replace=False):
            n = shape[-2] if len(shape) == 5 else shape[-1]
            x[b + (q // n, q % n)] = rng.standard_normal(shape[-1] if len(shape) == 5 else ()) + 2
    return x


BATCHED = {   # input, conversion
    "csr": ((2, 3, 4), lambda t: t.to_sparse_csr()),
    "csc": ((2, 3, 4), lambda t: t.to_sparse_csc()),
    "csr_two_batch_dims_hybrid": ((2, 2, 3, 4, 2), lambda t: t.to_sparse_csr(dense_dim=1)),
    "csc_two_batch_dims_hybrid": ((2, 2, 3, 4, 2), lambda t: t.to_sparse_csc(dense_dim=1)),
    "csr_to_csc": ((2, 3, 4), lambda t: t.to_sparse_csr().to_sparse_csc()),
    "csc_to_csr": ((2, 3, 4), lambda t: t.to_sparse_csc().to_sparse_csr()),
}


@pytest.mark.parametrize("case", list(BATCHED))
def test_batched_compressed_tensors_match_pytorch(case):
    """Batch dimensions before the matrix: PyTorch's crow/col (or ccol/row) of shape (*batch, ...), values
    (*batch, nnz, *dense), _nnz per batch, sparse_dim 2, to_dense, to_sparse (COO over batch + matrix
    dimensions), value-wise ops keeping the layout, and the constructor rebuilding it (size inferred)."""
    shape, convert = BATCHED[case]
    x = _batched(shape=shape)
    want, got = convert(torch.tensor(x)), convert(flambeau.tensor(x))
    assert str(got.layout) == str(want.layout) and got._nnz() == want._nnz()
    assert (got.sparse_dim(), got.dense_dim()) == (want.sparse_dim(), want.dense_dim())
    assert _components(got) == _components(want)
    np.testing.assert_array_equal(got.to_dense().numpy(), x)
    np.testing.assert_array_equal(got.to_sparse()._indices().numpy(), want.to_sparse()._indices().numpy())
    for op in (lambda t: t * 2, lambda t: t.sin(), lambda t: -t):
        assert _components(op(got))[:-1] == _components(op(want))[:-1]
        np.testing.assert_allclose(op(got).to_dense().numpy(), op(want).to_dense().numpy(), rtol=1e-6)
    row = str(want.layout) == "torch.sparse_csr"
    parts = [want.crow_indices(), want.col_indices()] if row else [want.ccol_indices(), want.row_indices()]
    ctor = flambeau.sparse_csr_tensor if row else flambeau.sparse_csc_tensor
    built = ctor(*(flambeau.tensor(t.numpy()) for t in parts), flambeau.tensor(want.values().numpy()))
    assert tuple(built.shape) == x.shape
    np.testing.assert_array_equal(built.to_dense().numpy(), x)


def test_batched_csr_gradients_and_refusals():
    """values() of a batched CSR made from a dense tensor carries the gradient to the stored entries
    (float64 math); PyTorch's refusals: batches of different nnz, a 3-D COO to CSR; ops other than the
    value-wise ones and bmm/matmul by a dense tensor are refused, as are batched blocked layouts."""
    x = _batched(shape=(2, 3, 4))
    t = flambeau.tensor(x.astype(np.float64), requires_grad=True)
    w = np.random.default_rng(4).standard_normal((2, 4))
    (t.to_sparse_csr().values() * flambeau.tensor(w)).sum().backward()
    want = np.zeros_like(x, dtype=np.float64)
    b, r, c = np.nonzero(x)
    want[b, r, c] = w.reshape(-1)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=0, atol=1e-12)
    uneven = x.copy()
    uneven[0, 0, 0] = 5.0 if x[0, 0, 0] == 0 else 0.0
    for m in (torch, flambeau):
        with pytest.raises(RuntimeError, match="Expect the same number of specified elements per batch"):
            m.tensor(uneven).to_sparse_csr()
        with pytest.raises(RuntimeError, match=r"coo_to_sparse_csr: conversion from Sparse to SparseCsr for input "
                                               r"tensors with sparse_dim\(\)!=2 is not supported"):
            m.tensor(x).to_sparse().to_sparse_csr()
    with pytest.raises(NotImplementedError, match="SparseCsrCPU"):
        flambeau.tensor(x).to_sparse_csr() + flambeau.tensor(x).to_sparse_csr()
    with pytest.raises(RuntimeError, match="batched blocked layouts are not supported"):
        flambeau.tensor(x).to_sparse_bsr((1, 2))


@pytest.mark.parametrize("layout", ["csr", "csc"])
@pytest.mark.parametrize("op", ["bmm", "matmul", "@", "matmul_2d"])
def test_batched_csr_times_dense_forward_and_gradients(layout, op):
    """A batched CSR (or CSC) tensor (B, M, K) times a dense (B, K, N) (matmul: also a (K, N) shared by the
    batches): PyTorch's `bmm` of batched CSR (its cuda kernel; torch 2.13's cpu has none). The product, the
    dense operand's gradient S^T @ G and the stored values' gradient (G @ D^T at the entries) vs float64
    math. Broken: the batch offset left out of the gathered rows -> fails."""
    x = _batched(seed=7, shape=(3, 4, 5), per_batch=6).astype(np.float64)
    rng = np.random.default_rng(8)
    dn = rng.standard_normal((5, 2) if op == "matmul_2d" else (3, 5, 2))
    g = rng.standard_normal((3, 4, 2))
    dense = flambeau.tensor(x, requires_grad=True)
    s = dense.to_sparse_csr() if layout == "csr" else dense.to_sparse_csc()
    d = flambeau.tensor(dn, requires_grad=True)
    out = {"bmm": lambda: flambeau.bmm(s, d), "matmul": lambda: flambeau.matmul(s, d), "@": lambda: s @ d,
           "matmul_2d": lambda: flambeau.matmul(s, d)}[op]()
    assert out.layout == flambeau.strided and tuple(out.shape) == (3, 4, 2)
    np.testing.assert_allclose(out.detach().numpy(), x @ dn, rtol=1e-12, atol=1e-12)
    (out * flambeau.tensor(g)).sum().backward()
    want_d = np.swapaxes(x, 1, 2) @ g
    np.testing.assert_allclose(d.grad.numpy(), want_d.sum(0) if op == "matmul_2d" else want_d, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dense.grad.numpy(), (g @ np.swapaxes(np.broadcast_to(dn, (3, 5, 2)), 1, 2)) * (x != 0),
                               rtol=1e-12, atol=1e-12)


def test_batched_csr_product_errors_name_the_op():
    s = flambeau.tensor(_batched(shape=(2, 3, 4))).to_sparse_csr()
    with pytest.raises(RuntimeError, match="bmm: batch1 and batch2 must have same number of batches, got 2 and 3"):
        flambeau.bmm(s, flambeau.ones(3, 4, 2))
    with pytest.raises(RuntimeError, match=r"Expected size for first two dimensions of batch2 tensor to be: \[2, 4\]"):
        flambeau.bmm(s, flambeau.ones(2, 3, 2))
    with pytest.raises(RuntimeError, match="bmm: expected scalar type Float but found Double"):
        flambeau.bmm(s, flambeau.ones(2, 4, 2, dtype=flambeau.float64))
