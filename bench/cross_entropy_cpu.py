"""CPU cost of cross_entropy forward + backward with class-index targets (N=2048, V=8192, float32).

    PYTHONPATH=$PWD python3 bench/cross_entropy_cpu.py

Prints the tracemalloc peak during one forward + backward as a multiple of the logits' size, and the
minimum over 5 repeats of 3 steps (timeit) in ms per step. Timings on a shared machine are noisy.
"""
from __future__ import annotations

import timeit
import tracemalloc

import numpy as np

import flambeau as fl
import flambeau.nn.functional as F

ROWS, CLASSES = 2048, 8192
REPEATS, NUMBER = 5, 3


def main() -> None:
    rng = np.random.default_rng(0)
    x = fl.tensor(rng.standard_normal((ROWS, CLASSES), dtype=np.float32), requires_grad=True)
    t = fl.tensor(rng.integers(0, CLASSES, ROWS))

    def step() -> None:
        x.grad = None
        F.cross_entropy(x, t).backward()

    step()
    tracemalloc.start()
    tracemalloc.reset_peak()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"peak / logits: {peak / (ROWS * CLASSES * 4):.2f}")
    best = min(timeit.repeat(step, number=NUMBER, repeat=REPEATS)) / NUMBER
    print(f"forward+backward: {best * 1e3:.1f} ms (min of {REPEATS}x{NUMBER})")


if __name__ == "__main__":
    main()
