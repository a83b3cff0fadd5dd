"""pytorch/examples' distributed scripts, unmodified, on the GPUs of one host: each under flambeau
(`python -m flambeau.distributed.run`, `import torch` aliased; `python -m flambeau.run` for a script that
spawns its own processes) and under PyTorch (`python -m torch.distributed.run`), side by side. Prints one
JSON line per run: script, arguments, system, exit code, whether it ran (a script finding too few GPUs exits
0 saying so: `ran` false), seconds, the last line of its output and its first error line.

    python3 bench/distributed_examples.py --examples DIR [--nproc 2] [--systems flambeau,torch] [--timeout 120]

DIR is a checkout of pytorch/examples at tests/compat/programs.py's EXAMPLES commit (its `distributed/`
folder is enough). Each system runs in a copy of each folder, so the FSDP2 example's second and later runs
load the checkpoints its earlier runs saved (`checkpoints/dtensor_api`, `checkpoints/dcp_api`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (folder under distributed/, script, arguments, how it starts its processes: "launcher" or "self")
RUNS = [
    ("FSDP2", "example.py", [], "launcher"),
    ("FSDP2", "example.py", [], "launcher"),                           # loads the first run's checkpoint
    ("FSDP2", "example.py", ["--mixed-precision"], "launcher"),
    ("FSDP2", "example.py", ["--explicit-prefetching"], "launcher"),
    ("FSDP2", "example.py", ["--dcp-api"], "launcher"),
    ("FSDP2", "example.py", ["--dcp-api", "--mixed-precision"], "launcher"),
    ("ddp", "example.py", [], "launcher"),
    ("ddp-tutorial-series", "multigpu_torchrun.py", ["4", "2"], "launcher"),
    ("ddp-tutorial-series", "multigpu.py", ["4", "2"], "self"),        # torch.multiprocessing.spawn
    ("tensor_parallelism", "tensor_parallel_example.py", [], "launcher"),
    ("tensor_parallelism", "sequence_parallel_example.py", [], "launcher"),
    ("tensor_parallelism", "fsdp_tp_example.py", [], "launcher"),     # needs 4 GPUs: exits saying so on 2
]


def command(system: str, how: str, nproc: int, script: str, args: list) -> list:
    if how == "self":
        return [sys.executable, "-m", "flambeau.run", script, *args] if system == "flambeau" else \
            [sys.executable, script, *args]
    if system == "flambeau":
        return [sys.executable, "-m", "flambeau.distributed.run", "--nproc-per-node", str(nproc), script, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), script, *args]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", required=True, help="a pytorch/examples checkout")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--systems", default="flambeau,torch")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="dist-examples-")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    try:
        for system in args.systems.split(","):
            for folder, script, sargs, how in RUNS:
                cwd = os.path.join(work, system, folder)
                if not os.path.isdir(cwd):
                    shutil.copytree(os.path.join(args.examples, "distributed", folder), cwd)
                t0 = time.monotonic()
                try:
                    out = subprocess.run(command(system, how, args.nproc, script, sargs), cwd=cwd, env=env,
                                         capture_output=True, text=True, timeout=args.timeout)
                    rc, text = out.returncode, out.stdout + out.stderr
                except subprocess.TimeoutExpired as e:
                    rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                        else (e.stdout or "")
                errors = [ln for ln in text.splitlines() if "Error" in ln and not ln.lstrip().startswith("^")]
                skipped = "Unable to locate sufficient" in text        # the script's own GPU-count check
                print(json.dumps({"script": f"{folder}/{script}", "args": sargs, "system": system, "rc": rc,
                                  "ran": not skipped,
                                  "seconds": round(time.monotonic() - t0, 1),
                                  "last_line": (text.strip().splitlines() or [""])[-1][:200],
                                  "first_error": errors[0][:300] if rc != 0 and errors else None}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
