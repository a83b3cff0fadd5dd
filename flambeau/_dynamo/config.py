"""Settings of graph capture (module attributes, like `torch._dynamo.config`)."""
import os

cache_size_limit: int = 8            # compiled entries kept per code object before running it eagerly
accumulated_cache_size_limit: int = 256
automatic_dynamic_shapes: bool = True
assume_static_by_default: bool = True
specialize_int: bool = False         # Python ints seen as inputs are guarded by value either way
capture_scalar_outputs: bool = False  # .item() breaks the graph (PyTorch's default)
suppress_errors: bool = True      # an internal/backend error runs the frame eagerly (with a warning)
verbose: bool = os.environ.get("FLAMBEAU_DYNAMO_VERBOSE", "0") == "1"
max_inline_depth: int = 64
