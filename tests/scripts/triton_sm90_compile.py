"""Compile the Triton kernels flambeau generates for some functions with `triton.compile` for sm_90
on a machine without a GPU (Triton's interpreter accepts code the GPU compiler rejects), through the
inductor's own cubin loader (`triton_runtime.load_or_compile`, CuPy's module replaced by a recorder),
and launch each once: every runtime argument must reach the launch, converted by its signature type.
The kernels of a graph are first compiled by worker processes (`triton_runtime.precompile_for`, into a
fresh cache directory), so the loader finds most in the cache. Then flambeau's eager max-pooling kernels
are compiled by `triton_launch` as on an sm_90 GPU and launched once the same way. Run without
TRITON_INTERPRET; prints one line per kernel and `OK <n>` at the end."""
import ctypes
import os
import sys
import tempfile

import ml_dtypes
import numpy as np

import flambeau as fl
from flambeau._inductor import codegen_triton, triton_runtime, triton_schedule
from flambeau._inductor.graph import GraphLowering
from flambeau._inductor.compile_fx import _size_names
from flambeau._inductor.scheduler import Kernel, schedule
from flambeau import _cpp_builder, _inductor
from flambeau._backends import triton_launch as TL

compiled = [0]
_cpp_builder.cache_dir = tempfile.mkdtemp(prefix="flambeau-sm90-")
_inductor.config.compile_threads = 2


def sm90_compile_fx(gm, example_inputs, **kwargs):
    graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
    order = triton_schedule.split_for_grid(schedule(graph), graph)
    kernels = [k for k in order if isinstance(k, Kernel)]
    source, launches = codegen_triton.generate(kernels, _size_names(graph))
    mod, _ = triton_runtime.load_module(source, CUDA_KEY)
    for fut in triton_runtime.precompile_for(mod, [launches[k.name] for k in kernels], "sm90"):
        fut.result()
    for k in kernels:
        la = launches[k.name]
        while la is not None:
            names = triton_runtime._arg_names(la)
            k = triton_runtime.load_or_compile(mod.kernel(la.name), la.signature(), la.constexprs,
                                               la.num_warps, tuple(names), "sm90")
            _launch_once(k, la.name)
            la = la.then
    return gm


def _launch_once(k, name):
    """Launch compiled kernel `k` against the recorder: every runtime argument must reach its slot,
    converted by its signature type."""
    sent = [TL.Ptr(0) if t.startswith("*") else 3 for t in k.arg_types]
    TL.launch(k, (1,), *sent)
    (f, params), = _launches
    _launches.clear()
    types = TL.c_types(k.arg_types)
    addresses = (ctypes.c_void_p * len(types)).from_address(params)
    packed = [t.from_address(a).value for t, a in zip(types, addresses)]
    assert f == k.function.ptr and len(types) == len(k.arg_types) + k.scratch, (name, k.arg_types)
    assert packed == [0 if t.startswith("*") else 3 for t in k.arg_types] + [0] * k.scratch, \
        (name, k.arg_types, packed)
    print(name, k.shared, flush=True)
    compiled[0] += 1


_inductor.compile_fx = sm90_compile_fx


_launches = []


class _Recorder:
    """A loaded kernel function: only its address is read (by the driver launch below)."""

    def __init__(self):
        self.ptr = id(self)


def _driver_launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    """cuLaunchKernel, recording the function and the address of its parameter block."""
    _launches.append((f, params))


TL._driver[:] = [_driver_launch, lambda: 0]


class _RecordingModule:
    def load(self, cubin):
        assert cubin

    def get_function(self, name):
        return _Recorder()


class _FakeCupy:
    class cuda:
        Module = _RecordingModule

        class driver:
            @staticmethod
            def funcSetAttribute(*args):
                pass


triton_runtime._cupy = TL._cupy = lambda: _FakeCupy


class _Sm90:
    type = "cuda"


CUDA_KEY = _Sm90()
triton_runtime.device_key = lambda d: "sm90" if d is CUDA_KEY else "interpret"

F = fl.nn.functional


def cases():
    x = fl.randn(33, 70)
    yield lambda a, b: ((a * 2 + b.t()).sin(), (a - 1).relu()), (fl.randn(33, 17), fl.randn(17, 33))
    yield lambda a: (F.softmax(a, -1), a.sum(0), a.var(1), a.argmax(1), a.amin(0)), (x,)
    yield lambda a, w, b: F.gelu(F.layer_norm(a, (70,), w, b)), (x, fl.randn(70), fl.randn(70))
    yield lambda a: (a.to(fl.bfloat16).float().exp() * 3).to(fl.bfloat16).sum(1), (x,)
    yield lambda a, i: a[i] * 2, (x, fl.tensor([0, 5, -1]))
    yield lambda a: (a > 0).all(1), (x,)
    yield lambda a: a.sum() / a.abs().max(), (x,)
    yield lambda a: a.prod(1), (x,)
    yield lambda a, i, v: a.index_put((i,), v, accumulate=True), (x, fl.tensor([1, 1, 4]), fl.randn(3, 70))
    yield lambda a, i: F.embedding(i, a), (x, fl.tensor([[1, 2], [1, 0]]))
    yield lambda a: (a.sum(), a.argmax(), (a > 0).all(), a.sum(0), a.prod()), (fl.randn(300, 400),)   # split
    yield lambda a, i, v: a.index_put((i,), v), (x, fl.tensor([1, 1, 4]), fl.randn(3, 70))
    yield lambda a, w, b: F.relu(F.batch_norm(a, None, None, w, b, training=True)), \
        (fl.randn(8, 4, 48, 48), fl.randn(4), fl.randn(4))                            # split BatchNorm sums


for fn, args in cases():
    fl._dynamo.reset()
    fl.compile(fn, backend="inductor")(*args)
    fl._dynamo.reset()
    fl.compile(fn, backend="inductor", dynamic=True)(*args)
# a channels-last conv-BatchNorm-ReLU block (layout optimization: NHWC kernels, fused column statistics split
# over the grid) under bf16 autocast, forward and backward
_inductor.config.backend, _inductor.config.layout_optimization = "triton", True
fl._dynamo.reset()
block_args = [fl.randn(8, 8, 48, 48, requires_grad=True), fl.randn(16, 8, 3, 3, requires_grad=True),
              fl.randn(16, requires_grad=True), fl.randn(16, requires_grad=True)]
with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
    block_out = fl.compile(lambda x, w, g, b: F.max_pool2d(F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None,
                                                                               g, b, training=True)), 2))(*block_args)
block_out.float().sum().backward()
# NCHW BatchNorm-ReLU forward and backward: the backward's split per-channel sums share one loop
_inductor.config.layout_optimization = False
fl._dynamo.reset()
bn_args = [fl.randn(8, 4, 48, 48, requires_grad=True), fl.randn(4, requires_grad=True), fl.randn(4, requires_grad=True)]
fl.compile(lambda x, w, b: F.relu(F.batch_norm(x, None, None, w, b, training=True)))(*bn_args).sum().backward()
_inductor.config.backend = "cpp"
if "--gpt" in sys.argv:              # a small GPT-2 training step under bf16 autocast, forward and backward
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench import gpu_models
    fl._dynamo.reset()
    model = fl.compile(gpu_models.gpt(fl, vocab=64, block=16, d=32, layers=1, heads=2))
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(fl.randint(0, 64, (2, 16)), fl.randint(0, 64, (2, 16)))
    loss.backward()

def eager_kernels():
    """flambeau's eager max-pooling kernels (`_backends/triton_max_pool.py`), dropout kernels, one-program-per-channel
    BatchNorm pair and channels-last BatchNorm kernels (`_backends/triton_batch_norm.py`) compiled by `triton_launch.compile_kernel` for
    sm_90 with the signatures their launches use, per dtype (BatchNorm: the smallest and largest block), and
    the fused cross-entropy's (`_backends/triton_cross_entropy.py`) with each dtype and reduction they take."""
    from flambeau._backends import triton_batch_norm as BN
    from flambeau._backends import triton_max_pool as MP
    TL._capability = lambda: 90
    TL.current_device = lambda: 0
    for dtype in (ml_dtypes.bfloat16, np.float16, np.float32, np.float64):
        for fn, signature in ((MP._max_pool_fwd, MP.forward_signature), (MP._max_pool_bwd, MP.backward_signature)):
            for cl in (False, True):
                sig, const = signature(np.dtype(dtype), cl)
                _launch_once(TL.compile_kernel(fn, sig, const, num_warps=MP.NUM_WARPS, num_stages=1),
                             f"{fn.__name__}[{np.dtype(dtype).name}{', channels-last' if cl else ''}]")
    f32, bf16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
    for block in (BN.onchip_block(1), BN.onchip_block(BN.ONCHIP_MAX)):
        for fn, (sig, const, warps) in ((BN._bn_fwd_onchip, BN.fwd_onchip_signature(bf16, f32, f32, f32, f32, block)),
                                        (BN._bn_fwd_onchip, BN.fwd_onchip_signature(f32, None, None, None, None, block)),
                                        (BN._bn_bwd_onchip, BN.bwd_onchip_signature(bf16, bf16, f32, f32, f32, f32, block)),
                                        (BN._bn_bwd_onchip, BN.bwd_onchip_signature(f32, f32, f32, f32, None, None, block))):
            _launch_once(TL.compile_kernel(fn, sig, const, num_warps=warps, num_stages=1),
                         f"{fn.__name__}[{sig['X']}, block {block}, {warps} warps]")
    from flambeau._backends import triton_pointwise as PW
    for dt in (bf16, np.dtype(np.float16), f32):      # dropout, forward and backward
        for fn, sig in zip((PW._dropout_fwd, PW._dropout_bwd), PW.dropout_signatures(dt)):
            _launch_once(TL.compile_kernel(fn, {**sig, "BLOCK": "constexpr"}, dict(BLOCK=PW.BLOCK),
                                           num_warps=PW.NUM_WARPS, num_stages=1), f"{fn.__name__}[{sig['M']}, {dt.name}]")
    for dt in (bf16, f32):                 # the split kernels' channels-last forms
        for fn, (sig, const, warps) in ((BN._bn_stats_cl, BN.stats_cl_signature(dt)),
                                        (BN._bn_apply, BN.apply_signature(dt, True)),
                                        (BN._bn_bwd_reduce_cl, BN.bwd_reduce_cl_signature(dt, dt, f32)),
                                        (BN._bn_bwd_apply, BN.bwd_apply_signature(dt, dt, f32, True))):
            _launch_once(TL.compile_kernel(fn, sig, const, num_warps=warps, num_stages=1),
                         f"{fn.__name__}[{sig['X']}, channels-last]")
    from flambeau._backends import triton_cross_entropy as CE     # the fused cross-entropy's kernels
    for dt in (bf16, np.dtype(np.float16), f32):
        for name, dtypes, red in (("fwd", (dt,), CE.NONE), ("fwd", (dt,), CE.MEAN), ("reduce", (dt,), CE.MEAN),
                                  ("reduce", (dt,), CE.SUM), ("scale", (dt,), CE.NONE), ("bwd", (dt, dt), CE.NONE),
                                  ("bwd", (dt, f32), CE.NONE)):
            k = CE._kernel(name, dtypes, 0, red)
            _launch_once(k, f"_ce_{name}[{', '.join(k.arg_types)}{', mean' if red == CE.MEAN else ''}]")


eager_kernels()
stats = triton_runtime.stats
print("workers compiled", stats["compiled_in_workers"], "of", stats["compiled_in_workers"] + stats["compiled"])
assert stats["compiled_in_workers"] > stats["compiled"], stats
print("OK", compiled[0])
sys.exit(0 if compiled[0] else 1)
