"""A differential compile fuzzer: random programs run by `flambeau.compile` vs flambeau eager vs PyTorch.

    python -m tests.fuzz --seeds 0:1000            # forward + backward, static and dynamic=True
    python -m tests.fuzz --seeds 17 --show         # print seed 17's program as a standalone repro

`gen.py` draws a program per seed (a chain of 3-8 operations over pointwise ops from the op
database, reductions, views and views of views, in-place ops, matmul, softmax, indexing, casts)
on inputs with odd layouts (transposed, strided, offset, expanded, size-0/1 dims, 0-dim) and
dtypes (float32/float64, int, bool, mixed), each step checked by running it in PyTorch.
`check.py` runs the program through PyTorch, flambeau eager and flambeau.compile (inductor,
optionally `dynamic=True`), forward and (for float programs) the gradients of a scalar function of
its outputs, and compares results as `torch.testing` does, forgiving elements where PyTorch's own
float32 result strays from its float64 one. A compiled run that falls back to eager, raises, or
differs is a failure, reported with a standalone repro script (`Program.repro()`).

The fuzzer lives under tests/ because it imports PyTorch (the reference), which flambeau never does.
"""
