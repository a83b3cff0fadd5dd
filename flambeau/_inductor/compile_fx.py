"""`compile_fx(gm, example_inputs)`: the code generator's entry point.

    GraphModule (core ops, meta["val"] fake tensors)
      -> GraphLowering (graph.py, lowering*.py): loop IR, views as index remapping
      -> schedule (scheduler.py): fused kernels, registers vs memory, memory plan
      -> codegen (codegen_cpp.py / codegen_numpy.py) + build (cpp_builder.py, cached on disk)
      -> wrapper (wrapper.py): a Python function calling the kernels and extern ops
      -> CompiledGraph: callable on flambeau Tensors, returning what the graph returns

The compiled code is specialised to the input strides seen at compile time; a call with other
strides compiles (or finds) another variant, a call with other sizes runs the graph eagerly. A graph the generator cannot take at all (non-tensor
or symbolic-size inputs, tensors not on cpu) runs eagerly through the GraphModule.
"""
from __future__ import annotations

from .. import _logging

import ctypes
import itertools
import os
import sys
import time
import warnings

from .._tensor import Tensor
from . import codegen_cpp, codegen_numpy, config, cpp_builder
from .graph import GraphLowering
from .ir import Unsupported
from .scheduler import Kernel, plan_memory, schedule
from .wrapper import WrapperCodegen

_warned_no_compiler = [False]
_malloc_tuned = [False]
_graph_ids = itertools.count()


class CompiledArtifact:
    """One specialisation of a graph: generated sources and the callable wrapper."""

    def __init__(self, graph, order, call, source, wrapper_source, backend, source_path):
        self.call = call
        self.source = source
        self.wrapper_source = wrapper_source
        self.backend = backend
        self.source_path = source_path
        self.kernels = [k for k in order if isinstance(k, Kernel)]
        self.externs = [k.node for k in order if not isinstance(k, Kernel)]
        self.fallback_ops = list(graph.fallback_ops)
        self.input_strides = [tuple(st * b.dtype.itemsize for st in b.layout.strides) for b in graph.inputs]
        self.input_shapes = [tuple(b.layout.shape) for b in graph.inputs]


class CompiledGraph:
    """The callable `compile_fx` returns (see module docstring)."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        self.id = next(_graph_ids)
        self.variants: dict = {}
        self.eager_reason = None
        self.compile_time = 0.0
        t0 = time.perf_counter()
        try:
            art = _compile(gm, example_inputs, self.id)
        except Unsupported as e:
            self.eager_reason = str(e)
            art = None
        self.compile_time = time.perf_counter() - t0
        self.artifact = art
        if art is not None:
            self._fast_key = tuple(zip(art.input_shapes, art.input_strides))
            self.variants[self._fast_key] = art
            self._fast = art.call

    # introspection used by tests and debugging
    @property
    def kernel_count(self) -> int:
        return len(self.artifact.kernels) if self.artifact else 0

    @property
    def fallback_ops(self) -> list:
        return self.artifact.fallback_ops if self.artifact else []

    @property
    def source(self) -> str:
        return self.artifact.source if self.artifact else ""

    def __call__(self, *args):
        if self.artifact is None:
            return self.gm(*args)
        key = tuple([(a._data.shape, a._data.strides) for a in args])
        if key == self._fast_key:
            return self._fast(args)
        if [a._data.shape for a in args] != self.artifact.input_shapes:
            return self.gm(*args)         # the graph is specialised to its sizes: run it as is
        art = self.variants.get(key)
        if art is None:
            art = _compile(self.gm, list(args), self.id)
            self.variants[key] = art
        return art.call(args)


def compile_fx(gm, example_inputs=None, **kwargs) -> CompiledGraph:
    """Compile a GraphModule of core operators into C++ kernels plus a Python wrapper."""
    return CompiledGraph(gm, example_inputs)


def _backend() -> str:
    if config.backend == "numpy":
        return "numpy"
    try:
        cpp_builder.detect_flags()
        return "cpp"
    except cpp_builder.NoCompilerError as e:
        if not _warned_no_compiler[0]:
            warnings.warn(f"flambeau inductor: no working C++ compiler ({e}); generating NumPy code instead, "
                          f"which is much slower", RuntimeWarning, stacklevel=3)
            _warned_no_compiler[0] = True
        return "numpy"


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
    if example_inputs is not None and all(isinstance(a, Tensor) for a in example_inputs):
        ex = list(example_inputs)
    graph = GraphLowering(gm, ex).run()
    order = schedule(graph)
    memory = plan_memory(order, graph)
    kernels = [k for k in order if isinstance(k, Kernel)]
    backend = _backend()
    source_path = None
    if backend == "cpp":
        info = cpp_builder.detect_flags()
        source = codegen_cpp.generate(kernels, info["simd_math"])
        if kernels:
            lib, source_path = cpp_builder.load(source, info)
            kernels_ns = {k.name: getattr(lib, k.name) for k in kernels}
            kernels_ns["fl_take_error"] = lib.fl_take_error
        else:
            kernels_ns = {}
    else:
        source = codegen_numpy.generate(kernels)
        kernels_ns = codegen_numpy.load(source)
    wc = WrapperCodegen(graph, order, memory, backend, kernels_ns)
    wrapper_source = wc.generate()
    exec(compile(wrapper_source, f"<flambeau-inductor-wrapper-{gid}>", "exec"), wc.ns)
    art = CompiledArtifact(graph, order, wc.ns["call"], source, wrapper_source, backend, source_path)
    if config.output_code or _logging.enabled("output_code"):
        print(f"===== flambeau inductor: graph {gid} ({backend}) =====\n{source}\n----- wrapper -----\n"
              f"{wrapper_source}", file=sys.stderr)
    if config.debug:
        _dump(gm, graph, order, art, gid)
    return art


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
