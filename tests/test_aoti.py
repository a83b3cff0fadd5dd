"""AOTInductor (flambeau._inductor.aoti_compile_and_package / aoti_load_package) and freezing.

Packages of an MLP, a CNN with BatchNorm, a small GPT and a dynamic-batch MLP run from Python and
from a C++ program built against the C API (aoti_runtime.h) and run with an empty environment (no
Python involved), each compared with flambeau's eager outputs; hostile and corrupted packages are
refused with clear errors; freezing turns weights into folded constants without changing values.
"""
from __future__ import annotations

import os
import subprocess
import zipfile

import numpy as np
import pytest

from bench.small_gpt import small_gpt as gpt_model
import flambeau as fl
import flambeau.nn as nn
from flambeau._inductor import aoti_compile_and_package, aoti_load_package, config
from flambeau._inductor.aoti_package import (AOTIPackageError, build_example_program, extract_package,
                                             read_tensor_file, write_tensor_file)
from flambeau.export import Dim, export
from tests.conftest import spy_compile_fx

RTOL, ATOL = 1e-5, 1e-5


def small_gpt(vocab=96, d=32, heads=4, layers=2, block=16):
    return gpt_model(fl, vocab=vocab, d=d, heads=heads, layers=layers, block=block).eval()


def _model(name):
    fl.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), (fl.randn(8, 8),)
    if name == "cnn":
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 10))
        with fl.no_grad():                      # running statistics that are not the initial 0/1
            m[1].running_mean.copy_(fl.randn(8) * 0.1)
            m[1].running_var.copy_(fl.rand(8) + 0.5)
        return m.eval(), (fl.randn(2, 3, 8, 8),)
    return small_gpt(), (fl.randint(0, 96, (2, 16)),)


def _eager(m, args):
    with fl.no_grad():
        return m(*args)


@pytest.fixture
def freezing():
    saved = config.freezing
    yield
    config.freezing = saved


def _package(tmp_path, m, args, name="m", configs=None, **kw):
    return aoti_compile_and_package(export(m, args, **kw), package_path=str(tmp_path / f"{name}.pt2"),
                                    inductor_configs=configs)


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_aoti_package_from_python_matches_eager(tmp_path, freezing, name, frozen):
    m, args = _model(name)
    config.freezing = frozen
    run = aoti_load_package(_package(tmp_path, m, args))
    np.testing.assert_allclose(run(*args).numpy(), _eager(m, args).numpy(), rtol=RTOL, atol=ATOL)
    assert (run.metadata["folded_constants"] > 0) == frozen


def _run_cpp(pkg, tmp_path, tensors, repeat=0):
    d = tmp_path / "pkg"
    extract_package(pkg, str(d))
    exe = build_example_program(str(d), str(tmp_path / "run"))
    for i, t in enumerate(tensors):
        write_tensor_file(str(tmp_path / f"input{i}.bin"), t)
    r = subprocess.run([exe, str(d), str(tmp_path), str(tmp_path)] + ([str(repeat)] if repeat else []),
                       capture_output=True, text=True, env={})          # no Python anywhere
    return r, d


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_aoti_package_from_cpp_program_matches_eager(tmp_path, name):
    m, args = _model(name)
    r, _ = _run_cpp(_package(tmp_path, m, args), tmp_path, args)
    assert r.returncode == 0, r.stderr
    y = read_tensor_file(str(tmp_path / "output0.bin"))
    np.testing.assert_allclose(y.numpy(), _eager(m, args).numpy(), rtol=RTOL, atol=ATOL)


def test_aoti_dynamic_batch_from_python_and_cpp(tmp_path):
    m, (x,) = _model("mlp")
    pkg = _package(tmp_path, m, (x,), dynamic_shapes={"input": {0: Dim("batch", min=2, max=64)}})
    run = aoti_load_package(pkg)
    assert run.metadata["inputs"][0]["shape"][0] == "s0"
    for b in (2, 5, 64):
        xb = fl.randn(b, 8)
        np.testing.assert_allclose(run(xb).numpy(), _eager(m, (xb,)).numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match=r"size 65 is outside the range \[2, 64\] of the Dim batch"):
        run(fl.randn(65, 8))
    assert run.metadata["dynamic_dims"] == {"s0": {"min": 2, "max": 64, "name": "batch"}}
    with pytest.raises(RuntimeError, match="dim 1: size 9, the program needs 8"):
        run(fl.randn(4, 9))
    x13 = fl.randn(13, 8)
    r, _ = _run_cpp(pkg, tmp_path, [x13])
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(read_tensor_file(str(tmp_path / "output0.bin")).numpy(), _eager(m, (x13,)).numpy(),
                               rtol=RTOL, atol=ATOL)
    r, _ = _run_cpp(pkg, tmp_path, [fl.randn(1, 8)])
    assert r.returncode == 1 and "size 1 is outside the range [2, 64] of the Dim batch" in r.stderr


def test_aoti_shape_errors_name_the_users_dims(tmp_path):
    """A derived Dim (batch + 1) and its root: the package's errors spell the Dim, not the symbol s0."""
    class Shifted(nn.Module):
        def forward(self, x, y):
            return x[1:] * 2 + y
    b = Dim("batch", min=2, max=32)
    ep = export(Shifted(), (fl.randn(5, 3), fl.randn(4, 3)), dynamic_shapes={"x": {0: b + 1}, "y": {0: b}})
    run = aoti_load_package(aoti_compile_and_package(ep, str(tmp_path / "shifted.pt2")))
    x, y = fl.randn(7, 3), fl.randn(6, 3)
    np.testing.assert_allclose(run(x, y).numpy(), (x[1:] * 2 + y).numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match=r"input x dim 0: size 7, the program needs 6 \(batch \+ 1\)$"):
        run(x, fl.randn(5, 3))
    with pytest.raises(RuntimeError, match=r"input y dim 0: size 39 is outside the range \[2, 32\] of the Dim batch$"):
        run(fl.randn(40, 3), fl.randn(39, 3))


def test_aoti_kernel_error_raises_index_error(tmp_path):
    m = nn.Embedding(10, 4)
    pkg = _package(tmp_path, m, (fl.tensor([1, 2, 3]),))
    run = aoti_load_package(pkg)
    with pytest.raises(IndexError, match="index out of range"):
        run(fl.tensor([1, 20, 3]))


def test_aoti_cpp_runner_refuses_weights_of_another_package(tmp_path):
    m, args = _model("mlp")
    pkg = _package(tmp_path, m, args)
    r, d = _run_cpp(pkg, tmp_path, args)
    assert r.returncode == 0, r.stderr
    w = bytearray((d / "weights.bin").read_bytes())
    w[0] ^= 0xFF
    (d / "weights.bin").write_bytes(bytes(w))
    r = subprocess.run([str(tmp_path / "run"), str(d), str(tmp_path), str(tmp_path)], capture_output=True, text=True,
                       env={})
    assert r.returncode == 1 and "checksum" in r.stderr
    (d / "weights.bin").write_bytes(bytes(w[:-4]))
    r = subprocess.run([str(tmp_path / "run"), str(d), str(tmp_path), str(tmp_path)], capture_output=True, text=True,
                       env={})
    assert r.returncode == 1 and "bytes, the library expects" in r.stderr


def _rewrite(src, dst, change):
    with zipfile.ZipFile(src) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    entries = change(entries)
    with zipfile.ZipFile(dst, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)


def test_hostile_packages_are_refused(tmp_path):
    m, args = _model("mlp")
    pkg = _package(tmp_path, m, args)
    data = open(pkg, "rb").read()
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(AOTIPackageError, match="truncated or corrupt"):
        aoti_load_package(str(bad))
    cases = {
        "traversal": (lambda e: {**e, "../evil.so": b"x"}, "unexpected entry '../evil.so'"),
        "absolute": (lambda e: {**e, "/tmp/evil": b"x"}, "unexpected entry"),
        "missing": (lambda e: {k: v for k, v in e.items() if k != "weights.bin"}, "lacks weights.bin"),
        "version": (lambda e: {**e, "version": b"99"}, "package version b'99'"),
        "format": (lambda e: {**e, "archive_format": b"pickle"}, "unknown archive format"),
        "metadata": (lambda e: {**e, "metadata.json": b"{"}, "metadata.json is not JSON"),
        "metadata version": (lambda e: {**e, "metadata.json": e["metadata.json"].replace(b'"version": 1',
                                                                                         b'"version": 7')},
                             "metadata.json says version 7"),
    }
    for what, (change, msg) in cases.items():
        _rewrite(pkg, bad, change)
        with pytest.raises(AOTIPackageError, match=msg.replace("(", r"\(").replace("[", r"\[")):
            aoti_load_package(str(bad))
    assert not os.path.exists("/tmp/evil") and not (tmp_path.parent / "evil.so").exists()


def test_aoti_refuses_a_program_that_writes_its_inputs(tmp_path):
    """Buffer updates package (tests/test_aoti_state.py); a write into a user input is refused by name."""
    def add_in_place(x):
        x.add_(1)
        return x * 2
    with pytest.raises(RuntimeError, match="output add is a USER_INPUT_MUTATION \\(x\\); AOTInductor packages user"):
        _package(tmp_path, lambda_module(add_in_place), (fl.randn(3),))


def test_freezing_folds_constants_into_generated_code_and_keeps_values(tmp_path, freezing):
    m, args = _model("cnn")
    sources = {}
    for frozen in (False, True):
        config.freezing = frozen
        pkg = _package(tmp_path, m, args, name=f"f{frozen}")
        run = aoti_load_package(pkg)
        np.testing.assert_allclose(run(*args).numpy(), _eager(m, args).numpy(), rtol=RTOL, atol=ATOL)
        with zipfile.ZipFile(pkg) as z:
            sources[frozen] = z.read("model.cpp").decode()
        assert run.metadata["freezing"] is frozen
    # BatchNorm's rsqrt(var + eps) * weight is computed at compile time: no sqrt left in the kernels
    assert "sqrt" in sources[False] and "sqrt" not in sources[True]


def test_jit_freezing_makes_weights_constants(freezing, monkeypatch):
    m, args = _model("cnn")
    graphs = spy_compile_fx(monkeypatch, [])
    config.freezing = True
    try:
        fl._dynamo.reset()
        with fl.no_grad():
            y = fl.compile(m)(*args)
    finally:
        fl._dynamo.reset()
    np.testing.assert_allclose(y.numpy(), _eager(m, args).numpy(), rtol=RTOL, atol=ATOL)
    (g,) = graphs
    assert g.artifact.wrapper_source.startswith("def call(args):\n    _in0, = args")   # the weights are not inputs
    assert "const" in g.artifact.wrapper_source and "sqrt" not in g.source



@pytest.mark.parametrize("dynamic", [False, True])
def test_aoti_outputs_of_every_kind_in_the_output_pytree(tmp_path, dynamic):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 3)

        def forward(self, x, y):
            h = self.l(x)
            return {"t": h.t(), "same": y, "arg": h.argmax(1), "view": x[:, 1:3]}
    fl.manual_seed(0)
    m, x, y = M(), fl.randn(5, 4), fl.randn(2, 2)
    dyn = {"x": {0: Dim("b", min=2, max=10)}, "y": None} if dynamic else None
    run = aoti_load_package(_package(tmp_path, m, (x, y), dynamic_shapes=dyn))
    x7 = fl.randn(7, 4) if dynamic else x
    out, ref = run(x7, y), _eager(m, (x7, y))
    assert list(out) == list(ref)
    for k in ref:
        assert out[k].shape == ref[k].shape and out[k].dtype == ref[k].dtype, k
        np.testing.assert_allclose(out[k].numpy(), ref[k].numpy(), rtol=RTOL, atol=ATOL)


def test_aoti_gpt_dynamic_batch_from_one_up(tmp_path):
    m, (idx,) = _model("gpt")
    run = aoti_load_package(_package(tmp_path, m, (idx,), dynamic_shapes={"idx": {0: Dim("batch", min=1, max=32)}}))
    for b in (1, 3, 32):
        x = fl.randint(0, 96, (b, 16))
        np.testing.assert_allclose(run(x).numpy(), _eager(m, (x,)).numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match="dim 1: size 8, the program needs 16"):
        run(fl.randint(0, 96, (2, 8)))


def _wide_mlp():
    """Products with K = 300 (two of the GEMM's 256-row blocks), N = 300 and 40 (a padded last panel);
    at batch 64 the first is split over threads by columns."""
    fl.manual_seed(0)
    return nn.Sequential(nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 40)).eval()


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
def test_aoti_packs_constant_weights_once_at_load(tmp_path, freezing, frozen):
    """The weights' GEMM panels are packed when the package is loaded (fl_graph_prepack), and every
    product reads them (fl_sgemm_packed: no per-call packing of B); outputs as eager's."""
    config.freezing = frozen
    m = _wide_mlp()
    pkg = _package(tmp_path, m, (fl.randn(64, 300),), dynamic_shapes={"input": {0: Dim("batch", max=128)}})
    with zipfile.ZipFile(pkg) as z:
        src = z.read("model.cpp").decode()
    run_src = src[src.index('extern "C" int fl_graph_run('):src.index("fl_graph_num_packed")]
    assert run_src.count("fl_sgemm_packed(") == 2 and "fl_sgemm(" not in run_src
    assert 'int fl_graph_num_packed(void) { return 2; }' in src
    run = aoti_load_package(pkg)
    for b in (64, 3):
        x = fl.randn(b, 300)
        np.testing.assert_allclose(run(x).numpy(), _eager(m, (x,)).numpy(), rtol=RTOL, atol=ATOL)
    x = fl.randn(64, 300)
    r, _ = _run_cpp(pkg, tmp_path, [x])
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(read_tensor_file(str(tmp_path / "output0.bin")).numpy(), _eager(m, (x,)).numpy(),
                               rtol=RTOL, atol=ATOL)


def test_jit_freezing_with_cpp_wrapper_packs_weights_once(freezing, monkeypatch):
    monkeypatch.setattr(config, "cpp_wrapper", True)
    config.freezing = True
    m = _wide_mlp()
    graphs = spy_compile_fx(monkeypatch, [])
    fl._dynamo.reset()
    try:
        with fl.no_grad():
            f = fl.compile(m)
            for b in (64, 64):
                x = fl.randn(b, 300)
                np.testing.assert_allclose(f(x).numpy(), _eager(m, (x,)).numpy(), rtol=RTOL, atol=ATOL)
    finally:
        fl._dynamo.reset()
    (g,) = graphs
    assert g.artifact.cpp_wrapper and g.source.count("fl_sgemm_packed(") == 2


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
def test_jit_python_wrapper_packs_frozen_weights_once(freezing, monkeypatch, frozen):
    """The Python wrapper of a frozen graph packs each weight's panels when it is compiled (once), not
    per call; without freezing the weights are read live (nothing packed)."""
    from flambeau._backends import cpu_kernels
    if not cpu_kernels.available():
        pytest.skip("flambeau's GEMM is not built here")
    config.freezing = frozen
    made = []
    orig = cpu_kernels.gemm_plan_packed

    def spy(a_layout, b):
        made.append(orig(a_layout, b))
        return made[-1]
    monkeypatch.setattr(cpu_kernels, "gemm_plan_packed", spy)
    m = _wide_mlp()
    fl._dynamo.reset()
    try:
        with fl.no_grad():
            f = fl.compile(m)
            for _ in range(2):
                x = fl.randn(64, 300)
                np.testing.assert_allclose(f(x).numpy(), _eager(m, (x,)).numpy(), rtol=RTOL, atol=ATOL)
    finally:
        fl._dynamo.reset()
    assert len(made) == (2 if frozen else 0) and all(p is not None for p in made)


def _conv_net(lib):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.c2 = nn.Conv2d(16, 8, 1, bias=False)
            self.c3 = nn.Conv1d(8, 4, 3, padding=2, dilation=2)

        def forward(self, x):
            return self.c3(self.c2(self.c1(x).relu()).flatten(2)).tanh()
    return Net()


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
def test_jit_python_wrapper_packs_frozen_convolution_weights_once(freezing, monkeypatch, frozen):
    """The Python wrapper of a frozen graph packs each 1-D/2-D convolution weight's tiles when it is
    compiled (once: cpu_kernels.conv2d_plan_packed), and its calls never pack again (the eager kernel's
    cpu_kernels.conv2d, which packs per call, is not called); without freezing nothing is packed at compile
    and the eager kernel runs per call. Outputs vs PyTorch."""
    import torch
    from flambeau._backends import cpu_kernels
    if not cpu_kernels.available():
        pytest.skip("flambeau's GEMM is not built here")
    config.freezing = frozen
    made, per_call = [], []
    plan, conv = cpu_kernels.conv2d_plan_packed, cpu_kernels.conv2d
    monkeypatch.setattr(cpu_kernels, "conv2d_plan_packed", lambda w: made.append(plan(w)) or made[-1])
    monkeypatch.setattr(cpu_kernels, "conv2d", lambda *a: per_call.append(1) or conv(*a))
    fl.manual_seed(0)
    m = _conv_net(fl).eval()
    tm = _conv_net(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    fl._dynamo.reset()
    try:
        with fl.no_grad():
            f = fl.compile(m)
            f(fl.randn(2, 3, 9, 10))
            per_call.clear()
            for _ in range(2):
                x = fl.randn(2, 3, 9, 10)
                with torch.no_grad():
                    want = tm(torch.tensor(x.numpy())).numpy()
                np.testing.assert_allclose(f(x).numpy(), want, rtol=RTOL, atol=ATOL)
    finally:
        fl._dynamo.reset()
    assert len(made) == (3 if frozen else 0) and all(p is not None for p in made)
    assert len(per_call) == (0 if frozen else 2)


def _cpu_flags() -> set:
    with open("/proc/cpuinfo") as f:
        line = next((ln for ln in f if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU's flags from /proc/cpuinfo")
def test_aoti_march_portable_package_and_cpu_feature_check(tmp_path):
    """aoti_march: a package for a baseline CPU runs here (no AVX2 code in it); one compiled for a CPU with
    features this one lacks (Sapphire Rapids' AMX and AVX512-FP16) is refused at load, from Python and
    from C++, with a message naming the missing features."""
    m, args = _model("mlp")
    pkg = _package(tmp_path, m, args, name="v2", configs={"aoti_march": "x86-64-v2"})
    run = aoti_load_package(pkg)
    assert run.metadata["march"] == "x86-64-v2" and "avx2" not in run.metadata["cpu_features"] \
        and "sse4.2" in run.metadata["cpu_features"]
    np.testing.assert_allclose(run(*args).numpy(), _eager(m, args).numpy(), rtol=RTOL, atol=ATOL)
    native = aoti_load_package(_package(tmp_path, m, args, name="native"))
    assert native.metadata["march"] == "native"
    if {"amx_tile", "avx512_fp16"} <= _cpu_flags():
        pytest.skip("this CPU has Sapphire Rapids' features: nothing to refuse")
    pkg = _package(tmp_path, m, args, name="spr", configs={"aoti_march": "sapphirerapids"})
    with pytest.raises(AOTIPackageError, match=r"compiled for CPU features this CPU lacks: .*(amx-tile|avx512fp16)"):
        aoti_load_package(pkg)
    r, _ = _run_cpp(pkg, tmp_path, list(args))
    assert r.returncode == 1 and "this CPU lacks" in r.stderr and "-march=sapphirerapids" in r.stderr
    with pytest.raises(RuntimeError, match="refuses -march=no-such-cpu"):
        _package(tmp_path, m, args, name="bad", configs={"aoti_march": "no-such-cpu"})


def _cnn1d(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv1d(3, 8, 5, stride=2, padding=2, dilation=2), nn.BatchNorm1d(8), nn.ReLU(),
                         nn.Conv1d(8, 4, 1), nn.Flatten(), nn.Linear(4 * 4, 6))


def test_aoti_conv1d_package_matches_pytorch(tmp_path):
    """1-D convolutions (stride, padding, dilation) run in the C++ wrapper as 2-D ones of the (N, C, 1, L)
    view: the package's outputs (Python and C++) equal PyTorch eager's with the same weights."""
    import torch
    fl.manual_seed(0)
    m = _cnn1d(fl)
    with fl.no_grad():
        m[1].running_mean.copy_(fl.randn(8) * 0.1)
        m[1].running_var.copy_(fl.rand(8) + 0.5)
    m.eval()
    tm = _cnn1d(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 3, 12),), dynamic_shapes={"input": {0: Dim("batch", max=16)}})
    run = aoti_load_package(pkg)
    for b in (2, 7):
        x = fl.randn(b, 3, 12)
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose(run(x).numpy(), want, rtol=RTOL, atol=ATOL)
    x = fl.randn(5, 3, 12)
    r, _ = _run_cpp(pkg, tmp_path, [x])
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        want = tm(torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(read_tensor_file(str(tmp_path / "output0.bin")).numpy(), want, rtol=RTOL, atol=ATOL)


def _gpt_pair(dtype):
    """A flambeau small GPT in `dtype` and PyTorch's with the same weights in float64 (the reference)."""
    import torch
    fl.manual_seed(0)
    m = gpt_model(fl, vocab=96, d=64, heads=4, layers=2, block=32).eval().to(dtype)
    tm = gpt_model(torch, vocab=96, d=64, heads=4, layers=2, block=32).eval()
    tm.load_state_dict({k: torch.tensor(v.float().numpy()) for k, v in m.state_dict().items()})
    return m, tm


def _rmse(a, ref):
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - ref) ** 2)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_aoti_gpt_calls_the_fused_attention_and_bf16_gemm(tmp_path, dtype):
    """A small GPT packages with `_sdpa_flash_cpu` as an extern of the C++ wrapper (the fused kernel of
    cpu_attention.cpp linked into model.so, one call per layer, no math-path softmax) and, in bfloat16,
    its Linear layers as bfloat16 GEMMs: outputs from Python and from the C++ program vs PyTorch's
    float64 forward with the same weights (float32: 1e-5; bfloat16: RMSE no worse than 1.5x PyTorch's
    own bfloat16 forward)."""
    import torch
    m, tm = _gpt_pair(getattr(fl, dtype))
    x = fl.randint(0, 96, (3, 32))
    pkg = _package(tmp_path, m, (x,), dynamic_shapes={"idx": {0: Dim("batch", max=8)}})
    with zipfile.ZipFile(pkg) as z:
        source = z.read("model.cpp").decode()
    assert source.count("fl_attention_forward(fl_sz") == 2 and "amax" not in source
    assert (source.count("fl_gemm_bf16(1") == 9) == (dtype == "bfloat16")
    run = aoti_load_package(pkg)
    x5 = fl.randint(0, 96, (5, 32))
    r, _ = _run_cpp(pkg, tmp_path, [x5])
    assert r.returncode == 0, r.stderr
    outs = [(x, run(x)), (x5, read_tensor_file(str(tmp_path / "output0.bin")))]
    for xi, y in outs:
        assert y.dtype is getattr(fl, dtype) and tuple(y.shape) == (xi.shape[0], 32, 96)
        tx = torch.tensor(xi.numpy())
        with torch.no_grad():
            ref = tm.double()(tx).numpy()
            if dtype == "float32":
                np.testing.assert_allclose(y.numpy(), ref, rtol=RTOL, atol=ATOL)
                continue
            peer = tm.to(torch.bfloat16)(tx).double().numpy()
        assert _rmse(y.float().numpy(), ref) <= 1.5 * _rmse(peer, ref)


def test_aoti_portable_bf16_package_widens_its_products_to_float(tmp_path):
    """Built for x86-64-v2 (no AVX-512 BF16), a bfloat16 MLP's products take flm_gemm_bf16's portable
    path (operands widened to float, the float32 kernel, one rounding): outputs within bfloat16's
    tolerance of float64 math with the same weights."""
    fl.manual_seed(0)
    m = nn.Sequential(nn.Linear(40, 72), nn.ReLU(), nn.Linear(72, 24)).eval().to(fl.bfloat16)
    x = fl.randn(6, 40).to(fl.bfloat16)
    run = aoti_load_package(_package(tmp_path, m, (x,), configs={"aoti_march": "x86-64-v2"}))
    assert "avx512bf16" not in run.metadata["cpu_features"]
    w1, b1, w2, b2 = (p.detach().float().numpy().astype(np.float64) for p in m.parameters())
    ref = np.maximum(x.float().numpy().astype(np.float64) @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(run(x).float().numpy(), ref, rtol=1.6e-2, atol=1.6e-2)


def _weighted(lib):
    """A batched product with a constant (3, 300, 40) weight (K = 300: two k-blocks; N = 40: a padded
    panel), one with a weight broadcast over the batch, and a convolution."""
    nn = lib.nn

    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(lib.randn(3, 300, 40) * 0.05)
            self.shared = nn.Parameter(lib.randn(1, 40, 20) * 0.1)
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x, img):
            y = lib.bmm(x, self.w)
            return lib.matmul(y, self.shared.expand(3, 40, 20)), self.conv(img)
    return Weighted()


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
def test_aoti_packs_bmm_and_conv_weights_once_at_load(tmp_path, freezing, frozen):
    """Constant right operands of batched products (each batch item's panels; one for a broadcast weight)
    and convolution weights (flm_conv_pack_w) are packed when the package is loaded: fl_graph_run calls
    only fl_sgemm_packed / fl_conv2d_packed; outputs from Python and C++ vs PyTorch with the same weights."""
    import torch
    config.freezing = frozen
    fl.manual_seed(0)
    m = _weighted(fl).eval()
    tm = _weighted(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    args = (fl.randn(3, 5, 300), fl.randn(2, 3, 8, 8))
    pkg = _package(tmp_path, m, args, dynamic_shapes=({1: Dim("rows", max=64)}, {0: Dim("batch", max=8)}))
    with zipfile.ZipFile(pkg) as z:
        src = z.read("model.cpp").decode()
    run_src = src[src.index('extern "C" int fl_graph_run('):src.index("fl_graph_num_packed")]
    assert run_src.count("fl_sgemm_packed(") == 2 and run_src.count("fl_conv2d_packed(") == 1
    assert "fl_sgemm(" not in run_src and "fl_conv2d(" not in run_src
    assert 'int fl_graph_num_packed(void) { return 3; }' in src
    run = aoti_load_package(pkg)
    x, img = fl.randn(3, 7, 300), fl.randn(4, 3, 8, 8)
    r, _ = _run_cpp(pkg, tmp_path, [x, img])
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        want = tm(torch.tensor(x.numpy()), torch.tensor(img.numpy()))
    got = [run(x, img), [read_tensor_file(str(tmp_path / f"output{i}.bin")) for i in range(2)]]
    for outs in got:
        for g, w in zip(outs, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)


def test_jit_freezing_with_cpp_wrapper_packs_bmm_and_conv_weights_once(freezing, monkeypatch):
    """The JIT C++ wrapper of a frozen graph packs the same operands once, when the graph is compiled."""
    import torch
    monkeypatch.setattr(config, "cpp_wrapper", True)
    config.freezing = True
    fl.manual_seed(0)
    m = _weighted(fl).eval()
    tm = _weighted(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    graphs = spy_compile_fx(monkeypatch, [])
    fl._dynamo.reset()
    try:
        x, img = fl.randn(3, 5, 300), fl.randn(2, 3, 8, 8)
        with fl.no_grad(), torch.no_grad():
            got = fl.compile(m)(x, img)
            want = tm(torch.tensor(x.numpy()), torch.tensor(img.numpy()))
    finally:
        fl._dynamo.reset()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)
    (g,) = graphs
    assert g.artifact.cpp_wrapper and g.source.count("fl_sgemm_packed(") == 2 and g.source.count("fl_conv2d_packed(") == 1


def _pool_cnn(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
                         nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8), nn.ReLU(),
                         nn.Conv2d(8, 12, 1, groups=4), nn.MaxPool2d(2, dilation=2), nn.Flatten(), nn.Linear(48, 5))


def test_aoti_max_pool_and_grouped_convolutions_match_pytorch(tmp_path):
    """MaxPool2d (padding, ceil_mode, dilation) and grouped convolutions (depthwise, groups 4) run in the
    C++ wrapper: a package from Python (batch 2 and 5) and from C++ (batch 3) vs PyTorch with the same
    weights; the max pool's indices are returned as F.max_pool2d(..., return_indices=True)'s."""
    import torch
    fl.manual_seed(0)
    m = _pool_cnn(fl).eval()
    tm = _pool_cnn(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 3, 9, 9),), dynamic_shapes={"input": {0: Dim("batch", max=16)}})
    run = aoti_load_package(pkg)
    with zipfile.ZipFile(pkg) as z:
        src = z.read("model.cpp").decode()
    assert src.count("fl_max_pool2d<float>(") == 2 and src.count("        fl_conv2d(1, ") == 2
    x3 = fl.randn(3, 3, 9, 9)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    outs = [(fl.randn(b, 3, 9, 9), None) for b in (2, 5)] + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]
    for x, y in outs:
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose((run(x) if y is None else y).numpy(), want, rtol=RTOL, atol=ATOL)
    pool = aoti_load_package(_package(tmp_path, lambda_module(lambda x: tuple(nn.functional.max_pool2d(
        x, 3, 2, 1, ceil_mode=True, return_indices=True))), (fl.randn(2, 4, 7, 7),), name="pool"))
    x = fl.randn(2, 4, 7, 7)
    x[0, 0, 1, 1] = float("nan")
    vals, idx = pool(x)
    tv, ti = torch.nn.functional.max_pool2d(torch.tensor(x.numpy()), 3, 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(vals.numpy(), tv.numpy())
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())


class lambda_module(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _resampling_net(lib):
    nn = lib.nn
    return nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, 6, 3), nn.Upsample(scale_factor=2, mode="bilinear"),
                         nn.AvgPool2d(3, stride=2, padding=1), nn.Upsample(scale_factor=2, mode="nearest"),
                         nn.ReplicationPad2d((1, 0, 2, 1)), nn.AdaptiveAvgPool2d(3), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten())


def test_aoti_resampling_ops_match_pytorch(tmp_path):
    """_taps_gather (reflect/replicate pads, bilinear and nearest upsampling, average and adaptive average
    pooling) runs in the C++ wrapper: package outputs from Python (batch 2 and 4) and C++ (batch 3) vs PyTorch."""
    import torch
    fl.manual_seed(0)
    m = _resampling_net(fl).eval()
    tm = _resampling_net(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 3, 7, 7),), dynamic_shapes={"input": {0: Dim("batch", max=8)}})
    with zipfile.ZipFile(pkg) as z:
        assert z.read("model.cpp").decode().count("fl_taps_axis<float>(") >= 11
    run = aoti_load_package(pkg)
    x3 = fl.randn(3, 3, 7, 7)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    for x, y in [(fl.randn(b, 3, 7, 7), None) for b in (2, 4)] + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]:
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose((run(x) if y is None else y).numpy(), want, rtol=RTOL, atol=ATOL)


def _decoder(lib):
    nn = lib.nn
    return nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                         nn.ConvTranspose2d(6, 3, (2, 3), stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
                         nn.ConvTranspose2d(3, 2, 3, bias=False))


def test_aoti_transposed_convolutions_match_pytorch(tmp_path):
    """Transposed convolutions (stride, padding, output_padding, dilation, no bias) run in the C++ wrapper
    as a GEMM plus fl_col2im: package outputs from Python (batch 2 and 5) and C++ (batch 3) vs PyTorch."""
    import torch
    fl.manual_seed(0)
    m = _decoder(fl).eval()
    tm = _decoder(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 4, 5, 6),), dynamic_shapes={"input": {0: Dim("batch", max=8)}})
    with zipfile.ZipFile(pkg) as z:
        assert z.read("model.cpp").decode().count("fl_col2im<float>(") == 3
    run = aoti_load_package(pkg)
    x3 = fl.randn(3, 4, 5, 6)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    for x, y in [(fl.randn(b, 4, 5, 6), None) for b in (2, 5)] + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]:
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose((run(x) if y is None else y).numpy(), want, rtol=RTOL, atol=ATOL)


def _grouped_decoder(lib):
    nn = lib.nn
    return nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), nn.ReLU(),
                         nn.ConvTranspose2d(6, 6, (2, 3), stride=(2, 1), dilation=(1, 2), groups=6, bias=False),
                         nn.ConvTranspose2d(6, 2, 3, groups=2))


def test_aoti_grouped_transposed_convolutions_match_pytorch(tmp_path):
    """Grouped transposed convolutions (groups 2, depthwise, with and without bias) run in the C++ wrapper
    as a GEMM plus fl_col2im per image and group: package outputs from Python (batch 2 and 5) and C++ (batch 3)
    vs PyTorch."""
    import torch
    fl.manual_seed(0)
    m = _grouped_decoder(fl).eval()
    tm = _grouped_decoder(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 4, 5, 6),), dynamic_shapes={"input": {0: Dim("batch", max=8)}})
    run = aoti_load_package(pkg)
    x3 = fl.randn(3, 4, 5, 6)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    for x, y in [(fl.randn(b, 4, 5, 6), None) for b in (2, 5)] + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]:
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose((run(x) if y is None else y).numpy(), want, rtol=RTOL, atol=ATOL)


def _volume_net(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2, stride=(1, 2, 2), padding=1),
                         nn.Conv3d(4, 3, (2, 3, 1), stride=(1, 2, 1), dilation=(2, 1, 1), bias=False),
                         nn.MaxPool3d(2, ceil_mode=True), nn.Flatten(), nn.Linear(12, 4))


def _volume_package_matches_pytorch(tmp_path, build) -> str:
    """build(lib)'s (N, 2, 5, 6, 7) model packaged with a dynamic batch: outputs from Python (batch 2 and 5)
    and from the C++ program (batch 3) vs PyTorch's with the same weights; returns model.cpp's source."""
    import torch
    fl.manual_seed(0)
    m = build(fl).eval()
    tm = build(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    pkg = _package(tmp_path, m, (fl.randn(2, 2, 5, 6, 7),), dynamic_shapes={"input": {0: Dim("batch", max=8)}})
    with zipfile.ZipFile(pkg) as z:
        src = z.read("model.cpp").decode()
    run = aoti_load_package(pkg)
    x3 = fl.randn(3, 2, 5, 6, 7)
    r, _ = _run_cpp(pkg, tmp_path, [x3])
    assert r.returncode == 0, r.stderr
    for x, y in [(fl.randn(b, 2, 5, 6, 7), None) for b in (2, 5)] + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]:
        with torch.no_grad():
            want = tm(torch.tensor(x.numpy())).numpy()
        np.testing.assert_allclose((run(x) if y is None else y).numpy(), want, rtol=RTOL, atol=ATOL)
    return src


def test_aoti_3d_convolutions_and_max_pooling_match_pytorch(tmp_path):
    """Conv3d (padding, stride, dilation, no bias) and MaxPool3d (padding, ceil_mode) run in the C++ wrapper
    (fl_conv3d, fl_max_pool3d): package outputs from Python (batch 2 and 5) and C++ (batch 3) vs PyTorch, and
    max_pool3d's indices equal to PyTorch's."""
    import torch
    src = _volume_package_matches_pytorch(tmp_path, _volume_net)
    assert src.count("fl_conv3d<float>(fl_g") == 2 and src.count("fl_max_pool3d<float>(fl_g") == 2
    pool = aoti_load_package(_package(tmp_path, lambda_module(lambda x: tuple(nn.functional.max_pool3d(
        x, 3, 2, 1, ceil_mode=True, return_indices=True))), (fl.randn(2, 3, 5, 6, 7),), name="pool3"))
    x = fl.randn(2, 3, 5, 6, 7)
    x[0, 0, 1, 1, 1] = float("nan")
    vals, idx = pool(x)
    tv, ti = torch.nn.functional.max_pool3d(torch.tensor(x.numpy()), 3, 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(vals.numpy(), tv.numpy())
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())


def _volume_decoder(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv3d(2, 4, 3, padding=1, groups=2), nn.ReLU(),
                         nn.Conv3d(4, 4, (3, 1, 2), stride=(2, 1, 1), dilation=(1, 1, 2), groups=4, bias=False),
                         nn.AvgPool3d(2, stride=(1, 2, 2), padding=1, count_include_pad=False, ceil_mode=True),
                         nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                         nn.ConvTranspose3d(6, 3, (2, 3, 1), stride=(1, 2, 3), dilation=(2, 1, 1), bias=False),
                         nn.AvgPool3d(3, 2, 1), nn.AdaptiveAvgPool3d((2, 1, 3)), nn.Flatten(), nn.Linear(18, 4))


def test_aoti_grouped_and_transposed_3d_convolutions_and_average_pooling_match_pytorch(tmp_path):
    """Grouped and depthwise Conv3d, ConvTranspose3d (grouped with output_padding; dilated, no bias) run in
    the C++ wrapper (fl_conv3d with groups, fl_conv_transpose3d: were refused), AvgPool3d (count_include_pad
    False, ceil_mode) and AdaptiveAvgPool3d through _taps_gather: package outputs from Python (batch 2 and 5)
    and C++ (batch 3) vs PyTorch."""
    src = _volume_package_matches_pytorch(tmp_path, _volume_decoder)
    assert src.count("fl_conv3d<float>(fl_g") == 2 and src.count("fl_conv_transpose3d<float>(fl_g") == 2
