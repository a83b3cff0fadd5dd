"""Run one public PyTorch program under PyTorch and under `python -m flambeau.run`, compare.

Sources are never committed. `source(repo, commit)` finds a checkout, first of the two that
exist: `$FLAMBEAU_COMPAT_SRC/<owner>+<name>` (a ready tree), the cache
`$FLAMBEAU_COMPAT_CACHE` (default `~/.cache/flambeau-compat`), a bare git mirror under
`$FLAMBEAU_COMPAT_MIRRORS/<owner>+<name>/repo`; else it fetches the pinned commit from GitHub
into the cache. No source (no network) means the program is skipped, not failed.

Each system runs in its own fresh copy of the program's folder (outputs never collide), with the
same arguments, environment and time limit; the losses the program prints are read with its
regular expression. A program passes when both runs exit 0, print the same number of losses (at
least one), and every loss is within `rtol` (10% unless the program says) of PyTorch's; it is
"exact" when they agree to 0.1%. flambeau's random generator is not PyTorch's bit for bit, so
initial weights and batches differ and losses agree statistically, not digit for digit; a program
judged by its output (`output_regex`) samples deterministically from one checkpoint; one that seeds
nothing is judged by `check`, the program's own goal read from each run's output.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("FLAMBEAU_COMPAT_CACHE", pathlib.Path.home() / ".cache" / "flambeau-compat"))
EXACT_RTOL = 1e-3           # agreement to the precision programs print their losses with
FETCH_TIMEOUT_S = 120


@dataclasses.dataclass
class Program:
    """One public program: where it lives, how to shrink it, how to read its losses."""
    name: str
    repo: str                                  # "owner/name" on GitHub
    commit: str                                # pinned, so the suite is reproducible
    script: str                                # path inside `folder`
    args: list[str]
    loss_regex: str                            # groups: a loss the program prints (first non-empty one)
    folder: str = "."                          # the part of the repository the program needs
    setup: Callable[[pathlib.Path, dict], None] | None = None   # (work dir, sources by repo) -> None
    needs: tuple[str, ...] = ()                # other repositories setup reads from: ("owner/name@commit",)
    rtol: float = 0.10
    timeout_s: int = 900
    slow: bool = False                         # left out unless --slow
    output_regex: str = ""                     # instead of losses: this part of stdout must be identical
    env: dict = dataclasses.field(default_factory=dict)      # extra environment variables, for both systems
    check: Callable[[str], str] | None = None  # instead of losses: stdout -> "" when the run did its job, else why


@dataclasses.dataclass
class Outcome:
    name: str
    status: str                                # "pass" | "FAIL" | "skip"
    detail: str = ""
    exact: bool = False
    max_rel: float | None = None
    losses: tuple[list[float], list[float]] = ((), ())
    seconds: tuple[float, float] = (0.0, 0.0)  # wall time (PyTorch, flambeau)
    cpu: tuple[float, float] = (0.0, 0.0)      # CPU time (PyTorch, flambeau): steadier on a shared machine

    @property
    def ratio(self) -> float | None:
        t, f = self.seconds
        return f / t if t > 0 and self.status != "skip" else None

    @property
    def cpu_ratio(self) -> float | None:
        t, f = self.cpu
        return f / t if t > 0 and self.status != "skip" else None


def _run_git(args: list[str], cwd: pathlib.Path | None = None) -> bool:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=FETCH_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _from_mirror(mirror: pathlib.Path, commit: str, dest: pathlib.Path) -> bool:
    """Extract `commit` of a bare mirror; blobs the mirror lacks (large data files) are left out."""
    listing = subprocess.run(["git", "--git-dir", str(mirror), "ls-tree", "-r", "--name-only", commit],
                             capture_output=True, text=True)
    if listing.returncode:
        return False
    for path in listing.stdout.splitlines():
        blob = subprocess.run(["git", "--git-dir", str(mirror), "show", f"{commit}:{path}"], capture_output=True)
        if blob.returncode == 0:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(blob.stdout)
    return True


def source(repo: str, commit: str, network: bool = True) -> pathlib.Path | None:
    """A checkout of `repo` at `commit` (see the module docstring), or None when none can be had;
    `network=False` (the pytest slice) never goes to GitHub."""
    key = repo.replace("/", "+")
    ready = os.environ.get("FLAMBEAU_COMPAT_SRC")
    if ready and (pathlib.Path(ready) / key).is_dir():
        return pathlib.Path(ready) / key
    dest = CACHE / f"{key}-{commit[:12]}"
    if (dest / ".complete").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    mirrors = os.environ.get("FLAMBEAU_COMPAT_MIRRORS")
    mirror = pathlib.Path(mirrors) / key / "repo" if mirrors else None
    if mirror is not None and mirror.is_dir() and _from_mirror(mirror, commit, dest):
        (dest / ".complete").touch()
        return dest
    url = f"https://github.com/{repo}.git"
    if network and (_run_git(["init", "-q"], dest) and _run_git(["fetch", "-q", "--depth", "1", url, commit], dest)
            and _run_git(["checkout", "-q", "FETCH_HEAD"], dest)):
        shutil.rmtree(dest / ".git", ignore_errors=True)
        (dest / ".complete").touch()
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    return None


def _losses(text: str, pattern: str) -> list[float]:
    out = []
    for m in re.findall(pattern, text):
        groups = m if isinstance(m, tuple) else (m,)
        out.append(float(next(g for g in groups if g)))
    return out


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _run(cmd: list[str], cwd: pathlib.Path, timeout_s: int, log: pathlib.Path,
         threads: int | None, extra_env: dict | None = None) -> tuple[int, str, str, float, float]:
    """(exit status, stdout, stderr, wall seconds, CPU seconds); a timeout reads as exit status -9. The program's folder
    is on the path (as `pip install -e .` would put it), then flambeau's repository. `threads` caps
    both systems' OpenMP/BLAS threads alike (fairer timings on a shared machine)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), str(REPO_ROOT)]), PYTHONHASHSEED="0",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    env.update(extra_env or {})
    t0, cpu0 = time.perf_counter(), _children_cpu()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -9, _text(e.stdout), _text(e.stderr) + f"\n[timed out after {timeout_s} s]"
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    log.write_text(out + "\n---- stderr ----\n" + err)
    return rc, out, err, seconds, cpu


def _children_cpu() -> float:
    """User + system CPU seconds of the waited-for child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def run_program(p: Program, logs: pathlib.Path, network: bool = True, threads: int | None = None) -> Outcome:
    """Both systems on fresh copies; the comparison as the module docstring states."""
    sources = {}
    for spec in (f"{p.repo}@{p.commit}", *p.needs):
        repo, commit = spec.split("@")
        sources[repo] = source(repo, commit, network)
        if sources[repo] is None:
            return Outcome(p.name, "skip", f"no source for {repo} (no network and no local copy)")
    runs = {}
    with tempfile.TemporaryDirectory(prefix=f"compat-{p.name}-") as tmp:
        for system, launcher in (("pytorch", [sys.executable]), ("flambeau", [sys.executable, "-m", "flambeau.run"])):
            work = pathlib.Path(tmp) / system
            shutil.copytree(sources[p.repo] / p.folder, work, ignore=shutil.ignore_patterns(".git", ".complete"))
            if p.setup is not None:
                p.setup(work, sources)
            runs[system] = _run([*launcher, p.script, *p.args], work, p.timeout_s, logs / f"{p.name}.{system}.log",
                                threads, p.env)
    (rc_t, out_t, err_t, s_t, c_t), (rc_f, out_f, err_f, s_f, c_f) = runs["pytorch"], runs["flambeau"]
    times = dict(seconds=(s_t, s_f), cpu=(c_t, c_f))
    if rc_t != 0:
        return Outcome(p.name, "skip", f"PyTorch itself failed (rc {rc_t}): {_last_line(err_t or out_t)}", **times)
    if rc_f != 0:
        return Outcome(p.name, "FAIL", f"flambeau rc {rc_f}: {_last_line(err_f or out_f)}", **times)
    if p.output_regex:
        return _compare_output(p, out_t, out_f, times)
    if p.check is not None:
        return _check_both(p, out_t, out_f, times)
    lt, lf = _losses(out_t, p.loss_regex), _losses(out_f, p.loss_regex)
    base = dict(losses=(lt, lf), **times)
    if not lt:
        return Outcome(p.name, "FAIL", "PyTorch's run printed no loss the pattern matches", **base)
    if len(lt) != len(lf):
        return Outcome(p.name, "FAIL", f"{len(lf)} losses under flambeau, {len(lt)} under PyTorch", **base)
    rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(lt, lf))
    status = "pass" if rel <= p.rtol else "FAIL"
    detail = "" if status == "pass" else f"losses differ by {rel:.1%} (tolerance {p.rtol:.0%})"
    return Outcome(p.name, status, detail, exact=rel <= EXACT_RTOL, max_rel=rel, **base)


def _compare_output(p: Program, out_t: str, out_f: str, times: dict) -> Outcome:
    """Generated text compared character for character (same checkpoint, deterministic sampling)."""
    mt, mf = re.search(p.output_regex, out_t), re.search(p.output_regex, out_f)
    if mt is None:
        return Outcome(p.name, "FAIL", "PyTorch's output has no part the pattern matches", **times)
    if mf is None or mf.group(1) != mt.group(1):
        return Outcome(p.name, "FAIL", "generated text differs from PyTorch's", **times)
    return Outcome(p.name, "pass", "identical output", exact=True, max_rel=0.0, **times)


def _check_both(p: Program, out_t: str, out_f: str, times: dict) -> Outcome:
    """Programs whose result is random in both systems (no seed): each run must meet the program's own
    goal, as `p.check` reads it from the output."""
    why_t, why_f = p.check(out_t), p.check(out_f)
    if why_t:
        return Outcome(p.name, "FAIL", f"PyTorch's run failed the check: {why_t}", **times)
    if why_f:
        return Outcome(p.name, "FAIL", f"flambeau's run failed the check: {why_f}", **times)
    return Outcome(p.name, "pass", "checked", **times)
