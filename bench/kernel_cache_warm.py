"""Time to build a compiled GPT training step's Triton kernels for sm_90 in a cold and a warm process, on a
machine without a GPU (issue 13's warm first step): the generated modules of a small GPT step (forward and
backward, bf16 autocast) and flambeau's fused AdamW kernel are loaded as a cuda launch would, CuPy's module
loading replaced by a recorder, Triton's compiler real (it compiles for sm_90 without a GPU).

`python3 bench/kernel_cache_warm.py [--layers 4] [--runs 3] [--trees A B ...]`: for each tree (a flambeau
checkout, run with PYTHONPATH=tree), one process with fresh FLAMBEAU_CACHE_DIR/TRITON_CACHE_DIR (cold), then
`--runs` processes on the same directories (warm). Prints one JSON line per process: the seconds to build
the kernels (loading the modules, every kernel's cubin, the AdamW kernel), kernels compiled by
`triton.compile`, `@triton.jit` functions made. `--child` is one such process."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(layers: int) -> dict:
    import flambeau as fl
    import triton
    from triton.runtime import jit as triton_jit

    from bench import gpu_models
    from bench.fake_cuda_loader import generating_compile_fx, loader_cupy
    from flambeau import _inductor
    from flambeau._backends import triton_adam, triton_launch as TL
    from flambeau._inductor import config, triton_runtime

    config.compile_threads = 1
    generated = []
    _inductor.compile_fx = generating_compile_fx(generated)
    fl.manual_seed(0)
    model = fl.compile(gpu_models.gpt(fl, vocab=64, block=16, d=32, layers=layers, heads=2))
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(fl.randint(0, 64, (2, 16)), fl.randint(0, 64, (2, 16)))
    loss.backward()
    Cupy = loader_cupy()
    triton_runtime._cupy = TL._cupy = lambda: Cupy
    TL.current_device = lambda: 0
    if hasattr(TL, "_capability"):
        TL._capability = lambda: 90
    else:                                   # trees before the cubin cache
        from triton.backends.compiler import GPUTarget
        TL._target = lambda: GPUTarget("cuda", 90, 32)
    counts = {"triton_compile": 0, "jit_functions": 0}
    real_compile, real_init = triton.compile, triton_jit.JITFunction.__init__

    def counting_compile(*a, **k):
        counts["triton_compile"] += 1
        return real_compile(*a, **k)

    def counting_init(self, *a, **k):
        counts["jit_functions"] += 1
        real_init(self, *a, **k)
    triton.compile, triton_jit.JITFunction.__init__ = counting_compile, counting_init
    sig = triton_adam.SIGNATURE
    const = dict(CHUNK=triton_adam.CHUNK, BLOCK=triton_adam.BLOCK, AMSGRAD=False, MAXIMIZE=False, DECOUPLED=True,
                 LR_ON_DEVICE=False, ALIGNED=True)

    class Sm90:
        type = "cuda"
    dev = Sm90()
    triton_runtime.device_key = lambda d: "sm90"
    n = 0
    t0 = time.perf_counter()
    for source, launches in generated:
        mod, _ = triton_runtime.load_module(source, dev)
        for la in launches.values():
            while la is not None:
                ref = mod.kernel(la.name) if hasattr(mod, "kernel") else getattr(mod, la.name)
                triton_runtime.load_or_compile(ref, la.signature(), la.constexprs, la.num_warps,
                                               triton_runtime._arg_names(la), "sm90")
                n, la = n + 1, la.then
    TL.compile_kernel(triton_adam._adam_chunks, sig, const, num_warps=triton_adam.NUM_WARPS, num_stages=1)
    build = time.perf_counter() - t0
    return {"build_s": round(build, 4), "kernels": n + 1, **counts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trees", nargs="+", default=[os.path.dirname(HERE)])
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.layers)), flush=True)
        return
    for tree in a.trees:
        cache = tempfile.mkdtemp(prefix="flambeau-kcache-")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(PYTHONPATH=tree, FLAMBEAU_CACHE_DIR=os.path.join(cache, "fl"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        warm = []
        for i in range(a.runs + 1):
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--layers", str(a.layers)],
                               env=env, capture_output=True, text=True, cwd=tree)
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            row = {"tree": tree, "run": "cold" if i == 0 else "warm", **json.loads(r.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            if i:
                warm.append(row["build_s"])
        print(json.dumps({"tree": tree, "warm_median_s": statistics.median(warm)}), flush=True)


if __name__ == "__main__":
    main()
