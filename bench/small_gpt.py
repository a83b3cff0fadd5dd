"""The small GPT used by the CPU benchmarks and the export/AOTInductor and low-precision tests.

One definition, written once for flambeau and torch (`lib` is either module): token and position
embeddings, pre-norm blocks (LayerNorm, fused qkv Linear, causal scaled_dot_product_attention, GELU
MLP), a final LayerNorm and a vocabulary head (its weight tied to the token embedding with
`tied_head=True`). `forward(idx)` returns the logits; with `with_loss=True` it is
`forward(idx, targets)` returning the cross entropy (the training workloads of bench/cpu_models.py).
"""
from __future__ import annotations


def small_gpt(lib, *, vocab: int, d: int, heads: int, layers: int, block: int, tied_head: bool = False,
              with_loss: bool = False):
    """A fresh small GPT of `lib` (flambeau or torch) with the given sizes (see module docstring)."""
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (z.view(B, T, heads, C // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=not tied_head)
            if tied_head:
                self.head.weight = self.tok.weight

        def forward(self, idx):
            x = self.tok(idx) + self.pos(lib.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln(self.blocks(x)))

    class GPTWithLoss(GPT):
        def forward(self, idx, targets):
            return F.cross_entropy(super().forward(idx).reshape(-1, vocab), targets.reshape(-1))

    return GPTWithLoss() if with_loss else GPT()
