"""Models for the GPU benchmarks, written once against a torch-like namespace `m` (flambeau or torch).

    gpt(m, ...)       GPT-2 (nanoGPT layout: tied embeddings, pre-LayerNorm blocks, causal SDPA, GELU tanh)
    resnet50(m, ...)  ResNet-50 (bottleneck blocks 3-4-6-3, BatchNorm, ReLU)
    mlp(m, ...)       an MLP of `depth` Linear(width, width) layers with ReLU between
    train_step(m, model, opt, x, y, amp_dtype)  one step: autocast forward + loss, backward, AdamW, zero_grad

Each model's forward(x, y) returns the cross-entropy loss. Used by bench/gpu_train.py and by
tests/test_cuda_syncs.py (a small GPT), so the code both libraries run is the same text.
"""
from __future__ import annotations

import contextlib
import math


def gpt(m, vocab=50257, block=1024, d=768, layers=12, heads=12, dropout=0.0):
    nn, F = m.nn, m.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(B, T, heads, C // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=dropout if self.training else 0.0)
            return self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = Attention()
            self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
            self.drop = nn.Dropout(dropout)
            self.h = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            with m.no_grad():
                for name, p in self.named_parameters():
                    if p.dim() == 2:
                        std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                        p.normal_(0.0, std)
                    elif name.endswith("bias"):
                        p.zero_()

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.drop(self.wte(idx) + self.wpe(m.arange(T, device=idx.device)))
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    return GPT()


def resnet50(m, num_classes=1000):
    nn, F = m.nn, m.nn.functional

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = F.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return F.relu(out + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
            self.pool = nn.MaxPool2d(3, 2, 1)
            stages, cin = [], 64
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(blocks):
                    stages.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
            self.layers = nn.Sequential(*stages)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x, targets):
            x = self.pool(F.relu(self.bn1(self.conv1(x))))
            x = self.layers(x)
            logits = self.fc(m.flatten(F.adaptive_avg_pool2d(x, 1), 1))
            return F.cross_entropy(logits, targets)
    return ResNet()


def mlp(m, width=256, depth=4):
    nn, F = m.nn, m.nn.functional

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x, targets):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < depth - 1:
                    x = F.relu(x)
            return F.cross_entropy(x, targets)
    return MLP()


def train_step(m, model, opt, x, y, amp_dtype=None, mark=None):
    """One training step; returns the loss tensor (not read: reading it is a synchronisation). `mark(name)`,
    if given, is called after the forward (with the loss: `mark("forward", loss)`), the backward and the
    optimizer step (bench phases)."""
    ctx = m.autocast(device_type="cuda", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
    with ctx:
        loss = model(x, y)
    mark and mark("forward", loss)
    loss.backward()
    mark and mark("backward")
    opt.step()
    mark and mark("step")
    opt.zero_grad(set_to_none=True)
    return loss
