"""The compatibility suite: real public PyTorch programs, unmodified, under PyTorch and under
`python -m flambeau.run`, losses (or generated text) compared and wall time of both reported.

    python -m tests.compat                 # every program but the slow ones
    python -m tests.compat makemore word   # programs whose names contain these words
    python -m tests.compat --slow          # also the slow ones (a 6-layer char GPT at full size)

`programs.py` lists the programs (pinned commits, shrinking arguments); `runner.py` fetches, runs
and compares. tests/test_compat.py runs a short slice under pytest (skipped without the sources).
"""
