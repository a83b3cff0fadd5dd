"""Scripts that tests/test_distributed_*.py start under `python -m flambeau.distributed.run` (one per scenario).

They are written as PyTorch scripts (`import torch`): the launcher runs them on flambeau through
flambeau.run's aliasing. Each rank writes its results into the output folder; the test compares them
with references computed in the test process (NumPy, PyTorch). `inputs.py` makes every rank's inputs
deterministically, so the test rebuilds them.
"""
