"""The PT2E flow vs PyTorch's (torchao's `quantize_pt2e` with `X86InductorQuantizer`, the reference
since torch 2.13 moved it there): observers on the same edges with the same statistics and scales on
the same calibration data, the same folded int8 weights; int8 accuracy within 1% of fp32 on a
generated classification task, eager and compiled; QAT and dynamic configurations."""
import warnings

import numpy as np
import pytest
import torch

import flambeau
from flambeau.ao.quantization.quantize_pt2e import (capture_pre_autograd_graph, convert_pt2e, prepare_pt2e,
                                                    prepare_qat_pt2e)
from flambeau.ao.quantization.quantizer import x86_inductor_quantizer as xiq

warnings.filterwarnings("ignore")
tao = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
txiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")


def _cnn(m):
    class CNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = m.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = m.nn.Conv2d(8, 16, 3, padding=1)
            self.fc = m.nn.Linear(16 * 4 * 4, 10)

        def forward(self, x):
            x = m.nn.functional.max_pool2d(m.relu(self.c1(x)), 2)
            x = m.nn.functional.max_pool2d(m.relu(self.c2(x)), 2)
            return self.fc(x.flatten(1))
    return CNN()


def _mlp(m, d_in=20, hidden=64, classes=4, skip=True):
    class MLP(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.l3 = m.nn.Linear(d_in, hidden), m.nn.Linear(hidden, hidden), m.nn.Linear(hidden, classes)

        def forward(self, x):
            h = m.relu(self.l2(m.relu(self.l1(x))))
            return self.l3(h + x.sum(1, keepdim=True) if skip else h)
    return MLP()


def _pair(build, seed=0):
    torch.manual_seed(seed)
    ref = build(torch).eval()
    ours = build(flambeau).eval()
    ours.load_state_dict({k: flambeau.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    return ours, ref


def _prepare_both(build, shape, n_batches=3, seed=0):
    ours, ref = _pair(build)
    rng = np.random.default_rng(seed)
    data = [(rng.standard_normal(shape) * (1 + i)).astype(np.float32) for i in range(n_batches)]
    tp = tao.prepare_pt2e(torch.export.export(ref, (torch.tensor(data[0]),)).module(),
                          txiq.X86InductorQuantizer().set_global(txiq.get_default_x86_inductor_quantization_config()))
    fp = prepare_pt2e(capture_pre_autograd_graph(ours, (flambeau.tensor(data[0]),)),
                      xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for x in data:
        tp(torch.tensor(x))
        fp(flambeau.tensor(x))
    return fp, tp, data


def _observers(gm):
    """(name, module) of each observer, by its number (the order the annotations were made in)."""
    names = [n.target for n in gm.graph.nodes if n.op == "call_module"
             and n.target.startswith("activation_post_process_")]
    return [(k, getattr(gm, k)) for k in sorted(names, key=lambda k: int(k.rsplit("_", 1)[1]))]


@pytest.mark.parametrize("build,shape", [(_cnn, (4, 3, 16, 16)), (_mlp, (5, 20))], ids=["cnn", "mlp"])
def test_observers_statistics_and_scales_match_pytorch_x86_flow(build, shape):
    fp, tp, data = _prepare_both(build, shape)
    ours, ref = _observers(fp), _observers(tp)
    assert [type(o).__name__ for _, o in ours] == [type(o).__name__ for _, o in ref]
    assert len(ours) == 6
    for i, ((_, a), (_, b)) in enumerate(zip(ours, ref)):
        sa, za = a.calculate_qparams()
        sb, zb = b.calculate_qparams()
        if i <= 1 or type(a).__name__ == "PerChannelMinMaxObserver":
            # the model input and the weights: identical data, identical statistics and qparams
            for buf in ("min_val", "max_val", "histogram"):
                if hasattr(b, buf):
                    np.testing.assert_array_equal(getattr(a, buf).numpy(), getattr(b, buf).numpy())
            np.testing.assert_array_equal(sa.numpy(), sb.numpy())
        else:
            # inner activations come out of float32 conv/linear kernels: last-bit differences
            np.testing.assert_allclose(a.histogram.numpy(), b.histogram.numpy(), atol=1)
            np.testing.assert_allclose(sa.numpy(), sb.numpy(), rtol=1e-5)
        np.testing.assert_array_equal(za.numpy(), zb.numpy())
    fc, tc = convert_pt2e(fp), tao.convert_pt2e(tp)
    frozen = sorted(k for k, _ in fc.named_buffers() if k.startswith("_frozen_param"))
    assert len(frozen) == 3
    for k in frozen:
        np.testing.assert_array_equal(getattr(fc, k).numpy(), getattr(tc, k).detach().numpy())
    for n in fc.graph.nodes:
        assert not (n.op == "call_module"), "an observer survived convert"
    x = data[1]
    got = fc(flambeau.tensor(x)).detach().numpy()
    want = tc(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def _task(n=1200, d=20, classes=4, seed=0):
    """Gaussian clusters (the same centers for every seed): samples of one classification task."""
    centers = np.random.default_rng(0).standard_normal((classes, d)) * 0.8     # one task, overlapping classes
    rng = np.random.default_rng(seed + 1)
    y = rng.integers(0, classes, n)
    x = (centers[y] + rng.standard_normal((n, d))).astype(np.float32)
    return x, y


def _train(model, x, y, steps=60, lr=0.05, batch=100):
    opt = flambeau.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(steps):
        i = (s * batch) % len(x)
        xb, yb = flambeau.tensor(x[i:i + batch]), flambeau.tensor(y[i:i + batch])
        loss = flambeau.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _accuracy(fn, x, y, batch=100):
    hits = 0
    for i in range(0, len(x), batch):
        out = fn(flambeau.tensor(x[i:i + batch]))
        hits += int((out.detach().numpy().argmax(1) == y[i:i + batch]).sum())
    return hits / len(x)


def test_int8_accuracy_within_one_percent_of_fp32_eager_and_compiled():
    x, y = _task()
    xt, yt = x[:1000], y[:1000]
    xv, yv = _task(600, seed=1)
    flambeau.manual_seed(0)
    model = _train(_mlp(flambeau, skip=False), xt, yt).eval()
    fp32 = _accuracy(model, xv, yv)
    assert fp32 > 0.85
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(xt[:100]),)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    for i in range(0, 500, 100):
        prepared(flambeau.tensor(xt[i:i + 100]))
    converted = convert_pt2e(prepared)
    int8 = _accuracy(converted, xv, yv)
    compiled = flambeau.compile(converted)
    int8_compiled = _accuracy(compiled, xv, yv)
    assert abs(int8 - fp32) <= 0.01 and abs(int8_compiled - fp32) <= 0.01, (fp32, int8, int8_compiled)
    a = converted(flambeau.tensor(xv[:100])).detach().numpy()
    b = compiled(flambeau.tensor(xv[:100])).detach().numpy()
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    ref = model(flambeau.tensor(xv[:100])).detach().numpy()
    assert np.abs(a - ref).max() > 0                                                   # it did quantize
    np.testing.assert_allclose(a, ref, atol=0.05 * np.abs(ref).max())                # ... to int8 precision


def test_qat_prepare_train_convert():
    x, y = _task()
    xv, yv = _task(600, seed=1)
    flambeau.manual_seed(0)
    model = _train(_mlp(flambeau, skip=False), x[:1000], y[:1000], steps=60)
    fp32 = _accuracy(model.eval(), xv, yv)
    qat = prepare_qat_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(x[:100]),)),
                           xiq.X86InductorQuantizer().set_global(
                               xiq.get_default_x86_inductor_quantization_config(is_qat=True)))
    fakes = [m for _, m in _observers(qat)]
    assert fakes and all(type(m).__name__ == "FusedMovingAvgObsFakeQuantize" for m in fakes)
    before = [p.detach().numpy().copy() for p in qat.parameters()]
    _train(qat, x[:1000], y[:1000], steps=40, lr=0.02)
    after = [p.detach().numpy() for p in qat.parameters()]
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, after))    # gradients reached the weights
    converted = convert_pt2e(qat)
    assert _accuracy(converted, xv, yv) >= fp32 - 0.01


def test_dynamic_config_matches_pytorch():
    ours, ref = _pair(_mlp)
    x = np.random.default_rng(5).standard_normal((5, 20)).astype(np.float32)
    cfg_t = txiq.get_default_x86_inductor_quantization_config(is_dynamic=True)
    cfg_f = xiq.get_default_x86_inductor_quantization_config(is_dynamic=True)
    tp = tao.prepare_pt2e(torch.export.export(ref, (torch.tensor(x),)).module(),
                          txiq.X86InductorQuantizer().set_global(cfg_t))
    fp = prepare_pt2e(capture_pre_autograd_graph(ours, (flambeau.tensor(x),)),
                      xiq.X86InductorQuantizer().set_global(cfg_f))
    tp(torch.tensor(x))
    fp(flambeau.tensor(x))
    tc, fc = tao.convert_pt2e(tp), convert_pt2e(fp)
    targets = [str(n.target) for n in fc.graph.nodes if n.op == "call_function"]
    assert sum("choose_qparams" in t for t in targets) == 3
    x2 = (np.random.default_rng(6).standard_normal((5, 20)) * 3).astype(np.float32)
    np.testing.assert_allclose(fc(flambeau.tensor(x2)).detach().numpy(), tc(torch.tensor(x2)).detach().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_prepare_rejects_an_uncaptured_module():
    with pytest.raises(TypeError, match="GraphModule"):
        prepare_pt2e(_mlp(flambeau), xiq.X86InductorQuantizer())
