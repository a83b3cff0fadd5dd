"""CPU speed on real models (issue 12, item 5): flambeau vs PyTorch in one process, paired timings.

    python bench/cpu_models.py [--only chargpt,bigram,small] [--rounds 7] [--min-time 0.2]
                               [--layers 2,4,8,16] [--batch 16]

Workloads, written once against either library (the models of karpathy's ng-video-lecture):
  chargpt_train  char GPT as in gpt.py: 6 layers, n_embd 384, 6 heads built from per-head Linear
                 key/query/value, a registered tril buffer, masked_fill(-inf), softmax, dropout 0.2,
                 ReLU feed-forward; vocab 65, B16 x T256 (--batch); one AdamW training step, eager
  chargpt_eval   the same model in eval() under no_grad, forward + loss (estimate_loss)
  bigram_train   bigram.py: Embedding(65, 65) as logits, B32 x T8, cross-entropy, AdamW step, eager
  bigram_eval    bigram.py's estimate_loss iteration: get_batch, forward under no_grad, loss.item()
Every eager step starts with the scripts' get_batch (randint, a list of 2 x B slices of a 1M-token
tensor, stack), which dominates the bigram's time as it does in bigram.py.
  small_L        a small GPT (d 64, 4 heads, T 32, B 8, scaled_dot_product_attention, GELU, L layers)
                 compiled forward + loss, then backward (both libraries' default compile), no optimizer

  gemm           the matrix products of the workloads above (shapes and layouts as the step runs them),
                 each through flambeau's matmul (its own packed kernel or NumPy's BLAS, as it chooses),
                 NumPy's BLAS directly, and torch.matmul: which BLAS should serve which product
                 (thread time with --threads 1, else wall time; same median-of-rounds method)

Timing: the machine may be shared and loaded, so no single wall time is trusted. Each workload keeps a
flambeau and a PyTorch copy of the same initial weights; a round times one then the other (the order
alternates between rounds), each running its step for at least --min-time seconds; the round's ratio is
flambeau / torch. We print the median over rounds of each system's mean step time and of the per-round
ratios (paired, so load that changes between rounds cancels to first order), and the ratio range;
also the median ratio of process CPU time per step (all threads; a spinning idle worker counts, a
descheduled one does not), which moves less with the load of other processes than wall time does.

Compiled workloads also report each library's first call (capture + compile, cold caches in fresh
temporary directories) and the losses both computed before timing.

Environment set here before either library loads, as bench/compile_training.py does (reasons there):
GOMP_SPINCOUNT=10000 for both libraries' OpenMP, OPENBLAS_THREAD_TIMEOUT=4 for NumPy's BLAS.
--threads N runs both libraries on N threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
torch.set_num_threads): on a loaded machine, --threads 1 compares the work each does without the
threads' waits for one another, which oversubscribed cores make erratic.
Output: one JSON object per line.
"""
from __future__ import annotations

import os
import sys
import tempfile

def _threads_arg() -> str | None:
    """--threads N, read before either library loads its OpenMP runtime."""
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return None


if _threads_arg():
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = _threads_arg()
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
_CACHE_ROOT = tempfile.mkdtemp(prefix="cpu_models_")
os.environ.setdefault("FLAMBEAU_CACHE_DIR", os.path.join(_CACHE_ROOT, "flambeau"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE_ROOT, "torchinductor"))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flambeau  # noqa: E402
from bench.small_gpt import small_gpt  # noqa: E402

VOCAB = 65                      # tiny-shakespeare's character set
CHAR_GPT = dict(n_embd=384, n_head=6, n_layer=6, block_size=256, dropout=0.2)
SMALL_GPT = dict(d=64, heads=4, block=32, batch=8)
BIGRAM_BATCH, BIGRAM_BLOCK = 32, 8


# ---- models (m is flambeau or torch) -------------------------------------------------------------
def char_gpt(m, n_embd, n_head, n_layer, block_size, dropout):
    """gpt.py of ng-video-lecture, unchanged in structure."""
    nn, F = m.nn, m.nn.functional

    class Head(nn.Module):
        def __init__(self, head_size):
            super().__init__()
            self.key = nn.Linear(n_embd, head_size, bias=False)
            self.query = nn.Linear(n_embd, head_size, bias=False)
            self.value = nn.Linear(n_embd, head_size, bias=False)
            self.register_buffer("tril", m.tril(m.ones(block_size, block_size)))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            B, T, C = x.shape
            k, q = self.key(x), self.query(x)
            wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
            wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
            wei = self.dropout(F.softmax(wei, dim=-1))
            return wei @ self.value(x)

    class MultiHeadAttention(nn.Module):
        def __init__(self, num_heads, head_size):
            super().__init__()
            self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
            self.proj = nn.Linear(head_size * num_heads, n_embd)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            out = m.cat([h(x) for h in self.heads], dim=-1)
            return self.dropout(self.proj(out))

    class FeedFoward(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(),
                                     nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))

        def forward(self, x):
            return self.net(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.sa = MultiHeadAttention(n_head, n_embd // n_head)
            self.ffwd = FeedFoward()
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            return x + self.ffwd(self.ln2(x))

    class GPTLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding_table = nn.Embedding(VOCAB, n_embd)
            self.position_embedding_table = nn.Embedding(block_size, n_embd)
            self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, VOCAB)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.token_embedding_table(idx) + self.position_embedding_table(m.arange(T))
            logits = self.lm_head(self.ln_f(self.blocks(x)))
            B, T, C = logits.shape
            return F.cross_entropy(logits.view(B * T, C), targets.view(B * T))
    return GPTLanguageModel()


def bigram(m):
    nn, F = m.nn, m.nn.functional

    class BigramLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding_table = nn.Embedding(VOCAB, VOCAB)

        def forward(self, idx, targets):
            logits = self.token_embedding_table(idx)
            B, T, C = logits.shape
            return F.cross_entropy(logits.view(B * T, C), targets.view(B * T))
    return BigramLanguageModel()


# ---- one workload for one library ----------------------------------------------------------------
class Step:
    """`run()` does one step of workload `name` in library m; both libraries start from one set of weights."""

    def __init__(self, name: str, m, ref, data, train: bool, compiled: bool):
        self.m, self.train = m, train
        self.block = data[0].shape[1]
        gen = np.random.default_rng(1)
        self.corpus = m.tensor(gen.integers(0, VOCAB, size=CORPUS_TOKENS), dtype=m.long)
        model = ref(m)
        if m is torch:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in WEIGHTS[name].items()})
        else:
            WEIGHTS[name] = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        self.model = model.train(train)
        self.x, self.y = (m.tensor(a) for a in data)
        self.fn = m.compile(model) if compiled else model
        self.opt = m.optim.AdamW(model.parameters(), lr=1e-3) if train and not compiled else None
        self.compiled = compiled

    def get_batch(self):
        """bigram.py's and gpt.py's get_batch."""
        m, data, block = self.m, self.corpus, self.block
        ix = m.randint(len(data) - block, (self.x.shape[0],))
        x = m.stack([data[i:i + block] for i in ix])
        y = m.stack([data[i + 1:i + block + 1] for i in ix])
        return x, y

    def timed(self):
        """One step as the scripts run it: a fresh batch, then the step (eval: the loss read as float)."""
        x, y = self.get_batch()
        out = self.run(x, y)
        return out.item() if not self.train else out

    def run(self, x=None, y=None):
        x, y = (self.x, self.y) if x is None else (x, y)
        if not self.train:
            with self.m.no_grad():
                return self.fn(x, y)
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)
        loss = self.fn(x, y)
        loss.backward()
        if self.opt is not None:
            self.opt.step()
        return loss


WEIGHTS: dict = {}
CORPUS_TOKENS = 1_000_000          # about tiny-shakespeare's length


def _batch(rng, batch, block):
    data = rng.integers(0, VOCAB, size=(batch, block + 1))
    return data[:, :-1].copy(), data[:, 1:].copy()


def workloads(only, layers, batch):
    """name -> (builder, data, train, compiled)."""
    rng = np.random.default_rng(0)
    out = {}
    if "chargpt" in only:
        cfg = dict(CHAR_GPT)
        data = _batch(rng, batch, cfg["block_size"])
        out["chargpt_train"] = (lambda m: char_gpt(m, **cfg), data, True, False)
        out["chargpt_eval"] = (lambda m: char_gpt(m, **cfg), data, False, False)
    if "bigram" in only:
        data = _batch(rng, BIGRAM_BATCH, BIGRAM_BLOCK)
        out["bigram_train"] = (bigram, data, True, False)
        out["bigram_eval"] = (bigram, data, False, False)
    if "small" in only:
        s = SMALL_GPT
        for n in layers:
            out[f"small_{n}"] = ((lambda m, n=n: small_gpt(m, vocab=VOCAB, d=s["d"], heads=s["heads"], layers=n,
                                                          block=s["block"], with_loss=True)),
                                 _batch(rng, s["batch"], s["block"]), True, True)
    return out


# (a shape, a strides in elements, b shape, b strides): chargpt's per-head projections, attention
# products and MLP; the small GPT's (4 layers) linear layers and per-head attention products
GEMMS = {
    "chargpt": [((4096, 384), (384, 1), (384, 64), (1, 384)), ((16, 256, 64), (16384, 64, 1), (16, 64, 256), (16384, 1, 64)),
                ((16, 256, 256), (65536, 256, 1), (16, 256, 64), (16384, 64, 1)),
                ((4096, 384), (384, 1), (384, 1536), (1, 384)), ((4096, 1536), (1536, 1), (1536, 384), (1, 1536)),
                ((384, 4096), (1, 384), (4096, 64), (64, 1))],
    "small": [((32, 32, 32), (1024, 32, 1), (32, 32, 16), (512, 16, 1)), ((32, 32, 16), (512, 16, 1), (32, 16, 32), (512, 1, 16)),
              ((256, 64), (64, 1), (64, 192), (1, 64)), ((256, 64), (64, 1), (64, 64), (1, 64)),
              ((256, 64), (64, 1), (64, 256), (1, 64)), ((256, 256), (256, 1), (256, 64), (1, 256)),
              ((64, 256), (1, 64), (256, 256), (256, 1)), ((256, 64), (64, 1), (64, 65), (1, 64))],
}


def _strided(rng, shape, strides):
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    buf = rng.standard_normal(span).astype(np.float32)
    return np.lib.stride_tricks.as_strided(buf, shape, tuple(4 * st for st in strides))


def measure_gemms(opts):
    from flambeau._backends import cpu_kernels
    rng = np.random.default_rng(0)
    clock = time.thread_time if opts.threads == 1 else time.perf_counter
    for model, shapes in GEMMS.items():
        for sa, sta, sb, stb in shapes:
            a, b = _strided(rng, sa, sta), _strided(rng, sb, stb)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns = {"flambeau": lambda: cpu_kernels.matmul(a, b), "numpy": lambda: np.matmul(a, b),
                   "torch": lambda: torch.matmul(ta, tb)}
            times = {k: [] for k in fns}
            for _ in range(opts.rounds):
                for k, f in fns.items():
                    times[k].append(mean_step_time(f, opts.min_time / 4, clock)[0])
            med = {k: statistics.median(v) for k, v in times.items()}
            print(json.dumps({"gemm": model, "a": [sa, sta], "b": [sb, stb],
                              **{f"{k}_us": round(v * 1e6, 1) for k, v in med.items()},
                              "flambeau_vs_torch": round(med["flambeau"] / med["torch"], 3),
                              "numpy_vs_torch": round(med["numpy"] / med["torch"], 3)}), flush=True)


def mean_step_time(fn, min_time, clock=time.perf_counter):
    """(wall seconds, process CPU seconds) per call, over at least min_time seconds of calls."""
    n = 1
    while True:
        t0, c0 = clock(), time.process_time()
        for _ in range(n):
            fn()
        t, c = clock() - t0, time.process_time() - c0
        if t >= min_time:
            return t / n, c / n
        n = max(n * 2, int(n * min_time / max(t, 1e-9)) + 1)


def measure(name, spec, opts):
    build, data, train, compiled = spec
    flambeau.manual_seed(0)
    torch.manual_seed(0)
    steps, first = {}, {}
    for label, m in (("flambeau", flambeau), ("torch", torch)):
        s = Step(name, m, build, data, train, compiled)
        t0 = time.perf_counter()
        loss = float(s.run())
        first[label] = (time.perf_counter() - t0, loss)
        s.run()
        steps[label] = s
    times = {"flambeau": [], "torch": []}
    ratios, cpu_ratios = [], []
    for r in range(opts.rounds):
        order = ("flambeau", "torch") if r % 2 == 0 else ("torch", "flambeau")
        got = {k: mean_step_time(steps[k].run if compiled else steps[k].timed, opts.min_time) for k in order}
        for k, v in got.items():
            times[k].append(v[0])
        ratios.append(got["flambeau"][0] / got["torch"][0])
        cpu_ratios.append(got["flambeau"][1] / got["torch"][1])
    rec = {"workload": name, "flambeau_ms": round(statistics.median(times["flambeau"]) * 1e3, 3),
           "torch_ms": round(statistics.median(times["torch"]) * 1e3, 3),
           "ratio": round(statistics.median(ratios), 3),
           "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
           "cpu_time_ratio": round(statistics.median(cpu_ratios), 3)}
    if not (train and "dropout" in repr(steps["torch"].model).lower()):
        rec["first_loss"] = {k: round(v[1], 5) for k, v in first.items()}
    if compiled:
        rec["first_call_s"] = {k: round(v[0], 3) for k, v in first.items()}
    print(json.dumps(rec), flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="chargpt,bigram,small,gemm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--layers", default="2,4,8,16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both libraries (OpenMP, OpenBLAS, torch); default: theirs")
    opts = ap.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    warnings.simplefilter("ignore")
    print(json.dumps({"config": True, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "rounds": opts.rounds, "min_time_s": opts.min_time,
                      "GOMP_SPINCOUNT": os.environ["GOMP_SPINCOUNT"],
                      "OPENBLAS_THREAD_TIMEOUT": os.environ["OPENBLAS_THREAD_TIMEOUT"],
                      "load_avg": os.getloadavg()}), flush=True)
    try:
        specs = workloads(opts.only.split(","), [int(n) for n in opts.layers.split(",")], opts.batch)
        for name, spec in specs.items():
            measure(name, spec, opts)
        if "gemm" in opts.only.split(","):
            measure_gemms(opts)
    finally:
        shutil.rmtree(_CACHE_ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
