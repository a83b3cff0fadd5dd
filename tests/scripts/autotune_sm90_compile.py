"""mode="max-autotune" for sm_90 on a machine without a GPU (Triton's compiler real, CuPy's module loading, events
and launches replaced by recorders): a graph with block-size-tuned kernels and matrix-product templates is compiled
as compile_fx does for cuda, then each kernel is called once as a first step would. Every candidate (each tuned
kernel's block/warp variants, each template configuration) must be compiled by the compile workers, none in this
process, and nothing is timed before every queued compile job is done; after each choice only the winner's loaded
kernel may stay alive (weakrefs of the recorded CuPy functions). The fake events time the second candidate of each
choice fastest, so the generator's own configuration (a tuned kernel's first) loses too. A kernel renamed (its own
and its parameters' names, as in a GPT's next layer) loads the same cubin, by the entry point recorded with it. Run
without TRITON_INTERPRET; prints `OK <n>` at the end."""
import dataclasses
import re
import tempfile
import weakref

import flambeau as fl
from flambeau import _cpp_builder, _inductor
from flambeau._backends import triton_launch as TL
from flambeau._inductor import autotune, codegen_triton, config, mm_template, triton_runtime, triton_schedule
from flambeau._inductor.compile_fx import _size_names
from flambeau._inductor.graph import GraphLowering
from flambeau._inductor.scheduler import Kernel, schedule
from bench.fake_cuda_loader import Event, Stream

_cpp_builder.cache_dir = tempfile.mkdtemp(prefix="flambeau-autotune-sm90-")
config.compile_threads = 2
config.max_autotune = True
functions: list = []                # weakrefs of every loaded kernel function
timings = [0]                       # events read in the current choice


class Function:
    def __init__(self):
        self.ptr = id(self)
        functions.append(weakref.ref(self))


class Module:
    def load(self, cubin):
        self.cubin = cubin

    def get_function(self, name):
        assert name.encode() in self.cubin, name           # the entry point is the cubin's own symbol
        return Function()


def elapsed(a, b):
    assert all(f.done() for f in triton_runtime._pending.values()), "timed while kernels were still compiling"
    timings[0] += 1
    return 1.0 if timings[0] == 2 else 5.0


class Cupy:
    class cuda:
        Module, Event = Module, Event
        get_current_stream = staticmethod(lambda: Stream())
        get_elapsed_time = staticmethod(elapsed)

        class driver:
            funcSetAttribute = staticmethod(lambda *a: None)
    empty = staticmethod(lambda n, dtype: triton_runtime.RawPointer(1 << 20))


triton_runtime._cupy = TL._cupy = lambda: Cupy
TL._driver[:] = [lambda *a: None, lambda: 0]
TL.current_device = lambda: 0
TL._capability = lambda: 90
mm_template.extern_product = lambda tk, device: (lambda arrays, out: out if out is not None else
                                                 triton_runtime.RawPointer(2 << 20))


class Sm90:
    type = "cuda"


DEV = Sm90()
triton_runtime.device_key = lambda d: "sm90" if d is DEV else "interpret"
calls = []                          # (callable, number of arguments)
launches_queued = [0]


def sm90_compile_fx(gm, example_inputs, **kwargs):
    """compile_fx's Triton branch for a cuda graph under max_autotune, up to the kernels' callables."""
    graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
    order = mm_template.fuse_products(triton_schedule.split_for_grid(schedule(graph), graph, interpret=False), graph)
    kernels = [k for k in order if isinstance(k, Kernel)]
    source, lmap = mm_template.generate_module(kernels, _size_names(graph), interpret=False)
    mod, _ = triton_runtime.load_module(source, DEV)
    for k in kernels:
        if isinstance(k, mm_template.TemplateKernel):
            tc = mm_template.launcher(triton_runtime, mod, k, lmap, DEV)
            calls.append((tc, len(k.loads) + len(k.stores) + (1 if tc.error_flag else 0)))
        else:
            la = triton_runtime.Launcher(mod, lmap[k.name], DEV, True)
            calls.append((la, la.n_bufs + (1 if la.error_flag else 0)))
    every = mm_template.all_launches(kernels, lmap)
    launches_queued[0] += len(every)
    triton_runtime.precompile(mod, every, DEV)
    first_calls()                   # at once, as the graph's first call follows its compile
    return gm


tuned = [0]


def first_calls():
    """Call each kernel once, checking which loaded kernels stay alive after each choice."""
    for fn, n in calls:
        timings[0] = 0
        before = len(functions)
        fn(*[triton_runtime.RawPointer(4096 * (i + 1)) for i in range(n)])
        made = functions[before:]
        alive = [f() for f in made if f() is not None]
        if isinstance(fn, mm_template.TemplateChoice):
            assert fn.choice == 1 and len(made) >= 3, (fn.choice, len(made))
            kept = list(fn.templates[1]._compiled.values())
            assert fn.epilogue is None and [t is None for t in fn.templates] == [False if i == 1 else True for i in
                                                                                  range(len(fn.templates))]
        elif fn.autotune:
            assert len(made) >= 3, len(made)
            (key, (kernel, _)), = fn._compiled.items()
            assert (key[1], key[2]) != (fn.launch.xblock, fn.launch.num_warps), key     # the second candidate won
            kept = list(fn._compiled.values())
            tuned[0] += 1
        else:
            continue
        assert alive == [k.function for k, _ in kept], (len(alive), len(made))   # the losers' kernels are released
        del alive, made, kept


_inductor.compile_fx = sm90_compile_fx
F = fl.nn.functional
x, w, b = fl.randn(256, 96), fl.randn(160, 96), fl.randn(160)
fl.compile(lambda x, w, b: (F.gelu(F.linear(x, w, b)), (x.sin() * 2).softmax(-1), x.sum(0).exp()))(x, w, b)
# The same kernel under other names (its own, its parameters': a GPT's next layer): two renamed copies (changed by a
# line, so not cached yet) in one module are one worker job, and both load its cubin by its recorded entry point
first = next(fn for fn, _ in calls if isinstance(fn, triton_runtime.Launcher))
la, ref = first.chain[0]
text = triton_runtime.kernel_sources(ref.module.source)[la.name]
copies, source = [], ref.module.source
for tag in ("a", "b"):
    renames = {la.name: f"kernel_{tag}", **{b.name: f"{tag}_{b.name}" for b in la.buffers}}
    head, body = re.sub(r"\b(" + "|".join(renames) + r")\b", lambda m: renames[m.group(1)], text).split("\n", 1)
    source += f"\n\n@triton.jit\n{head}\n    fl_unused = 0\n{body}\n"
    copies.append(dataclasses.replace(la, name=f"kernel_{tag}",
                                      buffers=[type(b)(renames[b.name], b.dtype) for b in la.buffers]))
other, _ = triton_runtime.load_module(source, DEV)
hits, compiled = triton_runtime.stats["cubin_cache_hits"], triton_runtime.stats["compiled"]
jobs = triton_runtime.precompile_for(other, copies, "sm90")
assert len(jobs) == 1, len(jobs)
for c in copies:
    triton_runtime.load_or_compile(other.kernel(c.name), c.signature(), c.constexprs, c.num_warps,
                                   triton_runtime._arg_names(c), "sm90")
assert triton_runtime.stats["cubin_cache_hits"] == hits + 2 and triton_runtime.stats["compiled"] == compiled
launches_queued[0] += 1
stats = triton_runtime.stats
print("queued", launches_queued[0], "tuned", tuned[0], stats)
assert tuned[0] >= 2 and mm_template.stats["tuned"] >= 1 and autotune.stats["tuned"] == tuned[0], \
    (tuned, mm_template.stats)
assert stats["compiled"] == 0 and stats["compiled_in_workers"] == launches_queued[0], stats     # all by workers
assert stats["modules_imported"] == 0, stats
print("OK", stats["compiled_in_workers"])
