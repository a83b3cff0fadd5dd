"""The compile part of a cold first compiled training step for cuda, timed on a machine without a GPU (issue 13):
the bench MLP (gpu_models.mlp, B 64, bf16 autocast) or a small GPT is traced, partitioned and lowered to Triton
as for cuda, each graph's kernels compiled for sm_90 by the compile workers (`triton_runtime`), and loaded in
launch order as its first call would (CuPy's module loading replaced by a recorder, Triton's compiler real);
then flambeau's fused AdamW kernel, which the first optimizer step compiles. The graphs themselves run on the
CPU (not timed apart). Each run is a fresh process with fresh FLAMBEAU_CACHE_DIR/TRITON_CACHE_DIR.

`python3 bench/cold_compile_cpu.py [--model mlp|gpt] [--runs 3] [--trees A B ...]`: one JSON line per process:
step_s (the step: trace, compile, wait for kernels, the eager CPU run of the graphs), and a timeline in
seconds from the step's start (fwd/bwd: compile_fx entered, lowered and generated, every kernel loaded),
kernels compiled in workers and in the process. `--warm` runs every process after the first on the same
cache directories (of its tree). Rounds interleave the trees."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(model_name: str) -> dict:
    import numpy as np

    import flambeau as fl
    from bench import gpu_models
    from flambeau import _inductor
    from flambeau._inductor import codegen_triton, pad_mm, triton_schedule
    from flambeau._inductor.compile_fx import _size_names
    from flambeau._inductor.graph import GraphLowering
    from flambeau._inductor.scheduler import Kernel, schedule

    class Sm90:
        type = "cuda"
    dev = Sm90()
    marks = {}
    t0 = [0.0]
    n_graph = [0]

    def mark(name):
        marks[name] = round(time.perf_counter() - t0[0], 3)

    def compile_for_sm90(gm, example_inputs, **kwargs):
        """compile_fx's Triton path for a cuda device, then every kernel loaded as the first call loads them."""
        from flambeau._inductor import triton_runtime as rt
        _fake_cupy(rt)
        g = "fwd" if n_graph[0] == 0 else f"g{n_graph[0]}"
        n_graph[0] += 1
        mark(f"{g}_enter")
        if hasattr(rt, "begin_cuda_compile"):
            rt.begin_cuda_compile(dev)
            rt.compile_worker._key[0].add_done_callback(lambda f: marks.get("triton_key") or mark("triton_key"))
        else:
            rt.prestart_workers()
        pad_mm.pad_matrix_products(gm)
        graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
        order = triton_schedule.split_for_grid(schedule(graph), graph)
        kernels = [k for k in order if isinstance(k, Kernel)]
        source, launches = codegen_triton.generate(kernels, _size_names(graph))
        mod, _ = rt.load_module(source, dev)
        rt.precompile(mod, [launches[k.name] for k in kernels], dev)
        mark(f"{g}_lowered")
        for k in kernels:
            la = launches[k.name]
            while la is not None:
                rt.load_or_compile(mod.kernel(la.name), la.signature(), la.constexprs, la.num_warps,
                                   rt._arg_names(la), "sm90")
                la = la.then
        mark(f"{g}_loaded")
        marks[f"{g}_kernels"] = len(kernels)
        return _zeros_like_outputs(gm)

    _inductor.compile_fx = compile_for_sm90
    fl.manual_seed(0)
    if model_name == "mlp":
        model = fl.compile(gpu_models.mlp(fl))
        rng = np.random.default_rng(0)
        x, y = fl.tensor(rng.standard_normal((64, 256)).astype(np.float32)), fl.tensor(rng.integers(0, 256, 64))
    else:
        model = fl.compile(gpu_models.gpt(fl, vocab=64, block=16, d=32, layers=2, heads=2))
        x, y = fl.randint(0, 64, (2, 16)), fl.randint(0, 64, (2, 16))
    t0[0] = time.perf_counter()
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(x, y)
    loss.backward()
    mark("backward_done")
    _compile_adam()
    mark("adam_loaded")
    step = time.perf_counter() - t0[0]
    from flambeau._backends import triton_launch as TL
    from flambeau._inductor import triton_runtime as rt
    return {"step_s": round(step, 3), **marks, "in_workers": rt.stats["compiled_in_workers"],
            "in_process": rt.stats["compiled"] + TL.stats["compiled"], "cache_hits": rt.stats["cubin_cache_hits"],
            "worker_jobs": [(n, s, w[-2:], round(t - t0[0], 3)) for n, s, w, t in getattr(rt, "compile_times", [])]}


def _zeros_like_outputs(gm):
    """A stand-in for the compiled graph: zeros of its outputs' shapes and dtypes (running the graph on the CPU
    in bfloat16 would take seconds, which the GPU does not spend)."""
    import flambeau as fl
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    vals = [None if n is None else n.meta["val"] for n in out]

    def run(*args):
        return [None if v is None else fl.zeros(tuple(v.shape), dtype=v.dtype) for v in vals]
    return run


def _compile_adam():
    """The fused AdamW kernel as the first optimizer step on an sm_90 device compiles it (CuPy faked)."""
    from flambeau._backends import triton_adam, triton_launch as TL
    TL.current_device = lambda: 0
    TL._capability = lambda: 90
    const = dict(CHUNK=triton_adam.CHUNK, BLOCK=triton_adam.BLOCK, AMSGRAD=False, MAXIMIZE=False, DECOUPLED=True,
                 LR_ON_DEVICE=False, ALIGNED=True)
    TL.compile_kernel(triton_adam._adam_chunks, triton_adam.SIGNATURE, const, num_warps=triton_adam.NUM_WARPS,
                      num_stages=1)


def _fake_cupy(rt):
    """The kernel loader's CuPy (module load, function lookup, attribute set) as recorders; device "sm90"."""
    from flambeau._backends import triton_launch as TL
    from bench.fake_cuda_loader import loader_cupy
    Cupy = loader_cupy()
    rt._cupy = TL._cupy = lambda: Cupy
    rt.device_key = lambda d: "interpret" if d.type == "cpu" else "sm90"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model", default="mlp", choices=("mlp", "gpt"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--trees", nargs="+", default=[os.path.dirname(HERE)])
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.model)), flush=True)
        return
    steps = {tree: [] for tree in a.trees}
    caches: dict = {}
    for i in range(a.runs):                 # rounds interleave the trees (the box's load moves)
        for tree in a.trees:
            if tree not in caches or not a.warm:
                caches[tree] = tempfile.mkdtemp(prefix="flambeau-cold-")
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            env.update(PYTHONPATH=tree, FLAMBEAU_CACHE_DIR=os.path.join(caches[tree], "fl"),
                       TRITON_CACHE_DIR=os.path.join(caches[tree], "triton"))
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--model", a.model],
                               env=env, capture_output=True, text=True, cwd=tree)
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            row = {"tree": tree, "run": i, **json.loads(r.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            steps[tree].append(row["step_s"])
    for tree in a.trees:
        print(json.dumps({"tree": tree, "model": a.model, "median_step_s": statistics.median(steps[tree]),
                          "runs": steps[tree], "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
