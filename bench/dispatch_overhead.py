"""Per-call cost of eager dispatch for small ops (tiny tensors, so the kernel is a small part).

Two figures per op, one JSON object per line:
- `us_per_call`: the minimum over `--repeats` timeit runs (wall time; noisy on a shared machine);
- `instr_per_call` (with `--instructions`): instructions executed per call, counted by valgrind's
  callgrind over only the timed loop (a tiny C helper toggles collection around it). Instruction
  counts barely move with machine load, so they compare two trees on a busy machine.

Compare two checkouts by running this same script against each:

    PYTHONPATH=/path/to/tree python bench/dispatch_overhead.py [--instructions] [--ops add,relu]

PyTorch is not the peer here: the figure of interest is flambeau before vs after a change.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import timeit

import numpy as np

SECONDS_PER_RUN = 0.05       # length of one timeit run
CALLS_COUNTED = 1000         # calls per op under callgrind
WARMUP_CALLS = 200           # lets CPython specialise the bytecode before counting

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
    return {
        "numpy_add": lambda: np.add(an, bn),      # the floor: the kernel alone, no dispatch
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "relu": lambda: m.relu(a),
        "sum": lambda: a.sum(),
        "view": lambda: a.view(64),
        "transpose": lambda: a.t(),
        "slice": lambda: a[1:3],
        "mlp_fwd_bwd": mlp_step,
    }


def _time(fn, repeats: int) -> float:
    """Microseconds per call: the minimum over `repeats` runs of about SECONDS_PER_RUN each."""
    for _ in range(WARMUP_CALLS):
        fn()
    per_call = timeit.timeit(fn, number=WARMUP_CALLS) / WARMUP_CALLS
    number = max(1, int(SECONDS_PER_RUN / max(per_call, 1e-9)))
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def _count_in_callgrind(names, ops) -> None:
    """Runs inside valgrind: collect only the loops, one stats dump per op."""
    helper = ctypes.CDLL(os.environ["FLAMBEAU_BENCH_HELPER"])
    for name in names:
        fn = ops[name]
        for _ in range(WARMUP_CALLS):
            fn()
        helper.flambeau_bench_toggle()
        for _ in range(CALLS_COUNTED):
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
        env = dict(os.environ, FLAMBEAU_BENCH_HELPER=_build_helper(tmp))
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
                counts[name] = total / CALLS_COUNTED
        return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="", help="comma-separated subset of the workloads")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    p.add_argument("--keep", help="folder for the callgrind files of --instructions")
    p.add_argument("--no-time", action="store_true", help="skip the wall-time figure")
    p.add_argument("--in-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    import flambeau
    ops = workloads(flambeau)
    names = [n for n in args.ops.split(",") if n] or list(ops)
    if args.in_callgrind:
        _count_in_callgrind(names, ops)
        return
    counts = _count(names, args.keep) if args.instructions else {}
    for name in names:
        row = {"workload": name, "system": "flambeau-eager", "tree": os.path.dirname(flambeau.__path__[0])}
        if not args.no_time:
            row["us_per_call"] = round(_time(ops[name], args.repeats), 3)
        if name in counts:
            row["instr_per_call"] = round(counts[name])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
