"""flambeau.onnx.export: models written as ONNX pass `onnx.checker` and run in onnxruntime with
flambeau's outputs (MLP, CNN with BatchNorm and adaptive pooling, a GPT block with causal attention),
with a dynamic batch from `dynamic_axes`. onnx and onnxruntime are optional: skipped without them."""
from __future__ import annotations

import io

import numpy as np
import pytest

import flambeau as fl

torch = pytest.importorskip("torch")

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _mlp():
    return fl.nn.Sequential(fl.nn.Linear(8, 16), fl.nn.ReLU(), fl.nn.Linear(16, 8), fl.nn.Tanh(), fl.nn.Linear(8, 2))


def _cnn():
    n = fl.nn
    return n.Sequential(n.Conv2d(3, 8, 3, padding=1), n.BatchNorm2d(8), n.ReLU(), n.MaxPool2d(2),
                        n.Conv2d(8, 16, 3, stride=2), n.BatchNorm2d(16), n.GELU(), n.AdaptiveAvgPool2d(1),
                        n.Flatten(), n.Linear(16, 10), n.LogSoftmax(dim=-1))


class _Block(fl.nn.Module):
    """Embedding, pre-norm causal self-attention and an MLP, tied head: a small GPT."""

    def __init__(self, d=32, h=4, vocab=50, T=16):
        super().__init__()
        n = fl.nn
        self.h = h
        self.emb = n.Embedding(vocab, d)
        self.pos = n.Parameter(fl.randn(T, d) * 0.02)
        self.ln1, self.qkv, self.proj = n.LayerNorm(d), n.Linear(d, 3 * d), n.Linear(d, d)
        self.ln2, self.fc, self.out = n.LayerNorm(d), n.Linear(d, 4 * d), n.Linear(4 * d, d)
        self.head = n.Linear(d, vocab, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        x = self.emb(idx) + self.pos[:T]
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in (q, k, v))
        a = fl.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, -1))
        x = x + self.out(fl.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return self.head(x)


def _run(model, example, others, axes, tol):
    buf = io.BytesIO()
    prog = fl.onnx.export(model, (example,), buf, input_names=["inp"], output_names=["out"], dynamic_axes=axes)
    onnx.checker.check_model(onnx.load_from_string(buf.getvalue()))
    assert prog.model_proto.graph.input[0].name == "inp"
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    shape = [d.dim_param or d.dim_value for d in prog.model_proto.graph.input[0].type.tensor_type.shape.dim]
    assert shape[0] == "batch"
    for x in (example, *others):
        got = sess.run(["out"], {"inp": x.numpy()})[0]
        want = model(x).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_mlp_runs_in_onnxruntime():
    _run(_mlp().eval(), fl.randn(4, 8), [fl.randn(9, 8)], {"inp": {0: "batch"}}, 1e-5)


def test_cnn_with_batchnorm_runs_in_onnxruntime():
    m = _cnn()
    for _ in range(2):
        m(fl.randn(4, 3, 16, 16))          # running statistics away from their initial values
    m.eval()
    _run(m, fl.randn(2, 3, 16, 16), [fl.randn(5, 3, 16, 16)], {"inp": {0: "batch"}}, 1e-4)


def test_gpt_block_runs_in_onnxruntime():
    m = _Block().eval()
    _run(m, fl.randint(0, 50, (2, 16)), [fl.randint(0, 50, (3, 16))], {"inp": {0: "batch"}}, 1e-4)


def _lstm(lib):
    class Tagger(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lib.nn.LSTM(6, 12, num_layers=2, batch_first=True)
            self.head = lib.nn.Linear(12, 3)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.head(out + h[-1].unsqueeze(1) + c[0].unsqueeze(1))
    return Tagger()


def test_lstm_runs_in_onnxruntime_as_pytorch():
    """A 2-layer batch-first LSTM (zero initial state: ConstantOfShape of the dynamic batch) and its last
    states: onnxruntime's outputs equal PyTorch's LSTM with the same weights, at two batch sizes."""
    fl.manual_seed(0)
    m = _lstm(fl).eval()
    tm = _lstm(torch).eval()
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    buf = io.BytesIO()
    fl.onnx.export(m, (fl.randn(2, 5, 6),), buf, input_names=["x"], output_names=["y"],
                   dynamic_axes={"x": {0: "batch"}})
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    for b in (2, 7):
        x = np.random.default_rng(b).standard_normal((b, 5, 6)).astype(np.float32)
        with torch.no_grad():
            want = tm(torch.tensor(x)).numpy()
        np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], want, rtol=1e-5, atol=1e-5)


class _Cond(fl.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = fl.nn.Linear(4, 4)

    def forward(self, x):
        return fl.cond(x.sum() > 0, lambda x: self.lin(x).sin(), lambda x: x.cos() * 2, (x,)) + 1


def test_cond_runs_in_onnxruntime_as_an_if():
    """flambeau.cond as an ONNX If (both branches kept, the weight read inside one from the outer scope):
    each branch taken by the data, outputs as PyTorch's."""
    fl.manual_seed(0)
    m = _Cond().eval()
    w, b = (torch.tensor(p.detach().numpy()) for p in (m.lin.weight, m.lin.bias))
    buf = io.BytesIO()
    prog = fl.onnx.export(m, (fl.randn(3, 4),), buf, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}})
    assert [n.op_type for n in prog.model_proto.graph.node].count("If") == 1
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    for sign, rows in ((1, 3), (-1, 5)):
        x = (sign * np.abs(np.random.default_rng(rows).standard_normal((rows, 4)))).astype(np.float32)
        t = torch.tensor(x)
        want = (torch.nn.functional.linear(t, w, b).sin() if t.sum() > 0 else t.cos() * 2) + 1
        np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], want.numpy(), rtol=1e-5, atol=1e-5)


def test_unsupported_programs_are_refused_by_name():
    class Sorts(fl.nn.Module):
        def forward(self, x):
            return x.sort(-1).values

    with pytest.raises(fl.onnx.OnnxExporterError, match="sort"):
        fl.onnx.export(Sorts(), (fl.randn(3, 4),), io.BytesIO())
    with pytest.raises(fl.onnx.OnnxExporterError, match="opset_version 13"):
        fl.onnx.export(_mlp(), (fl.randn(2, 8),), io.BytesIO(), opset_version=13)
    m = _cnn()
    with pytest.raises(fl.onnx.OnnxExporterError, match="training mode"):
        fl.onnx.export(m, (fl.randn(2, 3, 16, 16),), io.BytesIO())


def test_is_in_onnx_export_during_export():
    seen = []

    class Probe(fl.nn.Module):
        def forward(self, x):
            seen.append(fl.onnx.is_in_onnx_export())
            return x * 2
    fl.onnx.export(Probe(), (fl.randn(2),), io.BytesIO())
    assert seen and all(seen) and not fl.onnx.is_in_onnx_export()
