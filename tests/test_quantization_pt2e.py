"""The PT2E flow vs PyTorch's (torchao's `quantize_pt2e` with `X86InductorQuantizer`, the reference
since torch 2.13 moved it there): observers on the same edges with the same statistics and scales on
the same calibration data, the same folded int8 weights; int8 accuracy within 1% of fp32 on a
generated classification task, eager and compiled; QAT and dynamic configurations."""
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

import flambeau
from flambeau.ao.quantization.quantize_pt2e import (capture_pre_autograd_graph, convert_pt2e, prepare_pt2e,
                                                    prepare_qat_pt2e)
from flambeau.ao.quantization.quantizer import x86_inductor_quantizer as xiq
from flambeau.ao.quantization import move_exported_model_to_eval
from flambeau._inductor import config as inductor_config
from tests.conftest import spy_compile_fx
from tests.quantization_models import (build_avg_cnn, build_cnn, build_cnn_bn, build_flatten_cnn, build_mlp, build_mlp_bn,
                                       build_pool_cnn, build_qat_cnn, build_qat_res, calibration, qat_batches, qdq_pattern)

warnings.filterwarnings("ignore")
REPO = pathlib.Path(__file__).resolve().parent.parent
TORCHAO = REPO / ".torchao"        # .ci/run: pip install --no-deps --target .torchao torchao==0.18.0
MODELS = {"cnn": (build_cnn, (4, 3, 16, 16)), "mlp": (build_mlp, (5, 20)), "cnn_bn": (build_cnn_bn, (4, 3, 16, 16)),
          "mlp_bn": (build_mlp_bn, (5, 20)), "pool_cnn": (build_pool_cnn, (4, 3, 16, 16)),
          "avg_cnn": (build_avg_cnn, (4, 3, 16, 16)),
          **{f"flat_{how}": (lambda m, how=how: build_flatten_cnn(m, how), (4, 3, 16, 16))
             for how in ("flatten", "method", "view")}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """PyTorch's numbers, computed by tests/scripts/pt2e_reference.py in a process that sees torchao
    (kept off this one's path: transformers imports an installed torchao, which fails under flambeau)."""
    if not (TORCHAO / "torchao").is_dir():
        if os.environ.get("CI"):
            pytest.fail("the PT2E reference (torchao) is not installed in .torchao")
        pytest.skip("torchao (the PT2E reference) not installed in .torchao")
    out = tmp_path_factory.mktemp("pt2e") / "reference.npz"
    env = dict(os.environ, PYTHONPATH=str(TORCHAO))
    r = subprocess.run([sys.executable, str(REPO / "tests/scripts/pt2e_reference.py"), str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(np.load(out))


def _prepared(name, ref, dynamic=False):
    build, shape = MODELS[name.removesuffix("_dynamic").removesuffix("_conv_only")]
    model = build(flambeau).eval()
    prefix = f"{name}/state/"
    model.load_state_dict({k[len(prefix):]: flambeau.tensor(v) for k, v in ref.items() if k.startswith(prefix)})
    data = calibration(shape)
    cfg = xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    quantizer = xiq.X86InductorQuantizer()
    quantizer = quantizer.set_module_type_qconfig(flambeau.nn.Conv2d, cfg) if name.endswith("_conv_only") else \
        quantizer.set_global(cfg)
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(data[0]),)), quantizer)
    for x in data:
        prepared(flambeau.tensor(x))
    return prepared, data


def _observers(gm):
    """(name, module) of each observer, by its number (the order the annotations were made in)."""
    names = [n.target for n in gm.graph.nodes if n.op == "call_module"
             and n.target.startswith("activation_post_process_")]
    return [(k, getattr(gm, k)) for k in sorted(names, key=lambda k: int(k.rsplit("_", 1)[1]))]


@pytest.mark.parametrize("name", ["cnn", "mlp", "cnn_bn", "mlp_bn", "pool_cnn", "pool_cnn_conv_only", "avg_cnn",
                                  "flat_flatten", "flat_method"])
def test_observers_statistics_and_scales_match_pytorch_x86_flow(name, reference):
    """cnn_bn / mlp_bn: batch norms folded into the convolutions / linear layers (BatchNorm1d after a
    linear with a 2-D input) before observing, as PyTorch's prepare_pt2e: the folded weights' statistics,
    scales and int8 values equal PyTorch's. pool_cnn: int8 propagated through two max pools, a cat and
    nn.Flatten (ReLU modules end the conv patterns): the same 12 observer calls on the same edges, the
    shared instances called on the same tensors (so their histograms and scales are PyTorch's).
    pool_cnn_conv_only: `set_module_type_qconfig(nn.Conv2d, config)` and no global config, so only the
    convolutions are quantized (PyTorch maps the module type to the aten operator): 5 observers (c2 and c3
    read one), no pooling propagation. avg_cnn: int8 through nn.AvgPool2d, a padded F.avg_pool2d, the
    global nn.AdaptiveAvgPool2d and torch.flatten (PyTorch's `int8_in_int8_out_ops`): 12 observer calls.
    flat_*: torch.flatten / Tensor.flatten after a max pool: 6. Not flat_view: the capture records
    `x.view(x.size(0), -1)` as the same view as a flatten, which is propagated, where PyTorch's export keeps
    `aten.view` and observes the linear's input with an instance of its own (the same 6 calls, but the
    pool's shared histogram then holds 2 calls, not 3, and the linear's input scale differs)."""
    fp, data = _prepared(name, reference)
    ours = _observers(fp)
    assert len(ours) == sum(k.startswith(f"{name}/obs") and k.endswith("/type") for k in reference)
    assert len(ours) == {"pool_cnn": 12, "pool_cnn_conv_only": 5, "avg_cnn": 12}.get(name, 6)
    for i, (_, a) in enumerate(ours):
        key = f"{name}/obs{i}/"
        assert type(a).__name__ == str(reference[key + "type"])
        sa, za = a.calculate_qparams()
        sb, zb = reference[key + "scale"], reference[key + "zero_point"]
        if i <= 1 or type(a).__name__ == "PerChannelMinMaxObserver":
            # the model input and the weights: identical data, identical statistics and qparams
            for buf in ("min_val", "max_val", "histogram"):
                if key + buf in reference:
                    np.testing.assert_array_equal(getattr(a, buf).numpy(), reference[key + buf])
            np.testing.assert_array_equal(sa.numpy(), sb)
        else:
            # inner activations come out of float32 conv/linear kernels: last-bit differences (a value
            # on a bin edge moves one count per call of a shared observer)
            calls = sum(b is a for _, b in ours)
            np.testing.assert_allclose(a.histogram.numpy(), reference[key + "histogram"], atol=calls)
            np.testing.assert_allclose(sa.numpy(), sb, rtol=1e-5)
        assert str(sa.dtype) == "torch." + str(sb.dtype) and str(za.dtype) == "torch." + str(zb.dtype)
        np.testing.assert_array_equal(za.numpy(), zb)
    groups = [[j for j, (_, b) in enumerate(ours) if b is a] for _, a in ours]
    if name == "pool_cnn":           # which calls share an instance: PyTorch's grouping
        assert groups[2] == [2, 3] and groups[6] == [6, 7, 8, 9, 10], groups
    if name == "avg_cnn":            # each pool reads and writes its input's observer; the head's is one group
        assert groups[2] == [2, 3] and groups[5] == [5, 6] and groups[8] == [8, 9, 10], groups
    fc = convert_pt2e(fp)
    frozen = sorted(k for k, _ in fc.named_buffers() if k.startswith("_frozen_param"))
    assert len(frozen) == sum(k.startswith(f"{name}/_frozen_param") for k in reference)
    for k in frozen:
        np.testing.assert_array_equal(getattr(fc, k).numpy(), reference[f"{name}/{k}"])
    assert not any(n.op == "call_module" for n in fc.graph.nodes), "an observer survived convert"
    want = reference[f"{name}/output"]
    got = fc(flambeau.tensor(data[1] * 3)).detach().numpy()
    # avg_cnn: a float average of dequantized values lands on a half in exact arithmetic (a 2x2 pool's
    # mean), where each library's float rounding picks the integer: pooled values one step apart
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=(1e-2 if name == "avg_cnn" else 1e-3) * np.abs(want).max())


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
    model = _train(build_mlp(flambeau, skip=False), xt, yt).eval()
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
    model = _train(build_mlp(flambeau, skip=False), x[:1000], y[:1000], steps=60)
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


@pytest.mark.parametrize("name", ["qat", "qat_res"])
def test_qat_conv_bn_fusion_trains_and_converts_as_pytorch(name, reference):
    """prepare_qat_pt2e rewrites conv -> bn into PyTorch's fused QAT form (weight scaled by gamma / running
    std, fake-quantized with the fused op's FBGEMM qparams; conv / scale + bias; bn in training mode): from
    the same weights, 6 SGD steps give PyTorch's losses and running statistics (rtol 1e-5: float32 conv
    kernels differ in the last bits; seen 2e-7), convert_pt2e folds the batch norms into the convolutions
    (weights quantized with the scales learnt in training: PyTorch's int8 values) and the converted
    model's output is PyTorch's to float32 rounding. qat_res: conv -> bn -> add(identity) -> ReLU module,
    PyTorch's QAT conv-bn-add-relu annotation (the identity observed, sharing the first ReLU's observer)."""
    ref = {k[len(name) + 1:]: v for k, v in reference.items() if k.startswith(name + "/")}
    model = (build_qat_cnn if name == "qat" else build_qat_res)(flambeau).train()
    model.load_state_dict({k[len("state/"):]: flambeau.tensor(v) for k, v in ref.items() if k.startswith("state/")})
    batches = qat_batches()
    qat = prepare_qat_pt2e(capture_pre_autograd_graph(model, (flambeau.tensor(batches[0][0]),)),
                           xiq.X86InductorQuantizer().set_global(
                               xiq.get_default_x86_inductor_quantization_config(is_qat=True)))
    targets = [str(n.target) for n in qat.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.native_batch_norm") == 2 and targets.count("aten.sqrt") == 2   # fused, bn kept
    assert len(_observers(qat)) == int(ref["observer_calls"]) == 7
    opt = flambeau.optim.SGD(qat.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        loss = flambeau.nn.functional.cross_entropy(qat(flambeau.tensor(x)), flambeau.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.testing.assert_allclose(losses, ref["losses"], rtol=1e-5)
    assert abs(losses[-1] - losses[0]) > 1e-2                                   # training moved the loss
    for bn in ("b1", "b2"):       # the captured graph updates the model's own running statistics
        for stat in ("running_mean", "running_var"):
            np.testing.assert_allclose(getattr(getattr(model, bn), stat).numpy(), ref[f"{bn}_{stat}"],
                                       rtol=1e-5, atol=1e-7)
    move_exported_model_to_eval(qat)
    converted = convert_pt2e(qat)
    targets = [str(n.target) for n in converted.graph.nodes if n.op == "call_function"]
    assert "aten.native_batch_norm" not in targets and "aten.add_.Tensor" not in targets   # folded
    convs = [n for n in converted.graph.nodes if n.op == "call_function" and str(n.target) == "aten.convolution"]
    assert len(convs) == 2
    theirs = [v for k, v in ref.items() if k.startswith("_frozen_param")]
    for conv in convs:               # each folded int8 weight is one of PyTorch's
        got = getattr(converted, conv.args[1].args[0].target).numpy()
        assert any(v.shape == got.shape and np.array_equal(v, got) for v in theirs), conv
    want = ref["output"]
    np.testing.assert_allclose(converted(flambeau.tensor(batches[0][0])).detach().numpy(), want,
                               rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_dynamic_config_matches_pytorch(reference):
    fp, data = _prepared("mlp_dynamic", reference, dynamic=True)
    fc = convert_pt2e(fp)
    targets = [str(n.target) for n in fc.graph.nodes if n.op == "call_function"]
    assert sum("choose_qparams" in t for t in targets) == 3
    np.testing.assert_allclose(fc(flambeau.tensor(data[1] * 3)).detach().numpy(), reference["mlp_dynamic/output"],
                               rtol=1e-4, atol=1e-4)


def test_pt2e_int8_flows_through_pooling_cat_and_flatten_compiled(reference, monkeypatch):
    """The converted pool_cnn (shared qparams around both max pools, the cat and the flatten) compiles to
    int8 convolutions whose u8 outputs feed max pooling, cat and the flatten as integers
    (quantization_int8_io): both max pools run on uint8 tensors, no float convolution; the output equals
    the eager q/dq graph's to float rounding and PyTorch's converted model's to a quantization step.
    With `config.quantized_pooling` off the pools take float32 (the dequantize -> pool -> quantize path)."""
    fp, data = _prepared("pool_cnn", reference)
    converted = convert_pt2e(fp)
    x = flambeau.tensor(data[1] * 3)

    got, externs = _compiled_externs(monkeypatch, converted, x)
    names = [n for n, _ in externs]
    pools = [dt for n, dt in externs if n == "max_pool2d_with_indices"]
    assert pools == [flambeau.uint8, flambeau.uint8], externs
    assert names.count("onednn::qconv2d_pointwise") == 3 and names.count("onednn::qlinear_pointwise") == 1, names
    assert "convolution" not in names
    with flambeau.no_grad():
        eager = converted(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())
    want = reference["pool_cnn/output"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    monkeypatch.setattr(inductor_config, "quantized_pooling", False)
    off, externs = _compiled_externs(monkeypatch, converted, x)
    assert [dt for n, dt in externs if n == "max_pool2d_with_indices"] == [flambeau.float32] * 2, externs
    np.testing.assert_allclose(off, eager, rtol=0, atol=1e-5 * np.abs(eager).max())


def test_linear_bn_over_a_3d_input_is_not_folded():
    """BatchNorm1d after a linear applied to (N, C, L): the batch norm normalises C while the linear maps
    L, so prepare_pt2e leaves it (as PyTorch's `_fuse_linear_bn_`); the prepared model computes the float
    model's values (observers do not change them)."""
    flambeau.manual_seed(0)
    model = flambeau.nn.Sequential(flambeau.nn.Linear(6, 6), flambeau.nn.BatchNorm1d(4)).eval()
    model[1].running_mean.copy_(flambeau.randn(4))
    x = flambeau.randn(3, 4, 6)
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (x,)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    assert any(str(n.target) == "aten.native_batch_norm" for n in prepared.graph.nodes)
    np.testing.assert_allclose(prepared(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_prepare_rejects_an_uncaptured_module():
    with pytest.raises(TypeError, match="GraphModule"):
        prepare_pt2e(build_mlp(flambeau), xiq.X86InductorQuantizer())


def _our_kind(gm):
    """qdq_pattern's names for flambeau's capture: average pools are `_taps_gather` / a global mean, a
    flatten a view (PyTorch: avg_pool2d / adaptive_avg_pool2d, flatten.using_ints or view)."""
    names = {"aten.convolution": "conv", "aten.linear": "linear", "aten.max_pool2d_with_indices": "max_pool",
             "aten._taps_gather": "avg_pool", "aten.mean.dim": "avg_pool", "aten.view": "flatten", "aten.cat": "cat"}
    return lambda n: names.get(str(n.target))


@pytest.mark.parametrize("name", ["pool_cnn", "avg_cnn", "flat_flatten", "flat_method", "flat_view"])
def test_converted_graph_has_pytorchs_qdq_pattern(name, reference):
    """Around each convolution, linear, pool, cat and flatten of the converted graph, whether it reads a
    dequantize and feeds a quantize, in graph order, equals torchao's converted graph: every average pool
    and flatten sits between dq and q (int8 in, int8 out). Broken: pools not annotated -> avg_cnn fails."""
    fc = convert_pt2e(_prepared(name, reference)[0])
    assert qdq_pattern(fc.graph, _our_kind(fc)) == [str(v) for v in reference[f"{name}/qdq"]]


def _compiled_externs(monkeypatch, model, x):
    flambeau._dynamo.reset()
    made = spy_compile_fx(monkeypatch, [])
    with flambeau.no_grad():
        out = flambeau.compile(model)(x).numpy()
    return out, [(getattr(e.op, "name", str(e.op)), getattr(getattr(e.args[0], "layout", None), "dtype", None))
                 for c in made for e in c.artifact.externs]


def test_pt2e_int8_average_pools_compile_to_the_uint8_kernel(reference, monkeypatch):
    """The converted avg_cnn compiles with its three average pools (module, padded functional without the
    padding in the count, the global pool) as `_avg_pool2d_int8` on the convolutions' uint8 outputs and the
    flattened u8 pool output straight into the int8 GEMM: 3 int8 convolutions, 1 int8 linear, no float
    pooling, no float convolution. Output vs eager q/dq: the pools round the integer mean as PyTorch's
    quantized avg_pool2d where the q/dq graph rounds a float mean (one integer apart at near-halves), so
    within a few output quantization steps; vs torchao's converted model to 1e-3. With
    `config.quantized_pooling` off the pools run in float. Broken: the pass ignoring average pools -> fails."""
    fp, data = _prepared("avg_cnn", reference)
    converted = convert_pt2e(fp)
    x = flambeau.tensor(data[1] * 3)
    got, externs = _compiled_externs(monkeypatch, converted, x)
    names = [n for n, _ in externs]
    assert [dt for n, dt in externs if n == "_avg_pool2d_int8"] == [flambeau.uint8] * 3, externs
    assert names.count("onednn::qconv2d_pointwise") == 3 and names.count("onednn::qlinear_pointwise") == 1, names
    assert dict(externs)["onednn::qlinear_pointwise"] == flambeau.uint8
    assert not {"convolution", "_taps_gather", "mean"} & set(names), names
    with flambeau.no_grad():
        eager = converted(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=0, atol=2e-2 * np.abs(eager).max())
    want = reference["avg_cnn/output"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-2 * np.abs(want).max())
    monkeypatch.setattr(inductor_config, "quantized_pooling", False)
    off, externs = _compiled_externs(monkeypatch, converted, x)
    assert "_avg_pool2d_int8" not in [n for n, _ in externs]
    np.testing.assert_allclose(off, eager, rtol=0, atol=1e-5 * np.abs(eager).max())


@pytest.mark.parametrize("how", ["flatten", "method", "view"])
def test_functional_flatten_keeps_the_int8_chain_compiled(how, reference, monkeypatch):
    """torch.flatten(x, 1), x.flatten(1) and x.view(x.size(0), -1) after an int8 max pool: the int8 linear
    reads the pool's uint8 values through the flatten (no float flatten between a dequantize and a
    quantize); output equal to eager q/dq's to float rounding and to torchao's to 1e-3. Broken: a functional
    flatten not recognised by the quantizer -> the qdq pattern and this test fail."""
    fp, data = _prepared(f"flat_{how}", reference)
    converted = convert_pt2e(fp)
    x = flambeau.tensor(data[1] * 3)
    got, externs = _compiled_externs(monkeypatch, converted, x)
    assert dict(externs).get("max_pool2d_with_indices") == flambeau.uint8, externs
    assert dict(externs).get("onednn::qlinear_pointwise") == flambeau.uint8, externs
    with flambeau.no_grad():
        eager = converted(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=0, atol=1e-5 * np.abs(eager).max())
    want = reference[f"flat_{how}/output"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
