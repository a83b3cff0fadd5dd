"""The int8 convolution of compiled quantized graphs: `onednn::qconv_prepack` + `qconv2d_pointwise`
(`flambeau/_ops/quantized_conv.py`, an int8 im2col feeding the VNNI GEMM, and its NumPy fallback)
against PyTorch's x86 (oneDNN) ops bit for bit; the inductor's pass rewriting dequantize ->
convolution (-> relu) (-> quantize) into it; a PT2E-converted CNN compiled with every convolution
and linear layer in int8, packing each weight once with and without freezing."""
from __future__ import annotations

import collections
import importlib

import numpy as np
import pytest
import torch

import flambeau
from flambeau._backends import cpu_int8, cpu_int8_conv
from flambeau._dynamo.testing import no_unexpected_fallbacks
from flambeau._inductor import config as inductor_config
from flambeau.ao.quantization.quantize_pt2e import capture_pre_autograd_graph, convert_pt2e, prepare_pt2e
from flambeau.ao.quantization.quantizer import x86_inductor_quantizer as xiq
from tests.conftest import spy_compile_fx
from tests.quantization_models import build_cnn, calibration

importlib.import_module("torch.ao.quantization.fx._decomposed")    # registers torch.ops.quantized_decomposed
QD = flambeau.ops.quantized_decomposed
TQD = torch.ops.quantized_decomposed

CASES = {   # N, C, H, W, O, kernel, stride, padding, dilation, groups, output dtype, post op
    "3x3_pad_f32": (2, 8, 9, 9, 16, (3, 3), 1, 1, 1, 1, "float32", "none"),
    "3x3_s2_groups3_u8_relu": (1, 6, 10, 7, 12, (3, 3), 2, 1, 1, 3, "uint8", "relu"),
    "1x1_f32_relu": (2, 16, 8, 8, 32, (1, 1), 1, 0, 1, 1, "float32", "relu"),
    "5x3_strided_dilated_u8": (1, 4, 11, 11, 8, (5, 3), (2, 1), (2, 0), (2, 1), 1, "uint8", "none"),
    "depthwise_f32": (2, 8, 9, 9, 8, (3, 3), 1, 1, 1, 8, "float32", "none"),
    "s8_out_relu": (2, 8, 6, 6, 8, (3, 3), 1, 1, 1, 1, "int8", "relu"),
    "bf16_out_40ch": (1, 8, 6, 6, 40, (3, 3), 1, 1, 1, 1, "bfloat16", "relu"),
    "wide_threads": (4, 64, 14, 14, 96, (3, 3), 1, 1, 1, 1, "uint8", "relu"),
    "7x7_s2_stem_3ch": (2, 3, 23, 19, 64, (7, 7), 2, 3, 1, 1, "uint8", "relu"),
    "80ch_w_dilated": (1, 80, 9, 10, 24, (3, 3), 1, (1, 2), (1, 2), 1, "float32", "none"),
    "1x1_s2": (2, 16, 9, 9, 8, (1, 1), 2, 0, 1, 1, "uint8", "none"),
}


def _pair(v):
    return list(v) if isinstance(v, tuple) else [v, v]


def _problem(case, seed=0):
    N, C, H, W, O, k, s, p, d, g, od, attr = case
    rng = np.random.default_rng(seed)
    qx = rng.integers(0, 256, (N, C, H, W)).astype(np.uint8)
    qw = rng.integers(-127, 128, (O, C // g) + k).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, O).astype(np.float32)
    bias = rng.standard_normal(O).astype(np.float32)
    out_scale, out_zp = (0.05, -3 if od == "int8" else 3) if od in ("uint8", "int8") else (1.0, 0)
    return qx, qw, ws, bias, (_pair(s), _pair(p), _pair(d), g), (out_scale, out_zp, od, attr)


def _qconv(m, qx, x_scale, x_zp, qw, ws, bias, geometry, out, tensor_qparams=False):
    stride, padding, dilation, groups = geometry
    out_scale, out_zp, od, attr = out
    packed = m.ops.onednn.qconv_prepack(m.tensor(qw), m.tensor(ws), x_scale, x_zp, stride, padding, dilation, groups,
                                        list(qx.shape))
    op = m.ops.onednn.qconv2d_pointwise
    xs, xz = (m.tensor(x_scale), m.tensor(x_zp)) if tensor_qparams else (x_scale, x_zp)
    return (op.tensor if tensor_qparams else op.default)(
        m.tensor(qx), xs, xz, packed, m.tensor(ws), m.zeros(len(ws), dtype=m.int64),
        None if bias is None else m.tensor(bias), stride, padding, dilation, groups, out_scale, out_zp,
        getattr(m, od), attr, [], "")


@pytest.mark.parametrize("numpy_fallback", [False, True], ids=["vnni", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_qconv2d_equals_pytorchs_onednn_op(case, numpy_fallback, monkeypatch):
    """Padding (read as the zero point), strides, dilation, groups and depthwise, 1x1, every output dtype
    and ReLU: the integers and the epilogue's roundings equal oneDNN's; shape and channels-last strides too.
    On VNNI the patch rows are gathered while A is packed (a 7x7 stem of 3 channels, 80 channels a tap,
    dilation along the width): no im2col is built except the in-place 1x1 of stride 1."""
    if not numpy_fallback and not cpu_int8.vnni():
        pytest.skip("no AVX-512 VNNI here")
    if numpy_fallback:
        monkeypatch.setitem(cpu_int8._state, "fns", None)
    im2col = []
    patches = cpu_int8_conv._patches
    monkeypatch.setattr(cpu_int8_conv, "_patches", lambda *a: im2col.append(a[5:7]) or patches(*a))
    qx, qw, ws, bias, geometry, out = _problem(CASES[case], seed=len(case))
    got = _qconv(flambeau, qx, 0.02, 7, qw, ws, bias, geometry, out, tensor_qparams=case.startswith("s8"))
    in_place = case == "1x1_f32_relu"
    assert bool(im2col) == (numpy_fallback or in_place), im2col
    want = _qconv(torch, qx, 0.02, 7, qw, ws, bias, geometry, out)
    assert tuple(got.shape) == tuple(want.shape) and got.stride() == want.stride() and str(got.dtype) == str(want.dtype)
    np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())


def test_qconv2d_refuses_what_pytorchs_refuses():
    qx, qw, ws, bias, geometry, _ = _problem(CASES["3x3_pad_f32"])
    with pytest.raises(RuntimeError, match="uint8"):
        _qconv(flambeau, qx.view(np.int8), 0.02, 7, qw, ws, bias, geometry, (1.0, 0, "float32", "none"))
    with pytest.raises(RuntimeError, match="Unsupported post op gelu"):
        _qconv(flambeau, qx, 0.02, 7, qw, ws, bias, geometry, (1.0, 0, "float32", "gelu"))
    with pytest.raises(RuntimeError, match="output_scale must be 1.0"):
        _qconv(flambeau, qx, 0.02, 7, qw, ws, bias, geometry, (0.5, 0, "float32", "none"))
    with pytest.raises(RuntimeError, match="does not match a packed weight"):
        _qconv(flambeau, qx[:, :5], 0.02, 7, qw, ws, bias, geometry, (1.0, 0, "float32", "none"))


BINARY_CASES = {   # problem, accum/output dtype, (out scale, zp), (accum scale, zp), unary post-op
    "u8_relu": ("3x3_pad_f32", "uint8", (0.05, 3), (0.04, 5), "relu"),
    "u8_groups_strided": ("3x3_s2_groups3_u8_relu", "uint8", (0.13, 128), (0.07, 100), "none"),
    "f32_relu": ("1x1_f32_relu", "float32", (1.0, 0), (1.0, 0), "relu"),
    "bf16": ("depthwise_f32", "bfloat16", (1.0, 0), (1.0, 0), "none"),
}


def _qconv_binary(m, qx, qw, ws, bias, geometry, accum, out, accum_q, unary, tensor_qparams=False):
    stride, padding, dilation, groups = geometry
    packed = m.ops.onednn.qconv_prepack(m.tensor(qw), m.tensor(ws), 0.02, 7, stride, padding, dilation, groups,
                                        list(qx.shape))
    op = m.ops.onednn.qconv2d_pointwise
    xs, xz = (m.tensor(0.02), m.tensor(7)) if tensor_qparams else (0.02, 7)
    return (op.binary_tensor if tensor_qparams else op.binary)(
        m.tensor(qx), xs, xz, packed, m.tensor(ws), m.zeros(len(ws), dtype=m.int64), accum, m.tensor(bias), stride,
        padding, dilation, groups, out[0], out[1], accum.dtype, accum_q[0], accum_q[1], "sum", 1.0, unary, [], "")


@pytest.mark.parametrize("numpy_fallback", [False, True], ids=["vnni", "numpy"])
@pytest.mark.parametrize("case", list(BINARY_CASES))
def test_qconv2d_binary_sum_equals_pytorchs_onednn_op(case, numpy_fallback, monkeypatch):
    """conv + dequantized residual (oneDNN's sum post-op) -> [relu] -> output dtype, bit for bit, with small
    weight scales so the outputs lie inside the u8 range (not saturated)."""
    if not numpy_fallback and not cpu_int8.vnni():
        pytest.skip("no AVX-512 VNNI here")
    if numpy_fallback:
        monkeypatch.setitem(cpu_int8._state, "fns", None)
    problem, dtype, out, accum_q, unary = BINARY_CASES[case]
    qx, qw, ws, bias, geometry, _ = _problem(CASES[problem], seed=len(case))
    ws = ws / 50
    shape = tuple(_qconv(torch, qx, 0.02, 7, qw, ws, bias, geometry, (1.0, 0, "float32", "none")).shape)
    rng = np.random.default_rng(len(case) + 1)
    accum = (rng.integers(0, 256, shape).astype(np.uint8) if dtype == "uint8" else
             rng.standard_normal(shape).astype(np.float32))
    t_acc = torch.tensor(accum).to(getattr(torch, dtype)).contiguous(memory_format=torch.channels_last)
    f_acc = flambeau.tensor(accum).to(getattr(flambeau, dtype))
    got = _qconv_binary(flambeau, qx, qw, ws, bias, geometry, f_acc, out, accum_q, unary, case == "u8_relu")
    want = _qconv_binary(torch, qx, qw, ws, bias, geometry, t_acc.clone(), out, accum_q, unary)
    assert tuple(got.shape) == tuple(want.shape) and got.stride() == want.stride() and str(got.dtype) == str(want.dtype)
    if dtype == "uint8":
        assert 0.5 < float(((want > 0) & (want < 255)).float().mean())
    np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())
    np.testing.assert_array_equal(f_acc.float().numpy(), t_acc.float().numpy())    # functional: accum unchanged


def test_qconv2d_binary_refuses_what_pytorchs_refuses():
    qx, qw, ws, bias, geometry, _ = _problem(CASES["3x3_pad_f32"])
    acc = flambeau.zeros(2, 16, 9, 9)
    call = (lambda accum, out=(1.0, 0), accum_q=(1.0, 0), unary="relu", binary="sum":
            flambeau.ops.onednn.qconv2d_pointwise.binary(
                flambeau.tensor(qx), 0.02, 7, flambeau.ops.onednn.qconv_prepack(
                    flambeau.tensor(qw), flambeau.tensor(ws), 0.02, 7, *geometry, list(qx.shape)),
                flambeau.tensor(ws), flambeau.zeros(16, dtype=flambeau.int64), accum, flambeau.tensor(bias),
                *geometry, out[0], out[1], accum.dtype, accum_q[0], accum_q[1], binary, 1.0, unary, [], ""))
    assert call(acc).shape == (2, 16, 9, 9)
    with pytest.raises(RuntimeError, match="post_op sum or post_op sum_relu is supported.*add"):
        call(acc, binary="add")
    with pytest.raises(RuntimeError, match="accum_scale must be 1.0"):
        call(acc, accum_q=(0.5, 0))
    with pytest.raises(RuntimeError, match="does not match the output"):
        call(acc[:1])


# ---- the inductor's pass ---------------------------------------------------------------------------
def _externs(made) -> list:
    return [getattr(e.op, "name", str(e.op)) for c in made for e in c.artifact.externs]


def _conv_layer(m, qd, x, qw, ws, bias, geometry, per_channel, relu, out, functional):
    """q -> dq -> conv (-> relu) (-> q) written with `m`'s ops; `ws` a tensor per channel, a float per tensor."""
    stride, padding, dilation, groups = geometry
    qx = qd.quantize_per_tensor.default(x, 0.03, 120, 0, 255, m.uint8)
    dx = qd.dequantize_per_tensor.default(qx, 0.03, 120, 0, 255, m.uint8)
    if per_channel:
        dw = qd.dequantize_per_channel.default(qw, ws, m.zeros(ws.shape[0], dtype=m.int64), 0, -128, 127, m.int8)
    else:
        dw = qd.dequantize_per_tensor.default(qw, ws, 0, -128, 127, m.int8)
    if functional:
        y = m.nn.functional.conv2d(dx, dw, bias, stride, padding, dilation, groups)
    else:
        y = m.ops.aten.convolution.default(dx, dw, bias, stride, padding, dilation, False, [0, 0], groups)
    if relu == "inplace":                   # nn.ReLU(inplace=True), as torchvision's models
        y = m.relu_(y)
    elif relu:
        y = m.relu(y)
    if out is not None:
        y = qd.quantize_per_tensor.default(y, out[0], out[1], 0, 255, m.uint8)
    return y


PASS_CASES = {   # problem, per-channel weights, relu, requantized output (scale, zp), F.conv2d (else aten.convolution)
    "conv2d_per_channel": ("3x3_pad_f32", True, False, None, True),
    "conv_relu_requant": ("3x3_s2_groups3_u8_relu", True, True, (0.05, 2), False),
    "conv_per_tensor_1x1": ("1x1_f32_relu", False, False, None, False),
    "conv2d_relu_depthwise": ("depthwise_f32", True, True, None, True),
    "conv_inplace_relu_requant": ("3x3_s2_groups3_u8_relu", True, "inplace", (0.05, 2), False),
}


@pytest.mark.parametrize("case", list(PASS_CASES))
def test_compiled_pattern_becomes_one_int8_conv_equal_to_pytorchs(case, monkeypatch):
    problem, per_channel, relu, out, functional = PASS_CASES[case]
    qx, qw, ws, bias, geometry, _ = _problem(CASES[problem], seed=3)
    x = ((qx.astype(np.float32) - 128) / 40).astype(np.float32)
    w_scale = ws if per_channel else float(ws[0])
    ours = [flambeau.tensor(a) for a in (qw, bias)] + [flambeau.tensor(ws) if per_channel else w_scale]
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(lambda t: _conv_layer(flambeau, QD, t, ours[0], ours[2], ours[1], geometry,
                                                     per_channel, relu, out, functional))(flambeau.tensor(x))
    assert [e for e in _externs(made) if "conv" in e] == ["onednn::qconv_prepack", "onednn::qconv2d_pointwise"], \
        _externs(made)
    posts = [a for c in made for e in c.artifact.externs if "qconv2d" in str(getattr(e.op, "name", e.op))
             for a in e.args if a in ("relu", "none")]
    assert posts == ["relu" if relu else "none"], posts               # the ReLU fused as the post-op
    tqx = TQD.quantize_per_tensor.default(torch.tensor(x), 0.03, 120, 0, 255, torch.uint8).numpy()
    ws_full = ws if per_channel else np.full_like(ws, w_scale)
    want = _qconv(torch, tqx, 0.03, 120, qw, ws_full, bias, geometry,
                  (1.0, 0, "float32", "relu" if relu else "none") if out is None else
                  (out[0], out[1], "uint8", "relu" if relu else "none"))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("residual", ["quantized", "float"])
def test_compiled_conv_add_relu_becomes_one_binary_int8_conv_equal_to_pytorchs(residual, monkeypatch):
    """dq -> conv -> add(residual) -> relu -> q: a residual dequantized from u8 (PyTorch's X86 conv + add
    pattern) is the integer accum of one `qconv2d_pointwise.binary` with the requantization fused; a float
    residual is a float accum (the quantize after it stays generated code); both equal PyTorch's ops."""
    qx, qw, ws, bias, geometry, _ = _problem(CASES["3x3_pad_f32"], seed=5)
    ws = ws / 50
    x = ((qx.astype(np.float32) - 128) / 40).astype(np.float32)
    r = np.random.default_rng(8).standard_normal((2, 16, 9, 9)).astype(np.float32)

    def block(m, qd, t, res, qw_, ws_, bias_):
        y = _conv_layer(m, qd, t, qw_, ws_, bias_, geometry, True, False, None, True)
        if residual == "quantized":
            res = qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(res, 0.04, 100, 0, 255, m.uint8),
                                                   0.04, 100, 0, 255, m.uint8)
        return qd.quantize_per_tensor.default(m.relu(y + res), 0.05, 3, 0, 255, m.uint8)
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(lambda t, res: block(flambeau, QD, t, res, flambeau.tensor(qw), flambeau.tensor(ws),
                                                    flambeau.tensor(bias)))(flambeau.tensor(x), flambeau.tensor(r))
    assert [e for e in _externs(made) if "conv" in e] == ["onednn::qconv_prepack",
                                                          "onednn::qconv2d_pointwise.binary"], _externs(made)
    tqx = TQD.quantize_per_tensor.default(torch.tensor(x), 0.03, 120, 0, 255, torch.uint8).numpy()
    stride, padding, dilation, groups = geometry
    packed = torch.ops.onednn.qconv_prepack(torch.tensor(qw), torch.tensor(ws), 0.03, 120, stride, padding, dilation,
                                            groups, list(tqx.shape))
    if residual == "quantized":
        accum, out, accum_q = TQD.quantize_per_tensor.default(torch.tensor(r), 0.04, 100, 0, 255, torch.uint8), \
            (0.05, 3, torch.uint8), (0.04, 100)
    else:
        accum, out, accum_q = torch.tensor(r), (1.0, 0, torch.float32), (1.0, 0)
    want = torch.ops.onednn.qconv2d_pointwise.binary(
        torch.tensor(tqx), 0.03, 120, packed, torch.tensor(ws), torch.zeros(16, dtype=torch.int64),
        accum.contiguous(memory_format=torch.channels_last), torch.tensor(bias), stride, padding, dilation, groups,
        *out, *accum_q, "sum", 1.0, "relu", [], "")
    if residual == "float":
        want = TQD.quantize_per_tensor.default(want, 0.05, 3, 0, 255, torch.uint8)
    assert 0.3 < float(((want > 3) & (want < 255)).float().mean())     # half of it is under the relu
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("requant", [False, True], ids=["f32_out", "relu_requant"])
def test_compiled_conv1d_becomes_an_int8_conv_equal_to_pytorchs_qconv_pointwise(requant, monkeypatch):
    """dq -> conv1d (stride 2, padding 1, groups 2) [-> relu -> q] runs as a height-1 int8 convolution,
    bit-equal to PyTorch's 1-D `onednn::qconv_pointwise`."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 8, 21)).astype(np.float32)
    qw = rng.integers(-127, 128, (12, 4, 3)).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, 12).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)

    def layer(m, qd, t, qw_, ws_, bias_):
        dx = qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(t, 0.03, 120, 0, 255, m.uint8),
                                              0.03, 120, 0, 255, m.uint8)
        dw = qd.dequantize_per_channel.default(qw_, ws_, m.zeros(12, dtype=m.int64), 0, -128, 127, m.int8)
        y = m.nn.functional.conv1d(dx, dw, bias_, 2, 1, 1, 2)
        return qd.quantize_per_tensor.default(m.relu(y), 0.05, 3, 0, 255, m.uint8) if requant else y
    made = spy_compile_fx(monkeypatch, [])
    ours = [flambeau.tensor(a) for a in (qw, ws, bias)]
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(lambda t: layer(flambeau, QD, t, *ours))(flambeau.tensor(x))
    assert [e for e in _externs(made) if "conv" in e] == ["onednn::qconv_prepack", "onednn::qconv2d_pointwise"], \
        _externs(made)
    tqx = TQD.quantize_per_tensor.default(torch.tensor(x), 0.03, 120, 0, 255, torch.uint8)
    packed = torch.ops.onednn.qconv_prepack(torch.tensor(qw), torch.tensor(ws), 0.03, 120, [2], [1], [1], 2,
                                            list(tqx.shape))
    out = (0.05, 3, torch.uint8, "relu") if requant else (1.0, 0, torch.float32, "none")
    want = torch.ops.onednn.qconv_pointwise(tqx, 0.03, 120, packed, torch.tensor(ws), torch.zeros(12, dtype=torch.int64),
                                            torch.tensor(bias), [2], [1], [1], 2, *out, [], "")
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def _converted_cnn():
    flambeau.manual_seed(0)
    model = build_cnn(flambeau).eval()
    data = calibration((4, 3, 16, 16))
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(data[0]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for x in data:
        prepared(flambeau.tensor(x))
    return convert_pt2e(prepared), data


def _count_packing(monkeypatch) -> list:
    calls = []
    real = cpu_int8.pack_weight
    monkeypatch.setattr(cpu_int8, "_pack_cache", collections.OrderedDict())

    def counted_pack_weight(w):
        calls.append(w.shape)
        return real(w)
    monkeypatch.setattr(cpu_int8, "pack_weight", counted_pack_weight)
    return calls


@pytest.mark.parametrize("freezing", [False, True], ids=["unfrozen", "frozen"])
def test_pt2e_cnn_compiles_every_layer_to_int8_and_packs_once(freezing, monkeypatch):
    """A converted CNN (two convolutions + ReLU + max-pool, one linear layer): two int8 convolutions and
    one int8 GEMM, equal to the eager q/dq graph to float rounding; three calls pack each weight once."""
    converted, data = _converted_cnn()
    monkeypatch.setattr(inductor_config, "freezing", freezing)
    flambeau._dynamo.reset()
    calls = _count_packing(monkeypatch)
    made = spy_compile_fx(monkeypatch, [])
    compiled = flambeau.compile(converted)
    with flambeau.no_grad(), no_unexpected_fallbacks():
        outs = [compiled(flambeau.tensor(x)).numpy() for x in data]
        eager = converted(flambeau.tensor(data[2])).numpy()
    names = _externs(made)
    assert names.count("onednn::qconv2d_pointwise") == 2 and names.count("onednn::qlinear_pointwise") == 1, names
    assert "convolution" not in names, names
    assert len(calls) == 3, calls
    np.testing.assert_allclose(outs[2], eager, rtol=0, atol=1e-5 * np.abs(eager).max())
    monkeypatch.setattr(inductor_config, "quantized_conv", False)
    flambeau._dynamo.reset()
    made.clear()
    with flambeau.no_grad():
        floats = flambeau.compile(converted)(flambeau.tensor(data[2])).numpy()
    assert "onednn::qconv2d_pointwise" not in _externs(made)
    np.testing.assert_allclose(floats, eager, rtol=1e-5, atol=1e-5)


def _residual_block(m, batch_norm=False):
    class Block(m.nn.Module):
        """stem conv -> relu -> conv -> relu -> conv + identity -> relu -> conv: ResNet's basic block
        (with batch_norm, a BatchNorm2d after each 3x3 convolution, as torchvision's)."""

        def __init__(self):
            super().__init__()
            self.stem, self.c1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.Conv2d(8, 8, 3, padding=1, bias=not batch_norm)
            self.c2, self.head = m.nn.Conv2d(8, 8, 3, padding=1, bias=not batch_norm), m.nn.Conv2d(8, 4, 1)
            bn = (lambda: m.nn.BatchNorm2d(8)) if batch_norm else m.nn.Identity
            self.b0, self.b1, self.b2 = bn(), bn(), bn()

        def forward(self, x):
            x = m.relu(self.b0(self.stem(x)))
            return self.head(m.relu(self.b2(self.c2(m.relu(self.b1(self.c1(x))))) + x))
    block = Block()
    if batch_norm:
        rng = np.random.default_rng(2)
        for b in (block.b0, block.b1, block.b2):
            b.running_mean.copy_(m.tensor(rng.standard_normal(8).astype(np.float32) * 0.1))
            b.running_var.copy_(m.tensor(rng.uniform(0.5, 2, 8).astype(np.float32)))
    return block


@pytest.mark.parametrize("batch_norm", [False, True], ids=["plain", "batch_norm"])
def test_pt2e_residual_block_quantizes_the_identity_and_compiles_the_add_into_the_int8_conv(batch_norm, monkeypatch):
    """X86InductorQuantizer annotates conv -> add(identity) as PyTorch's `_annotate_conv2d_binary_unary`:
    the identity is observed (sharing the observer of c1's input, the same edge and spec), so the
    converted add reads a dequantized u8 tensor, and the compiled block is 3 plain int8 convolutions +
    one `qconv2d_pointwise.binary` whose accum is that u8 tensor (the add's output requantized for the
    head); equal to the eager q/dq graph to float rounding. With batch norms (torchvision's block):
    prepare_pt2e folds them into the convolutions first, so the same int8 graph comes out."""
    flambeau.manual_seed(0)
    model = _residual_block(flambeau, batch_norm).eval()
    data = calibration((2, 3, 12, 12))
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(data[0]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    add = next(n for n in prepared.graph.nodes if n.target is flambeau.ops.aten.add.Tensor)
    conv1 = [n for n in prepared.graph.nodes if n.target is flambeau.ops.aten.convolution.default][1]
    extra = add.args[1] if add.args[0].target is flambeau.ops.aten.convolution.default else add.args[0]
    assert extra.op == "call_module" and extra is conv1.args[0], (extra, conv1.args)
    for x in data:
        prepared(flambeau.tensor(x))
    converted = convert_pt2e(prepared)
    add = next(n for n in converted.graph.nodes if n.target is flambeau.ops.aten.add.Tensor)
    assert any(a.target is QD.dequantize_per_tensor.default for a in add.args), add.args
    flambeau._dynamo.reset()
    made = spy_compile_fx(monkeypatch, [])
    accums = []
    real = cpu_int8_conv.qconv2d_packed

    def recording_qconv2d_packed(*args, accum=None, **kwargs):
        accums.append(None if accum is None else accum.dtype)
        return real(*args, accum=accum, **kwargs)
    monkeypatch.setattr(cpu_int8_conv, "qconv2d_packed", recording_qconv2d_packed)
    with flambeau.no_grad(), no_unexpected_fallbacks():
        got = flambeau.compile(converted)(flambeau.tensor(data[1])).numpy()
        eager = converted(flambeau.tensor(data[1])).numpy()
    names = _externs(made)
    assert names.count("onednn::qconv2d_pointwise") == 3 and names.count("onednn::qconv2d_pointwise.binary") == 1, \
        names
    assert [a for a in accums if a is not None] == [np.uint8], accums
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())


def test_pt2e_block_with_inplace_relu_modules_compiles_every_relu_into_the_int8_ops(monkeypatch):
    """nn.ReLU(inplace=True) (torchvision's): the capture records relu_ and later reads of the conv's (or the
    add's) tensor, which the pass rewrites as a functional relu, so the converted block compiles to a
    qconv with the ReLU post-op, a uint8 max pool and a qconv2d_pointwise.binary with sum + ReLU, equal to
    the eager q/dq graph to float rounding."""
    nn = flambeau.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.r1, self.pool = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
            self.c2, self.r2, self.c3 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.pool(self.r1(self.c1(x)))
            return self.c3(self.r2(self.c2(y) + y))
    flambeau.manual_seed(0)
    data = calibration((2, 3, 16, 16))
    prepared = prepare_pt2e(capture_pre_autograd_graph(Block().eval(), (flambeau.tensor(data[0]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for x in data:
        prepared(flambeau.tensor(x))
    converted = convert_pt2e(prepared)
    flambeau._dynamo.reset()
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad():
        got = flambeau.compile(converted)(flambeau.tensor(data[1])).numpy()
        want = converted(flambeau.tensor(data[1])).numpy()
    ops = [(getattr(e.op, "name", str(e.op)), [a for a in e.args if a in ("relu", "none", "sum")])
           for c in made for e in c.artifact.externs if "prepack" not in str(getattr(e.op, "name", e.op))]
    assert ops == [("onednn::qconv2d_pointwise", ["relu"]), ("max_pool2d_with_indices", []),
                   ("onednn::qconv2d_pointwise.binary", ["sum", "relu"]), ("onednn::qconv2d_pointwise", ["none"])], ops
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
