"""flambeau._functorch: functionalization, AOT autograd (joint graph + partitioners), and the
function transforms of `flambeau.func` (vmap and its batched tensors, grad/vjp/jvp/jacobians,
functional_call).

Layer 10 of tests/test_layers.py's order: imports `_decomp`, tracing and below.
"""
from .functionalization import FunctionalTensorMode, functionalize, run_functionalized  # noqa: F401
from .aot_autograd import aot_function, aot_module, aot_module_simplified, make_boxed_func  # noqa: F401
from .partitioners import default_partition, min_cut_rematerialization_partition  # noqa: F401
