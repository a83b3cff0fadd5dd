"""Settings of graph capture (module attributes, like `torch._dynamo.config`)."""
import os

cache_size_limit: int = 8            # compiled entries kept per code object before it runs eagerly
automatic_dynamic_shapes: bool = True  # a recompile caused by a size change makes that size symbolic
suppress_errors: bool = False        # True: an internal or backend error runs the frame eagerly, with a warning
max_inline_depth: int = 64           # nested inlined calls before the call breaks the graph
inline_inbuilt_nn_modules: bool = True   # trace built-in layers' forwards (False: one call_module node each)
optimize_ddp: bool = True           # compiled DDP modules: graph split at gradient-bucket boundaries (backends/distributed.py)
# each DDP split moved earlier, within half a bucket of parameters, to just before a matrix product where the
# fewest bytes cross (backends/distributed.py `_narrowest`);
# FLAMBEAU_DDP_SPLIT=bucket cuts exactly where the bucket fills, as PyTorch's DDPOptimizer
_ddp_split = os.environ.get("FLAMBEAU_DDP_SPLIT", "narrowest")
if _ddp_split not in ("narrowest", "bucket"):
    raise ValueError(f"FLAMBEAU_DDP_SPLIT={_ddp_split!r}: expected 'narrowest' or 'bucket'")
ddp_split_narrowest: bool = _ddp_split == "narrowest"
# buckets' worth of parameters a DDP subgraph holds (FLAMBEAU_DDP_SUBGRAPH_BUCKETS): 1 cuts at every bucket
# as PyTorch's DDPOptimizer; k > 1 puts k buckets' worth in each, the first one too: fewer subgraphs, each
# costing the host its wrappers and launches every step, against all-reduces that start later. 4 (GPT-2
# 124M in 4 subgraphs, not 13; 2 H100s, session 23): 23.1 vs 22.9 ms a step on fast hosts, 23.7-26.8 vs
# 27.0-28.9 where the hosts ran Python 2x slower; a slow interconnect may want 1
_subgraph_buckets = os.environ.get("FLAMBEAU_DDP_SUBGRAPH_BUCKETS", "4")
if not _subgraph_buckets.isdigit() or int(_subgraph_buckets) < 1:
    raise ValueError(f"FLAMBEAU_DDP_SUBGRAPH_BUCKETS={_subgraph_buckets!r}: expected a positive integer")
ddp_subgraph_buckets: int = int(_subgraph_buckets)
trace_numpy: bool = True             # NumPy arrays and np.* calls become graph nodes (flambeau._numpy); False: graph breaks

# the minifier (flambeau._dynamo.repro; PyTorch's TORCHDYNAMO_REPRO_AFTER / _LEVEL)
repro_after: str | None = os.environ.get("FLAMBEAU_REPRO_AFTER") or None   # "dynamo" | "aot": which graphs are watched
repro_level: int = int(os.environ.get("FLAMBEAU_REPRO_LEVEL", "2"))  # 1 dump, 2 minify errors, 3 +launcher, 4 accuracy
repro_tolerance: float = 1e-3        # accuracy tolerance of repro level 4 (PyTorch's default)
repro_ignore_non_fp: bool = False    # level 4: integer/bool outputs that differ don't count as a failure
minifier_dir: str | None = os.environ.get("FLAMBEAU_MINIFIER_DIR") or None  # default ./flambeau_compile_debug/minifier
