"""bfloat16 on the CPU, compiled, and the fused CPU attention kernel, against PyTorch in one process.

    python bench/cpu_lowp.py [--only gpt,sdpa] [--rounds 7] [--min-time 0.3]

gpt: the char-level GPT of bench/compile_training.py (4 layers, d=128, 4 heads, T=64, batch 16,
causal scaled_dot_product_attention, tied embeddings), one training step (compiled forward + loss +
backward, eager AdamW step), in four systems: flambeau.compile and torch.compile, each in float32
and under torch.autocast("cpu", dtype=bfloat16). Every system trains its own copy of the same
weights. Reports the median step time over rounds (systems interleaved) and the ratios
bf16/fp32 (target: not slower) and flambeau/torch in bf16.

sdpa: scaled_dot_product_attention at T=2048, head dim 64 (batch 1, 8 heads, float32, causal and
not): flambeau's fused CPU kernel (eager call) vs PyTorch's CPU flash attention, forward and
forward+backward; and flambeau's peak extra memory (tracemalloc: the kernels' workspace is a NumPy
array) at T=2048 and T=4096 (O(T): the ratio is about 2; the score matrix would be 16 MiB per head at
2048).

The environment settings of bench/compile_training.py apply (GOMP_SPINCOUNT, OPENBLAS_THREAD_TIMEOUT,
FLAMBEAU_TUNE_MALLOC, fresh compile caches): it is imported first. Output: JSON lines.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import compile_training as CT  # noqa: E402  (sets the environment before the libraries load)
from bench import measure  # noqa: E402

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flambeau  # noqa: E402
from flambeau._dynamo.utils import counters  # noqa: E402

CPU_EXTENSIONS = ("avx512f", "avx512_bf16", "amx_bf16", "f16c", "avx512_fp16")   # reported in the config line


class GptStep:
    """One compiled training step of the char GPT in library m, float32 or autocast bfloat16."""

    def __init__(self, m, ref, bf16: bool):
        self.m = m
        model = copy.deepcopy(ref) if m is flambeau else CT.gpt_model(torch)
        if m is torch:
            CT._copy_weights(ref, model)
        data = np.random.default_rng(0).integers(0, 65, size=(16, 65))
        self.x, self.y = m.tensor(data[:, :-1].copy()), m.tensor(data[:, 1:].copy())
        F = m.nn.functional

        def loss_fn(x, y):
            with m.autocast(device_type="cpu", dtype=m.bfloat16, enabled=bf16):
                logits = model(x)
            return F.cross_entropy(logits.float().reshape(-1, 65), y.reshape(-1))
        self.fn = m.compile(loss_fn)
        self.opt = m.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.fn(self.x, self.y)
        loss.backward()
        self.opt.step()
        return loss


def gpt(opts):
    flambeau.manual_seed(0)
    ref = CT.gpt_model(flambeau)
    systems = {}
    for label, m in (("flambeau", flambeau), ("torch", torch)):
        for prec in ("fp32", "bf16"):
            t0 = time.perf_counter()
            w = GptStep(m, ref, prec == "bf16")
            loss = float(w.step())
            systems[f"{label}-compile-{prec}"] = w
            print(json.dumps({"workload": "gpt_train", "system": f"{label}-compile-{prec}",
                              "first_call_s": round(time.perf_counter() - t0, 2), "first_loss": round(loss, 4)}),
                  flush=True)
    fallbacks = dict(counters["inductor_fallbacks"])
    times, med = measure.interleaved_rounds(systems, opts.rounds, lambda s: CT.mean_step_time(s.step, opts.min_time))
    for k, v in med.items():
        print(json.dumps({"workload": "gpt_train", "system": k, "step_ms": round(v * 1e3, 2),
                          "min_ms": round(min(times[k]) * 1e3, 2)}), flush=True)
    print(json.dumps({"workload": "gpt_train", "summary": True, "flambeau_fallbacks": fallbacks,
                      "flambeau_bf16_over_fp32": round(med["flambeau-compile-bf16"] / med["flambeau-compile-fp32"], 3),
                      "torch_bf16_over_fp32": round(med["torch-compile-bf16"] / med["torch-compile-fp32"], 3),
                      "flambeau_over_torch_bf16": round(med["flambeau-compile-bf16"] / med["torch-compile-bf16"], 3),
                      "flambeau_over_torch_fp32": round(med["flambeau-compile-fp32"] / med["torch-compile-fp32"], 3)}),
          flush=True)


def _sdpa_inputs(m, T, grad):
    rng = np.random.default_rng(0)
    return [m.tensor(rng.standard_normal((1, 8, T, 64)).astype(np.float32)).requires_grad_(grad) for _ in range(3)]


def _peak_extra_bytes(T, causal, backward):
    q, k, v = _sdpa_inputs(flambeau, T, backward)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    out = flambeau.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if backward:
        out.backward(flambeau.ones_like(out))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def sdpa(opts):
    T = 2048
    for causal in (False, True):
        for backward in (False, True):
            fns = {}
            for label, m in (("flambeau", flambeau), ("torch", torch)):
                q, k, v = _sdpa_inputs(m, T, backward)
                g = m.ones(1, 8, T, 64)

                def run(m=m, q=q, k=k, v=v, g=g):
                    out = m.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    if backward:
                        out.backward(g)
                    return out
                run()
                fns[label] = run
            times, med = measure.interleaved_rounds(fns, opts.rounds, lambda s: CT.mean_step_time(s, opts.min_time))
            print(json.dumps({"workload": "sdpa", "T": T, "head_dim": 64, "batch_heads": 8, "causal": causal,
                              "backward": backward, "flambeau_ms": round(med["flambeau"] * 1e3, 2),
                              "torch_ms": round(med["torch"] * 1e3, 2),
                              "flambeau_over_torch": round(med["flambeau"] / med["torch"], 3)}), flush=True)
    for backward in (False, True):
        peaks = {n: _peak_extra_bytes(n, True, backward) for n in (2048, 4096)}
        print(json.dumps({"workload": "sdpa_peak_extra_memory", "backward": backward, "heads": 8,
                          **{f"T{n}_MiB": round(p / 2 ** 20, 2) for n, p in peaks.items()},
                          "ratio_4096_over_2048": round(peaks[4096] / peaks[2048], 2),
                          "one_score_matrix_MiB_T2048": 16.0}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--only", default="gpt,sdpa")
    opts = ap.parse_args()
    warnings.simplefilter("ignore")
    print(json.dumps({"config": True, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "rounds": opts.rounds, "min_time_s": opts.min_time,
                      "cpu_has": measure.cpu_has(CPU_EXTENSIONS)}), flush=True)
    try:
        if "gpt" in opts.only:
            gpt(opts)
        if "sdpa" in opts.only:
            sdpa(opts)
    finally:
        shutil.rmtree(CT._CACHE_ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
