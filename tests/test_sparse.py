"""Sparse tensors (flambeau.sparse) against PyTorch on cpu: COO/CSR construction and conversions,
coalesce, sparse.mm (with reduce=), sparse.sum, torch.mm/@/addmm with a sparse left operand, forward
values and gradients (a sparse input's gradient is sparse with its pattern, as in PyTorch), and the
errors for what is not supported. 2:4 semi-structured sparsity is in test_sparse_semi_structured.py."""
import io

import numpy as np
import pytest
import torch

import flambeau

pytestmark = pytest.mark.filterwarnings("ignore:Sparse (CSR tensor support|invariant checks)")

IDX = [[0, 1, 1, 0, 3, 2], [2, 0, 2, 2, 1, 3]]        # (0, 2) twice: an uncoalesced tensor
VALS = [3.0, 4.0, 5.0, 1.0, -2.0, 0.5]
SHAPE = (4, 5)


def _np(t):
    if t.layout is not flambeau.strided and t.layout is not torch.strided:
        t = t.to_dense()
    return t.detach().numpy()


def _close(a, b, rtol=1.3e-6, atol=1e-5):
    np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol)


def _pair(values=VALS, idx=IDX, shape=SHAPE, requires_grad=True):
    """The same uncoalesced COO tensor in both libraries, built from leaf values."""
    fv = flambeau.tensor(values, requires_grad=requires_grad)
    tv = torch.tensor(values, requires_grad=requires_grad)
    fs = flambeau.sparse_coo_tensor(flambeau.tensor(idx), fv, shape)
    ts = torch.sparse_coo_tensor(torch.tensor(idx), tv, shape)
    return fs, ts, fv, tv


def _dense_pair(*shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return flambeau.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _same_pattern(f, t):
    assert f.layout.name == str(t.layout).split(".")[-1]
    if t.layout is torch.sparse_coo:
        np.testing.assert_array_equal(f._indices().numpy(), t._indices().numpy())
    else:
        np.testing.assert_array_equal(f.crow_indices().numpy(), t.crow_indices().numpy())
        np.testing.assert_array_equal(f.col_indices().numpy(), t.col_indices().numpy())


# ---- construction, metadata, conversions ---------------------------------------------------------------------
def test_coo_construction_and_metadata():
    fs, ts, _, _ = _pair()
    assert fs.is_sparse and fs.layout is flambeau.sparse_coo and not fs.is_coalesced()
    assert tuple(fs.shape) == tuple(ts.shape) and fs.dtype is flambeau.float32
    assert fs._nnz() == ts._nnz() and fs.sparse_dim() == 2 and fs.dense_dim() == 0
    _same_pattern(fs, ts)
    _close(fs, ts)
    c = fs.coalesce()
    assert c.is_coalesced()
    _same_pattern(c, ts.coalesce())
    _close(c.values(), ts.coalesce().values())
    np.testing.assert_array_equal(c.indices().numpy(), ts.coalesce().indices().numpy())
    assert not flambeau.ones(2).is_sparse and flambeau.ones(2).layout is flambeau.strided


def test_coo_size_inferred_and_hybrid():
    fs = flambeau.sparse_coo_tensor(flambeau.tensor([[0, 2]]), flambeau.tensor([[1.0, 2.0], [3.0, 4.0]]))
    ts = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert tuple(fs.shape) == tuple(ts.shape) == (3, 2) and fs.dense_dim() == 1
    _close(fs, ts)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    x[1] = 0
    fh, th = flambeau.tensor(x).to_sparse(1), torch.tensor(x).to_sparse(1)
    _same_pattern(fh, th)
    _close(fh.values(), th.values())


def test_dense_to_sparse_and_back_with_grad():
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    x[x < 0.3] = 0
    fx, tx = flambeau.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    fs, ts = fx.to_sparse(), tx.to_sparse()
    _same_pattern(fs, ts)
    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    (fs.to_dense() * flambeau.tensor(w)).sum().backward()
    (ts.to_dense() * torch.tensor(w)).sum().backward()
    _close(fx.grad, tx.grad)
    assert fx.grad.layout is flambeau.strided


def test_csr_conversions():
    fs, ts, _, _ = _pair(requires_grad=False)
    fc, tc = fs.to_sparse_csr(), ts.to_sparse_csr()
    assert fc.layout is flambeau.sparse_csr and fc.is_sparse_csr and not fc.is_sparse
    _same_pattern(fc, tc)
    _close(fc.values(), tc.values())
    _close(fc, tc)
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32) * (np.arange(12).reshape(3, 4) % 3 == 0)
    _same_pattern(flambeau.tensor(x).to_sparse_csr(), torch.tensor(x).to_sparse_csr())
    back = fc.to_sparse()
    assert back.layout is flambeau.sparse_coo
    _same_pattern(back, tc.to_sparse())
    built = flambeau.sparse_csr_tensor(fc.crow_indices(), fc.col_indices(), fc.values(), SHAPE)
    _close(built, tc)


def test_values_gradient_through_to_dense():
    fs, ts, fv, tv = _pair()
    w = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    (fs.to_dense() * flambeau.tensor(w)).sum().backward()
    (ts.to_dense() * torch.tensor(w)).sum().backward()
    _close(fv.grad, tv.grad)


def test_to_dense_gradient_of_sparse_leaf_is_sparse():
    fs, ts, _, _ = _pair(requires_grad=False)
    fs, ts = fs.coalesce().requires_grad_(), ts.coalesce().requires_grad_()
    w = np.random.default_rng(6).standard_normal(SHAPE).astype(np.float32)
    (fs.to_dense() * flambeau.tensor(w)).sum().backward()
    (ts.to_dense() * torch.tensor(w)).sum().backward()
    assert fs.grad.layout is flambeau.sparse_coo
    _same_pattern(fs.grad.coalesce(), ts.grad.coalesce())
    _close(fs.grad, ts.grad)


# ---- products ----------------------------------------------------------------------------------------------
def test_sparse_mm_forward_and_grads():
    fs, ts, fv, tv = _pair()
    fd, td = _dense_pair(5, 3)
    fo, to = flambeau.sparse.mm(fs, fd), torch.sparse.mm(ts, td)
    _close(fo, to)
    g = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    fo.backward(flambeau.tensor(g))
    to.backward(torch.tensor(g))
    _close(fv.grad, tv.grad)
    _close(fd.grad, td.grad)


def test_sparse_mm_leaf_gradient_is_sparse_with_its_pattern():
    fs, ts, _, _ = _pair(requires_grad=False)
    fs, ts = fs.coalesce().requires_grad_(), ts.coalesce().requires_grad_()
    fd, td = _dense_pair(5, 3, seed=8)
    flambeau.sparse.mm(fs, fd).sum().backward()
    torch.sparse.mm(ts, td).sum().backward()
    assert fs.grad.layout is flambeau.sparse_coo
    _same_pattern(fs.grad.coalesce(), ts.grad.coalesce())
    _close(fs.grad.coalesce().values(), ts.grad.coalesce().values())
    _close(fd.grad, td.grad)


@pytest.mark.parametrize("how", ["mm", "matmul", "addmm"])
def test_mm_matmul_addmm_with_sparse_left_give_dense_grad(how):
    fs, ts, _, _ = _pair(requires_grad=False)
    fs, ts = fs.coalesce().requires_grad_(), ts.coalesce().requires_grad_()
    fd, td = _dense_pair(5, 3, seed=9)
    fb, tb = _dense_pair(4, 3, seed=10)
    if how == "mm":
        fo, to = flambeau.mm(fs, fd), torch.mm(ts, td)
    elif how == "matmul":
        fo, to = fs @ fd, ts @ td
    else:
        fo, to = flambeau.addmm(fb, fs, fd, beta=0.5, alpha=2.0), torch.addmm(tb, ts, td, beta=0.5, alpha=2.0)
    _close(fo, to)
    g = np.random.default_rng(11).standard_normal((4, 3)).astype(np.float32)
    fo.backward(flambeau.tensor(g))
    to.backward(torch.tensor(g))
    assert fs.grad.layout is flambeau.strided and ts.grad.layout is torch.strided
    _close(fs.grad, ts.grad)
    _close(fd.grad, td.grad)
    if how == "addmm":
        _close(fb.grad, tb.grad)


def test_mm_values_gradient_of_built_sparse_tensor():
    fs, ts, fv, tv = _pair()
    fd, td = _dense_pair(5, 2, seed=12)
    (flambeau.mm(fs, fd) ** 2).sum().backward()
    (torch.mm(ts, td) ** 2).sum().backward()
    _close(fv.grad, tv.grad)
    _close(fd.grad, td.grad)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "max", "min"])
def test_sparse_mm_reduce_csr(reduce):
    fs, ts, _, _ = _pair(requires_grad=False)
    fc, tc = fs.to_sparse_csr().requires_grad_(), ts.to_sparse_csr().requires_grad_()
    fd, td = _dense_pair(5, 3, seed=13)
    fo, to = flambeau.sparse.mm(fc, fd, reduce), torch.sparse.mm(tc, td, reduce)
    _close(fo, to)
    g = np.random.default_rng(14).standard_normal((4, 3)).astype(np.float32)
    fo.backward(flambeau.tensor(g))
    to.backward(torch.tensor(g))
    assert fc.grad.layout is flambeau.sparse_csr
    _same_pattern(fc.grad, tc.grad)
    _close(fc.grad.values(), tc.grad.values())
    _close(fd.grad, td.grad)


def test_sparse_mm_sparse_sparse():
    fs, ts, _, _ = _pair(requires_grad=False)
    fo, to = flambeau.sparse.mm(fs, fs.t()), torch.sparse.mm(ts, ts.t())
    assert fo.layout is flambeau.sparse_coo
    _close(fo, to)


def test_sparse_addmm():
    fs, ts, fv, tv = _pair()
    fd, td = _dense_pair(5, 3, seed=15)
    fb, tb = _dense_pair(4, 3, seed=16)
    fo = flambeau.sparse.addmm(fb, fs, fd, beta=2.0, alpha=0.5)
    to = torch.sparse.addmm(tb, ts, td, beta=2.0, alpha=0.5)
    _close(fo, to)
    fo.sum().backward()
    to.sum().backward()
    _close(fv.grad, tv.grad)
    _close(fb.grad, tb.grad)


def test_sampled_addmm_csr():
    fs, ts, _, _ = _pair(requires_grad=False)
    fc, tc = fs.to_sparse_csr().requires_grad_(), ts.to_sparse_csr().requires_grad_()
    fa, ta = _dense_pair(4, 6, seed=25)
    fb, tb = _dense_pair(6, 5, seed=26)
    fo = flambeau.sparse.sampled_addmm(fc, fa, fb, beta=0.5, alpha=2.0)
    to = torch.sparse.sampled_addmm(tc, ta, tb, beta=0.5, alpha=2.0)
    assert fo.layout is flambeau.sparse_csr
    _same_pattern(fo, to)
    _close(fo.values(), to.values())
    w = np.random.default_rng(27).standard_normal(fo._nnz()).astype(np.float32)
    (fo.values() * flambeau.tensor(w)).sum().backward()
    (to.values() * torch.tensor(w)).sum().backward()
    _close(fa.grad, ta.grad)
    _close(fb.grad, tb.grad)
    _close(fc.grad.values(), tc.grad.values())
    _same_error(lambda: flambeau.sparse.sampled_addmm(fs, fa, fb), lambda: torch.sparse.sampled_addmm(ts, ta, tb))


# ---- reductions and arithmetic --------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)])
def test_sparse_sum(dim):
    fs, ts, fv, tv = _pair()
    fo = flambeau.sparse.sum(fs) if dim is None else flambeau.sparse.sum(fs, dim)
    to = torch.sparse.sum(ts) if dim is None else torch.sparse.sum(ts, dim)
    assert (fo.layout is flambeau.strided) == (to.layout is torch.strided)
    _close(fo, to)
    w = np.random.default_rng(17).standard_normal(tuple(to.shape)).astype(np.float32)
    (fo.to_dense() * flambeau.tensor(w)).sum().backward()
    (to.to_dense() * torch.tensor(w)).sum().backward()
    _close(fv.grad, tv.grad)


def test_sparse_sum_leaf_grad_is_sparse():
    fs, ts, _, _ = _pair(requires_grad=False)
    fs, ts = fs.coalesce().requires_grad_(), ts.coalesce().requires_grad_()
    flambeau.sparse.sum(fs).backward()
    torch.sparse.sum(ts).backward()
    assert fs.grad.layout is flambeau.sparse_coo
    _same_pattern(fs.grad.coalesce(), ts.grad.coalesce())
    _close(fs.grad.coalesce().values(), ts.grad.coalesce().values())


def test_arithmetic_on_sparse():
    fs, ts, fv, tv = _pair()
    f2, t2, _, _ = _pair(values=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], idx=[[3, 3, 0, 1, 2, 0], [4, 1, 2, 0, 0, 0]])
    fo, to = fs * 2.0 + f2 - (-fs) / 4.0, ts * 2.0 + t2 - (-ts) / 4.0
    assert fo.layout is flambeau.sparse_coo
    _close(fo, to)
    fd, td = _dense_pair(*SHAPE, seed=18)
    _close(fd + fs, td + ts)
    flambeau.sparse.sum(fo).backward()
    torch.sparse.sum(to).backward()
    _close(fv.grad, tv.grad)
    _close(fs.t(), ts.t())
    _close(fs.double(), ts.double())
    _close(fs.clone(), ts.clone())


def test_sparse_gradients_accumulate_with_dense_ones():
    fs, ts, _, _ = _pair(requires_grad=False)
    fs, ts = fs.coalesce().requires_grad_(), ts.coalesce().requires_grad_()
    fd, td = _dense_pair(5, 3, seed=19)
    (flambeau.sparse.sum(fs) + flambeau.mm(fs, fd).sum() + flambeau.sparse.mm(fs, fd).sum()).backward()
    (torch.sparse.sum(ts) + torch.mm(ts, td).sum() + torch.sparse.mm(ts, td).sum()).backward()
    _close(fs.grad, ts.grad)


@pytest.mark.parametrize("name", ["abs", "sqrt", "sin", "tanh", "relu", "square", "expm1", "sign", "isnan"])
def test_zero_preserving_unary_ops(name):
    fs, ts, fv, tv = _pair(values=[3.0, 4.0, 5.0, 1.0, 2.0, 0.5])
    fo, to = getattr(flambeau, name)(fs), getattr(torch, name)(ts)
    assert fo.layout is flambeau.sparse_coo
    _close(fo, to)
    if to.dtype.is_floating_point:
        flambeau.sparse.sum(fo).backward()
        getattr(torch, name)(ts.to_dense()).sum().backward()     # PyTorch's sparse backward lacks several of these
        _close(fv.grad, tv.grad)


def test_pow_mul_dense_and_sparse_mask():
    fs, ts, fv, tv = _pair()
    fd, td = _dense_pair(*SHAPE, seed=20)
    fo, to = (fs ** 2) * fd, (ts ** 2) * td
    assert fo.layout is flambeau.sparse_coo
    _close(fo, to)
    flambeau.sparse.sum(fo).backward()
    torch.sparse.sum(to).backward()
    _close(fv.grad, tv.grad)
    _close(fd.grad, td.grad)
    fm, tm = fd.sparse_mask(fs.coalesce()), td.sparse_mask(ts.coalesce())
    _same_pattern(fm, tm)
    _close(fm.values(), tm.values())
    with pytest.raises(NotImplementedError):
        fs ** -1


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1])
def test_sparse_softmax(fn, dim):
    fs, ts, fv, tv = _pair()
    fo, to = getattr(flambeau.sparse, fn)(fs, dim), getattr(torch.sparse, fn)(ts, dim)
    assert fo.layout is flambeau.sparse_coo
    _same_pattern(fo, to)
    _close(fo.values(), to.coalesce().values())
    w = np.random.default_rng(21).standard_normal(SHAPE).astype(np.float32)
    (fo.to_dense() * flambeau.tensor(w)).sum().backward()
    (to.to_dense() * torch.tensor(w)).sum().backward()
    _close(fv.grad, tv.grad)


def test_empty_sparse_tensors():
    fz, tz = flambeau.zeros(3, 4).to_sparse(), torch.zeros(3, 4).to_sparse()
    assert fz._nnz() == tz._nnz() == 0
    fd, td = _dense_pair(4, 2, seed=22)
    _close(flambeau.sparse.mm(fz, fd), torch.sparse.mm(tz, td))
    _close(flambeau.sparse.sum(fz), torch.sparse.sum(tz))
    _close(fz.to_sparse_csr(), tz.to_sparse_csr())


def _gcn_losses(lib, adj_idx, feats, labels, w1, w2, steps=5):
    """A two-layer GCN (normalised sparse adjacency, sparse.mm) trained with SGD; the losses per step."""
    n = feats.shape[0]
    idx = lib.tensor(adj_idx)
    adj = lib.sparse_coo_tensor(idx, lib.ones(idx.shape[1]), (n, n)).coalesce()
    deg = lib.sparse.sum(adj, dim=1).to_dense()
    adj = lib.sparse_coo_tensor(adj.indices(), adj.values() / deg[adj.indices()[0]], (n, n))
    x, y = lib.tensor(feats), lib.tensor(labels)
    p1, p2 = lib.tensor(w1, requires_grad=True), lib.tensor(w2, requires_grad=True)
    opt = lib.optim.SGD([p1, p2], lr=0.5)
    losses = []
    for _ in range(steps):
        h = lib.relu(lib.sparse.mm(adj, x @ p1))
        logits = lib.sparse.mm(adj, h @ p2)
        loss = lib.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gcn_training_matches_pytorch():
    rng = np.random.default_rng(23)
    n, f, c = 30, 8, 3
    edges = rng.integers(0, n, (2, 90))
    adj_idx = np.concatenate([edges, edges[::-1], np.stack([np.arange(n)] * 2)], axis=1)
    feats = rng.standard_normal((n, f)).astype(np.float32)
    labels = rng.integers(0, c, n)
    w1 = (rng.standard_normal((f, 16)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((16, c)) * 0.3).astype(np.float32)
    ours, theirs = _gcn_losses(flambeau, adj_idx, feats, labels, w1, w2), _gcn_losses(torch, adj_idx, feats, labels, w1, w2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert ours[-1] < ours[0]


def test_compile_runs_sparse_inputs_eagerly_and_fullgraph_refuses():
    fs, ts, _, _ = _pair(requires_grad=False)
    fd, td = _dense_pair(5, 3, seed=24)

    def f(s, d):
        return flambeau.sparse.mm(s, d).relu() + 1
    _close(flambeau.compile(f)(fs, fd.detach()), torch.sparse.mm(ts, td.detach()).relu() + 1)
    with pytest.raises(RuntimeError, match="does not support sparse Tensors"):
        flambeau.compile(f, fullgraph=True)(fs, fd.detach())


@pytest.mark.parametrize("how", ["index_select0", "index_select1", "select0", "select1", "getitem"])
def test_index_select_and_select(how):
    fs, ts, fv, tv = _pair()
    d = int(how[-1]) if how[-1].isdigit() else 0
    ix = [2, 2, 0] if d == 0 else [2, 2, 0, 4]

    def ref(x):
        if how.startswith("index_select"):
            return x.index_select(d, torch.tensor(ix))
        return x[1] if how == "getitem" else x.select(d, 2)
    if how.startswith("index_select"):
        fo = fs.index_select(d, flambeau.tensor(ix))
    else:
        fo = fs[1] if how == "getitem" else fs.select(d, 2)
    to = ref(ts)
    assert fo.layout is flambeau.sparse_coo and tuple(fo.shape) == tuple(to.shape)
    _close(fo, to)
    w = np.random.default_rng(28).standard_normal(tuple(to.shape)).astype(np.float32)
    (fo.to_dense() * flambeau.tensor(w)).sum().backward()
    (ref(ts.to_dense()) * torch.tensor(w)).sum().backward()     # PyTorch's sparse index_select has no backward
    _close(fv.grad, tv.grad)


# ---- errors ---------------------------------------------------------------------------------------------------
def _same_error(fn_f, fn_t):
    with pytest.raises(Exception) as et:
        fn_t()
    with pytest.raises(type(et.value)) as ef:
        fn_f()
    return str(ef.value), str(et.value)


def test_errors_match_pytorch_types():
    fs, ts, _, _ = _pair(requires_grad=False)
    m, _ = _same_error(lambda: fs.view(20), lambda: ts.view(20))
    _same_error(lambda: fs[9], lambda: ts[9])
    assert m.startswith("Could not run 'aten::view' with arguments from the 'SparseCPU' backend")
    m, tm = _same_error(lambda: fs.exp(), lambda: ts.exp())
    assert "aten::exp" in m
    m, tm = _same_error(lambda: fs.reshape(20), lambda: ts.reshape(20))
    assert m == tm
    m, tm = _same_error(lambda: fs.numpy(), lambda: ts.numpy())
    assert m == tm
    m, tm = _same_error(lambda: fs.values(), lambda: ts.values())
    assert m == tm
    m, tm = _same_error(lambda: fs + flambeau.ones(SHAPE), lambda: ts + torch.ones(SHAPE))
    assert m == tm
    m, tm = _same_error(lambda: fs.data_ptr(), lambda: ts.data_ptr())
    assert m == tm
    m, tm = _same_error(lambda: flambeau.sparse_coo_tensor(flambeau.tensor([[0, 1]]), flambeau.tensor([1.0, 2.0, 3.0])),
                        lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0, 3.0])))
    assert m == tm
    _same_error(lambda: flambeau.sparse.mm(fs, flambeau.ones(5, 2), "sum"),
                lambda: torch.sparse.mm(ts, torch.ones(5, 2), "sum"))
    _same_error(lambda: flambeau.sparse.mm(fs.to_sparse_csr(), flambeau.ones(5, 2), "prod2"),
                lambda: torch.sparse.mm(ts.to_sparse_csr(), torch.ones(5, 2), "prod2"))
    _same_error(lambda: flambeau.mm(fs, flambeau.ones(4, 2)), lambda: torch.mm(ts, torch.ones(4, 2)))
    _same_error(lambda: flambeau.mm(fs, flambeau.ones(5, 2, dtype=flambeau.float64)),
                lambda: torch.mm(ts, torch.ones(5, 2, dtype=torch.float64)))


def test_save_and_load_round_trip():
    fs, _, _, _ = _pair(requires_grad=False)
    leaf = fs.coalesce().requires_grad_()
    buf = io.BytesIO()
    flambeau.save({"coo": fs, "leaf": leaf, "csr": fs.to_sparse_csr(), "dense": flambeau.ones(2)}, buf)
    buf.seek(0)
    back = flambeau.load(buf)
    assert back["coo"].layout is flambeau.sparse_coo and not back["coo"].is_coalesced()
    np.testing.assert_array_equal(back["coo"]._indices().numpy(), fs._indices().numpy())
    np.testing.assert_array_equal(back["coo"]._values().detach().numpy(), fs._values().detach().numpy())
    assert back["leaf"].requires_grad and back["leaf"].is_coalesced()
    assert back["csr"].layout is flambeau.sparse_csr
    _close(back["csr"], fs)
    with pytest.raises(RuntimeError, match="no single array to copy out.*to_dense"):
        np.asarray(fs.cpu()._host())


def test_repr_names_layout_and_pattern():
    fs, ts, _, _ = _pair(requires_grad=False)
    assert repr(fs.coalesce()) == repr(ts.coalesce())
    assert "layout=torch.sparse_csr" in repr(fs.to_sparse_csr())
