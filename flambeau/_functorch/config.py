"""Settings of `flambeau.func`'s transforms (PyTorch's `torch._functorch.config`).

    FLAMBEAU_VMAP_CACHE_ALLOCATOR=0    turn off vmap_cache_allocator (below)
    FLAMBEAU_AOT_CSE=0                 turn off cse (below)
    FLAMBEAU_EAGER_BACKWARD=0          never compile a backward before its first use (below)
"""
from __future__ import annotations

import os

# The NumPy arrays made while an outermost `vmap` call runs (its batched activations, per-example
# gradients, temporaries) are allocated by flambeau's caching allocator (_backends/cpu_allocator.py:
# NumPy's allocation policy, a context variable set for the call only, as around compiled graphs), so
# the next call reuses the blocks this one freed. With glibc's own policy a per-sample-gradient step of
# bench/func.py's CNN gives its ~9 MB of freed heap back to the system and faults it in again at the
# next (~2200 minor faults, a third of the step's process CPU time).
vmap_cache_allocator: bool = os.environ.get("FLAMBEAU_VMAP_CACHE_ALLOCATOR", "1") not in ("", "0")

# AOT autograd merges duplicate pure calls of a joint forward+backward graph before partitioning it
# (`compile_utils.fx_graph_cse`, PyTorch's `torch._functorch.config.cse`): a backward formula that
# recomputes a forward value (cross-entropy's softmax) then shares it, and the partitioner saves its small
# statistics instead of reading the logits again.
cse: bool = os.environ.get("FLAMBEAU_AOT_CSE", "1") not in ("", "0")

# A training graph's backward compiled right after its forward (PyTorch's `force_non_lazy_backward_lowering`)
# instead of at its first use, its example inputs the traced values with the strides the compiled forward
# gives its saved values (`compiled_fw.output_strides`, where the forward's compiler says). Off by default, as
# in PyTorch. The inductor backend turns it on for a cuda graph compiled on an empty kernel cache (a cold
# start): the backward's kernels are then queued to the compile workers beside the forward's instead of after
# the forward has run. FLAMBEAU_EAGER_BACKWARD=0 keeps that from happening.
force_non_lazy_backward_lowering: bool = False
eager_backward_on_cold_cuda: bool = os.environ.get("FLAMBEAU_EAGER_BACKWARD", "1") not in ("", "0")
