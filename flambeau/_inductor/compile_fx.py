"""`compile_fx(gm, example_inputs)`: the code generator's entry point.

    GraphModule (core ops, meta["val"] fake tensors)
      -> GraphLowering (graph.py, lowering*.py): loop IR, views as index remapping
      -> schedule (scheduler.py): fused kernels, registers vs memory, memory plan
      -> codegen (codegen_cpp.py / codegen_numpy.py / codegen_triton.py) + build (flambeau._cpp_builder,
         triton_runtime.py; cached on disk)
      -> wrapper (wrapper.py): a Python function calling the kernels and extern ops
      -> CompiledGraph: callable on flambeau Tensors, returning what the graph returns

The compiled code is specialised to the input strides seen at compile time; a call with other
strides compiles (or finds) another variant, a call with other sizes runs the graph eagerly. A
graph the generator cannot take at all (non-tensor inputs, sizes that aren't polynomials in the
size symbols, tensors on several devices) runs eagerly through the GraphModule. Graphs on cuda
tensors generate Triton kernels (`codegen_triton`); so do cpu graphs with `config.backend ==
"triton"` (FLAMBEAU_INDUCTOR_BACKEND=triton), run by Triton's interpreter.

A graph traced with symbolic sizes (placeholders whose meta["val"] has SymInt sizes) compiles
once for every size: its kernels take the size symbols as arguments (see graph.py, sizevars.py,
wrapper.py); a call whose inputs don't fit the assumptions (strides, a size of 0 or 1, a guard of
the tracer) runs eagerly and counts in `counters["dynamic_eager_calls"]`.

Everything that runs eagerly (a whole graph, a call sent to eager) is recorded as a fallback of op
"whole graph" in `flambeau._dynamo.utils.counters["inductor_fallbacks"]` (see flambeau/_counters.py).
"""
from __future__ import annotations

from .. import _fp_errors, _logging
from .._code_cache import compile_source
from .._compile_lock import compile_lock
from .._counters import record_fallback

import ctypes
import itertools
import os
import time
import warnings

from .._device import CPU
from .._tensor import Tensor
from .. import _cpp_builder
from .._backends import cpu_allocator
from ..fx.passes.example_values import drop_values, restore_values
from . import codegen_cpp, codegen_numpy, codegen_triton, config, cpp_wrapper, cudagraphs, mm_template, pad_mm, \
    triton_schedule
from .graph import GraphLowering, graph_device
from .ir import SUPPORTED_DTYPES, Unsupported
from .scheduler import Kernel, plan_memory, schedule
from .sizevars import SizeExpr, derived_definition
from .wrapper import WrapperCodegen

log = _logging.get_logger("flambeau._inductor")

counters = {"dynamic_graphs": 0, "dynamic_eager_calls": 0, "cpp_wrapper_graphs": 0, "cpp_wrapper_fallbacks": 0}
WHOLE_GRAPH = "whole graph"          # the op of a fallback that runs a graph eagerly
AUTOTUNE = "block-size autotuning"   # the op of the note that max_autotune does not apply to a graph
INPUT_WRITES = "input_writes"          # gm.meta: {output index: input position} AOT autograd copies the output into
OTHER_SIZES = "called with other sizes than the graph was compiled for"
INPUTS_NOT_AS_ASSUMED = "inputs don't fit the dynamic graph's assumptions (strides, a size of 0 or 1, a guard)"
_warned_no_compiler = [False]
_malloc_tuned = [False]
_graph_ids = itertools.count()


class CompiledArtifact:
    """One specialisation of a graph: generated sources and the callable wrapper."""

    def __init__(self, graph, order, call, source, wrapper_source, backend, source_path, size_names=(),
                 cpp_wrapper=False):
        self.call = call
        self.cpp_wrapper = cpp_wrapper          # the wrapper is generated C++ (config.cpp_wrapper)
        self.source = source
        self.wrapper_source = wrapper_source
        self.backend = backend
        self.source_path = source_path
        kernels = [k for k in order if isinstance(k, Kernel)]
        externs = [k.node for k in order if not isinstance(k, Kernel)]
        self.kernel_count = len(kernels)
        self.random_ops = cudagraphs.random_ops(externs)
        # the scheduled kernels and extern IR nodes: kept only for introspection (config.keep_ir)
        self.kernels = kernels if config.keep_ir else None
        self.externs = externs if config.keep_ir else None
        self.fallback_ops = list(graph.fallback_ops)
        self.input_strides = [tuple(st * b.dtype.itemsize for st in b.layout.strides) for b in graph.inputs]
        self.input_shapes = [tuple(b.layout.shape) for b in graph.inputs]
        # each graph output's element strides (None: not known statically), what its caller receives
        self.output_strides = None if graph.dynamic else [_static_strides(o) for o in (
            graph.outputs if isinstance(graph.outputs, list) else [graph.outputs])]
        self.size_names = list(size_names)      # the size symbols its kernels take (dynamic graphs)
        self.dynamic = graph.dynamic            # traced with symbolic sizes: the wrapper checks its inputs
        self.mutated_inputs = sorted(graph.mutations)   # input positions the graph writes (copy_)
        self.device_flag = None                 # cuda: the error flag its kernels set (raised at the next sync)
        self.device = None                      # the device its kernels run on


class CompiledGraph:
    """The callable `compile_fx` returns (see module docstring)."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        self.id = next(_graph_ids)
        self.variants: dict = {}
        self.eager_reason = None
        self._told_other_sizes = False       # a call with other sizes was logged once
        self.compile_time = 0.0
        t0 = time.perf_counter()
        try:
            art = _compile(gm, example_inputs, self.id)
        except Unsupported as e:
            self.eager_reason = str(e)
            record_fallback(WHOLE_GRAPH, self.eager_reason)
            art = None
        self.compile_time = time.perf_counter() - t0
        self.artifact = art
        # NumPy allocations go through the CPU caching allocator for cpu graphs only: a cuda graph's
        # buffers are CuPy's, and loading the allocator builds its C++ on a cold cache (1.6 s of a compiled
        # MLP's first step on the H100)
        self._host_cache = config.cpu_cache_allocator and (art is None or getattr(art.device, "type", "cpu") == "cpu")
        if art is not None and art.dynamic:
            self._fast_key = None
            self._fast = art.call
        elif art is not None:
            self._fast_key = tuple(zip(art.input_shapes, art.input_strides))
            self.variants[self._fast_key] = art
            self._fast = art.call

    @property
    def output_strides(self) -> list | None:
        """The element strides of each output as the compiled code returns it (None where not static or
        not compiled): what AOT autograd gives the backward's example inputs when it compiles it at once."""
        return self.artifact.output_strides if self.artifact else None

    # introspection used by tests and debugging
    @property
    def kernel_count(self) -> int:
        return self.artifact.kernel_count if self.artifact else 0

    @property
    def fallback_ops(self) -> list:
        return self.artifact.fallback_ops if self.artifact else []

    @property
    def source(self) -> str:
        return self.artifact.source if self.artifact else ""

    @property
    def size_names(self) -> list:
        """The size symbols the generated code takes (empty for a graph specialised to its sizes)."""
        return self.artifact.size_names if self.artifact else []

    def __call__(self, *args):
        token = _fp_errors.quiet()   # generated NumPy code and extern kernels: inf/nan silent, as in PyTorch
        memory = cpu_allocator.using_cache() if self._host_cache else None
        try:
            return self._call(args)
        finally:
            cpu_allocator.restore(memory)
            _fp_errors.restore(token)

    def _call(self, args):
        if self.artifact is None:
            return self.gm(*args)
        if self._fast_key is None:            # symbolic sizes: the wrapper checks the inputs itself
            return self._fast(args)
        key = tuple([(a._data.shape, a._data.strides) for a in args])
        if key == self._fast_key:
            return self._fast(args)
        if [a._data.shape for a in args] != self.artifact.input_shapes:
            record_fallback(WHOLE_GRAPH, OTHER_SIZES, log=not self._told_other_sizes)
            self._told_other_sizes = True
            return self.gm(*args)         # the graph is specialised to its sizes: run it as is
        art = self.variants.get(key)
        if art is None:
            with compile_lock:                # one thread compiles a variant, the others then find it
                art = self.variants.get(key)
                if art is None:
                    art = self.variants[key] = _compile_again(self.gm, list(args), self.id)
        return art.call(args)


def _static_strides(out):
    layout = getattr(out, "layout", None)
    strides = getattr(layout, "strides", None)
    if strides is None or not all(isinstance(st, int) for st in strides):
        return None
    return tuple(strides)


def _compile_again(gm, args: list, gid: int) -> CompiledArtifact:
    """`_compile` of a graph whose example values its backend dropped once compiled (example_values.py):
    recomputed from these inputs for the compile, dropped again after."""
    restored = restore_values(gm, args)
    try:
        return _compile(gm, args, gid)
    finally:
        if restored:
            drop_values(gm)


def compile_fx(gm, example_inputs=None, static_input_idxs=(), **kwargs):
    """Compile a GraphModule of core operators into kernels plus a Python wrapper (a CompiledGraph);
    under `config.triton_cudagraphs` that is recorded and replayed as CUDA graphs
    (`cudagraphs.cudagraphify`; `static_input_idxs`: inputs at fixed addresses, the module's
    parameters and buffers)."""
    compiled = CompiledGraph(gm, example_inputs)
    if not config.triton_cudagraphs:
        return compiled
    return cudagraphs.cudagraphify(compiled, _device_of(compiled, example_inputs), static_input_idxs)


def _device_of(compiled, example_inputs):
    if compiled.artifact is not None:
        return compiled.artifact.device
    return next((a.device for a in example_inputs or () if isinstance(a, Tensor)), CPU)


def _backend(device) -> str:
    """The code generator of a graph on `device`: Triton on cuda, `config.backend` on cpu."""
    if device.type == "cuda" or config.backend == "triton":
        why = _triton_unavailable(device)
        if why is not None:
            raise Unsupported(f"graph on {device}: {why}")
        return "triton"
    if device.type != "cpu":
        raise Unsupported(f"no code generator for tensors on {device}")
    if config.backend == "numpy":
        return "numpy"
    try:
        _cpp_builder.detect_flags()
        return "cpp"
    except _cpp_builder.NoCompilerError as e:
        if not _warned_no_compiler[0]:
            warnings.warn(f"flambeau inductor: no working C++ compiler ({e}); generating NumPy code instead, "
                          f"which is much slower", RuntimeWarning, stacklevel=3)
            _warned_no_compiler[0] = True
        return "numpy"


def _triton_runtime():
    from . import triton_runtime  # deferred: imports Triton, an optional dependency
    return triton_runtime


def _triton_unavailable(device) -> str | None:
    """Why Triton kernels can't run on `device` here (None: they can). cpu tensors need Triton's
    interpreter, which `TRITON_INTERPRET=1` turns on when Triton is imported (Triton's own `tl.sum`
    and friends are interpreted functions only then); cuda tensors need it off, and CuPy."""
    try:
        rt = _triton_runtime()
    except ImportError:
        return "triton is not installed"
    interpret = bool(rt.triton.knobs.runtime.interpret)
    if device.type == "cpu" and not interpret:
        return "Triton kernels run on cpu tensors only in Triton's interpreter: set TRITON_INTERPRET=1"
    if device.type == "cuda":
        if not rt.TL.available():
            return "the Triton backend on cuda needs cupy"
        if interpret:
            return "TRITON_INTERPRET=1 runs Triton kernels on the CPU; unset it to compile them for cuda"
    return None


def _tune_malloc():
    """See config.tune_malloc; glibc only, once."""
    if _malloc_tuned[0] or not config.tune_malloc:
        return
    _malloc_tuned[0] = True
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(-3, 32 << 20)          # M_MMAP_THRESHOLD
    mallopt(-1, 1 << 30)           # M_TRIM_THRESHOLD


def _compile(gm, example_inputs, gid) -> CompiledArtifact:
    _tune_malloc()
    ex = None
    if example_inputs is not None and all(isinstance(a, (Tensor, int)) for a in example_inputs):
        ex = list(example_inputs)
    device = graph_device(gm, ex)
    backend = _backend(device)
    if config.max_autotune and (backend != "triton" or device.type != "cuda"):
        record_fallback(AUTOTUNE, "the C++ kernels have no block sizes to tune" if backend != "triton" else
                        "Triton's interpreter runs one program at a time: nothing to tune")
    dtypes = {"triton": codegen_triton.DTYPES, "cpp": codegen_cpp.DTYPES}.get(backend, SUPPORTED_DTYPES)
    if backend == "triton":
        if device.type == "cuda":
            _triton_runtime().begin_cuda_compile(device)    # overlaps the lowering below
        pad_mm.pad_matrix_products(gm)
    graph = GraphLowering(gm, ex, device, dtypes).run()
    size_names = _size_names(graph)
    order = schedule(graph)
    if backend == "triton":
        order = triton_schedule.split_for_grid(order, graph, interpret=device.type == "cpu")
        if config.max_autotune:
            order = mm_template.fuse_products(order, graph)     # products as Triton templates (mm_template.py)
        if not size_names:
            interpret = device.type == "cpu"
            order = triton_schedule.combine_pointwise(
                order, graph, lambda k: codegen_triton.plain_launch(k, size_names, interpret))
    memory = plan_memory(order, graph)
    kernels = [k for k in order if isinstance(k, Kernel)]
    source_path = None
    if backend == "triton":
        source, launches = mm_template.generate_module(kernels, size_names, interpret=device.type == "cpu")
        kernels_ns = {}
        if kernels:
            rt = _triton_runtime()
            mod, _ = rt.load_module(source, device)
            templates = {k.name for k in kernels if isinstance(k, mm_template.TemplateKernel)}
            kernels_ns = {k.name: mm_template.launcher(rt, mod, k, launches, device) if k.name in templates else
                          rt.Launcher(mod, launches[k.name], device, config.max_autotune) for k in kernels}
            rt.precompile(mod, mm_template.all_launches(kernels, launches), device)
            source_path = mod.__file__
    elif backend == "cpp":
        info = dict(_cpp_builder.detect_flags())
        info["flags"] = list(info["flags"]) + list(config.kernel_cflags)
        source = codegen_cpp.generate(kernels, info["simd_math"], size_names)
        cpp_source = _cpp_wrapper_source(graph, order, memory, size_names) if config.cpp_wrapper else None
        if cpp_source is not None:
            source += cpp_source
        if kernels or cpp_source is not None:
            try:
                lib, source_path = _cpp_builder.load(source, info)
            except _cpp_builder.CppCompileError as e:
                if not size_names:
                    raise
                raise Unsupported(f"the size-generic kernels don't compile: {e}") from e
            kernels_ns = {k.name: getattr(lib, k.name) for k in kernels}
            if codegen_cpp.DATA_OFFSET is not None:
                kernels_ns.update({k.name + "_obj": getattr(lib, k.name + "_obj") for k in kernels})
            kernels_ns["fl_take_error"] = lib.fl_take_error
            if cpp_source is not None:
                kernels_ns["fl_graph_run_obj"] = cpp_wrapper.bind_jit(lib, graph, size_names)
        else:
            kernels_ns = {}
    else:
        source = codegen_numpy.generate(kernels, size_names)
        kernels_ns = codegen_numpy.load(source)
    if "fl_graph_run_obj" in kernels_ns:
        wc = cpp_wrapper.CppShimCodegen(graph, order, memory, size_names, _eager_runner(gm), device,
                                        *kernels_ns["fl_graph_run_obj"])
        counters["cpp_wrapper_graphs"] += 1
    else:
        writes = gm.meta.get(INPUT_WRITES) if config.write_inputs_in_place and not config.triton_cudagraphs else None
        # (a forward graph's outputs from "num_fwd_outputs" on are the activations saved for its backward;
        # those at the positions "saved_returned_by_backward" among them its backward returns as gradients)
        saved = (gm.meta["num_fwd_outputs"], gm.meta.get("saved_returned_by_backward", frozenset())) \
            if config.saved_arena and not config.triton_cudagraphs and "num_fwd_outputs" in gm.meta else None
        wc = WrapperCodegen(graph, order, memory, backend, kernels_ns, size_names, _eager_runner(gm), device, writes,
                            saved)
    wrapper_source = wc.generate()
    exec(compile_source(wrapper_source, f"<flambeau-inductor-wrapper-{gid}>"), wc.ns)
    art = CompiledArtifact(graph, order, wc.ns["call"], source, wrapper_source, backend, source_path, size_names,
                           cpp_wrapper="fl_graph_run_obj" in kernels_ns)
    art.device = device
    if "_flag_pending" in wc.ns:
        art.device_flag = wc.ns["_err"]
    if graph.dynamic:
        counters["dynamic_graphs"] += 1
    if config.output_code or _logging.enabled("output_code"):
        _logging.log_artifact(log, "output_code", "===== flambeau inductor: graph %s (%s) =====\n%s\n"
                              "----- wrapper -----\n%s", gid, backend, source, wrapper_source,
                              force=config.output_code)
    if config.debug:
        _dump(gm, graph, order, art, gid)
    return art


def _cpp_wrapper_source(graph, order, memory, size_names) -> str | None:
    """The C++ wrapper of this graph (cpp_wrapper.py), or None where it can't run a step: the graph
    then keeps the Python wrapper, and the reason is logged and counted."""
    try:
        return cpp_wrapper.CppWrapper(graph, order, memory, size_names, cpp_wrapper.jit_externs()).generate()
    except Unsupported as e:
        counters["cpp_wrapper_fallbacks"] += 1
        log.info("cpp_wrapper: keeping the Python wrapper: %s", e)
        return None


def _size_names(graph) -> list:
    """The size symbols of a dynamic graph, each of which must be readable from an input as is."""
    if not graph.dynamic:
        return []
    names, plain = set(), set()
    for _, _, e in graph.size_inputs:
        if isinstance(e, SizeExpr):
            names |= e.free_symbols()
            if len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.terms[0][0]) == 1:
                plain.add(e.terms[0][0][0])
    used = set(names) | graph.derived_names
    for b in graph.buffers:
        sizes = list(b.layout.shape) + list(b.layout.strides) + [b.layout.offset] if b.layout is not None else []
        sizes += list(getattr(getattr(b, "data", None), "reduction_ranges", ()))
        sizes += list(getattr(getattr(b, "data", None), "scatter_ranges", ()))
        for o in getattr(b, "outputs", ()):
            sizes += list(o.layout.shape) if o.layout is not None else []
        for e in sizes:
            if isinstance(e, SizeExpr):
                used |= e.free_symbols()
    derived = {n for n in used - plain if derived_definition(n) is not None}
    for n in derived:
        used |= {s.name for s in derived_definition(n).free_symbols}
    if used - plain - derived:
        raise Unsupported(f"size symbols {sorted(used - plain - derived)} can't be read from the inputs")
    order = lambda n: (len(n), n)      # noqa: E731
    return sorted(used - derived, key=order) + sorted(derived, key=order)


def _eager_runner(gm):
    told = [False]

    def run(*args):
        counters["dynamic_eager_calls"] += 1
        record_fallback(WHOLE_GRAPH, INPUTS_NOT_AS_ASSUMED, log=not told[0])
        told[0] = True
        return gm(*args)
    return run


def _dump(gm, graph, order, art, gid):
    d = os.path.join(config.debug_dir, f"run_{os.getpid()}", f"graph_{gid}")
    os.makedirs(d, exist_ok=True)

    def write(name, text):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    write("fx_graph.py", getattr(gm, "code", None) or str(gm.graph))
    ir_lines = [f"{b.name}: {b!r}" + (f"\n    data: {b.data!r}" if hasattr(b, "data") else "") for b in graph.buffers]
    ir_lines += [f"output: {o!r}" for o in graph.flat_outputs()]
    write("ir.txt", "\n".join(ir_lines) + "\n")
    sched = []
    for k in order:
        if isinstance(k, Kernel):
            sched.append(f"{k.name}: outer={list(k.outer)} loads={[b.name for b in k.loads]} "
                         f"stores={[b.name for b in k.stores]} locals={sorted(k.locals)}")
            for s in k.steps:
                sched.append(f"    {s.kind} inner={list(s.inner)}: {[n.name for n in s.nodes]}")
        else:
            sched.append(f"{k.node.kind} {k.name}: {k.node.op}")
    write("schedule.txt", "\n".join(sched) + "\n")
    write("output_code.cpp" if art.backend == "cpp" else "output_code.py", art.source)
    write("wrapper.py", art.wrapper_source)
