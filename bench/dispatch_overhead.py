"""Per-call cost of eager dispatch for small ops (tiny tensors, so the kernel is a small part).

Two figures per op, one JSON object per line:
- `us_per_call`: the minimum over `--repeats` timeit runs (wall time; noisy on a shared machine);
- `instr_per_call` (with `--instructions`): instructions executed per call, counted by valgrind's
  callgrind over only the timed loop (a tiny C helper toggles collection around it). Instruction
  counts barely move with machine load, so they compare two trees on a busy machine. valgrind decodes
  no AVX-512, so the counted child runs without NumPy's AVX-512 loops and with FLAMBEAU_GEMM=0 (the C++
  kernels off, NumPy in their place; attention by the math backend): the host path is counted, not the
  kernels this machine runs.

Compare two checkouts by running this same script against each:

    PYTHONPATH=/path/to/tree python bench/dispatch_overhead.py [--instructions] [--ops add,relu]

The training-step workloads (`mlp_step`, `mlp_step_amp`, `conv_step`, `gpt_step` (distributed_train.py's
`--small` GPT: 2 layers, width 64, B 2, T 32; 20 calls counted under callgrind): a whole step of a tiny model,
forward, backward and AdamW, so the kernels cost little and the host path is what is timed) also
print `ops_per_step` (operator calls reaching the backend: flambeau's `call_functional`, PyTorch's
ATen ops under a dispatch mode) and `us_per_op` = step time / ops; `--peer torch` adds PyTorch's line
for the same workloads, timed right after flambeau's in the same process (`python bench/dispatch_overhead.py
--peer torch --ops add,matmul,mlp_step`).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit

import contextlib

import numpy as np

SECONDS_PER_RUN = 0.05       # length of one timeit run
CALLS_COUNTED = 1000         # calls per op under callgrind
WARMUP_CALLS = 200           # lets CPython specialise the bytecode before counting
STEP_WIDTH = 16              # features of the tiny MLP of the step workloads
STEP_BATCH = 4
STEP_CHANNELS = 4            # channels, image side and batch of the conv-bn-relu step
STEP_SIDE = 4
STEP_IMAGES = 2
STEP_WORKLOADS = ("mlp_step", "mlp_step_amp", "conv_step", "get_batch", "gpt_step")   # printed with ops_per_step
GPT_STEP = dict(vocab=96, block=32, d=64, layers=2, heads=2, batch=2, seq=32)   # distributed_train.py --small
SLOW_CALLS = {"gpt_step": 20}
NPY_AVX512 = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"  # workloads of milliseconds: fewer calls counted (and warm-up calls) under callgrind

_HELPER_C = r"""
#include <valgrind/callgrind.h>
void flambeau_bench_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void flambeau_bench_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


def workloads(m) -> dict:
    """name -> zero-argument callable; each does one small eager op (the MLP does one step)."""
    rng = np.random.default_rng(0)

    def T(*shape, grad=False):
        return m.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)

    a, b = T(8, 8), T(8, 8)
    F = m.nn.functional
    w1, b1, w2, b2 = T(16, 8, grad=True), T(16, grad=True), T(4, 16, grad=True), T(4, grad=True)
    x = T(2, 8)

    def mlp_step():
        loss = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2).sum()
        loss.backward()

    an, bn = a.numpy(), b.numpy()
    return {**_steps(m),
        "numpy_add": lambda: np.add(an, bn),      # the floor: the kernel alone, no dispatch
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "matmul": lambda: a @ b,
        "relu": lambda: m.relu(a),
        "sum": lambda: a.sum(),
        "view": lambda: a.view(64),
        "transpose": lambda: a.t(),
        "slice": lambda: a[1:3],
        "reshape": lambda: a.reshape(-1),
        "sum_dim": lambda: a.sum(0),
        "to_bf16": lambda: a.to(m.bfloat16),
        "add_grad": lambda: a + b1[:8],                # records an autograd node
        "linear_grad": lambda: F.linear(x, w1, b1),    # records an autograd node
        "mlp_fwd_bwd": mlp_step,
        **_get_batch(m),
    }


def _get_batch(m) -> dict:
    """bigram.py's get_batch (B 32, T 8, 1M-token corpus: ~200 tiny integer ops) and its parts: `iter32`
    (iterating the 32 drawn offsets), `add_int` (0-dim int64 tensor + Python int), `slice_tensor_bounds`
    (`corpus[i:j]`, 0-dim tensor bounds), `stack32` (stacking 32 slices of 8)."""
    corpus = m.tensor(np.random.default_rng(1).integers(0, 65, size=1_000_000), dtype=m.long)
    ix = m.randint(len(corpus) - 8, (32,))
    i = ix[3]
    j = i + 8
    pieces = [corpus[k:k + 8] for k in ix]

    def get_batch():
        ix = m.randint(len(corpus) - 8, (32,))
        return m.stack([corpus[i:i + 8] for i in ix]), m.stack([corpus[i + 1:i + 8 + 1] for i in ix])
    return {"iter32": lambda: list(ix), "add_int": lambda: i + 8, "slice_tensor_bounds": lambda: corpus[i:j],
            "stack32": lambda: m.stack(pieces), "get_batch": get_batch}


def _steps(m) -> dict:
    """The training-step workloads: bench/gpu_models.py's MLP and a conv-BN-ReLU residual block,
    shrunk so that the host path is the cost, and its small GPT; AdamW; `mlp_step_amp` under cpu bf16
    autocast."""
    nn, F = m.nn, m.nn.functional
    m.manual_seed(0)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(STEP_WIDTH, STEP_WIDTH) for _ in range(4)])

        def forward(self, x, targets):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = F.relu(x)
            return F.cross_entropy(x, targets)

    class ConvBlock(nn.Module):
        def __init__(self):
            super().__init__()
            c = STEP_CHANNELS
            self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)
            self.fc = nn.Linear(c, c)

        def forward(self, x, targets):
            out = F.relu(self.bn1(self.conv1(x)))
            out = F.relu(self.bn2(self.conv2(out)) + x)
            return F.cross_entropy(self.fc(m.flatten(F.adaptive_avg_pool2d(out, 1), 1)), targets)

    def make_step(model, x, y, amp):
        opt = m.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

        def step():
            ctx = m.autocast(device_type="cpu", dtype=m.bfloat16) if amp else contextlib.nullcontext()
            with ctx:
                loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    mx, my = m.randn(STEP_BATCH, STEP_WIDTH), m.randint(0, STEP_WIDTH, (STEP_BATCH,))
    cx = m.randn(STEP_IMAGES, STEP_CHANNELS, STEP_SIDE, STEP_SIDE)
    cy = m.randint(0, STEP_CHANNELS, (STEP_IMAGES,))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import gpu_models
    g = GPT_STEP
    gx, gy = (m.randint(0, g["vocab"], (g["batch"], g["seq"])) for _ in range(2))
    gpt = gpu_models.gpt(m, vocab=g["vocab"], block=g["block"], d=g["d"], layers=g["layers"], heads=g["heads"])
    return {"mlp_step": make_step(MLP(), mx, my, False), "mlp_step_amp": make_step(MLP(), mx, my, True),
            "conv_step": make_step(ConvBlock(), cx, cy, False), "gpt_step": make_step(gpt, gx, gy, False)}


def ops_per_call(m, fn) -> int:
    """Operator calls that reach the backend during one call of `fn` (after a warm-up call)."""
    fn()
    if m.__name__ == "torch":
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.n += 1
                return func(*args, **(kwargs or {}))
        with Count():
            fn()
        return Count.n
    from bench import measure
    return measure.functional_calls(fn)


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _time(fn, repeats: int, clock: str = "wall") -> float:
    """Microseconds per call: the minimum over `repeats` runs of about SECONDS_PER_RUN each, in wall time
    or in the thread's CPU time (`clock="thread"`: steadier on a loaded machine)."""
    for _ in range(WARMUP_CALLS):
        fn()
    timer = timeit.Timer(fn, timer=CLOCKS[clock])
    per_call = timer.timeit(number=WARMUP_CALLS) / WARMUP_CALLS
    number = max(1, int(SECONDS_PER_RUN / max(per_call, 1e-9)))
    return min(timer.repeat(number=number, repeat=repeats)) / number * 1e6


def _count_in_callgrind(names, ops) -> None:
    """Runs inside valgrind: collect only the loops, one stats dump per op (attention by the math backend:
    the fused CPU kernel is AVX-512 code)."""
    from flambeau.nn.attention import SDPBackend, sdpa_kernel
    helper = ctypes.CDLL(os.environ["FLAMBEAU_BENCH_HELPER"])
    with sdpa_kernel(SDPBackend.MATH):
        _count_loops(helper, names, ops)


def _count_loops(helper, names, ops) -> None:
    for name in names:
        fn = ops[name]
        for _ in range(SLOW_CALLS.get(name, WARMUP_CALLS)):
            fn()
        helper.flambeau_bench_toggle()
        for _ in range(SLOW_CALLS.get(name, CALLS_COUNTED)):
            fn()
        helper.flambeau_bench_toggle()
        helper.flambeau_bench_dump(name.encode())


def _build_helper(tmp: str) -> str:
    src, lib = os.path.join(tmp, "helper.c"), os.path.join(tmp, "helper.so")
    with open(src, "w") as f:
        f.write(_HELPER_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", src, "-o", lib], check=True)
    return lib


def _count(names, keep: str | None) -> dict:
    """name -> instructions per call, from a child process run under callgrind; `keep` names a
    folder that receives the callgrind files (for callgrind_annotate)."""
    with tempfile.TemporaryDirectory() as tmp:
        # valgrind 3.19 decodes no AVX-512: NumPy's AVX-512 loops are switched off and our C++ kernels too
        # (FLAMBEAU_GEMM=0: NumPy serves them), else the child dies of SIGILL on an AVX-512 machine
        env = dict(os.environ, FLAMBEAU_BENCH_HELPER=_build_helper(tmp), FLAMBEAU_GEMM="0",
                   NPY_DISABLE_CPU_FEATURES=NPY_AVX512)
        out = os.path.join(keep or tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}",
                        sys.executable, __file__, "--in-callgrind", "--ops", ",".join(names)],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        counts = {}
        folder = os.path.dirname(out)
        for fname in os.listdir(folder):
            if not fname.startswith("cg.out"):
                continue
            name = total = None
            for line in open(os.path.join(folder, fname)):
                if line.startswith("desc: Trigger: Client Request: "):
                    name = line.split(": ", 3)[-1].strip()
                elif line.startswith("totals:") or line.startswith("summary:"):
                    total = int(line.split()[1])
            if name in names:
                counts[name] = total / SLOW_CALLS.get(name, CALLS_COUNTED)
        return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="", help="comma-separated subset of the workloads")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    p.add_argument("--keep", help="folder for the callgrind files of --instructions")
    p.add_argument("--no-time", action="store_true", help="skip the wall-time figure")
    p.add_argument("--peer", choices=["torch"], help="also time PyTorch on the step workloads")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="thread: CPU time of the thread")
    p.add_argument("--in-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    import flambeau
    ops = workloads(flambeau)
    names = [n for n in args.ops.split(",") if n] or list(ops)
    if args.in_callgrind:
        _count_in_callgrind(names, ops)
        return
    counts = _count(names, args.keep) if args.instructions else {}
    peer = None
    if args.peer:
        import torch
        peer = workloads(torch)
    for name in names:
        row = {"workload": name, "system": "flambeau-eager", "tree": os.path.dirname(flambeau.__path__[0])}
        if not args.no_time:
            row["us_per_call"] = round(_time(ops[name], args.repeats, args.clock), 3)
        if name in counts:
            row["instr_per_call"] = round(counts[name])
        if name in STEP_WORKLOADS:
            row["ops_per_step"] = ops_per_call(flambeau, ops[name])
            if "us_per_call" in row:
                row["us_per_op"] = round(row["us_per_call"] / row["ops_per_step"], 2)
        print(json.dumps(row), flush=True)
        if peer is not None and name != "numpy_add":
            row = {"workload": name, "system": "torch-eager", "us_per_call": round(_time(peer[name], args.repeats, args.clock), 3)}
            if name in STEP_WORKLOADS:
                row["ops_per_step"] = ops_per_call(torch, peer[name])
                row["us_per_op"] = round(row["us_per_call"] / row["ops_per_step"], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
