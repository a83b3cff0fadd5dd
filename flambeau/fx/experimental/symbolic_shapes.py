"""`flambeau.fx.experimental.symbolic_shapes`: PyTorch's module path for SymInt and ShapeEnv."""
from .._symbolic_shapes import ShapeEnv, SymInt, is_symbolic, free_symbols, sym_size  # noqa: F401


class GuardOnDataDependentSymNode(RuntimeError):
    """Tracing needed a value that depends on tensor data (data-dependent control flow)."""
