"""Models shared by the tensor-parallel/FSDP workers (where `torch` is flambeau) and their tests (real
PyTorch): `build(torch)` returns the classes; `batch(torch, step)` the deterministic data."""
import math

import numpy as np

H, HEADS, HIDDEN, B, S, STEPS, OUT = 12, 6, 24, 2, 6, 3, 5
TIED_GPT = dict(vocab=16, block=8, d=8, layers=2, heads=2)     # bench/gpu_models.gpt: lm_head tied to wte


def build(torch):
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(H, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, H)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    class Block(nn.Module):
        """Pre-norm attention + MLP; head count read from the (possibly local) projection width."""

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
            self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
            self.mlp = MLP()

        def forward(self, x):
            h = self.ln1(x)
            q, k, v = self.q(h), self.k(h), self.v(h)
            bsz, seq, width = q.shape
            hd = H // HEADS
            nh = width // hd
            q, k, v = (t.view(bsz, seq, nh, hd).transpose(1, 2) for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(bsz, seq, nh * hd)
            x = x + self.o(y)
            return x + self.mlp(self.ln2(x))

    return MLP, Block


def build_model(torch):
    """Linear -> 2 Blocks -> Linear head, the model FSDP shards per block and at the root."""
    nn = torch.nn
    _, Block = build(torch)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(H, H)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(H, OUT)

        def forward(self, x):
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
            return self.head(x)
    return Model


def fsdp_batch(torch, step, world):
    """The whole batch of FSDP step `step` (each rank trains on its B rows)."""
    g = np.random.default_rng(2000 + step)
    return torch.from_numpy(g.standard_normal((B * world, S, H))), torch.from_numpy(g.standard_normal((B * world, S, OUT)))


def batch(torch, step):
    g = np.random.default_rng(1000 + step)
    x = torch.from_numpy(g.standard_normal((B, S, H)))
    y = torch.from_numpy(g.standard_normal((B, S, H)))
    return x, y


def tied_batch(step, world):
    """Token ids and targets (numpy) of the tied-GPT FSDP step `step`: B rows per rank."""
    g = np.random.default_rng(3000 + step)
    return (g.integers(0, TIED_GPT["vocab"], (B * world, TIED_GPT["block"])),
            g.integers(0, TIED_GPT["vocab"], (B * world, TIED_GPT["block"])))
