"""cProfile of the first compiled training step of a bench/gpu_train.py workload on cuda, with cold
caches (fresh FLAMBEAU_CACHE_DIR / TRITON_CACHE_DIR set by the caller): where the first step's
seconds go (issue 13's first-step target). `python3 bench/first_step_profile.py mlp [ROWS]`"""
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    import flambeau
    from bench import gpu_models, gpu_train
    name = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    spec = gpu_train.WORKLOADS[name]
    model = flambeau.compile(spec["build"](flambeau).to("cuda"))
    xs, ys = spec["batch"](np.random.default_rng(0))
    x, y = flambeau.tensor(xs, device="cuda"), flambeau.tensor(ys, device="cuda")
    opt = flambeau.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    gpu_models.train_step(flambeau, model, opt, x, y, flambeau.bfloat16)
    flambeau.cuda.synchronize()
    prof.disable()
    print(f"== {name}: first compiled step {time.perf_counter() - t0:.2f} s (profiled)", flush=True)
    _worker_summary(t0)
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(rows)
    st.sort_stats("tottime").print_stats(rows // 2)


def _worker_summary(t0: float) -> None:
    """The compile workers' jobs of the step: how many, their seconds, when the first and last were done."""
    import sys as _sys
    rt = _sys.modules.get("flambeau._inductor.triton_runtime")
    times = getattr(rt, "compile_times", None) if rt is not None else None
    if not times:
        print("== compile workers: no job", flush=True)
        return
    done = sorted(t - t0 for _, _, _, t in times)
    secs = sorted(s for _, s, _, _ in times)
    print(f"== compile workers: {len(times)} kernels in {len({w for _, _, w, _ in times})} workers, "
          f"{sum(secs):.2f} s of compiling (median {secs[len(secs) // 2]:.3f} s, max {secs[-1]:.3f} s), "
          f"first done at {done[0]:.2f} s, last at {done[-1]:.2f} s of the step", flush=True)


if __name__ == "__main__":
    main()
