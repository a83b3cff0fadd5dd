"""Paired wall-time ratios of two flambeau checkouts on small eager workloads (a change's speed-up).

    python bench/ab_trees.py BASE_TREE NEW_TREE [--rounds 9] [--min-time 0.3] [--only add,bigram_eval]
                             [--clock wall|thread]

Each round starts one process per tree (the order alternates between rounds), each process times
every workload for about --min-time seconds after a warm-up; the round's ratio is new / base. On a
loaded machine only the median of those paired ratios means something (load that changes between
rounds cancels to first order); absolute times are printed for reference only. One JSON object per
workload: median ratio, ratio range, median µs per call of each tree.

Workloads: `add`, `mul_scalar`, `relu`, `view`, `transpose`, `slice`, `reshape`, `sum_dim`, `to_bf16`,
`add_grad`, `linear_grad` (8×8 float32), `mlp_fwd_bwd` (bench/dispatch_overhead.py's two-layer step), its
training steps `mlp_step`, `mlp_step_amp`, `conv_step`, `bigram_eval` (bench/cpu_models.py's bigram
estimate_loss iteration: get_batch from a 1M-token corpus, forward under no_grad, loss.item()), `bigram_train`
(its training step: get_batch, forward, backward, AdamW), `cross_entropy` (forward + backward, 256 x 65),
`gpt_train` (bench/distributed_train.py --small's eager step: bench/gpu_models.py's GPT of 2 layers, width 64,
B2 x T32, AdamW), and bench/dispatch_overhead.py's get_batch ops (`iter32`, `add_int`, `slice_tensor_bounds`, `stack32`, `get_batch`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VOCAB = 65
BLOCK = 8
BATCH = 32
SMALL_OPS = ("add", "matmul", "relu", "view", "transpose", "slice", "reshape", "sum_dim", "to_bf16", "add_grad", "linear_grad",
             "mlp_fwd_bwd", "mlp_step", "mlp_step_amp", "conv_step", "iter32", "add_int", "slice_tensor_bounds", "stack32",
             "get_batch")


def workloads(m) -> dict:
    """bench/dispatch_overhead.py's small ops and MLP step, plus `mul_scalar` and `bigram_eval`."""
    import numpy as np
    from dispatch_overhead import workloads as small_ops    # bench/ is this script's directory
    ops = {k: v for k, v in small_ops(m).items() if k in SMALL_OPS}
    ops_input = m.tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    F = m.nn.functional
    rng = np.random.default_rng(1)
    table = m.nn.Embedding(VOCAB, VOCAB)
    corpus = m.tensor(rng.integers(0, VOCAB, size=1_000_000), dtype=m.long)

    def bigram_eval():
        ix = m.randint(len(corpus) - BLOCK, (BATCH,))
        xb = m.stack([corpus[i:i + BLOCK] for i in ix])
        yb = m.stack([corpus[i + 1:i + BLOCK + 1] for i in ix])
        with m.no_grad():
            logits = table(xb)
            return F.cross_entropy(logits.view(BATCH * BLOCK, VOCAB), yb.view(BATCH * BLOCK)).item()

    opt = m.optim.AdamW(table.parameters(), lr=1e-3)

    def bigram_train():
        ix = m.randint(len(corpus) - BLOCK, (BATCH,))
        xb = m.stack([corpus[i:i + BLOCK] for i in ix])
        yb = m.stack([corpus[i + 1:i + BLOCK + 1] for i in ix])
        logits = table(xb)
        loss = F.cross_entropy(logits.view(BATCH * BLOCK, VOCAB), yb.view(BATCH * BLOCK))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    logits = m.tensor(rng.standard_normal((BATCH * BLOCK, VOCAB)).astype(np.float32), requires_grad=True)
    targets = m.tensor(rng.integers(0, VOCAB, size=BATCH * BLOCK))

    def cross_entropy():
        F.cross_entropy(logits, targets).backward()

    from gpu_models import gpt, train_step
    m.manual_seed(0)
    model = gpt(m, vocab=96, block=32, d=64, layers=2, heads=2)
    gpt_opt = m.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    idx, tgt = (m.tensor(rng.integers(0, 96, (2, 32))) for _ in range(2))

    ops.update(mul_scalar=lambda: ops_input * 0.5, bigram_eval=bigram_eval, bigram_train=bigram_train,
               cross_entropy=cross_entropy, gpt_train=lambda: train_step(m, model, gpt_opt, idx, tgt, None))
    return ops


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _child(names, min_time: float, clock: str) -> None:
    import flambeau
    ops = workloads(flambeau)
    now = CLOCKS[clock]
    out = {}
    for name in names:
        fn = ops[name]
        for _ in range(50):
            fn()
        n, t0 = 0, now()
        while (elapsed := now() - t0) < min_time:
            for _ in range(20):
                fn()
            n += 20
        out[name] = elapsed / n * 1e6
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--only", default="")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="thread: the process's CPU time (steadier than wall time on a loaded machine)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or ["add", "mul_scalar", "relu", "view", "transpose", "slice",
                                                       "mlp_fwd_bwd", "bigram_eval"]
    if args.child:
        _child(names, args.min_time, args.clock)
        return
    trees = {"base": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    runs = {"base": [], "new": []}
    for r in range(args.rounds):
        for which in (("base", "new") if r % 2 == 0 else ("new", "base")):
            env = dict(os.environ, PYTHONPATH=trees[which])
            p = subprocess.run([sys.executable, __file__, trees["base"], "--child", "--only", ",".join(names),
                                "--min-time", str(args.min_time), "--clock", args.clock], env=env, capture_output=True, text=True, check=True)
            runs[which].append(json.loads(p.stdout.strip().splitlines()[-1]))
    for name in names:
        ratios = [n[name] / b[name] for b, n in zip(runs["base"], runs["new"])]
        print(json.dumps({"workload": name, "ratio_new_over_base": round(statistics.median(ratios), 3),
                          "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                          "base_us": round(statistics.median(b[name] for b in runs["base"]), 2),
                          "new_us": round(statistics.median(n[name] for n in runs["new"]), 2),
                          "rounds": args.rounds, "base_tree": trees["base"], "new_tree": trees["new"]}))


if __name__ == "__main__":
    main()
