"""Whole models trained a few steps from identical weights in flambeau and PyTorch: losses agree.

Each model is defined once against the PyTorch API and instantiated with both modules (`m` is
`torch` or `flambeau`); PyTorch's initial weights are copied into flambeau through its state_dict.
"""
import numpy as np
import pytest
import torch

import flambeau


def mlp(m):
    return m.nn.Sequential(m.nn.Linear(6, 16), m.nn.ReLU(), m.nn.Linear(16, 16), m.nn.GELU(), m.nn.Linear(16, 4))


def cnn(m):
    return m.nn.Sequential(m.nn.Conv2d(2, 4, 3, padding=1), m.nn.BatchNorm2d(4), m.nn.ReLU(), m.nn.MaxPool2d(2),
                           m.nn.Conv2d(4, 4, 3), m.nn.AdaptiveAvgPool2d(1), m.nn.Flatten(), m.nn.Linear(4, 4))


def lstm(m):
    class Net(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = m.nn.LSTM(5, 8, num_layers=2, batch_first=True)
            self.head = m.nn.Linear(8, 4)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])
    return Net()


def gpt(m):
    class Block(m.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = m.nn.LayerNorm(d), m.nn.LayerNorm(d)
            self.attn = m.nn.MultiheadAttention(d, 2, batch_first=True)
            self.mlp = m.nn.Sequential(m.nn.Linear(d, 4 * d), m.nn.GELU(), m.nn.Linear(4 * d, d))

        def forward(self, x):
            t = x.shape[1]
            mask = m.triu(m.ones(t, t, dtype=m.bool), diagonal=1)
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(m.nn.Module):
        def __init__(self, vocab=11, d=16, t=8):
            super().__init__()
            self.tok = m.nn.Embedding(vocab, d)
            self.pos = m.nn.Parameter(m.zeros(t, d))
            self.blocks = m.nn.Sequential(Block(d), Block(d))
            self.ln = m.nn.LayerNorm(d)
            self.head = m.nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx):
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            return self.head(self.ln(self.blocks(x))).reshape(-1, 11)
    return GPT()


def transformer(m):
    class Net(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = m.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                      dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=True)
            self.head = m.nn.Linear(8, 4)

        def forward(self, x):
            src, tgt = x[:, :5], x[:, 5:]
            mask = self.t.generate_square_subsequent_mask(tgt.shape[1])
            return self.head(self.t(src, tgt, tgt_mask=mask)).reshape(-1, 4)
    return Net()


def data(name, m, rng):
    if name == "cnn":
        x = rng.standard_normal((4, 2, 8, 8))
    elif name == "lstm":
        x = rng.standard_normal((4, 6, 5))
    elif name == "gpt":
        x = rng.integers(0, 11, size=(4, 8))
        return m.tensor(x), m.tensor(rng.integers(0, 11, size=32))
    elif name == "transformer":
        x = rng.standard_normal((3, 9, 8))
        return m.tensor(x), m.tensor(rng.integers(0, 4, size=12))
    else:
        x = rng.standard_normal((8, 6))
    return m.tensor(x), m.tensor(rng.integers(0, 4, size=x.shape[0]))


MODELS = {"mlp": mlp, "cnn": cnn, "lstm": lstm, "gpt": gpt, "transformer": transformer}
OPTIMS = {"SGD": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), "Adam": dict(lr=1e-2),
          "AdamW": dict(lr=1e-2, weight_decay=0.1, amsgrad=True), "RMSprop": dict(lr=1e-3, centered=True),
          "Adagrad": dict(lr=0.05), "NAdam": dict(lr=1e-2), "RAdam": dict(lr=1e-2), "Adamax": dict(lr=1e-2)}


def _losses(m, model, name, opt_name, steps=4):
    rng = np.random.default_rng(0)
    opt = getattr(m.optim, opt_name)(model.parameters(), **OPTIMS[opt_name])
    out = []
    model.train()
    for _ in range(steps):
        x, y = data(name, m, rng)
        loss = m.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


CASES = [(n, o) for n in MODELS for o in OPTIMS]


@pytest.mark.parametrize("name,opt", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_training_matches_pytorch(name, opt):
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float64)
    flambeau.set_default_dtype(flambeau.float64)
    try:
        ref_model = MODELS[name](torch)
        our_model = MODELS[name](flambeau)
        sd = {k: flambeau.tensor(v.detach().numpy()) for k, v in ref_model.state_dict().items()}
        assert list(sd) == list(our_model.state_dict())
        for k, v in our_model.state_dict().items():
            assert tuple(v.shape) == tuple(sd[k].shape), k
        our_model.load_state_dict(sd)
        ref = _losses(torch, ref_model, name, opt)
        ours = _losses(flambeau, our_model, name, opt)
    finally:
        torch.set_default_dtype(torch.float32)
        flambeau.set_default_dtype(flambeau.float32)
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    assert ref[-1] != ref[0]
