"""Graph passes: shape propagation, dropping and restoring example values (dead-code elimination is
`Graph.eliminate_dead_code`)."""
from . import shape_prop, example_values  # noqa: F401
