"""The compile part of a first compiled GPT training step under mode="max-autotune", for sm_90 on a machine
without a GPU (issue 13: the first max-autotune step). A small GPT step (forward and backward, bf16 autocast) is
compiled as compile_fx does for cuda under `config.max_autotune` (matrix-product templates, autotuned Launchers,
the compile workers started by `precompile`), Triton's compiler real, CuPy's module loading, events and launches
replaced by recorders; then every compiled kernel is called once as the first step would (each autotuned kernel
and template builds its candidates and "times" them against fake CUDA events). Nothing runs on a GPU: what is
measured is the host's part, compiling, which the GPU host spends on the same kernels.

`python3 bench/max_autotune_compile_cpu.py [--layers 1] [--runs 3] [--trees A B ...]`: for each tree (a flambeau
checkout, PYTHONPATH=tree), `--runs` processes, each with no cubin or autotuning result cached and a fresh
TRITON_CACHE_DIR (cold; the eager CPU kernels' C++ is kept from an uncounted warm-up process). One JSON
line per process: seconds of the model's trace+compile and of the first calls, kernels compiled in this process and
in workers, gc-tracked objects after it and the seconds of a full gc.collect(); then the median per tree.
`--child` is one such process; `--profile N` prints a cProfile (N rows) of the child."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _fakes(TL, triton_runtime, mm_template):
    """CuPy as the runtime uses it on cuda, recorded: module loads, events (each timing a fixed 1 ms, so the
    first candidate wins), a stream that is not capturing; launches recorded by count; the extern product of
    a template does nothing (cuBLASLt is not here)."""
    from bench.fake_cuda_loader import Event, Stream, loader_cupy
    launches = [0]
    Cupy = loader_cupy()
    Cupy.cuda.Event = Event
    Cupy.cuda.get_current_stream = staticmethod(lambda: Stream())
    Cupy.cuda.get_elapsed_time = staticmethod(lambda a, b: 1.0)
    Cupy.empty = staticmethod(lambda n, dtype: triton_runtime.RawPointer(1 << 20))     # scratch arrays
    triton_runtime._cupy = TL._cupy = lambda: Cupy

    def launch(*a):
        launches[0] += 1
    TL._driver[:] = [launch, lambda: 0]
    TL.current_device = lambda: 0
    TL._capability = lambda: 90
    triton_runtime.device_key = lambda d: "sm90" if d.type == "cuda" else "interpret"
    mm_template.extern_product = lambda tk, device: (lambda arrays, out: out if out is not None else
                                                           triton_runtime.RawPointer(2 << 20))
    return launches


def child(layers: int, d: int, profile: int) -> dict:
    import gc

    import flambeau as fl
    from bench import gpu_models
    from flambeau import _inductor
    from flambeau._backends import triton_launch as TL
    from flambeau._inductor import codegen_triton, config, mm_template, pad_mm, triton_runtime, triton_schedule
    from flambeau._inductor.compile_fx import _size_names
    from flambeau._inductor.graph import GraphLowering
    from flambeau._inductor.scheduler import Kernel, schedule

    launches = _fakes(TL, triton_runtime, mm_template)
    config.max_autotune = not os.environ.get("MAT_DEFAULT")     # MAT_DEFAULT=1: the default mode, to compare

    class Sm90:
        type = "cuda"
    dev = Sm90()
    calls = []                      # (callable, number of arguments) of every compiled kernel

    def sm90_max_autotune_compile_fx(gm, example_inputs, **kwargs):
        """compile_fx's Triton branch for a cuda graph under max_autotune, up to the kernels' callables."""
        triton_runtime.begin_cuda_compile(dev)
        pad_mm.pad_matrix_products(gm)
        graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
        order = triton_schedule.split_for_grid(schedule(graph), graph, interpret=False)
        if config.max_autotune:
            order = mm_template.fuse_products(order, graph)
        kernels = [k for k in order if isinstance(k, Kernel)]
        source, lmap = mm_template.generate_module(kernels, _size_names(graph), interpret=False)
        mod, _ = triton_runtime.load_module(source, dev)
        for k in kernels:
            if isinstance(k, mm_template.TemplateKernel):
                tc = mm_template.launcher(triton_runtime, mod, k, lmap, dev)
                calls.append((tc, len(k.loads) + len(k.stores) + (1 if tc.error_flag else 0)))
            else:
                la = triton_runtime.Launcher(mod, lmap[k.name], dev, config.max_autotune)
                calls.append((la, la.n_bufs + (1 if la.error_flag else 0) + len(la.size_names)))
        triton_runtime.precompile(mod, mm_template.all_launches(kernels, lmap), dev)
        return gm
    _inductor.compile_fx = sm90_max_autotune_compile_fx
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    fl.manual_seed(0)
    t0 = time.perf_counter()
    model = fl.compile(gpu_models.gpt(fl, vocab=50257, block=128, d=d, layers=layers, heads=max(1, d // 64)))
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(fl.randint(0, 50257, (2, 128)), fl.randint(0, 50257, (2, 128)))
    loss.backward()
    t1 = time.perf_counter()
    for fn, n in calls:             # the first step's first call of each kernel (addresses 16-byte aligned)
        fn(*[triton_runtime.RawPointer(4096 * (i + 1)) for i in range(n)])
    t2 = time.perf_counter()
    if prof is not None:
        import pstats
        prof.disable()
        st = pstats.Stats(prof, stream=sys.stderr)
        st.sort_stats("cumulative").print_stats(profile)
        st.sort_stats("tottime").print_stats(profile // 2)
    objects = gc.get_objects()
    tracked = len(objects)
    if os.environ.get("MAT_TYPES"):            # the most numerous gc-tracked types, on stderr
        import collections
        top = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects).most_common(30)
        print("\n".join(f"{n:7d} {t}" for t, n in top), file=sys.stderr)
    if os.environ.get("MAT_CELLS"):            # which functions own the live closure cells (investigation aid)
        import collections
        owners = collections.Counter()
        for o in objects:
            if type(o).__name__ == "function" and o.__closure__:
                owners[f"{o.__module__}.{o.__qualname__}"] += len(o.__closure__)
        print("\n".join(f"{n:7d} {t}" for t, n in owners.most_common(15)), file=sys.stderr)
    del objects
    t3 = time.perf_counter()
    gc.collect()
    gc_s = time.perf_counter() - t3
    s = triton_runtime.stats
    return {"trace_compile_s": round(t1 - t0, 3), "first_calls_s": round(t2 - t1, 3), "total_s": round(t2 - t0, 3),
            "kernels": len(calls), "compiled_in_process": s["compiled"],
            "compiled_in_workers": s["compiled_in_workers"], "cubin_cache_hits": s["cubin_cache_hits"],
            "modules_imported": s["modules_imported"], "launches": launches[0], "gc_tracked": tracked,
            "gc_collect_s": round(gc_s, 4), "compile_threads": config.compile_threads}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--trees", nargs="+", default=[os.path.dirname(HERE)])
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.layers, a.d, a.profile)), flush=True)
        return
    cache = tempfile.mkdtemp(prefix="flambeau-mat-")     # the eager CPU kernels' C++ kept from the warm-up on
    for tree in a.trees:
        totals = []
        for run in range(a.runs + (1 if tree == a.trees[0] else 0)):
            shutil.rmtree(os.path.join(cache, "triton"), ignore_errors=True)    # cubins, autotune choices
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            env.update(PYTHONPATH=tree, FLAMBEAU_CACHE_DIR=cache, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="tr-"))
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--layers", str(a.layers),
                                "--d", str(a.d), "--profile", str(a.profile)], env=env, capture_output=True,
                               text=True, cwd=os.path.dirname(HERE))
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            if a.profile:
                print(r.stderr[-20000:])
            row = {"tree": tree, **json.loads(r.stdout.strip().splitlines()[-1])}
            if tree == a.trees[0] and run == 0:
                row["warm_up"] = True               # builds the eager CPU kernels' C++: not counted
            else:
                totals.append(row["total_s"])
            print(json.dumps(row), flush=True)
        print(json.dumps({"tree": tree, "median_total_s": statistics.median(totals),
                          "load": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
