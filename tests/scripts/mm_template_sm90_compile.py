"""Compile the matrix-product templates (flambeau/_inductor/mm_template.py) that mode="max-autotune" makes
for a few graphs with `triton.compile` for sm_90 on a machine without a GPU (Triton's interpreter accepts
code the GPU compiler rejects): every block configuration, with its pipelining stages, of plain, transposed,
batched and epilogue-fused products in float32 and bfloat16, and each epilogue alone, by the compile workers
(`triton_runtime.precompile_for`: their cubins carry the configurations' stages). Run without
TRITON_INTERPRET; prints one line per kernel (its shared memory) and `OK <n>` at the end."""
import tempfile

import flambeau as fl
from flambeau import _cpp_builder, _inductor
from flambeau._backends import cubin_cache
from flambeau._inductor import mm_template, triton_runtime
from flambeau._inductor.graph import GraphLowering
from flambeau._inductor.scheduler import Kernel, schedule

_cpp_builder.cache_dir = tempfile.mkdtemp(prefix="flambeau-mm-sm90-")


class _Sm90:
    type = "cuda"


CUDA_KEY = _Sm90()
triton_runtime.device_key = lambda d: "sm90" if d is CUDA_KEY else "interpret"
compiled = [0]
stages_checked: list = []
_inductor.config.compile_threads = 2


def sm90_compile_fx(gm, example_inputs, **kwargs):
    graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, mm_template.TEMPLATE_DTYPES +
                          (fl.int64, fl.bool)).run()
    order = mm_template.fuse_products(schedule(graph), graph)
    kernels = [k for k in order if isinstance(k, Kernel)]
    source, launches = mm_template.generate_module(kernels)
    mod, _ = triton_runtime.load_module(source, CUDA_KEY)
    for fut in triton_runtime.precompile_for(mod, mm_template.all_launches(kernels, launches), "sm90"):
        fut.result()                        # the compile workers build every template configuration
    for k in kernels:
        if not isinstance(k, mm_template.TemplateKernel):
            continue
        for la in launches[k.name] + ([launches[k.name + "_epilogue"]] if k.epilogue is not None else []):
            names = triton_runtime._arg_names(la)
            key = triton_runtime._cubin_key(mod.kernel(la.name), la.signature(), la.constexprs, la.num_warps, names,
                                            "sm90", la.num_stages)
            cubin, meta = cubin_cache.read(key)
            assert cubin and meta["shared"] <= 228 * 1024, (la.name, meta)
            print(la.name, la.constexprs, la.num_stages, meta["shared"], flush=True)
            compiled[0] += 1
            if la.num_stages > 1 and not stages_checked:     # the workers built it with its stages
                one = triton_runtime.build_cubin(mod.kernel(la.name).jit, la.signature(), la.constexprs,
                                                 la.num_warps, names, 90)
                assert one[1]["shared"] < meta["shared"], (one[1], meta)
                stages_checked.append(la.name)
    return gm


_inductor.compile_fx = sm90_compile_fx
F = fl.nn.functional


def cases():
    for dt in (fl.float32, fl.bfloat16):
        x, w, b, r = (t.to(dt) for t in (fl.randn(300, 96), fl.randn(160, 96), fl.randn(160), fl.randn(300, 160)))
        yield lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r, (x, w, b, r)
        yield lambda x, w: (x.t() @ x, fl.relu(x @ w.t())), (x, w)
    a, c = fl.randn(3, 70, 40).to(fl.bfloat16), fl.randn(3, 40, 50).to(fl.bfloat16)
    yield lambda a, c: F.silu(fl.bmm(a, c)).float(), (a, c)


for fn, args in cases():
    fl._dynamo.reset()
    fl.compile(fn, backend="inductor", mode="max-autotune")(*args)
assert compiled[0] >= 5 * len(mm_template.CONFIGS) and stages_checked, compiled[0]
print("OK", compiled[0])
