"""flambeau._inductor: the code generator behind `flambeau.compile` (TorchInductor's design).

`compile_fx(gm, example_inputs)` takes an FX GraphModule of core operators and returns a
callable running fused C++/OpenMP kernels (NumPy code when no compiler works). The path from
graph to kernels, one module each: graph.py + lowering*.py (loop IR) -> scheduler.py (fusion,
memory plan) -> codegen_cpp.py / codegen_numpy.py -> flambeau._cpp_builder (compile, cache) ->
wrapper.py (the Python that calls the kernels). Knobs and debug flags: config.py. Graphs traced
with symbolic sizes compile once for every size (sizes as kernel arguments): sizevars.py.

Layer 11 of tests/test_layers.py's order: imports `_functorch`, `_decomp`, tracing and below; it
loads at the first compile.
"""
from . import config  # noqa: F401
from .compile_fx import CompiledGraph, compile_fx  # noqa: F401
from .._cpp_builder import CppCompileError  # noqa: F401
from .aoti import aoti_compile_and_package  # noqa: F401
from .aoti_package import aoti_load_package  # noqa: F401
