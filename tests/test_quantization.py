"""Quantized tensors and quantization ops vs PyTorch: integer representations bit for bit (rounding
half to even, clamping), the qparams accessors, fake quantization's straight-through gradients, and
the `quantized_decomposed` ops eager and compiled."""
import warnings

import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

import flambeau

warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
QDTYPES = [("quint8", 0, 255), ("qint8", -128, 127), ("qint32", -1000, 1000)]


def _data(shape=(37, 211), scale=30.0, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    x.reshape(-1)[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e9, -1e9]      # ties and saturation
    return x


@pytest.mark.parametrize("name,zlo,zhi", QDTYPES)
def test_quantize_per_tensor_int_repr_bit_exact(name, zlo, zhi):
    x = _data()
    rng = np.random.default_rng(1)
    for scale in [1.0, 0.5, 0.1, 1 / 3, 0.0371, *rng.uniform(1e-3, 2, 12)]:
        zp = int(rng.integers(zlo, zhi))
        ref = torch.quantize_per_tensor(torch.from_numpy(x), float(scale), zp, getattr(torch, name))
        got = flambeau.quantize_per_tensor(flambeau.tensor(x), float(scale), zp, getattr(flambeau, name))
        assert got.dtype is getattr(flambeau, name) and got.is_quantized
        np.testing.assert_array_equal(got.int_repr().numpy(), ref.int_repr().numpy())
        np.testing.assert_array_equal(got.dequantize().numpy(), ref.dequantize().numpy())
        assert got.q_scale() == ref.q_scale() and got.q_zero_point() == ref.q_zero_point()
        assert got.qscheme() is flambeau.per_tensor_affine and str(got.qscheme()) == str(ref.qscheme())


@pytest.mark.parametrize("name", ["quint8", "qint8"])
@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_per_channel_bit_exact(name, axis):
    x = _data()
    rng = np.random.default_rng(2)
    n = x.shape[axis]
    scales = rng.uniform(1e-3, 2, n)
    zps = rng.integers(0 if name == "quint8" else -128, 128, n)
    ref = torch.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps), axis,
                                     getattr(torch, name))
    got = flambeau.quantize_per_channel(flambeau.tensor(x), flambeau.tensor(scales), flambeau.tensor(zps), axis,
                                        getattr(flambeau, name))
    np.testing.assert_array_equal(got.int_repr().numpy(), ref.int_repr().numpy())
    np.testing.assert_array_equal(got.dequantize().numpy(), ref.dequantize().numpy())
    np.testing.assert_array_equal(got.q_per_channel_scales().numpy(), ref.q_per_channel_scales().numpy())
    np.testing.assert_array_equal(got.q_per_channel_zero_points().numpy(), ref.q_per_channel_zero_points().numpy())
    assert got.q_per_channel_axis() == ref.q_per_channel_axis()
    assert str(got.qscheme()) == str(ref.qscheme())


def test_quantized_tensor_errors_and_repr():
    x = flambeau.tensor([[0.1, -0.25], [1.0, 2.5]])
    q = flambeau.quantize_per_tensor(x, 0.1, 3, flambeau.quint8)
    r = torch.quantize_per_tensor(torch.tensor([[0.1, -0.25], [1.0, 2.5]]), 0.1, 3, torch.quint8)
    assert repr(q).split("quantization_scheme")[0].split() == repr(r).split("quantization_scheme")[0].split()
    assert "scale=0.1, zero_point=3" in repr(q)
    with pytest.raises(RuntimeError, match="kPerChannelAffine"):
        q.q_per_channel_axis()
    qc = flambeau.quantize_per_channel(x, flambeau.tensor([0.1, 0.2]), flambeau.tensor([0, 1]), 1, flambeau.qint8)
    with pytest.raises(RuntimeError, match="kPerTensorAffine"):
        qc.q_scale()
    with pytest.raises(RuntimeError):
        flambeau.quantize_per_tensor(x, 0.1, 0, flambeau.float32)
    with pytest.raises(RuntimeError):
        flambeau.int_repr(x)
    assert not x.is_quantized and x.dequantize() is x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fake_quantize_values_and_straight_through_gradient(dtype):
    x = _data((16, 9), 3.0).astype(dtype)
    cases = [(lambda m, t: m.fake_quantize_per_tensor_affine(t, 0.1, 3, 0, 40)),
             (lambda m, t: m.fake_quantize_per_tensor_affine(t, m.tensor([0.05]), m.tensor([-2], dtype=m.int32),
                                                            -20, 20)),
             (lambda m, t: m.fake_quantize_per_channel_affine(t, m.linspace(0.01, 0.3, 9), m.arange(9, dtype=m.int32)
                                                             - 4, 1, -10, 10))]
    for f in cases:
        a = flambeau.tensor(x, requires_grad=True)
        b = torch.tensor(x, requires_grad=True)
        ya, yb = f(flambeau, a), f(torch, b)
        np.testing.assert_array_equal(ya.detach().numpy(), yb.detach().numpy())
        g = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
        ya.backward(flambeau.tensor(g))
        yb.backward(torch.tensor(g))
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
        assert 0 < (a.grad.numpy() == 0).sum() < x.size      # some clamped, some passed


def test_compiled_fake_quantize_keeps_the_straight_through_gradient():
    """QAT compiled: values from the decomposition, gradients from the op's derivative (the mask)."""
    x = _data((8, 7), 3.0)

    def f(t):
        return (flambeau.fake_quantize_per_tensor_affine(t * 2, 0.1, 3, 0, 40) ** 2).sum()

    a = flambeau.tensor(x, requires_grad=True)
    f(a).backward()
    b = flambeau.tensor(x, requires_grad=True)
    flambeau.compile(f, fullgraph=True)(b).backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    assert (a.grad.numpy() != 0).sum() > 0


def _qd(m):
    return m.ops.quantized_decomposed


def test_quantized_decomposed_ops_bit_exact_eager_and_compiled():
    x = _data((33, 17), 3.0)
    rng = np.random.default_rng(4)
    sc = rng.uniform(0.01, 0.1, 17)
    zp = rng.integers(-5, 5, 17)
    wq = np.clip(np.round(_data((17, 17), 1.0, 5) * 20), -128, 127).astype(np.int8)

    def f(m, t, scales, zps, w):
        qd = _qd(m)
        s, z = qd.choose_qparams.tensor(t, 0, 255, 2 ** -12, m.uint8)
        q = qd.quantize_per_tensor.tensor(t, s, z, 0, 255, m.uint8)
        d = qd.dequantize_per_tensor.tensor(q, s, z, 0, 255, m.uint8)
        q2 = qd.quantize_per_tensor(t, 0.0371, 7, 0, 255, m.uint8)
        d2 = qd.dequantize_per_tensor(q2, 0.0371, 7, 0, 255, m.uint8)
        qc = qd.quantize_per_channel(t, scales, zps, 1, -128, 127, m.int8)
        dc = qd.dequantize_per_channel(qc, scales, zps, 1, -128, 127, m.int8)
        dw = qd.dequantize_per_channel(w, scales, zps, 0, -128, 127, m.int8)
        ties = qd.quantize_per_tensor(t, 1.0, 3, -128, 127, m.int8)       # x.5 inputs: half to even
        y = m.nn.functional.linear(d2, dw)
        return s, z, q, d, q2, d2, qc, dc, ties, qd.quantize_per_tensor(m.relu(y), 0.05, 0, 0, 255, m.uint8)

    ref = f(torch, torch.from_numpy(x), torch.from_numpy(sc), torch.from_numpy(zp), torch.from_numpy(wq))
    args = (flambeau.tensor(x), flambeau.tensor(sc), flambeau.tensor(zp), flambeau.tensor(wq))
    eager = f(flambeau, *args)
    compiled = flambeau.compile(lambda *a: f(flambeau, *a), fullgraph=True)(*args)
    for i, (r, e, c) in enumerate(zip(ref, eager, compiled)):
        assert str(e.dtype) == str(r.dtype) == str(c.dtype), i
        if i == len(ref) - 1:      # after a float32 GEMM: summation order may move a value by one step
            assert np.abs(e.numpy().astype(int) - r.numpy().astype(int)).max() <= 1
            continue
        np.testing.assert_array_equal(e.numpy(), r.numpy(), err_msg=f"output {i} eager")
        np.testing.assert_array_equal(c.numpy(), r.numpy(), err_msg=f"output {i} compiled")


def test_quantized_decomposed_namespace():
    qd = flambeau.ops.quantized_decomposed
    assert repr(qd.quantize_per_tensor.default) == "quantized_decomposed.quantize_per_tensor"
    assert qd.quantize_per_tensor.tensor is not qd.quantize_per_tensor.default
    assert "quantize_per_tensor" not in flambeau.ops.aten.__dict__.get("_cache", {})
    with pytest.raises(AttributeError):
        qd.no_such_op
    with pytest.raises(AssertionError, match="quant_max out of bounds"):
        qd.quantize_per_tensor(flambeau.ones(3), 0.1, 0, 0, 256, flambeau.uint8)
    with pytest.raises(AssertionError, match="Expecting input to have dtype"):
        qd.dequantize_per_tensor(flambeau.ones(3, dtype=flambeau.int8), 0.1, 0, 0, 255, flambeau.uint8)


@pytest.mark.parametrize("call", [lambda m, q, f: q + q, lambda m, q, f: q.sum(), lambda m, q, f: f + q,
                                  lambda m, q, f: q.sum(dim=0), lambda m, q, f: q.mul_(2)],
                         ids=["add", "sum", "float_plus_quantized", "sum_dim", "inplace"])
def test_ops_without_a_quantized_kernel_refuse_quantized_tensors_as_pytorch(call):
    # PyTorch raises (no QuantizedCPU kernel: NotImplementedError; a quantized dtype meeting a float
    # one, or an in-place op: RuntimeError); computing on the integers would be silently wrong
    tq = torch.quantize_per_tensor(torch.tensor([1.0, 2.0, 3.0]), 0.1, 10, torch.quint8)
    with pytest.raises((NotImplementedError, RuntimeError)) as expected:
        call(torch, tq, torch.ones(3))
    q = flambeau.quantize_per_tensor(flambeau.tensor([1.0, 2.0, 3.0]), 0.1, 10, flambeau.quint8)
    with pytest.raises(expected.type, match="quantized|QuantizedCPU"):
        call(flambeau, q, flambeau.ones(3))
    assert q.int_repr().tolist() == [20, 30, 40]
