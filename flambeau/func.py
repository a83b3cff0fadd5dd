"""`flambeau.func` (PyTorch's `torch.func`): composable function transforms.

grad, grad_and_value, vjp, jvp, linearize, jacrev, jacfwd, hessian (`_functorch.eager_transforms`),
vmap (`_functorch.vmap`, batching rules declared with each op in `flambeau/_ops`), functional_call
and stack_module_state (`_functorch.functional_call`). Under `flambeau.compile`, every transform
and functional_call is captured as graph nodes that backends trace through, for module-level
functions, bound methods and functions made in the frame whose tensors are lifted as operands
(`_dynamo/variables/torch.py`); a vjp_fn/jvp_fn the compiled function returns is made after the
graph; stack_module_state (new leaf tensors) and a body that cannot run on fake tensors break the
graph, logged with the reason under FLAMBEAU_LOGS=graph_breaks.
"""
from ._functorch.eager_transforms import (grad, grad_and_value, vjp, jvp, linearize, jacrev, jacfwd,  # noqa: F401
                                          hessian)
from ._functorch.vmap import vmap  # noqa: F401
from ._functorch.functional_call import functional_call, stack_module_state  # noqa: F401

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "linearize", "jacrev", "jacfwd", "hessian", "vmap",
           "functional_call", "stack_module_state"]
