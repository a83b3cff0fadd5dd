"""`python -m tests.compat [names...] [--slow] [--logs DIR] [--threads N]`: run the suite, print a table and the
pass rate; exit status 1 when a program fails (skips do not count either way)."""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from .programs import by_name
from .runner import Outcome, run_program


def _ratio(r: float | None) -> str:
    return f"{r:5.2f}x" if r is not None else "   -  "


def _row(o: Outcome) -> str:
    t, f = o.seconds
    ct, cf = o.cpu
    last = f"{o.losses[0][-1]:.4f} / {o.losses[1][-1]:.4f}" if o.losses[0] and o.losses[1] else ""
    kind = "exact" if o.exact else (f"{o.max_rel:.2%}" if o.max_rel is not None else "")
    return (f"{o.name:22s} {o.status:5s} {kind:>7s} {t:7.1f}s {f:7.1f}s {_ratio(o.ratio)} {ct:7.1f}s {cf:7.1f}s "
            f"{_ratio(o.cpu_ratio)}  {last:19s} {o.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only programs whose names contain one of these")
    parser.add_argument("--slow", action="store_true", help="include the slow programs")
    parser.add_argument("--logs", type=pathlib.Path, default=None, help="keep both runs' output here")
    parser.add_argument("--threads", type=int, default=None, help="OMP/BLAS threads for both systems")
    args = parser.parse_args(argv)
    logs = args.logs or pathlib.Path(tempfile.mkdtemp(prefix="compat-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{'program':22s} {'':5s} {'losses':>7s} {'wall PT':>8s} {'wall fl':>8s} {'ratio':6s} {'CPU PT':>8s} "
          f"{'CPU fl':>8s} {'ratio':6s}  {'last loss (PT / fl)':19s}", flush=True)
    outcomes = []
    for program in by_name(args.names, args.slow):
        outcome = run_program(program, logs, threads=args.threads)
        outcomes.append(outcome)
        print(_row(outcome), flush=True)
    ran = [o for o in outcomes if o.status != "skip"]
    passed = [o for o in ran if o.status == "pass"]
    print(f"\n{len(passed)}/{len(ran)} pass ({len(outcomes) - len(ran)} skipped); "
          f"{sum(o.exact for o in passed)} exact; logs in {logs}")
    for what, key in (("wall", "ratio"), ("CPU", "cpu_ratio")):
        ratios = sorted(getattr(o, key) for o in passed if getattr(o, key) is not None)
        if ratios:
            print(f"{what} time flambeau/PyTorch over passing programs: median {ratios[len(ratios) // 2]:.2f}x, "
                  f"range {ratios[0]:.2f}x-{ratios[-1]:.2f}x")
    return 0 if len(passed) == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
