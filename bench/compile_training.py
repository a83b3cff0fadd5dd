"""flambeau.compile vs eager vs PyTorch (eager and torch.compile) on three CPU workloads, one process.

    python bench/compile_training.py [--rounds 9] [--min-time 0.3] [--only ln,mlp,gpt]

Workloads (issue 4, item 8):
  ln_gelu_tanh  LayerNorm(1024) -> x*1.5+0.1 -> GELU -> tanh on 256x1024 float32, inference (no_grad)
  mlp_train     MLP 3x256 (Linear 256->256 three times, ReLU between), batch 64, one training step:
                cross-entropy forward + backward + AdamW step
  gpt_train     char-level GPT (4 layers, d=128, 4 heads, T=64, batch 16, vocab 65, tied embeddings,
                causal scaled_dot_product_attention, no dropout), one training step with AdamW

Systems: flambeau eager, flambeau.compile (backend "inductor"), PyTorch eager, torch.compile
(default inductor). For the training workloads the compiled function is model forward + loss; its
backward is compiled too (AOT autograd in both libraries); the optimizer step (AdamW with its default foreach choice, the per-tensor loop
on cpu in both libraries) and zero_grad stay eager in all four systems. Every system trains its own copy
of the same initial weights.

Timing: after warm-up, rounds interleave the four systems; in a round each system runs its step
repeatedly for at least --min-time seconds and we record the mean step time; we report the
median over rounds. The machine is shared (2 cores), so ratios matter more than absolute times.

First call: the first call of the compiled step (capture, AOT, decomposition, code generation,
C++ compiler; for torch: Dynamo, AOTAutograd, Inductor) is timed "cold" in this process with fresh,
empty cache directories (FLAMBEAU_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR point to new temporary
directories, set before either library is imported), then "warm" in a new Python process
(spawned with --first-call-only) that reuses the filled cache directories, as a user's second run
of a script would.

OpenMP: PyTorch ships its own libgomp, and once both libraries are loaded our generated kernels
share that OpenMP runtime. libgomp's idle workers spin (default GOMP_SPINCOUNT around 300k
iterations) after each parallel region and starve NumPy's BLAS threads on this 2-core machine.
flambeau alone sets GOMP_SPINCOUNT=10000 before loading libgomp; so that this comparison runs both
libraries under the same setting, this script sets GOMP_SPINCOUNT=10000 in its environment
before importing either library (unless already set; the value used is reported in the first JSON
line). This applies to PyTorch eager and torch.compile too.

OpenBLAS: NumPy's BLAS (OpenBLAS, used by flambeau's matrix products, eager and compiled) keeps its
worker threads spinning for about 2^28 cycles (~0.1 s) after every call. Between the extern matrix
products of a compiled graph, that spinning worker occupies one of the two cores while the
generated OpenMP kernels want both, and the kernels run up to twice as slowly. This script sets
OPENBLAS_THREAD_TIMEOUT=4 (the shortest spin OpenBLAS allows; read once when NumPy loads) before
importing NumPy, unless already set; the value is reported in the config line. PyTorch uses MKL,
not OpenBLAS, so the setting only concerns flambeau (eager and compiled). Run with
OPENBLAS_THREAD_TIMEOUT=28 to see the default behaviour.

malloc: this script opts in (FLAMBEAU_TUNE_MALLOC=1, unless set; reported in the config line) to
flambeau's inductor raising glibc's mmap and trim thresholds for the whole process at its first
compile (flambeau._inductor.config.tune_malloc, off by default because it is process-wide), so that
freed buffers are reused instead of being returned to the kernel and faulted in again on the next
step. The first calls (compiles) run before the timing rounds, so all four systems, flambeau eager
and PyTorch included, are timed with that setting (it makes flambeau eager faster, i.e. the
compiled/eager ratio more conservative). Run with FLAMBEAU_TUNE_MALLOC=0 to see the default.

Output: one JSON object per line (config, first calls, one line per workload and system, one
"summary" line per workload with the ratios).
"""
from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("GOMP_SPINCOUNT", "10000")     # before torch or flambeau loads libgomp (see docstring)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")   # before NumPy loads OpenBLAS (see docstring)
os.environ.setdefault("FLAMBEAU_TUNE_MALLOC", "1")      # before flambeau reads its config (see docstring)
if "--first-call-only" not in sys.argv:
    _CACHE_ROOT = tempfile.mkdtemp(prefix="compile_training_")
    os.environ["FLAMBEAU_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "flambeau")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "torchinductor")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import measure  # noqa: E402
from bench.small_gpt import small_gpt  # noqa: E402

import torch  # noqa: E402

import flambeau  # noqa: E402


# ---- models, written once against either library -------------------------------------------------
def ln_model(m):
    F = m.nn.functional

    class LnGeluTanh(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = m.nn.LayerNorm(1024)

        def forward(self, x):
            return F.gelu(self.ln(x) * 1.5 + 0.1).tanh()
    return LnGeluTanh()


def mlp_model(m):
    return m.nn.Sequential(m.nn.Linear(256, 256), m.nn.ReLU(), m.nn.Linear(256, 256), m.nn.ReLU(),
                           m.nn.Linear(256, 256))


def gpt_model(m, vocab=65, d=128, heads=4, layers=4, block=64):
    """bench/small_gpt.py's GPT with its head tied to the token embedding, that embedding scaled as nanoGPT's."""
    model = small_gpt(m, vocab=vocab, d=d, heads=heads, layers=layers, block=block, tied_head=True)
    with m.no_grad():
        model.tok.weight.mul_(0.02)
    return model


def _copy_weights(src, dst):
    """Copy a flambeau module's state into the same torch module (names match by construction)."""
    sd = {k: torch.from_numpy(np.array(v.detach().numpy())) for k, v in src.state_dict().items()}
    dst.load_state_dict(sd)


class Workload:
    """Builds one workload for one library: `step()` runs one inference call or training step."""

    def __init__(self, name, m, compiled, seed=0):
        self.name, self.m = name, m
        rng = np.random.default_rng(seed)
        flambeau.manual_seed(seed)
        build = {"ln_gelu_tanh": ln_model, "mlp_train": mlp_model, "gpt_train": gpt_model}[name]
        ref = build(flambeau)
        if m is flambeau:
            model = copy.deepcopy(ref)
        else:
            model = build(torch)
            _copy_weights(ref, model)
        self.model = model
        if name == "ln_gelu_tanh":
            model.ln.weight.data.copy_(m.tensor(rng.standard_normal(1024).astype(np.float32)))
            self.x = m.tensor(rng.standard_normal((256, 1024)).astype(np.float32))
            self.fn = m.compile(model) if compiled else model
            self.train = False
            return
        if name == "mlp_train":
            self.x = m.tensor(rng.standard_normal((64, 256)).astype(np.float32))
            self.y = m.tensor(rng.integers(0, 256, size=64))
        else:
            data = rng.integers(0, 65, size=(16, 65))
            self.x = m.tensor(data[:, :-1].copy())
            self.y = m.tensor(data[:, 1:].copy())
        F = m.nn.functional

        def loss_fn(x, y):
            logits = model(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.fn = m.compile(loss_fn) if compiled else loss_fn
        self.opt = m.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)   # each library's default path
        self.train = True

    def step(self):
        if not self.train:
            with self.m.no_grad():
                return self.fn(self.x)
        self.opt.zero_grad(set_to_none=True)
        loss = self.fn(self.x, self.y)
        loss.backward()
        self.opt.step()
        return loss


WORKLOADS = {"ln": "ln_gelu_tanh", "mlp": "mlp_train", "gpt": "gpt_train"}
SYSTEMS = (("flambeau-eager", flambeau, False), ("flambeau-compile", flambeau, True),
           ("torch-eager", torch, False), ("torch-compile", torch, True))


def first_call(name, m):
    """(seconds of the first compiled step, the workload) for library m."""
    w = Workload(name, m, compiled=True)
    t0 = time.perf_counter()
    out = w.step()
    float(out.sum() if not w.train else out)
    return time.perf_counter() - t0, w


def mean_step_time(fn, min_time):
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            return t / n
        n = max(n * 2, int(n * min_time / max(t, 1e-9)) + 1)


def first_call_only(names):
    """Child process: warm first-call times (cache directories already filled by the parent)."""
    for name in names:
        for label, m in (("flambeau-compile", flambeau), ("torch-compile", torch)):
            t, _ = first_call(name, m)
            print(json.dumps({"workload": name, "system": label, "warm_first_call_s": round(t, 4)}), flush=True)


def warm_first_calls(names) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--first-call-only", "--only",
                        ",".join(k for k, v in WORKLOADS.items() if v in names)],
                       capture_output=True, text=True, env=dict(os.environ))
    if r.returncode != 0:
        raise RuntimeError(f"warm first-call process failed:\n{r.stderr[-4000:]}")
    out = {}
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        out[(rec["workload"], rec["system"])] = rec["warm_first_call_s"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--only", default="ln,mlp,gpt")
    ap.add_argument("--first-call-only", action="store_true")
    opts = ap.parse_args()
    names = [WORKLOADS[k] for k in opts.only.split(",")]
    warnings.simplefilter("ignore")
    if opts.first_call_only:
        first_call_only(names)
        return
    print(json.dumps({"config": True, "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT"),
                      "OPENBLAS_THREAD_TIMEOUT": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                      "FLAMBEAU_TUNE_MALLOC": os.environ.get("FLAMBEAU_TUNE_MALLOC"),
                      "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "rounds": opts.rounds, "min_time_s": opts.min_time,
                      "optimizer": "AdamW (default foreach choice: the per-tensor loop on cpu), eager in every system"}), flush=True)
    try:
        measure(names, opts)
    finally:
        shutil.rmtree(_CACHE_ROOT, ignore_errors=True)


def measure(names, opts):
    runs, cold = {}, {}
    for name in names:
        for label, m, compiled in SYSTEMS:
            if compiled:
                cold[(name, label)], runs[(name, label)] = first_call(name, m)
            else:
                runs[(name, label)] = Workload(name, m, compiled=False)
    warm = warm_first_calls(names)
    for name in names:
        systems = {label: runs[(name, label)] for label, _, _ in SYSTEMS}
        first_losses = {k: (None if not w.train else round(float(w.step()), 5)) for k, w in systems.items()}
        for w in systems.values():
            w.step()
        times, med = measure.interleaved_rounds(systems, opts.rounds, lambda s: mean_step_time(s.step, opts.min_time))
        for k, v in med.items():
            rec = {"workload": name, "system": k, "step_ms": round(v * 1e3, 3),
                   "min_ms": round(min(times[k]) * 1e3, 3), "vs_torch_eager": round(v / med["torch-eager"], 3)}
            if first_losses[k] is not None:
                rec["loss_before_timing"] = first_losses[k]
            if (name, k) in cold:
                rec["first_call_cold_s"] = round(cold[(name, k)], 3)
                rec["first_call_warm_s"] = round(warm[(name, k)], 3)
            print(json.dumps(rec), flush=True)
        print(json.dumps({
            "workload": name, "summary": True,
            "flambeau_compile_speedup_over_flambeau_eager": round(med["flambeau-eager"] / med["flambeau-compile"], 2),
            "flambeau_compile_time_over_torch_eager": round(med["flambeau-compile"] / med["torch-eager"], 2),
            "torch_compile_time_over_torch_eager": round(med["torch-compile"] / med["torch-eager"], 2),
            "first_call_cold_s": {"flambeau": round(cold[(name, "flambeau-compile")], 2),
                                  "torch": round(cold[(name, "torch-compile")], 2)},
            "first_call_warm_s": {"flambeau": round(warm[(name, "flambeau-compile")], 2),
                                  "torch": round(warm[(name, "torch-compile")], 2)}}), flush=True)


if __name__ == "__main__":
    main()
