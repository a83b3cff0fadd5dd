"""`python -m tests.fuzz --seeds 0:1000 [--modes eager,inductor,dynamic] [--strict] [--show]`: run the compile
fuzzer over a range of seeds and print each failure with a standalone repro script, then the ops that ran
eagerly for want of a lowering; exit status 1 on any failure."""
from __future__ import annotations

import argparse
import sys
import time

from tests.fuzz import check
from tests.fuzz.check import MODES, check_seed, torch_step
from tests.fuzz.gen import generate


def _seeds(text: str) -> range:
    if ":" in text:
        lo, hi = text.split(":")
        return range(int(lo), int(hi))
    return range(int(text), int(text) + 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    p.add_argument("--seeds", default="0:100", help="a seed or a range lo:hi (default 0:100)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--show", action="store_true", help="print the programs (as repro scripts) instead of running them")
    p.add_argument("--strict", action="store_true", help="an op without a lowering (run eagerly) fails the program")
    p.add_argument("--quiet", action="store_true", help="one line per failure, no repro scripts")
    args = p.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    failed, t0 = 0, time.time()
    seeds = _seeds(args.seeds)
    for seed in seeds:
        if args.show:
            print(generate(seed, torch_step).repro())
            continue
        for failure in check_seed(seed, modes, args.strict):
            failed += 1
            print(failure.report().splitlines()[0] if args.quiet else failure.report() + "\n", flush=True)
    if not args.show:
        ops = ", ".join(f"{k} x{n}" for k, n in check.op_fallbacks.most_common())
        print(f"{len(seeds)} programs, {failed} failures, {time.time() - t0:.0f} s"
              + (f"; ops run eagerly: {ops}" if ops else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
