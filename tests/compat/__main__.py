"""`python -m tests.compat [names...] [--slow] [--logs DIR]`: run the suite, print a table and the
pass rate; exit status 1 when a program fails (skips do not count either way)."""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from .programs import by_name
from .runner import Outcome, run_program


def _row(o: Outcome) -> str:
    t, f = o.seconds
    ratio = f"{o.ratio:5.2f}x" if o.ratio is not None else "   -  "
    last = f"{o.losses[0][-1]:.4f} / {o.losses[1][-1]:.4f}" if o.losses[0] and o.losses[1] else ""
    kind = "exact" if o.exact else (f"{o.max_rel:.2%}" if o.max_rel is not None else "")
    return f"{o.name:22s} {o.status:5s} {kind:>7s} {t:7.1f}s {f:7.1f}s {ratio}  {last:19s} {o.detail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only programs whose names contain one of these")
    parser.add_argument("--slow", action="store_true", help="include the slow programs")
    parser.add_argument("--logs", type=pathlib.Path, default=None, help="keep both runs' output here")
    args = parser.parse_args(argv)
    logs = args.logs or pathlib.Path(tempfile.mkdtemp(prefix="compat-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{'program':22s} {'':5s} {'losses':>7s} {'PyTorch':>8s} {'flambeau':>8s} {'ratio':6s}  "
          f"{'last loss (PT / fl)':19s}")
    outcomes = []
    for program in by_name(args.names, args.slow):
        outcome = run_program(program, logs)
        outcomes.append(outcome)
        print(_row(outcome), flush=True)
    ran = [o for o in outcomes if o.status != "skip"]
    passed = [o for o in ran if o.status == "pass"]
    ratios = sorted(o.ratio for o in passed if o.ratio is not None)
    print(f"\n{len(passed)}/{len(ran)} pass ({len(outcomes) - len(ran)} skipped); "
          f"{sum(o.exact for o in passed)} exact; logs in {logs}")
    if ratios:
        print(f"wall time flambeau/PyTorch over passing programs: median {ratios[len(ratios) // 2]:.2f}x, "
              f"range {ratios[0]:.2f}x-{ratios[-1]:.2f}x")
    return 0 if len(passed) == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
