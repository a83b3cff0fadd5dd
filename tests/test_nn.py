"""nn.Module semantics and layers vs PyTorch: state_dict keys/shapes, forward outputs with copied
weights, load_state_dict errors, repr strings, hooks, init distributions, nn.utils."""
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

import flambeau as fl
import flambeau.nn as fnn


def F_(t):
    """torch tensor -> flambeau tensor (same values and dtype)."""
    return fl.tensor(t.detach().numpy())


def N(x):
    return x.detach().numpy() if isinstance(x, (torch.Tensor, fl.Tensor)) else np.asarray(x)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(N(a), N(b), rtol=rtol, atol=atol)


def copy_weights(tm, fm):
    """Load PyTorch module tm's state_dict into flambeau module fm (through numpy)."""
    fm.load_state_dict(OrderedDict((k, F_(v)) for k, v in tm.state_dict().items()))


def sd_shapes(m):
    return [(k, tuple(v.shape)) for k, v in m.state_dict().items()]


def build(ns, arch):
    return arch(ns)


def mlp(nn):
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def cnn(nn):
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3, stride=2, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.Flatten(), nn.Linear(6, 3))


def lstm(nn):
    return nn.LSTM(4, 5, num_layers=2, batch_first=True, bidirectional=True)


def transformer(nn):
    return nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16,
                          dropout=0.0)


ARCHS = {"mlp": mlp, "cnn": cnn, "lstm": lstm, "transformer": transformer}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_state_dict_keys_and_shapes_match_pytorch(arch):
    tm, fm = ARCHS[arch](torch.nn), ARCHS[arch](fnn)
    assert sd_shapes(tm) == sd_shapes(fm)
    assert [k for k, _ in tm.named_parameters()] == [k for k, _ in fm.named_parameters()]
    assert [k for k, _ in tm.named_buffers()] == [k for k, _ in fm.named_buffers()]
    assert [k for k, _ in tm.named_modules()] == [k for k, _ in fm.named_modules()]
    sd = fm.state_dict()
    assert isinstance(sd, OrderedDict) and hasattr(sd, "_metadata")


def test_mlp_forward_backward_matches():
    torch.manual_seed(0)
    tm, fm = mlp(torch.nn).double(), mlp(fnn).double()
    copy_weights(tm, fm)
    x = torch.randn(7, 5, dtype=torch.float64)
    ty, fy = tm(x), fm(F_(x))
    close(ty, fy, 1e-10, 1e-12)
    ty.sum().backward()
    fy.sum().backward()
    for (k, tp), (_, fp) in zip(tm.named_parameters(), fm.named_parameters()):
        close(tp.grad, fp.grad, 1e-9, 1e-12)


def test_cnn_batchnorm_train_and_eval_match():
    torch.manual_seed(0)
    tm, fm = cnn(torch.nn).double(), cnn(fnn).double()
    copy_weights(tm, fm)
    x = torch.randn(3, 2, 6, 6, dtype=torch.float64)
    close(tm(x), fm(F_(x)), 1e-9, 1e-10)
    for k, v in tm.state_dict().items():
        close(v, fm.state_dict()[k], 1e-9, 1e-10)
    assert int(fm[1].num_batches_tracked) == 1
    tm.eval(), fm.eval()
    assert not fm[1].training
    close(tm(x), fm(F_(x)), 1e-9, 1e-10)


def test_batchnorm_cumulative_average_and_no_tracking():
    torch.manual_seed(0)
    for kw in [dict(momentum=None), dict(track_running_stats=False), dict(affine=False)]:
        tb, fb = torch.nn.BatchNorm1d(3, **kw).double(), fnn.BatchNorm1d(3, **kw).double()
        assert sd_shapes(tb) == sd_shapes(fb)
        for _ in range(3):
            x = torch.randn(5, 3, dtype=torch.float64)
            close(tb(x), fb(F_(x)), 1e-9, 1e-10)
        for k, v in tb.state_dict().items():
            close(v, fb.state_dict()[k], 1e-9, 1e-10)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_rnn_forward_matches(mode):
    torch.manual_seed(0)
    kw = dict(num_layers=2, batch_first=True, bidirectional=True)
    tm, fm = getattr(torch.nn, mode)(4, 5, **kw).double(), getattr(fnn, mode)(4, 5, **kw).double()
    assert sd_shapes(tm) == sd_shapes(fm)
    copy_weights(tm, fm)
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    h0 = torch.randn(4, 3, 5, dtype=torch.float64)
    if mode == "LSTM":
        c0 = torch.randn(4, 3, 5, dtype=torch.float64)
        (to, (th, tc)), (fo, (fh, fc)) = tm(x, (h0, c0)), fm(F_(x), (F_(h0), F_(c0)))
        close(tc, fc, 1e-9, 1e-10)
    else:
        (to, th), (fo, fh) = tm(x, h0), fm(F_(x), F_(h0))
    close(to, fo, 1e-9, 1e-10)
    close(th, fh, 1e-9, 1e-10)
    (to, _), (fo, _) = tm(x[0]), fm(F_(x[0]))      # unbatched input, zero initial state
    close(to, fo, 1e-9, 1e-10)


def test_lstm_proj_and_cells_match():
    torch.manual_seed(0)
    tm, fm = torch.nn.LSTM(3, 6, proj_size=2).double(), fnn.LSTM(3, 6, proj_size=2).double()
    assert sd_shapes(tm) == sd_shapes(fm)
    copy_weights(tm, fm)
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    close(tm(x)[0], fm(F_(x))[0], 1e-9, 1e-10)
    for name in ["RNNCell", "LSTMCell", "GRUCell"]:
        tc, fc = getattr(torch.nn, name)(3, 4).double(), getattr(fnn, name)(3, 4).double()
        copy_weights(tc, fc)
        x = torch.randn(2, 3, dtype=torch.float64)
        to, fo = tc(x), fc(F_(x))
        for a, b in zip(to if isinstance(to, tuple) else (to,), fo if isinstance(fo, tuple) else (fo,)):
            close(a, b, 1e-9, 1e-10)


def test_packed_sequence_lstm_matches():
    torch.manual_seed(0)
    tm, fm = torch.nn.LSTM(3, 4, bidirectional=True).double(), fnn.LSTM(3, 4, bidirectional=True).double()
    copy_weights(tm, fm)
    x = torch.randn(5, 3, 3, dtype=torch.float64)
    lengths = [3, 5, 2]
    tp = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    fp = fnn.utils.rnn.pack_padded_sequence(F_(x), lengths, enforce_sorted=False)
    close(tp.data, fp.data)
    assert tp.batch_sizes.tolist() == fp.batch_sizes.tolist()
    assert tp.sorted_indices.tolist() == fp.sorted_indices.tolist()
    (to, (th, tc)), (fo, (fh, fc)) = tm(tp), fm(fp)
    close(to.data, fo.data, 1e-9, 1e-10)
    close(th, fh, 1e-9, 1e-10)
    close(tc, fc, 1e-9, 1e-10)
    tpad, tl = torch.nn.utils.rnn.pad_packed_sequence(to, batch_first=True)
    fpad, fl_ = fnn.utils.rnn.pad_packed_sequence(fo, batch_first=True)
    close(tpad, fpad, 1e-9, 1e-10)
    assert tl.tolist() == fl_.tolist()


def test_pad_sequence_matches():
    seqs = [torch.randn(n, 2) for n in (3, 1, 4)]
    for bf in (False, True):
        close(torch.nn.utils.rnn.pad_sequence(seqs, batch_first=bf, padding_value=-1.0),
              fnn.utils.rnn.pad_sequence([F_(s) for s in seqs], batch_first=bf, padding_value=-1.0))


def test_transformer_forward_matches_with_masks():
    torch.manual_seed(0)
    tm, fm = transformer(torch.nn).double().eval(), transformer(fnn).double().eval()
    copy_weights(tm, fm)
    src = torch.randn(5, 2, 8, dtype=torch.float64)
    tgt = torch.randn(4, 2, 8, dtype=torch.float64)
    tmask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    fmask = fnn.Transformer.generate_square_subsequent_mask(4, dtype=fl.float64)
    close(tmask, fmask)
    kpm = torch.tensor([[False, False, False, True, True], [False] * 5])
    to = tm(src, tgt, tgt_mask=tmask, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    fo = fm(F_(src), F_(tgt), tgt_mask=fmask, src_key_padding_mask=F_(kpm), memory_key_padding_mask=F_(kpm))
    close(to, fo, 1e-9, 1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_batch_first_gelu(norm_first):
    torch.manual_seed(0)
    kw = dict(dim_feedforward=12, dropout=0.0, batch_first=True, norm_first=norm_first, activation="gelu")
    tm, fm = torch.nn.TransformerEncoderLayer(8, 4, **kw).double(), fnn.TransformerEncoderLayer(8, 4, **kw).double()
    copy_weights(tm, fm)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    close(tm(x, is_causal=False), fm(F_(x)), 1e-9, 1e-10)


def test_multihead_attention_weights_match():
    torch.manual_seed(0)
    for kw in [dict(), dict(batch_first=True), dict(kdim=3, vdim=5), dict(add_bias_kv=True), dict(bias=False)]:
        tm, fm = torch.nn.MultiheadAttention(8, 2, **kw).double(), fnn.MultiheadAttention(8, 2, **kw).double()
        assert sd_shapes(tm) == sd_shapes(fm)
        copy_weights(tm, fm)
        bf = kw.get("batch_first", False)
        shp = (lambda L, E: (3, L, E) if bf else (L, 3, E))
        q = torch.randn(*shp(4, 8), dtype=torch.float64)
        k = torch.randn(*shp(6, kw.get("kdim", 8)), dtype=torch.float64)
        v = torch.randn(*shp(6, kw.get("vdim", 8)), dtype=torch.float64)
        amask = torch.rand(4, 6) > 0.7
        amask[:, 0] = False
        for avg in (True, False):
            to, tw = tm(q, k, v, attn_mask=amask, average_attn_weights=avg)
            fo, fw = fm(F_(q), F_(k), F_(v), attn_mask=F_(amask), average_attn_weights=avg)
            close(to, fo, 1e-9, 1e-10)
            close(tw, fw, 1e-9, 1e-10)


def test_load_state_dict_size_mismatch_message_names_every_key():
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    fm = fnn.Sequential(fnn.Linear(3, 4), fnn.Linear(4, 2))
    bad_t = {"0.weight": torch.zeros(5, 3), "0.bias": torch.zeros(4), "1.weight": torch.zeros(4, 4),
             "1.bias": torch.zeros(3)}
    bad_f = {k: F_(v) for k, v in bad_t.items()}
    with pytest.raises(RuntimeError) as te:
        tm.load_state_dict(bad_t)
    with pytest.raises(RuntimeError) as fe:
        fm.load_state_dict(bad_f)
    assert str(fe.value) == str(te.value)
    assert "size mismatch for 0.weight: copying a param with shape torch.Size([5, 3]) from checkpoint, the shape " \
           "in current model is torch.Size([4, 3])." in str(fe.value)
    assert "1.weight" in str(fe.value) and "1.bias" in str(fe.value)


def test_load_state_dict_missing_unexpected():
    tm, fm = mlp(torch.nn), mlp(fnn)
    tsd, fsd = tm.state_dict(), fm.state_dict()
    for sd in (tsd, fsd):
        del sd["2.bias"]
        sd["9.weight"] = sd["0.bias"]
        sd["extra"] = sd["0.bias"]
    with pytest.raises(RuntimeError) as te:
        tm.load_state_dict(tsd)
    with pytest.raises(RuntimeError) as fe:
        fm.load_state_dict(fsd)
    assert str(fe.value) == str(te.value)
    tr, fr = tm.load_state_dict(tsd, strict=False), fm.load_state_dict(fsd, strict=False)
    assert tr.missing_keys == fr.missing_keys and tr.unexpected_keys == fr.unexpected_keys
    assert repr(fm.load_state_dict(fm.state_dict())) == "<All keys matched successfully>"


def test_repr_matches_pytorch():
    def small(nn):
        m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.LeakyReLU(0.2, inplace=True), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                          nn.Dropout(0.1), nn.Linear(8, 4))
        return nn.ModuleDict({"body": m, "blocks": nn.ModuleList([nn.Linear(4, 4) for _ in range(3)] + [nn.GELU()]),
                              "rnn": nn.LSTM(4, 5, 2, batch_first=True), "emb": nn.Embedding(10, 3, padding_idx=0),
                              "ln": nn.LayerNorm(4), "enc": nn.TransformerEncoderLayer(8, 2, 16)})
    assert repr(small(fnn)) == repr(small(torch.nn))


def test_module_reprs_of_many_layers():
    def layers(nn):
        return [nn.ReLU(), nn.ReLU6(inplace=True), nn.ELU(0.5), nn.GELU("tanh"), nn.Softmax(dim=1),
                nn.Hardtanh(-2, 2), nn.Softplus(2, 10), nn.Threshold(0.1, 20), nn.PReLU(3), nn.Softshrink(),
                nn.GLU(), nn.Conv1d(2, 4, 3, padding="same"), nn.ConvTranspose2d(3, 4, 3, stride=2,
                                                                                   output_padding=1),
                nn.BatchNorm1d(3, momentum=None, affine=False, track_running_stats=False), nn.GroupNorm(2, 4),
                nn.InstanceNorm2d(3), nn.RMSNorm(4), nn.EmbeddingBag(10, 3), nn.MaxPool1d(3, 2, 1, ceil_mode=True),
                nn.AvgPool2d(2), nn.AvgPool1d(3), nn.AdaptiveMaxPool1d(2), nn.ZeroPad2d(1),
                nn.ConstantPad1d(2, 3.5), nn.ReflectionPad2d((1, 2, 3, 4)), nn.Upsample(scale_factor=2),
                nn.PixelShuffle(2), nn.Unflatten(1, (2, 3)), nn.Bilinear(2, 3, 4), nn.GRU(3, 4, bias=False),
                nn.RNNCell(3, 4), nn.MultiheadAttention(8, 2), nn.CrossEntropyLoss(), nn.Identity(),
                nn.ParameterList([nn.Parameter(torch.zeros(2) if nn is torch.nn else fl.zeros(2))])]
    for t, f in zip(layers(torch.nn), layers(fnn)):
        assert repr(f) == repr(t)


def test_parameter_basics():
    p = fnn.Parameter(fl.ones(2))
    assert isinstance(p, fnn.Parameter) and isinstance(p, fl.Tensor) and p.requires_grad
    assert repr(p) == repr(torch.nn.Parameter(torch.ones(2)))
    assert not fnn.Parameter(fl.ones(2), requires_grad=False).requires_grad
    assert type(p * 2) is fl.Tensor
    import copy
    q = copy.deepcopy(p)
    assert isinstance(q, fnn.Parameter) and q is not p and q.requires_grad


def test_registration_and_traversal():
    class M(fnn.Module):
        def __init__(self):
            super().__init__()
            self.a = fnn.Linear(2, 2)
            self.b = self.a                       # tied
            self.register_buffer("buf", fl.zeros(2))
            self.register_buffer("tmp", fl.zeros(1), persistent=False)
            self.w = fnn.Parameter(fl.ones(3))
            self.plain = 3

    m = M()
    assert [k for k, _ in m.named_parameters()] == ["w", "a.weight", "a.bias"]
    assert [k for k, _ in m.named_parameters(remove_duplicate=False)] == ["w", "a.weight", "a.bias", "b.weight",
                                                                          "b.bias"]
    assert [k for k, _ in m.named_modules()] == ["", "a"]
    assert [k for k, _ in m.named_modules(remove_duplicate=False)] == ["", "a", "b"]
    assert [k for k, _ in m.named_buffers()] == ["buf", "tmp"]
    assert list(m.state_dict()) == ["w", "buf", "a.weight", "a.bias", "b.weight", "b.bias"]
    assert [k for k, _ in m.named_parameters(prefix="x", recurse=False)] == ["x.w"]
    assert m.get_submodule("a") is m.a and m.get_parameter("a.bias") is m.a.bias
    assert "buf" in dir(m) and "a" in dir(m)
    m.w = None
    assert m.w is None and "w" not in dict(m.named_parameters())
    with pytest.raises(TypeError, match="cannot assign 'int' as parameter 'w'"):
        m.w = 3
    with pytest.raises(TypeError, match="cannot assign 'int' as child module 'a'"):
        m.a = 3
    with pytest.raises(KeyError):
        m.register_buffer("a.b", fl.zeros(1))
    with pytest.raises(AttributeError, match="'M' object has no attribute 'nope'"):
        m.nope
    m.buf2 = fnn.Buffer(fl.ones(1), persistent=False)
    assert "buf2" in dict(m.named_buffers()) and "buf2" not in m.state_dict()
    del m.a
    assert "a" not in m._modules


def test_train_eval_apply_to_zero_grad_requires_grad():
    m = cnn(fnn)
    m.eval()
    assert all(not x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    seen = []
    m.apply(lambda x: seen.append(type(x).__name__))
    assert seen[-1] == "Sequential"
    w = m[0].weight
    m.double()
    assert m[0].weight is w and w.dtype == fl.float64 and m[1].num_batches_tracked.dtype == fl.int64
    m.to(fl.float32)
    assert w.dtype == fl.float32
    m.to(fl.zeros(1, dtype=fl.float64))
    assert w.dtype == fl.float64
    with pytest.raises(TypeError, match="nn.Module.to only accepts floating point or complex dtypes"):
        m.to(fl.int32)
    out = m(fl.randn(2, 2, 6, 6, dtype=fl.float64)).sum()
    out.backward()
    assert w.grad is not None
    m.zero_grad()
    assert w.grad is None
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_forward_hooks_and_backward_hooks():
    torch.manual_seed(0)
    calls = []

    def run(nn, T):
        lin = nn.Linear(3, 2).double()
        log = []
        h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
        lin.register_forward_hook(lambda m, args, out: out + 1)
        lin.register_forward_pre_hook(lambda m, args, kwargs: (args, kwargs), with_kwargs=True)
        lin.register_forward_hook(lambda m, args, kwargs, out: log.append(("fwd", tuple(out.shape))),
                                  with_kwargs=True)
        lin.register_full_backward_pre_hook(lambda m, go: log.append(("bpre", tuple(go[0].shape))))
        lin.register_full_backward_hook(lambda m, gi, go: log.append(("bwd", tuple(gi[0].shape),
                                                                      tuple(go[0].shape))))
        return lin, log, h1

    tl, tlog, th = run(torch.nn, torch)
    fl_, flog, fh = run(fnn, fl)
    copy_weights(tl, fl_)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    fx = F_(x).requires_grad_()
    ty, fy = tl(x), fl_(fx)
    close(ty, fy, 1e-12)
    ty.sum().backward()
    fy.sum().backward()
    close(x.grad, fx.grad, 1e-12)
    assert flog == tlog
    th.remove(), fh.remove()
    close(tl(x), fl_(fx), 1e-12)
    calls.append(1)


def test_state_dict_hooks_and_keep_vars():
    m = fnn.Linear(2, 2)
    assert m.state_dict(keep_vars=True)["weight"] is m.weight
    assert type(m.state_dict()["weight"]) is fl.Tensor
    assert list(m.state_dict(prefix="p.")) == ["p.weight", "p.bias"]
    seen = []
    m.register_state_dict_post_hook(lambda mod, sd, prefix, meta: seen.append(list(sd)))
    m.state_dict()
    assert seen == [["weight", "bias"]]


def test_containers():
    seq = fnn.Sequential(fnn.Linear(2, 3), fnn.ReLU(), fnn.Linear(3, 1))
    assert isinstance(seq[1], fnn.ReLU) and isinstance(seq[-1], fnn.Linear)
    sub = seq[:2]
    assert isinstance(sub, fnn.Sequential) and len(sub) == 2
    seq.append(fnn.Sigmoid())
    assert len(seq) == 4 and list(seq._modules) == ["0", "1", "2", "3"]
    del seq[1]
    assert list(seq._modules) == ["0", "1", "2"]
    od = fnn.Sequential(OrderedDict([("fc", fnn.Linear(2, 2)), ("act", fnn.Tanh())]))
    assert list(od.state_dict()) == ["fc.weight", "fc.bias"]
    ml = fnn.ModuleList([fnn.Linear(1, 1)])
    ml.extend([fnn.ReLU()])
    ml.insert(0, fnn.Tanh())
    assert [type(x).__name__ for x in ml] == ["Tanh", "Linear", "ReLU"]
    md = fnn.ModuleDict({"a": fnn.ReLU()})
    md["b"] = fnn.Tanh()
    assert list(md.keys()) == ["a", "b"] and "b" in md
    pl = fnn.ParameterList([fl.ones(2), fnn.Parameter(fl.zeros(1))])
    assert all(isinstance(p, fnn.Parameter) for p in pl) and len(list(pl.parameters())) == 2
    pd = fnn.ParameterDict({"x": fl.ones(1)})
    assert isinstance(pd["x"], fnn.Parameter) and list(dict(pd.named_parameters())) == ["x"]


# ---- layer forward parity ------------------------------------------------------------------------
LAYERS = [
    ("ReLU", (), (4, 5)), ("ReLU6", (), (4, 5)), ("LeakyReLU", (0.2,), (4, 5)), ("ELU", (), (4, 5)),
    ("SELU", (), (4, 5)), ("CELU", (0.7,), (4, 5)), ("GELU", (), (4, 5)), ("GELU", ("tanh",), (4, 5)),
    ("SiLU", (), (4, 5)), ("Mish", (), (4, 5)), ("Sigmoid", (), (4, 5)), ("Tanh", (), (4, 5)),
    ("Softplus", (), (4, 5)), ("Softsign", (), (4, 5)), ("Hardtanh", (), (4, 5)), ("Hardswish", (), (4, 5)),
    ("Hardsigmoid", (), (4, 5)), ("LogSigmoid", (), (4, 5)), ("PReLU", (), (4, 5)), ("Softmax", (1,), (4, 5)),
    ("LogSoftmax", (1,), (4, 5)), ("Softmin", (1,), (4, 5)), ("GLU", (), (4, 6)), ("Threshold", (0.1, 2.0), (4, 5)),
    ("Tanhshrink", (), (4, 5)), ("Softshrink", (), (4, 5)), ("Hardshrink", (), (4, 5)),
    ("Identity", (), (4, 5)), ("Flatten", (), (2, 3, 4)), ("Unflatten", (1, (2, 3)), (4, 6)),
    ("Linear", (5, 3), (4, 5)), ("Conv1d", (2, 3, 3), (2, 2, 7)), ("Conv2d", (2, 3, 3, 2, 1), (2, 2, 7, 7)),
    ("Conv2d", (2, 4, 3, 1, "same", 2, 2, True, "reflect"), (2, 2, 7, 7)), ("Conv3d", (1, 2, 2), (1, 1, 4, 4, 4)),
    ("ConvTranspose1d", (2, 3, 3, 2), (2, 2, 5)), ("ConvTranspose2d", (2, 3, 3, 2, 1, 1), (2, 2, 4, 4)),
    ("LayerNorm", (5,), (4, 5)), ("GroupNorm", (2, 4), (2, 4, 3)), ("RMSNorm", (5,), (4, 5)),
    ("InstanceNorm1d", (3,), (2, 3, 5)), ("InstanceNorm2d", (3, 1e-5, 0.1, True), (2, 3, 4, 4)),
    ("LocalResponseNorm", (2,), (2, 4, 3, 3)),
    ("MaxPool1d", (2,), (2, 3, 8)), ("MaxPool2d", (3, 2, 1), (2, 3, 7, 7)), ("MaxPool3d", (2,), (1, 1, 4, 4, 4)),
    ("AvgPool1d", (2,), (2, 3, 8)), ("AvgPool2d", (3, 2, 1), (2, 3, 7, 7)), ("AdaptiveAvgPool1d", (3,), (2, 3, 8)),
    ("AdaptiveAvgPool2d", ((2, 3),), (2, 3, 7, 7)), ("AdaptiveMaxPool1d", (3,), (2, 3, 8)),
    ("AdaptiveMaxPool2d", (2,), (2, 3, 7, 7)), ("Upsample", (None, 2.0, "nearest"), (1, 2, 3, 3)),
    ("Upsample", (None, 2.0, "bilinear", False), (1, 2, 3, 3)), ("PixelShuffle", (2,), (1, 8, 3, 3)),
    ("ZeroPad2d", ((1, 2, 0, 1),), (1, 2, 3, 3)), ("ConstantPad1d", (2, 1.5), (1, 2, 3)),
    ("ReflectionPad1d", (2,), (1, 2, 4)), ("ReflectionPad2d", (1,), (1, 2, 3, 3)),
    ("ReplicationPad2d", ((1, 0, 2, 1),), (1, 2, 3, 3)), ("Dropout", (0.5,), (4, 5)), ("Dropout2d", (), (2, 3, 4, 4)),
    ("AlphaDropout", (0.3,), (4, 5)),
]


@pytest.mark.parametrize("name,args,shape", LAYERS, ids=[f"{n}{i}" for i, (n, _, _) in enumerate(LAYERS)])
def test_layer_forward_matches(name, args, shape):
    torch.manual_seed(0)
    tm, fm = getattr(torch.nn, name)(*args).double().eval(), getattr(fnn, name)(*args).double().eval()
    assert sd_shapes(tm) == sd_shapes(fm)
    assert repr(tm) == repr(fm)
    copy_weights(tm, fm)
    x = torch.randn(*shape, dtype=torch.float64)
    close(tm(x), fm(F_(x)), 1e-9, 1e-10)


def test_embedding_and_bag():
    torch.manual_seed(0)
    te, fe = torch.nn.Embedding(10, 3, padding_idx=2).double(), fnn.Embedding(10, 3, padding_idx=2).double()
    assert float(fe.weight[2].abs().sum()) == 0.0
    copy_weights(te, fe)
    idx = torch.tensor([[1, 2, 3], [9, 0, 2]])
    close(te(idx), fe(F_(idx)))
    w = torch.randn(4, 2, dtype=torch.float64)
    pe = fnn.Embedding.from_pretrained(F_(w))
    assert not pe.weight.requires_grad
    close(pe(fl.tensor([3, 0])), w[[3, 0]])
    tb, fb = torch.nn.EmbeddingBag(10, 3, mode="sum").double(), fnn.EmbeddingBag(10, 3, mode="sum").double()
    copy_weights(tb, fb)
    inp, off = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2])
    close(tb(inp, off), fb(F_(inp), F_(off)))


LOSSES = [("MSELoss", {}), ("L1Loss", {}), ("SmoothL1Loss", {"beta": 0.5}), ("HuberLoss", {"delta": 0.7}),
          ("MSELoss", {"reduction": "sum"}), ("L1Loss", {"reduction": "none"}), ("SoftMarginLoss", {}),
          ("KLDivLoss", {"reduction": "batchmean"}), ("BCEWithLogitsLoss", {}), ("BCELoss", {}),
          ("CrossEntropyLoss", {}), ("CrossEntropyLoss", {"label_smoothing": 0.1}), ("NLLLoss", {}),
          ("MultiLabelSoftMarginLoss", {}), ("HingeEmbeddingLoss", {}), ("PoissonNLLLoss", {})]


@pytest.mark.parametrize("name,kw", LOSSES, ids=[f"{n}{i}" for i, (n, _) in enumerate(LOSSES)])
def test_loss_modules_match(name, kw):
    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64)
    if name in ("CrossEntropyLoss", "NLLLoss"):
        y = torch.tensor([0, 4, 2, 1])
        if name == "NLLLoss":
            x = x.log_softmax(1)
    elif name == "BCELoss":
        x, y = x.sigmoid(), torch.rand(4, 5, dtype=torch.float64)
    elif name in ("SoftMarginLoss", "HingeEmbeddingLoss"):
        y = torch.randint(0, 2, (4, 5)).double() * 2 - 1
    elif name in ("BCEWithLogitsLoss", "MultiLabelSoftMarginLoss"):
        y = torch.randint(0, 2, (4, 5)).double()
    elif name == "KLDivLoss":
        x, y = x.log_softmax(1), torch.rand(4, 5, dtype=torch.float64).softmax(1)
    else:
        y = torch.randn(4, 5, dtype=torch.float64)
    close(getattr(torch.nn, name)(**kw)(x, y), getattr(fnn, name)(**kw)(F_(x), F_(y)), 1e-9, 1e-10)


def test_distance_modules_match():
    a, b = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    close(torch.nn.CosineSimilarity()(a, b), fnn.CosineSimilarity()(F_(a), F_(b)))
    close(torch.nn.PairwiseDistance()(a, b), fnn.PairwiseDistance()(F_(a), F_(b)))


# ---- init ------------------------------------------------------------------------------------------
def test_calculate_gain_matches():
    for nl, p in [("linear", None), ("sigmoid", None), ("tanh", None), ("relu", None), ("leaky_relu", None),
                  ("leaky_relu", 0.2), ("selu", None), ("conv2d", None)]:
        assert fnn.init.calculate_gain(nl, p) == torch.nn.init.calculate_gain(nl, p)


def test_default_init_distributions():
    fl.manual_seed(0)
    lin = fnn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w = N(lin.weight)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.02 * bound
    assert np.abs(N(lin.bias)).max() <= bound
    conv = fnn.Conv2d(8, 16, 3)
    assert np.abs(N(conv.weight)).max() <= 1 / math.sqrt(8 * 9)
    emb = fnn.Embedding(1000, 50)
    assert abs(N(emb.weight).std() - 1) < 0.02
    t = fl.empty(300, 400)
    fnn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu")
    assert abs(N(t).std() - math.sqrt(2 / 300)) < 0.02 * math.sqrt(2 / 300)
    fnn.init.xavier_uniform_(t, gain=2.0)
    assert np.abs(N(t)).max() <= 2.0 * math.sqrt(6 / 700)
    fnn.init.trunc_normal_(t, std=0.5, a=-0.3, b=0.6)
    assert N(t).min() >= -0.3 and N(t).max() <= 0.6
    fnn.init.orthogonal_(t)
    q = N(t)
    np.testing.assert_allclose(q @ q.T, np.eye(300), atol=1e-5)


def test_deterministic_inits_match():
    for fn, shape in [("eye_", (3, 4)), ("dirac_", (4, 2, 3)), ("ones_", (2, 3)), ("zeros_", (2, 3))]:
        a, b = torch.empty(*shape), fl.empty(*shape)
        getattr(torch.nn.init, fn)(a)
        getattr(fnn.init, fn)(b)
        close(a, b)
    a, b = torch.empty(2, 3), fl.empty(2, 3)
    torch.nn.init.constant_(a, 0.3)
    fnn.init.constant_(b, 0.3)
    close(a, b)


def test_manual_seed_reproducible():
    fl.manual_seed(3)
    a = N(fnn.Linear(4, 4).weight).copy()
    fl.manual_seed(3)
    assert np.array_equal(a, N(fnn.Linear(4, 4).weight))


# ---- nn.utils ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 0.0, 3.0, -math.inf])
@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_matches(norm_type, foreach):
    torch.manual_seed(0)
    tm, fm = mlp(torch.nn).double(), mlp(fnn).double()
    copy_weights(tm, fm)
    x = torch.randn(3, 5, dtype=torch.float64)
    (tm(x) ** 2).sum().backward()
    (fm(F_(x)) ** 2).sum().backward()
    tn = torch.nn.utils.clip_grad_norm_(tm.parameters(), 0.5, norm_type)
    fn = fnn.utils.clip_grad_norm_(fm.parameters(), 0.5, norm_type, foreach=foreach)
    close(tn, fn, 1e-10)
    for tp, fp in zip(tm.parameters(), fm.parameters()):
        close(tp.grad, fp.grad, 1e-10, 1e-12)
    torch.nn.utils.clip_grad_value_(tm.parameters(), 0.01)
    fnn.utils.clip_grad_value_(fm.parameters(), 0.01, foreach=foreach)
    for tp, fp in zip(tm.parameters(), fm.parameters()):
        close(tp.grad, fp.grad, 1e-10, 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_clip_grad_norm_mixed_dtypes_and_result_dtype(dtype):
    """Two dtype groups: the total norm is the norm of every tensor's norm (PyTorch's stack of per-tensor
    norms), a 0-d tensor of the groups' promoted dtype; grads rescaled in their own dtype."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) * 3 for s in [(3, 4), (5,), (2, 2, 2)]]
    dtypes = [dtype, "float64", dtype]
    tp = [torch.zeros(a.shape, dtype=getattr(torch, d), requires_grad=True) for a, d in zip(arrays, dtypes)]
    fp = [fnn.Parameter(fl.zeros(a.shape, dtype=getattr(fl, d))) for a, d in zip(arrays, dtypes)]
    for t, f, a in zip(tp, fp, arrays):
        t.grad, f.grad = torch.tensor(a).to(t.dtype), fl.tensor(a).to(f.dtype)
    tn = torch.nn.utils.clip_grad_norm_(tp, 1.0)
    fn = fnn.utils.clip_grad_norm_(fp, 1.0)
    assert str(fn.dtype) == str(tn.dtype) and fn.shape == ()               # float64: the groups' promotion
    tol = 2e-2 if dtype == "bfloat16" else 1e-6
    close(tn.float(), fn.float(), tol)
    for t, f in zip(tp, fp):
        close(t.grad.float(), f.grad.float(), tol, tol)


def test_clip_grad_norm_nonfinite_error():
    p = fnn.Parameter(fl.ones(2))
    p.grad = fl.tensor([float("inf"), 1.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        fnn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


def test_parameters_vector_roundtrip():
    m = mlp(fnn)
    v = fnn.utils.parameters_to_vector(m.parameters())
    assert v.shape == (sum(p.numel() for p in m.parameters()),)
    fnn.utils.vector_to_parameters(v * 0 + 1, m.parameters())
    assert all(float(p.min()) == 1.0 for p in m.parameters())


def test_weight_norm():
    torch.manual_seed(0)
    tl, fl_ = torch.nn.Linear(3, 4).double(), fnn.Linear(3, 4).double()
    copy_weights(tl, fl_)
    tw = torch.nn.utils.weight_norm(tl)
    fw = fnn.utils.weight_norm(fl_)
    assert sorted(tw.state_dict()) == sorted(fw.state_dict())
    x = torch.randn(2, 3, dtype=torch.float64)
    close(tw(x), fw(F_(x)), 1e-10)


def test_lazy_linear_deepcopy_pickle():
    import copy
    import pickle
    m = fnn.LazyLinear(3)
    assert m(fl.ones(2, 5)).shape == (2, 3)
    assert type(m) is fnn.Linear and m.weight.shape == (3, 5) and isinstance(m.weight, fnn.Parameter)
    s = cnn(fnn)
    c = copy.deepcopy(s)
    assert c[0].weight is not s[0].weight and isinstance(c[0].weight, fnn.Parameter)
    assert np.array_equal(N(c[0].weight), N(s[0].weight))
    p = pickle.loads(pickle.dumps(s))
    assert repr(p) == repr(s) and list(p.state_dict()) == list(s.state_dict())


@pytest.mark.cuda
def test_module_to_cuda_and_back():
    m = cnn(fnn).cuda()
    assert all(p.is_cuda for p in m.parameters()) and all(b.is_cuda for b in m.buffers())
    out = m(fl.randn(2, 2, 6, 6, device="cuda"))
    assert out.is_cuda
    m.cpu()
    assert all(p.device.type == "cpu" for p in m.parameters())
