"""Settings of graph capture (module attributes, like `torch._dynamo.config`)."""

cache_size_limit: int = 8            # compiled entries kept per code object before it runs eagerly
automatic_dynamic_shapes: bool = True  # a recompile caused by a size change makes that size symbolic
suppress_errors: bool = True         # an internal or backend error runs the frame eagerly, with a warning
max_inline_depth: int = 64           # nested inlined calls before the call breaks the graph
inline_inbuilt_nn_modules: bool = True   # trace built-in layers' forwards (False: one call_module node each)
