"""EmbeddingBag in exported and compiled programs (recommendation models' sparse features): a traced call
of a 2-D input (bags of one length) is embedding + a reduction over the bag (sum with per-sample weights,
mean, max; padding_idx entries left out, an empty bag zeros), so it exports, packages with AOTInductor
(run from Python and from the C++ program) and compiles with fullgraph=True. Outputs vs PyTorch eager;
1-D input with offsets (data-dependent bag sizes) is refused by name when traced."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._inductor import aoti_compile_and_package, aoti_load_package
from flambeau._inductor.aoti_package import read_tensor_file
from flambeau.export import Dim, export
from tests.conftest import spy_compile_fx
from tests.test_aoti import _run_cpp


def dlrm(lib):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.users = nn.EmbeddingBag(20, 6, mode="sum", padding_idx=0)
            self.items = nn.EmbeddingBag(15, 6, mode="max", padding_idx=3)
            self.tags = nn.EmbeddingBag(12, 6, mode="mean", padding_idx=1)
            self.top = nn.Sequential(nn.Linear(18 + 4, 8), nn.ReLU(), nn.Linear(8, 1))

        def forward(self, dense, users, weights, items, tags):
            feats = [self.users(users, per_sample_weights=weights), self.items(items), self.tags(tags), dense]
            return self.top(lib.cat(feats, 1))
    return Net()


def _inputs(lib, batch):
    rng = np.random.default_rng(batch)
    users = rng.integers(0, 20, (batch, 4))
    users[0, :2] = 0                                  # padding entries
    items = rng.integers(0, 15, (batch, 3))
    items[1] = 3                                      # an empty bag (all padding): zeros
    tags = rng.integers(0, 12, (batch, 5))
    tags[:, 0] = 1                                    # left out of the mean's count
    arrays = [rng.standard_normal((batch, 4)), users, rng.random((batch, 4)), items, tags]
    return tuple(lib.tensor(a.astype(np.float32) if a.dtype.kind == "f" else a) for a in arrays)


def _pair():
    fl.manual_seed(0)
    m, tm = dlrm(fl).eval(), dlrm(torch).eval()
    with fl.no_grad():                                # padding rows that are not zero: left out all the same
        for bag, row in ((m.users, 0), (m.items, 3), (m.tags, 1)):
            bag.weight[row] = 1.5
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    return m, tm


def _want(tm, batch):
    with torch.no_grad():
        return tm(*_inputs(torch, batch)).numpy()


def _dims():
    b = Dim("batch", min=2, max=16)
    return {"dense": {0: b}, "users": {0: b}, "weights": {0: b}, "items": {0: b}, "tags": {0: b}}


def test_embedding_bag_exports_and_packages_as_pytorch(tmp_path):
    m, tm = _pair()
    ep = export(m, _inputs(fl, 3), dynamic_shapes=_dims())
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("embedding" in t for t in targets) == 3
    for batch in (3, 7):
        np.testing.assert_allclose(ep.module()(*_inputs(fl, batch)).detach().numpy(), _want(tm, batch), rtol=1e-5,
                                   atol=1e-5)
    pkg = aoti_compile_and_package(ep, package_path=str(tmp_path / "dlrm.pt2"))
    run = aoti_load_package(pkg)
    for batch in (2, 9):
        np.testing.assert_allclose(run(*_inputs(fl, batch)).numpy(), _want(tm, batch), rtol=1e-5, atol=1e-5)
    r, _ = _run_cpp(pkg, tmp_path, list(_inputs(fl, 5)))
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(read_tensor_file(str(tmp_path / "output0.bin")).numpy(), _want(tm, 5),
                               rtol=1e-5, atol=1e-5)


def test_embedding_bag_compiles_in_one_graph(monkeypatch):
    m, tm = _pair()
    graphs = spy_compile_fx(monkeypatch, [])
    fl._dynamo.reset()
    try:
        f = fl.compile(m, fullgraph=True)
        with fl.no_grad():
            for batch in (4, 4):
                np.testing.assert_allclose(f(*_inputs(fl, batch)).numpy(), _want(tm, batch), rtol=1e-5, atol=1e-5)
    finally:
        fl._dynamo.reset()
    assert len(graphs) == 1


def test_traced_embedding_bag_with_offsets_is_refused_by_name():
    class Bags(fl.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = fl.nn.EmbeddingBag(10, 4)

        def forward(self, x, offsets):
            return self.e(x, offsets)
    with pytest.raises(NotImplementedError, match="embedding_bag: .*1-D input with offsets"):
        export(Bags(), (fl.tensor([1, 2, 3, 4]), fl.tensor([0, 1])))
