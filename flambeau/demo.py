"""The demo: train a small GPT from scratch on a task it generates itself (sorting digits).

    python -m flambeau.demo [--steps N] [--device cpu|cuda] [--no-compile] [--out DIR]

Each example is a sequence of 8 random digits followed by the same digits sorted; the model
learns to emit the sorted half. It reports training loss with a progress bar, accuracy on
held-out sequences, a few sampled predictions, and writes `loss.png` (the training curve). It trains
the same model twice, eagerly and through `flambeau.compile`, and compares their step times.
Written entirely against the PyTorch API (`import flambeau as torch`).

Optional extras (`pip install flambeau[demo]`): with matplotlib the curve is a labelled chart
(axes, log scale, legend), without it a plain raster from flambeau's PNG writer; with tqdm and a
terminal, progress is a tqdm bar, otherwise a one-line text bar.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    from matplotlib.figure import Figure          # the chart; optional (the PNG writer stands in)
except ImportError:
    Figure = None
try:
    from tqdm import tqdm                         # the progress bar on a terminal; optional
except ImportError:
    tqdm = None

import flambeau as torch
import flambeau.nn as nn
import flambeau.nn.functional as F

DIGITS, LEN = 10, 8
SEP = DIGITS            # token id of the separator
VOCAB = DIGITS + 1
T = 2 * LEN + 1         # digits, separator, sorted digits (the last one is never an input)


def make_batch(rng: np.random.Generator, n: int, device):
    x = rng.integers(0, DIGITS, size=(n, LEN))
    seq = np.concatenate([x, np.full((n, 1), SEP), np.sort(x, axis=1)], axis=1)
    inp = torch.tensor(seq[:, :-1], device=device)
    tgt = seq[:, 1:].copy()
    tgt[:, :LEN - 1] = -100          # only the sorted half is scored
    return inp, torch.tensor(tgt, device=device)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d=64, layers=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(T - 1, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.tok.weight            # tied embeddings

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


def progress(i, n, loss, t0, width=30):
    done = int(width * (i + 1) / n)
    rate = (i + 1) / max(time.time() - t0, 1e-9)
    sys.stdout.write(f"\r  [{'#' * done}{'.' * (width - done)}] {i + 1}/{n} loss {loss:.4f} {rate:.1f} it/s")
    sys.stdout.flush()


def train(model, steps, device, rng, label, step_fn=None):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    losses, times = [], []
    t0 = time.time()
    print(f"training ({label}) for {steps} steps on {device}")
    bar = tqdm(total=steps, desc=label, unit="step") if tqdm is not None and sys.stdout.isatty() else None
    fwd = step_fn or model
    for i in range(steps):
        inp, tgt = make_batch(rng, 64, device)
        ts = time.perf_counter()
        logits = fwd(inp)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        lv = loss.item()
        times.append(time.perf_counter() - ts)
        losses.append(lv)
        if bar is not None:
            bar.set_postfix(loss=f"{lv:.4f}", refresh=False)
            bar.update(1)
        elif i % 5 == 0 or i == steps - 1:
            progress(i, steps, lv, t0)
    if bar is not None:
        bar.close()
    else:
        print()
    return losses, times


def plot_losses(series, path):
    """The training curves as a matplotlib chart (returned), or with the built-in PNG writer
    (returns None) when matplotlib is not installed."""
    if Figure is None:
        from ._png import line_plot  # deferred: test_demo runs this source on PyTorch
        line_plot(series, path)
        return None
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    for name, losses in series.items():
        ax.plot(np.arange(1, len(losses) + 1), losses, label=name, alpha=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (log scale)")
    ax.set_title(f"sorting {LEN} digits: training loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return fig


@torch.no_grad()
def evaluate(model, device, rng, n=512, show=4):
    model.eval()
    inp, _ = make_batch(rng, n, device)
    seq = inp[:, : LEN + 1]
    for _ in range(LEN):                                   # greedy decoding of the sorted half
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    pred = seq[:, LEN + 1:].cpu().numpy()
    truth = np.sort(inp[:, :LEN].cpu().numpy(), axis=1)
    acc = float((pred == truth).all(axis=1).mean())
    tok = float((pred == truth).mean())
    for i in range(show):
        ok = "ok " if (pred[i] == truth[i]).all() else "BAD"
        print(f"  {ok} {''.join(map(str, inp[i, :LEN].tolist()))} -> {''.join(map(str, pred[i]))}")
    model.train()
    return acc, tok


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="skip the second run through flambeau.compile")
    p.add_argument("--out", default=".")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = GPT().to(a.device)
    n = sum(p.numel() for p in model.parameters())
    print(f"flambeau {torch.__version__}: GPT with {n:,} parameters, task: sort {LEN} digits")
    losses, times = train(model, a.steps, a.device, rng, "eager")
    series = {"eager": losses}
    eager_ms = 1e3 * float(np.median(times[len(times) // 4:]))
    print(f"eager step time {eager_ms:.1f} ms (median)")
    if a.compile:
        torch.manual_seed(0)
        cmodel = GPT().to(a.device)
        closs, ctimes = train(cmodel, a.steps, a.device, np.random.default_rng(0), "compiled",
                              step_fn=torch.compile(cmodel))
        series["compiled"] = closs
        comp_ms = 1e3 * float(np.median(ctimes[len(ctimes) // 4:]))
        print(f"compiled step time {comp_ms:.1f} ms (median), speed-up {eager_ms / comp_ms:.2f}x, "
              f"first call {1e3 * ctimes[0]:.0f} ms")
    acc, tok = evaluate(model, a.device, np.random.default_rng(123))
    print(f"held-out accuracy: {100 * acc:.1f}% of sequences fully sorted, {100 * tok:.1f}% of digits right")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "loss.png")
    how = "matplotlib chart" if plot_losses(series, path) is not None else "log10 loss per step"
    legend = "blue: eager" + (", orange: compiled (it lies on the eager curve when losses agree)"
                              if "compiled" in series else "")
    print(f"loss curve ({how}; {legend}) written to {path}")
    return acc


if __name__ == "__main__":
    main()
