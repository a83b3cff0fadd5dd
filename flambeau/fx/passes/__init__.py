"""Graph passes: shape propagation (dead-code elimination is `Graph.eliminate_dead_code`)."""
from . import shape_prop  # noqa: F401
