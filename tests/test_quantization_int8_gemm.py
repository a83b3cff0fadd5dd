"""The int8 GEMM of compiled quantized graphs: the kernel (`flambeau/_backends/cpu_int8.cpp`, AVX-512
VNNI, and its NumPy fallback) and the `onednn::qlinear_pointwise` op against PyTorch's x86 (oneDNN)
op bit for bit; the inductor's pass (`flambeau/_inductor/quantization.py`) rewriting dequantize ->
linear/mm/addmm (-> relu) (-> quantize) into it, with per-tensor and per-channel weights, u8 and s8
activations and dynamic (tensor) qparams, compiled results equal to PyTorch's fused ops; a
PT2E-converted MLP compiled with every linear layer as an int8 GEMM, within one output step of the
eager q/dq graph."""
from __future__ import annotations

import collections
import importlib

import numpy as np
import pytest
import torch

import flambeau
from flambeau._backends import cpu_int8
from flambeau._dynamo.testing import no_unexpected_fallbacks
from flambeau._inductor import config as inductor_config
from flambeau.ao.quantization.quantize_pt2e import capture_pre_autograd_graph, convert_pt2e, prepare_pt2e
from flambeau.ao.quantization.quantizer import x86_inductor_quantizer as xiq
from tests.conftest import spy_compile_fx
from tests.quantization_models import build_mlp, calibration

importlib.import_module("torch.ao.quantization.fx._decomposed")    # registers torch.ops.quantized_decomposed
QD = flambeau.ops.quantized_decomposed
TQD = torch.ops.quantized_decomposed
OUT = {"float32": (np.float32, torch.float32), "uint8": (np.uint8, torch.uint8), "int8": (np.int8, torch.int8)}


def _torch_qlinear(qx, x_scale, x_zp, qw, w_scales, bias, out_scale, out_zp, out_dtype, post):
    packed = torch.ops.onednn.qlinear_prepack(torch.tensor(qw), list(qx.shape))
    return torch.ops.onednn.qlinear_pointwise(torch.tensor(qx), x_scale, x_zp, packed, torch.tensor(w_scales),
                                              torch.zeros(len(w_scales), dtype=torch.int64),
                                              None if bias is None else torch.tensor(bias), out_scale, out_zp,
                                              OUT[out_dtype][1], post, [], "").numpy()


def _problem(rng, M, K, N, signed):
    qx = rng.integers(-128, 128, (M, K)).astype(np.int8) if signed else rng.integers(0, 256, (M, K)).astype(np.uint8)
    qw = rng.integers(-127, 128, (N, K)).astype(np.int8)
    return qx, qw, rng.uniform(0.001, 0.02, N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


KERNEL_CASES = [  # M, K, N, signed activations, relu, output dtype
    (64, 128, 48, False, False, "float32"), (7, 20, 5, False, True, "uint8"), (33, 77, 70, True, False, "float32"),
    (130, 256, 100, False, True, "uint8"), (5, 19, 3, True, True, "int8"), (1, 4, 1, False, False, "float32"),
    (97, 1030, 65, False, False, "uint8"), (20, 600, 300, True, True, "uint8")]   # threads split rows / columns


@pytest.mark.parametrize("numpy_fallback", [False, True], ids=["vnni", "numpy"])
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[str(c[:3]) + ("s8" if c[3] else "u8") + c[5] for c in KERNEL_CASES])
def test_kernel_equals_pytorchs_onednn_qlinear(case, numpy_fallback, monkeypatch):
    """Tile edges (M, N not multiples of 12/32, K not of 4), several threads, both activation types and
    all outputs: the integers and the epilogue's roundings equal oneDNN's exactly."""
    if not numpy_fallback and not cpu_int8.vnni():
        pytest.skip("no AVX-512 VNNI here")
    if numpy_fallback:
        monkeypatch.setitem(cpu_int8._state, "fns", None)
    M, K, N, signed, relu, od = case
    rng = np.random.default_rng(M * K + N)
    qx, qw, ws, b = _problem(rng, M, K, N, signed)
    x_scale, x_zp = 0.037, (5 if signed else 128)
    out_scale, out_zp = (1.0, 0) if od == "float32" else (0.07, -2 if od == "int8" else 3)
    got = cpu_int8.qlinear(qx, x_scale, x_zp, qw.T, ws, np.zeros(N, np.int64), b, out_scale, out_zp, OUT[od][0], relu)
    want = _torch_qlinear(qx, x_scale, x_zp, qw, ws, b, out_scale, out_zp, od, "relu" if relu else "none")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_weight_zero_points_are_honoured():
    """PyTorch's x86 weights are symmetric (it ignores a weight zero point); ours subtracts it: vs int64 math."""
    rng = np.random.default_rng(3)
    qx, qw, ws, b = _problem(rng, 30, 50, 40, False)
    wz = rng.integers(-5, 6, 40)
    got = cpu_int8.qlinear(qx, 0.05, 100, qw.T, ws, wz, b, 1.0, 0, np.float32)
    acc = (qx.astype(np.int64) - 100) @ (qw.astype(np.int64) - wz[:, None]).T
    np.testing.assert_array_equal(got, (acc.astype(np.float32) * np.float32(0.05)) * ws + b)


# ---- the inductor's pass ---------------------------------------------------------------------------
def _externs(made) -> list:
    """The op names of the extern calls of the graphs compiled."""
    return [getattr(e.op, "name", str(e.op)) for c in made for e in c.artifact.externs]


def _layer(m, qd, x, qw, ws, bias, x_scale, x_zp, xdt, form, per_channel, relu, out):
    """A q -> dq -> linear (-> relu) (-> q) layer written with `m`'s ops (flambeau or torch); `ws` is a
    tensor of scales per channel, a float per tensor."""
    qx = qd.quantize_per_tensor.default(x, x_scale, x_zp, *_RANGE[xdt], getattr(m, xdt))
    dx = qd.dequantize_per_tensor.default(qx, x_scale, x_zp, *_RANGE[xdt], getattr(m, xdt))
    if per_channel:
        dw = qd.dequantize_per_channel.default(qw, ws, m.zeros(ws.shape[0], dtype=m.int64), 0, -128, 127, m.int8)
    else:
        dw = qd.dequantize_per_tensor.default(qw, ws, 0, -128, 127, m.int8)
    if form == "linear":
        y = m.nn.functional.linear(dx, dw, bias)
    elif form == "mm":
        y = m.mm(dx, dw.permute(1, 0))
    else:
        y = m.addmm(bias, dx, dw.permute(1, 0))
    if relu:
        y = m.relu(y)
    if out is not None:
        y = qd.quantize_per_tensor.default(y, out[0], out[1], *_RANGE[out[2]], getattr(m, out[2]))
    return y


_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
PASS_CASES = {   # form, per_channel, activation dtype, relu, requantized output (scale, zp, dtype)
    "linear_per_channel": ("linear", True, "uint8", False, None),
    "linear_relu_requant": ("linear", True, "uint8", True, (0.05, 2, "uint8")),
    "linear_per_tensor_s8": ("linear", False, "int8", False, None),
    "mm_requant_s8": ("mm", True, "uint8", False, (0.3, -1, "int8")),
    "addmm_relu": ("addmm", False, "uint8", True, None),
}


def _onednn_reference(x, qw, ws, bias, x_scale, x_zp, xdt, relu, out):
    qx = TQD.quantize_per_tensor.default(torch.tensor(x), x_scale, x_zp, *_RANGE[xdt], getattr(torch, xdt)).numpy()
    out_scale, out_zp, od = (1.0, 0, "float32") if out is None else out
    return _torch_qlinear(qx, x_scale, x_zp, qw, ws, bias, out_scale, out_zp, od, "relu" if relu else "none")


@pytest.mark.parametrize("case", list(PASS_CASES))
def test_compiled_pattern_becomes_one_int8_gemm_equal_to_pytorchs(case, monkeypatch):
    form, per_channel, xdt, relu, out = PASS_CASES[case]
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((24, 40)) * 2).astype(np.float32)
    _, qw, ws, b = _problem(rng, 1, 40, 36, False)
    bias = None if form == "mm" else b
    x_scale, x_zp = 0.03, (0 if xdt == "int8" else 120)
    if not per_channel:
        ws = np.full_like(ws, ws[0])
    fws, fqw = flambeau.tensor(ws) if per_channel else float(ws[0]), flambeau.tensor(qw)
    fb = None if bias is None else flambeau.tensor(bias)

    def fn(t):
        return _layer(flambeau, QD, t, fqw, fws, fb, x_scale, x_zp, xdt, form, per_channel, relu, out)
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(fn)(flambeau.tensor(x)).numpy()
    assert _externs(made) == ["onednn::qlinear_prepack", "onednn::qlinear_pointwise"], _externs(made)
    want = _onednn_reference(x, qw, ws, bias, x_scale, x_zp, xdt, relu, out)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    eager = fn(flambeau.tensor(x)).numpy()            # the q/dq float graph: within one output step
    step = 1 if out is not None else 1e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(got.astype(np.float64) - eager.astype(np.float64)).max() <= step


def test_dynamic_qparams_use_the_tensor_overload(monkeypatch):
    """choose_qparams -> quantize/dequantize.tensor -> linear (the dynamic PT2E config) runs
    qlinear_pointwise.tensor, equal to PyTorch's op with the same qparams."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((9, 40)) * 3).astype(np.float32)
    _, qw, ws, b = _problem(rng, 1, 40, 20, False)

    fqw, fws, fwz, fb = flambeau.tensor(qw), flambeau.tensor(ws), flambeau.zeros(20, dtype=flambeau.int64), \
        flambeau.tensor(b)

    def fn(t):
        s, z = QD.choose_qparams.tensor(t, 0, 255, 1.1920928955078125e-07, flambeau.uint8)
        qx = QD.quantize_per_tensor.tensor(t, s, z, 0, 255, flambeau.uint8)
        dx = QD.dequantize_per_tensor.tensor(qx, s, z, 0, 255, flambeau.uint8)
        dw = QD.dequantize_per_channel.default(fqw, fws, fwz, 0, -128, 127, flambeau.int8)
        return flambeau.nn.functional.linear(dx, dw, fb)
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(fn)(flambeau.tensor(x)).numpy()
    assert _externs(made) == ["onednn::qlinear_prepack", "onednn::qlinear_pointwise.tensor"], _externs(made)
    s, z = TQD.choose_qparams.tensor(torch.tensor(x), 0, 255, 1.1920928955078125e-07, torch.uint8)
    qx = TQD.quantize_per_tensor.tensor(torch.tensor(x), s, z, 0, 255, torch.uint8).numpy()
    want = _torch_qlinear(qx, float(s), int(z), qw, ws, b, 1.0, 0, "float32", "none")
    np.testing.assert_array_equal(got, want)


def _converted_and_compiled(monkeypatch, model):
    """`model` through PT2E (X86InductorQuantizer's default config, calibrated on (16, 20) batches), then
    compiled with the inductor spied: (converted graph, compiled graphs, input, compiled output)."""
    data = calibration((16, 20))
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(data[0]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for x in data:
        prepared(flambeau.tensor(x))
    converted = convert_pt2e(prepared)
    made = spy_compile_fx(monkeypatch, [])
    x = flambeau.tensor(data[1])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(converted)(x).numpy()
    return converted, made, x, got


def test_pt2e_mlp_compiles_every_linear_layer_to_the_int8_gemm(monkeypatch):
    """A converted MLP (X86InductorQuantizer, per-channel weights): three int8 GEMMs, no float mm, no
    q/dq kernels between them; outputs within one step of the last layer's input scale of eager's."""
    flambeau.manual_seed(0)
    model = build_mlp(flambeau, skip=False).eval()
    converted, made, x, got = _converted_and_compiled(monkeypatch, model)
    assert _externs(made) == ["onednn::qlinear_prepack", "onednn::qlinear_pointwise"] * 3, _externs(made)
    assert sum(len(c.artifact.kernels) for c in made) == 1      # the input's quantize; none between the layers
    with flambeau.no_grad():
        eager = converted(x).numpy()
    # exact integer sums vs float sums of dequantized values: float rounding only on these inputs (a
    # requantization flipped by it would move the output by a whole step, ~1e-2)
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())
    monkeypatch.setattr(inductor_config, "quantized_linear", False)
    flambeau._dynamo.reset()
    with flambeau.no_grad():
        floats = flambeau.compile(converted)(x).numpy()
    np.testing.assert_allclose(floats, eager, rtol=1e-5, atol=1e-5)


def test_a_bias_being_trained_keeps_the_float_path(monkeypatch):
    """Grad mode on and a bias requiring grad: the int8 op has no derivative, so the layer stays float
    and its bias gets a gradient."""
    rng = np.random.default_rng(5)
    _, qw, ws, b = _problem(rng, 1, 16, 8, False)
    fqw, fws, fb = flambeau.tensor(qw), flambeau.tensor(ws), flambeau.tensor(b, requires_grad=True)
    made = spy_compile_fx(monkeypatch, [])
    out = flambeau.compile(lambda t: _layer(flambeau, QD, t, fqw, fws, fb, 0.05, 128, "uint8", "linear", True, False,
                                            None))(flambeau.tensor(rng.standard_normal((4, 16)).astype(np.float32)))
    out.sum().backward()
    assert "onednn::qlinear_pointwise" not in _externs(made) and fb.grad is not None


def _count_packing(monkeypatch) -> list:
    """Record each call of the weight-packing routine (`cpu_int8.pack_weight`), on an empty cache."""
    calls = []
    monkeypatch.setattr(cpu_int8, "_pack_cache", collections.OrderedDict())
    real = cpu_int8.pack_weight

    def counted_pack_weight(w):
        calls.append(w.shape)
        return real(w)
    monkeypatch.setattr(cpu_int8, "pack_weight", counted_pack_weight)
    return calls


def _converted_mlp():
    """A PT2E-converted MLP (X86InductorQuantizer, calibrated) and its data."""
    flambeau.manual_seed(0)
    model = build_mlp(flambeau, skip=False).eval()
    data = calibration((16, 20))
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(data[0]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for x in data:
        prepared(flambeau.tensor(x))
    return convert_pt2e(prepared), data


def test_frozen_compiled_mlp_packs_each_weight_once(monkeypatch):
    """Freezing folds `qlinear_prepack` at compile time: three int8 layers pack three weights once
    across several calls (the kernel reads the packed panels and column sums, no per-call packing)."""
    converted, data = _converted_mlp()
    monkeypatch.setattr(inductor_config, "freezing", True)
    flambeau._dynamo.reset()
    calls = _count_packing(monkeypatch)
    compiled = flambeau.compile(converted)
    with flambeau.no_grad():
        outs = [compiled(flambeau.tensor(x)).numpy() for x in data[:3]]
        eager = converted(flambeau.tensor(data[2])).numpy()
    assert len(calls) == 3, calls
    np.testing.assert_allclose(outs[2], eager, rtol=0, atol=1e-5 * np.abs(eager).max())


def test_unfrozen_compiled_mlp_packs_each_weight_once_until_it_changes(monkeypatch):
    """Without freezing the graph calls `qlinear_prepack` every time: it returns the cached packing of
    an unchanged weight (three packings over three calls) and packs again a weight changed in place,
    whose new values the next call uses (equal to the eager q/dq graph)."""
    converted, data = _converted_mlp()
    calls = _count_packing(monkeypatch)
    compiled = flambeau.compile(converted)
    with flambeau.no_grad():
        for x in data[:3]:
            compiled(flambeau.tensor(x))
        assert len(calls) == 3, calls
        weight = next(t for t in converted.state_dict().values() if t.dtype is flambeau.int8 and t.ndim == 2)
        weight.mul_(-1)
        got = compiled(flambeau.tensor(data[1])).numpy()
        eager = converted(flambeau.tensor(data[1])).numpy()
    assert len(calls) == 4, calls
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())


def test_prepacked_weight_is_packed_once_and_equals_pytorch(monkeypatch):
    """onednn::qlinear_prepack packs once; three qlinear_pointwise calls on it pack nothing and equal
    PyTorch's op; a dynamically quantized Linear packs its weight once, at conversion."""
    calls = _count_packing(monkeypatch)
    rng = np.random.default_rng(11)
    qx, qw, ws, b = _problem(rng, 9, 37, 45, False)
    packed = flambeau.ops.onednn.qlinear_prepack(flambeau.tensor(qw), None)
    for _ in range(3):
        got = flambeau.ops.onednn.qlinear_pointwise(flambeau.tensor(qx), 0.02, 7, packed, flambeau.tensor(ws),
                                                    flambeau.zeros(45, dtype=flambeau.int64), flambeau.tensor(b),
                                                    1.0, 0, flambeau.float32, "relu", [], "").numpy()
    np.testing.assert_array_equal(got, _torch_qlinear(qx, 0.02, 7, qw, ws, b, 1.0, 0, "float32", "relu"))
    assert len(calls) == 1
    lin = flambeau.ao.quantization.quantize_dynamic(flambeau.nn.Sequential(flambeau.nn.Linear(37, 45)),
                                                    {flambeau.nn.Linear}, dtype=flambeau.qint8)
    packed_at_conversion = len(calls)
    for _ in range(3):
        lin(flambeau.tensor(rng.standard_normal((4, 37)).astype(np.float32)))
    assert len(calls) == packed_at_conversion


# ---- the binary (add / sum) post-ops ----------------------------------------------------------------
LOWP = {"bfloat16": torch.bfloat16}
BINARY_CASES = {  # M (or 3-D lead), K, N, post op, other dtype, (other scale, zp), unary, output (scale, zp, dtype)
    "add_f32_out": ((24,), 40, 36, "add", "float32", (1.0, 0), "none", (1.0, 0, "float32")),
    # other's qparams are unused by "add"
    "add_relu_u8_out": ((2, 13), 77, 70, "add", "float32", (0.2, 9), "relu", (0.05, 3, "uint8")),
    "add_relu_s8_out": ((30,), 64, 33, "add", "float32", (1.0, 0), "relu", (0.04, -2, "int8")),
    "add_bf16_other_bf16_out": ((9,), 50, 40, "add", "bfloat16", (1.0, 0), "relu", (1.0, 0, "bfloat16")),
    "add_u8_other_raw": ((7,), 20, 5, "add", "uint8", (1.0, 0), "none", (1.0, 0, "float32")),
    "sum_f32_relu": ((130,), 256, 100, "sum", "float32", (1.0, 0), "relu", (1.0, 0, "float32")),
    "sum_u8_accum": ((33,), 40, 65, "sum", "uint8", (0.04, 90), "none", (0.05, 100, "uint8")),
    "sum_s8_accum_relu": ((20,), 600, 300, "sum", "int8", (0.03, 2), "relu", (0.05, 0, "int8")),
    "sum_bf16": ((5,), 19, 3, "sum", "bfloat16", (1.0, 0), "none", (1.0, 0, "bfloat16")),
}


def _binary_problem(rng, lead, K, N, other_dtype):
    M = int(np.prod(lead))
    qx, qw, ws, b = _problem(rng, M, K, N, False)
    if other_dtype in ("uint8", "int8"):
        lo, hi = _RANGE[other_dtype]
        other = torch.tensor(rng.integers(lo, hi + 1, lead + (N,)).astype(OUT[other_dtype][0]))
    else:
        other = torch.tensor((rng.standard_normal(lead + (N,)) * 3).astype(np.float32)).to(getattr(torch, other_dtype))
    return qx.reshape(lead + (K,)), qw, ws, b, other


def _to_flambeau(t):
    return flambeau.tensor(t.float().numpy()).to(flambeau.bfloat16) if t.dtype is torch.bfloat16 \
        else flambeau.tensor(t.numpy())


def _as_numpy(t):
    """float32 values of a bf16 result (exact), else the array."""
    return t.float().numpy() if t.dtype in (torch.bfloat16, flambeau.bfloat16) else t.numpy()


@pytest.mark.parametrize("numpy_fallback", [False, True], ids=["vnni", "numpy"])
@pytest.mark.parametrize("tensor_qparams", [False, True], ids=["binary", "binary_tensor"])
@pytest.mark.parametrize("case", list(BINARY_CASES))
def test_qlinear_binary_equals_pytorchs_onednn_op(case, tensor_qparams, numpy_fallback, monkeypatch):
    """qlinear_pointwise.binary(_tensor) vs PyTorch's: "add" (other's values as they are, any float/int
    dtype, other qparams unused) and "sum" (the accum dequantized), ReLU, float32/bf16/u8/s8 outputs,
    3-D input: dtype, shape and values bit for bit; other unchanged (ours is functional)."""
    if not numpy_fallback and not cpu_int8.vnni():
        pytest.skip("no AVX-512 VNNI here")
    if numpy_fallback:
        monkeypatch.setitem(cpu_int8._state, "fns", None)
    lead, K, N, post, odt, (o_scale, o_zp), unary, (out_scale, out_zp, od) = BINARY_CASES[case]
    rng = np.random.default_rng(K * N)
    qx, qw, ws, b, other = _binary_problem(rng, lead, K, N, odt)
    x_scale, x_zp = 0.021, 128
    out_dtype = getattr(torch, od)
    tpacked = torch.ops.onednn.qlinear_prepack(torch.tensor(qw), list(qx.shape))
    want = torch.ops.onednn.qlinear_pointwise.binary(
        torch.tensor(qx), x_scale, x_zp, tpacked, torch.tensor(ws), torch.zeros(N, dtype=torch.int64), other.clone(),
        torch.tensor(b), out_scale, out_zp, out_dtype, o_scale, o_zp, post, 1.0, unary, [], "")
    fother = _to_flambeau(other)
    before = _as_numpy(fother).copy()
    fpacked = flambeau.ops.onednn.qlinear_prepack(flambeau.tensor(qw), list(qx.shape))
    xs, xz = (flambeau.tensor(x_scale), flambeau.tensor(x_zp)) if tensor_qparams else (x_scale, x_zp)
    op = flambeau.ops.onednn.qlinear_pointwise.binary_tensor if tensor_qparams else \
        flambeau.ops.onednn.qlinear_pointwise.binary
    got = op(flambeau.tensor(qx), xs, xz, fpacked, flambeau.tensor(ws), flambeau.zeros(N, dtype=flambeau.int64),
             fother, flambeau.tensor(b), out_scale, out_zp, getattr(flambeau, od), o_scale, o_zp, post, 1.0, unary, [],
             "")
    assert str(got.dtype).split(".")[-1] == od and tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(_as_numpy(got), _as_numpy(want))
    np.testing.assert_array_equal(_as_numpy(fother), before)
    base = torch.ops.onednn.qlinear_pointwise(torch.tensor(qx), x_scale, x_zp, tpacked, torch.tensor(ws),
                                              torch.zeros(N, dtype=torch.int64), torch.tensor(b), 1.0, 0,
                                              torch.float32, "none", [], "")
    assert not torch.equal(want.float(), base.float())          # the post-op changes the result


def test_qlinear_binary_refuses_what_pytorchs_refuses():
    rng = np.random.default_rng(1)
    qx, qw, ws, b, other = _binary_problem(rng, (4,), 8, 6, "float32")
    args = {m: (m.tensor(qx), 0.1, 128, m.ops.onednn.qlinear_prepack(m.tensor(qw), [4, 8]), m.tensor(ws),
                m.zeros(6, dtype=m.int64)) for m in (torch, flambeau)}
    fo = flambeau.tensor(other.numpy())
    bad = [  # (other, output dtype, other scale, zp, binary, alpha, unary), what both say
        ((other, "float32", 1.0, 0, "mul", 1.0, "none"), "unsupported binary post op"),
        ((other, "float32", 1.0, 0, "add", 2.0, "none"), "alpha != 1"),
        ((other, "float32", 1.0, 0, "add", 1.0, "gelu"), "unsupported unary post op"),
        ((None, "float32", 1.0, 0, "add", 1.0, "none"), "extra input is missing"),
        ((other, "float32", 2.0, 3, "add", 1.0, "none"), "expect extra input scale = 1.0 and zero point = 0"),
        ((other, "bfloat16", 1.0, 0, "sum", 1.0, "none"), "should be .*same as output dtype"),
    ]
    for (o, od, s, z, post, alpha, unary), message in bad:
        for m, oth in ((torch, o), (flambeau, None if o is None else fo)):
            with pytest.raises(RuntimeError, match=message):
                m.ops.onednn.qlinear_pointwise.binary(*args[m], oth, None, 1.0, 0, getattr(m, od), s, z, post, alpha,
                                                      unary, [], "")
    with pytest.raises(RuntimeError, match=r"qlinear_pointwise.binary: extra input of shape \(4, 7\)"):
        flambeau.ops.onednn.qlinear_pointwise.binary(*args[flambeau], flambeau.zeros(4, 7), None, 1.0, 0,
                                                     flambeau.float32, 1.0, 0, "add", 1.0, "none", [], "")


ADD_PASS_CASES = {   # form, relu, requantized output (scale, zp, dtype), other first in the add
    "linear_add": ("linear", False, None, False),
    "linear_add_relu_requant_u8": ("linear", True, (0.05, 2, "uint8"), True),
    "addmm_add_requant_s8": ("addmm", False, (0.3, -1, "int8"), False),
    "mm_add_relu": ("mm", True, None, True),
}


@pytest.mark.parametrize("tensor_qparams", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", list(ADD_PASS_CASES))
def test_compiled_linear_add_becomes_one_binary_int8_gemm_equal_to_pytorchs(case, tensor_qparams, monkeypatch):
    """dequantize -> linear/addmm/mm -> add(_, float residual) [-> relu] [-> quantize]: exactly prepack +
    qlinear_pointwise.binary(_tensor) with the add post-op, bit-equal to PyTorch's op (what its X86
    inductor pass makes of the same pattern)."""
    form, relu, out, swap = ADD_PASS_CASES[case]
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((24, 40)) * 2).astype(np.float32)
    res = (rng.standard_normal((24, 36)) * 3).astype(np.float32)
    _, qw, ws, b = _problem(rng, 1, 40, 36, False)
    bias = None if form == "mm" else b
    fqw, fws, fb = flambeau.tensor(qw), flambeau.tensor(ws), None if bias is None else flambeau.tensor(bias)

    def fn(t, r):
        if tensor_qparams:
            s, z = QD.choose_qparams.tensor(t, 0, 255, 1.1920928955078125e-07, flambeau.uint8)
            dx = QD.dequantize_per_tensor.tensor(QD.quantize_per_tensor.tensor(t, s, z, 0, 255, flambeau.uint8),
                                                 s, z, 0, 255, flambeau.uint8)
        else:
            dx = QD.dequantize_per_tensor.default(QD.quantize_per_tensor.default(t, 0.03, 120, 0, 255, flambeau.uint8),
                                                  0.03, 120, 0, 255, flambeau.uint8)
        dw = QD.dequantize_per_channel.default(fqw, fws, flambeau.zeros(36, dtype=flambeau.int64), 0, -128, 127,
                                               flambeau.int8)
        y = {"linear": lambda: flambeau.nn.functional.linear(dx, dw, fb), "mm": lambda: flambeau.mm(dx, dw.t()),
             "addmm": lambda: flambeau.addmm(fb, dx, dw.permute(1, 0))}[form]()
        y = r + y if swap else y + r
        if relu:
            y = flambeau.relu(y)
        if out is not None:
            y = QD.quantize_per_tensor.default(y, out[0], out[1], *_RANGE[out[2]], getattr(flambeau, out[2]))
        return y
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(fn)(flambeau.tensor(x), flambeau.tensor(res)).numpy()
    binary = "onednn::qlinear_pointwise.binary" + ("_tensor" if tensor_qparams else "")
    assert _externs(made) == ["onednn::qlinear_prepack", binary], _externs(made)
    if tensor_qparams:
        s, z = TQD.choose_qparams.tensor(torch.tensor(x), 0, 255, 1.1920928955078125e-07, torch.uint8)
        x_scale, x_zp = float(s), int(z)
    else:
        x_scale, x_zp = 0.03, 120
    qx = TQD.quantize_per_tensor.default(torch.tensor(x), x_scale, x_zp, 0, 255, torch.uint8)
    out_scale, out_zp, od = (1.0, 0, "float32") if out is None else out
    want = torch.ops.onednn.qlinear_pointwise.binary(
        qx, x_scale, x_zp, torch.ops.onednn.qlinear_prepack(torch.tensor(qw), [24, 40]), torch.tensor(ws),
        torch.zeros(36, dtype=torch.int64), torch.tensor(res), None if bias is None else torch.tensor(bias), out_scale,
        out_zp, getattr(torch, od), 1.0, 0, "add", 1.0, "relu" if relu else "none", [], "").numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def build_residual_mlp(m, d=32, classes=4):
    class ResidualMLP(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.l3 = m.nn.Linear(20, d), m.nn.Linear(d, d), m.nn.Linear(d, classes)

        def forward(self, x):
            h = m.relu(self.l1(x))
            return self.l3(m.relu(self.l2(h) + h))
    return ResidualMLP()


def test_pt2e_residual_mlp_compiles_the_add_into_the_int8_gemm(monkeypatch):
    """A converted MLP with a residual linear + add + relu (X86InductorQuantizer: the add's other input
    not quantized, as PyTorch's `_annotate_linear_binary_unary`): l2 + add + relu + l3's input
    quantize become one qlinear_pointwise.binary with a u8 output; within float rounding of eager's."""
    flambeau.manual_seed(0)
    model = build_residual_mlp(flambeau).eval()
    converted, made, x, got = _converted_and_compiled(monkeypatch, model)
    assert _externs(made) == ["onednn::qlinear_prepack", "onednn::qlinear_pointwise", "onednn::qlinear_prepack",
                              "onednn::qlinear_pointwise.binary", "onednn::qlinear_prepack",
                              "onednn::qlinear_pointwise"], _externs(made)
    with flambeau.no_grad():
        eager = converted(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())
