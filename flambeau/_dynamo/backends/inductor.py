"""The "inductor" backend: the quantization pass (int8 linear layers of PT2E-converted graphs), AOT
autograd with the core-op decompositions (plus the inductor's own, e.g. attention as batched
products and a softmax) and the min-cut partitioner, each graph compiled
by `flambeau._inductor.compile_fx` (C++/OpenMP kernels). `options` of `flambeau.compile` set
`flambeau._inductor.config` knobs for the duration of the compile."""
from __future__ import annotations

import contextlib

from ..._decomp import core_aten_decompositions
from ..._backends import cublaslt
from ..._functorch import config as functorch_config
from ..._functorch.aot_autograd import aot_module_simplified, named_state
from ..._functorch.partitioners import min_cut_rematerialization_partition
from ... import _inductor
from ..._inductor import config as inductor_config, freezing, quantization, quantization_int8_io
from ..._inductor.compile_fx import _triton_runtime as triton_runtime
from ..._inductor.decompositions import decomposition_table
from ..._tensor import Tensor
from ...fx.passes.example_values import drop_values
from ..repro.after_aot import wrap_compiler_debug
from .registry import register_builtin


def check_inductor_options(options: dict) -> dict:
    """{config name: value} for `options`, each key a knob of `flambeau._inductor.config` given a
    value of its type (else RuntimeError, with PyTorch's messages)."""
    knobs = inductor_config.__annotations__
    out = {}
    for k, v in options.items():
        key = k.replace(".", "_").replace("-", "_")
        if key not in knobs:
            raise RuntimeError(f"Unexpected optimization option {k}, known options are {sorted(knobs)}")
        current = getattr(inductor_config, key)
        if not isinstance(v, type(current)):
            raise RuntimeError(f"Unexpected type of attr {k}, got {type(v).__name__} should be "
                               f"{type(current).__name__}")
        out[key] = v
    return out


@contextlib.contextmanager
def _inductor_options(options: dict | None):
    saved = {}
    try:
        for key, v in check_inductor_options(options or {}).items():
            saved[key] = getattr(inductor_config, key)
            setattr(inductor_config, key, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(inductor_config, k, v)


def inductor(gm, example_inputs, options=None):
    n_state = len(named_state(gm))            # the module's parameters and buffers: the forward's first inputs

    def compile_with(static):
        def compile_graph(g, ex):
            with _inductor_options(options):
                # (compile_fx looked up per call: tools and tests wrap it)
                compiled = _inductor.compile_fx(g, ex, static_input_idxs=static)
            drop_values(g)                  # AOT's graph, kept for recompiles only (example_values.py)
            return compiled
        return wrap_compiler_debug(compile_graph, "inductor")       # FLAMBEAU_REPRO_AFTER=aot

    def compile_inference(g, ex):
        """config.freezing: the module's parameters and buffers (inputs 0..n_state-1, those the graph
        does not write) become constants, folded (freezing.py); otherwise as the forward."""
        with _inductor_options(options):
            if inductor_config.freezing:
                compiled = freezing.compile_frozen(g, ex, n_state, _inductor.compile_fx)
            else:
                compiled = _inductor.compile_fx(g, ex, static_input_idxs=range(n_state))
        drop_values(g)
        return compiled
    compile_forward, compile_graph = compile_with(range(n_state)), compile_with(())
    with _inductor_options(options):        # a C++ wrapper calls no Python extern (the fused CPU attention)
        python_externs = not inductor_config.cpp_wrapper
        if python_externs:                  # int8 layers and pooling, before AOT decomposes their q/dq ops
            quantization_int8_io.fuse_int8_in_int8_out(gm)
            quantization.fuse_quantized_linear(gm)
    cuda = [a.device.index for a in example_inputs if isinstance(a, Tensor) and a.device.type == "cuda"]
    if cuda:
        cublaslt.preload(cuda[0])           # the graph's products need it: loaded while AOT traces and lowers
    eager_backward = functorch_config.force_non_lazy_backward_lowering or (bool(cuda) and _cold_cuda())
    was = functorch_config.force_non_lazy_backward_lowering
    functorch_config.force_non_lazy_backward_lowering = eager_backward
    try:
        return aot_module_simplified(gm, example_inputs, fw_compiler=compile_forward, bw_compiler=compile_graph,
                                     partition_fn=min_cut_rematerialization_partition,
                                     decompositions=decomposition_table(core_aten_decompositions(), python_externs),
                                     inference_compiler=wrap_compiler_debug(compile_inference, "inductor"))
    finally:
        functorch_config.force_non_lazy_backward_lowering = was


def _cold_cuda() -> bool:
    """For a cuda graph: whether the kernel cache holds nothing (a cold start). AOT autograd then compiles its
    backward right after its forward (`functorch_config.force_non_lazy_backward_lowering`), and the backward's
    kernels go to the compile workers beside the forward's, not after the forward has run (the MLP's first
    step waited for 11 backward kernels after its 9 forward ones). FLAMBEAU_EAGER_BACKWARD=0: never."""
    if not functorch_config.eager_backward_on_cold_cuda:
        return False
    try:
        rt = triton_runtime()           # imports Triton (optional, cuda only) at the first cuda compile
    except ImportError:
        return False
    return rt.cold_cache()


register_builtin("inductor", inductor)
