"""AOTInductor packages of float64, bfloat16 and float16 models (the C++ wrapper's externs of every dtype).

A CNN with every extern the C++ wrapper runs besides the attention (convolutions plain, grouped and
transposed, max pooling, bilinear upsampling, adaptive average pooling, a linear layer) and an MLP of
batched products, each in float64 (double kernels: fl_dgemm, fl_conv2d_f64, the templated pooling and
resampling) and in bfloat16/float16 (operands widened to float, results rounded once), packaged with a
dynamic batch and run from Python and from the C++ program (no Python), against PyTorch eager with the
same weights: float64 to 1e-10; low precision judged against PyTorch's float64 forward, our RMSE no
worse than 1.5x that of PyTorch's own low-precision forward. `sort` and `topk` (any dtype) against
PyTorch's stable sort and topk, values and indices exactly.
"""
from __future__ import annotations

import copy
import zipfile

import numpy as np
import pytest

import flambeau as fl
from flambeau._inductor import aoti_compile_and_package, aoti_load_package
from flambeau._inductor.aoti_package import read_tensor_file
from flambeau.export import Dim, export
from tests.test_aoti import _run_cpp

DTYPES = ["float64", "bfloat16", "float16"]


def _cnn(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                         nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.Upsample(scale_factor=2, mode="bilinear"),
                         nn.ConvTranspose2d(8, 4, 3, stride=2), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(16, 5))


class _Mixer:
    """x (B, T, D) -> per-example products with a shared weight (bmm) and a projection (mm)."""

    @staticmethod
    def make(lib):
        nn = lib.nn

        class Mixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(6, 6)
                self.mix = nn.Parameter(lib.randn(6, 6) * 0.3)

            def forward(self, x):
                h = self.proj(x).relu()
                return lib.bmm(h, self.mix.expand(x.shape[0], 6, 6)) + h @ h.transpose(1, 2) @ x
        return Mixer()


NETS = {"cnn": (_cnn, (2, 3, 9, 9)), "mixer": (_Mixer.make, (2, 4, 6))}


def _pair(name, dtype):
    import torch
    make, shape = NETS[name]
    fl.manual_seed(0)
    m = make(fl).eval()
    tm = make(torch).eval()
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    tm.load_state_dict({k: torch.tensor(v) for k, v in sd.items()})
    return m.to(getattr(fl, dtype)), tm, shape


def _torch_forward(tm, x, dtype):
    import torch
    with torch.no_grad():
        return copy.deepcopy(tm).to(getattr(torch, dtype))(torch.tensor(x).to(getattr(torch, dtype))).double().numpy()


def _check(got, x64, tm, dtype):
    want = _torch_forward(tm, x64, "float64")
    if dtype == "float64":
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        return
    theirs = _torch_forward(tm, x64, dtype)
    rmse, ref = np.sqrt(np.mean((got - want) ** 2)), np.sqrt(np.mean((theirs - want) ** 2))
    assert rmse <= 1.5 * ref + 1e-6, (rmse, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(NETS))
def test_aoti_package_of_each_dtype_matches_pytorch(tmp_path, name, dtype):
    m, tm, shape = _pair(name, dtype)
    low = getattr(fl, dtype)
    pkg = aoti_compile_and_package(export(m, (fl.randn(*shape).to(low),),
                                          dynamic_shapes={"input" if name == "cnn" else "x": {0: Dim("batch", max=8)}}),
                                   package_path=str(tmp_path / "m.pt2"))
    with zipfile.ZipFile(pkg) as z:
        src = z.read("model.cpp").decode()
    if dtype == "float64":
        assert ("fl_conv2d_f64(" if name == "cnn" else "fl_dgemm(") in src.split("fl_graph_run(", 1)[1]
    elif name == "mixer" and dtype == "bfloat16":        # bfloat16 products: their own GEMM
        assert "fl_gemm_bf16(" in src and "fl_widen(fl_w" not in src
    else:
        assert src.count("fl_widen(fl_w") >= 3 and src.count("fl_narrow(") >= 3
    run = aoti_load_package(pkg)
    fl.manual_seed(1)
    for b in (2, 5):
        x = fl.randn(b, *shape[1:]).to(low)
        _check(run(x).double().numpy(), x.double().numpy(), tm, dtype)
    x3 = fl.randn(3, *shape[1:]).to(low)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    _check(read_tensor_file(str(tmp_path / "output0.bin")).double().numpy(), x3.double().numpy(), tm, dtype)


class _Sorter:
    @staticmethod
    def make(lib):
        class Sorter(lib.nn.Module):
            def forward(self, x, y):
                return (*x.sort(dim=1, descending=True), *x.sort(dim=0), *y.topk(3), *y.topk(2, dim=1, largest=False))
        return Sorter()


def _sort_inputs(b, dtype, seed):
    """x: values with ties (and a NaN for float dtypes) to sort; y: each row a permutation of 0..7 (no
    ties: PyTorch's topk orders ties as it likes) with a NaN, the largest, in row 0."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, (b, 8)).astype(np.float64)
    y = np.stack([rng.permutation(8) for _ in range(b)]).astype(np.float64)
    if dtype != "int64":
        x[0, 3], y[0, 5] = np.nan, np.nan
        x = x + rng.integers(0, 2, x.shape) * 0.5
    return fl.tensor(x).to(getattr(fl, dtype)), fl.tensor(y).to(getattr(fl, dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int64"])
def test_aoti_sort_and_topk_match_pytorch(tmp_path, dtype):
    """sort (stable: ties in order, NaN the largest) and topk (largest/smallest) run in the C++ wrapper:
    values and indices equal to PyTorch's (sort stable=True) from Python (batch 3 and 6) and C++ (batch 4)."""
    import torch
    m, tm = _Sorter.make(fl), _Sorter.make(torch)
    x, y = _sort_inputs(3, dtype, 0)
    pkg = aoti_compile_and_package(export(m, (x, y), dynamic_shapes={"x": {0: Dim("b", max=8)}, "y": {0: Dim("c", max=8)}}),
                                   package_path=str(tmp_path / "s.pt2"))
    with zipfile.ZipFile(pkg) as z:
        assert z.read("model.cpp").decode().count("fl_sort<") == 4
    run = aoti_load_package(pkg)
    x4, y4 = _sort_inputs(4, dtype, 1)
    r, _ = _run_cpp(pkg, tmp_path, [x4, y4])
    assert r.returncode == 0, r.stderr
    cpp = [read_tensor_file(str(tmp_path / f"output{i}.bin")) for i in range(8)]
    torch_sort = torch.Tensor.sort
    for (xs, ys), got in [(_sort_inputs(b, dtype, b), None) for b in (3, 6)] + [((x4, y4), cpp)]:
        got = run(xs, ys) if got is None else got
        tx, ty = (torch.tensor(t.double().numpy()).to(getattr(torch, dtype)) for t in (xs, ys))
        torch.Tensor.sort = lambda t, *a, **k: torch_sort(t, *a, stable=True, **k)
        try:
            want = tm(tx, ty)
        finally:
            torch.Tensor.sort = torch_sort
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.double().numpy(), w.double().numpy())


def _sampling_head(lib):
    nn = lib.nn

    class Head(nn.Module):
        """Positions from a mask by cumsum (bool -> int64), a running float sum, a top-p mask over sorted
        probabilities, a float64 and a bfloat16 cumsum."""

        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(16, 8)
            self.out = nn.Linear(8, 12)

        def forward(self, x):
            ids = (x[..., 0] > 0).cumsum(1)
            p = self.out(x.cumsum(1) + self.pos(ids)).softmax(-1)
            sp, _ = p.sort(-1, descending=True)
            keep = (sp.cumsum(-1) - sp) < 0.9
            return sp * keep, x.cumsum(0, dtype=lib.float64), x.to(lib.bfloat16).cumsum(-1)
    return Head()


def test_aoti_cumsum_matches_pytorch(tmp_path):
    """cumsum runs in the C++ wrapper (fl_cumsum: was refused): bool -> int64 positions, float32, float64 by
    `dtype=`, bfloat16 widened and rounded once; package outputs from Python (batch 3 and 6) and C++ (batch
    4) vs PyTorch (float32/float64 1e-5, bfloat16 1.6e-2)."""
    import torch
    fl.manual_seed(0)
    m, tm = _sampling_head(fl).eval(), _sampling_head(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = aoti_compile_and_package(export(m, (fl.randn(2, 5, 8),), dynamic_shapes={"x": {0: Dim("b", max=8)}}),
                                   package_path=str(tmp_path / "h.pt2"))
    with zipfile.ZipFile(pkg) as z:
        assert z.read("model.cpp").decode().count("fl_cumsum<") == 5
    run = aoti_load_package(pkg)
    x4 = fl.randn(4, 5, 8)
    r, _ = _run_cpp(pkg, tmp_path, [x4])
    assert r.returncode == 0, r.stderr
    cpp = [read_tensor_file(str(tmp_path / f"output{i}.bin")) for i in range(3)]
    for x, got in [(fl.randn(b, 5, 8), None) for b in (3, 6)] + [(x4, cpp)]:
        got = run(x) if got is None else got
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy()))
        for g, w in zip(got, want):
            assert str(g.dtype) == str(w.dtype)
            tol = 1.6e-2 if w.dtype == torch.bfloat16 else 1e-5
            np.testing.assert_allclose(g.double().numpy(), w.double().numpy(), rtol=tol, atol=tol)


class _AdaptiveMax:
    @staticmethod
    def make(lib):
        class Pools(lib.nn.Module):
            def forward(self, x, v):
                F = lib.nn.functional
                vals, idx = F.adaptive_max_pool2d(x, (3, 2), return_indices=True)
                return (vals, idx, F.adaptive_max_pool1d(x.flatten(2), 4, return_indices=True)[1],
                        F.adaptive_max_pool3d(v, (2, 1, 3)))
        return Pools()


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_aoti_adaptive_max_pooling_matches_pytorch(tmp_path, dtype):
    """adaptive_max_pool{1,2,3}d run in the C++ wrapper (fl_adaptive_max_pool: were refused): uneven windows
    (7 -> 3, 5 -> 2), a NaN in a window; values and indices equal to PyTorch's from Python (batch 2 and 5)
    and C++ (batch 3)."""
    import torch
    m, tm = _AdaptiveMax.make(fl), _AdaptiveMax.make(torch)

    def inputs(b, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((b, 3, 7, 5))
        x[0, 1, 2, 3] = np.nan
        return (fl.tensor(x).to(getattr(fl, dtype)), fl.tensor(rng.standard_normal((b, 2, 5, 3, 7))).to(getattr(fl, dtype)))
    b = Dim("b", max=8)
    pkg = aoti_compile_and_package(export(m, inputs(2, 0), dynamic_shapes={"x": {0: b}, "v": {0: b}}),
                                   package_path=str(tmp_path / "a.pt2"))
    with zipfile.ZipFile(pkg) as z:
        assert z.read("model.cpp").decode().count("fl_adaptive_max_pool<") == 3
    run = aoti_load_package(pkg)
    x3 = inputs(3, 3)
    r, _ = _run_cpp(pkg, tmp_path, list(x3))
    assert r.returncode == 0, r.stderr
    cpp = [read_tensor_file(str(tmp_path / f"output{i}.bin")) for i in range(4)]
    for xs, got in [(inputs(b, b), None) for b in (2, 5)] + [(x3, cpp)]:
        got = run(*xs) if got is None else got
        want = tm(*(torch.tensor(t.double().numpy()).to(getattr(torch, dtype)) for t in xs))
        for g, w in zip(got, want):
            assert str(g.dtype) == str(w.dtype)
            np.testing.assert_array_equal(g.double().numpy(), w.double().numpy())
