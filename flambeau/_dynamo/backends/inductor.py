"""The "inductor" backend: AOT autograd with the core-op decompositions (plus the inductor's own,
e.g. attention as batched products and a softmax) and the min-cut partitioner, each graph compiled
by `flambeau._inductor.compile_fx` (C++/OpenMP kernels). `options` of `flambeau.compile` set
`flambeau._inductor.config` knobs for the duration of the compile."""
from __future__ import annotations

import contextlib

from ..._decomp import core_aten_decompositions
from ..._functorch.aot_autograd import aot_module_simplified
from ..._functorch.partitioners import min_cut_rematerialization_partition
from ... import _inductor
from ..._inductor import config as inductor_config
from ..._inductor.decompositions import decomposition_table
from ..repro.after_aot import wrap_compiler_debug
from .registry import register_builtin


@contextlib.contextmanager
def _inductor_options(options: dict | None):
    saved = {}
    try:
        for k, v in (options or {}).items():
            key = k.replace(".", "_")
            if not hasattr(inductor_config, key):
                raise RuntimeError(f"Unexpected optimization option {k}, known options are "
                                   f"{sorted(n for n in vars(inductor_config) if not n.startswith('_'))}")
            saved[key] = getattr(inductor_config, key)
            setattr(inductor_config, key, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(inductor_config, k, v)


def inductor(gm, example_inputs, options=None):
    def compile_graph(g, ex):
        with _inductor_options(options):
            return _inductor.compile_fx(g, ex)      # looked up per call: tools and tests wrap it
    compile_graph = wrap_compiler_debug(compile_graph, "inductor")      # FLAMBEAU_REPRO_AFTER=aot
    return aot_module_simplified(gm, example_inputs, fw_compiler=compile_graph, bw_compiler=compile_graph,
                                 partition_fn=min_cut_rematerialization_partition,
                                 decompositions=decomposition_table(core_aten_decompositions()))


register_builtin("inductor", inductor)
